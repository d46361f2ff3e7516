"""Linear recurrences: the chunk form against the parallel form, and a decoding step against softmax attention.

For each length L (default 1024 ... 32768) and one function of :mod:`attnkit.functional.recurrences`
(default ``gated_delta_rule``; B = 1, H = 4, Dk = Dv = 64, float32, blocks of 64), at one thread:

- training: forward + backward of the ``chunk`` and ``parallel`` forms, timed interleaved
  (:func:`attnkit.lab.analysis.timing.time_interleaved`, medians), and the peak resident memory each
  adds, measured in a fresh child process per form and length (this script with one JSON argument; Linux
  ``VmHWM`` reset through ``/proc/self/clear_refs``). The parallel form holds ``L x L`` matrices
  (with one decay per channel too: ``split_decayed_products`` holds no ``L x L x Dk`` mask): it is skipped,
  with its estimate, beyond ``--max-gib``.
- decoding: one new token after L tokens, the ``recurrent`` form from the state (constant in L)
  against softmax attention of one query over a KV cache of L keys (:func:`attnkit.attention`),
  timed interleaved.

Prints a Markdown table; ``--write BENCHMARKS.md`` puts it, with the command and the machine, into
that file's ``linear-forms`` section (:mod:`attnkit.lab.benchmarking.sections`), ``--json FILE`` keeps
the numbers. Nothing here asserts a time.

Usage::

    python benchmarks/linear_forms.py --write BENCHMARKS.md            # L = 1024 ... 32768, gated_delta_rule
    python benchmarks/linear_forms.py --lengths 1024 4096 --function kimi_delta_attention --json out.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

import attnkit
from attnkit.functional import recurrences as linear
from attnkit.lab.analysis.memory import peak_bytes, reset_peak
from attnkit.lab.analysis.timing import time_interleaved
from attnkit.lab.benchmarking.child import child_output, run_as_child
from attnkit.lab.benchmarking.machine import machine_info
from attnkit.lab.benchmarking.sections import write_section

__all__ = ["Config", "FUNCTIONS", "NAME", "TITLE", "run", "table", "section", "main"]

NAME, TITLE = "linear-forms", "Linear recurrences: chunk and parallel forms, recurrent and softmax decoding"
MODULE = "benchmarks.linear_forms"

# name -> (one decay per key channel, delta rule): what the function's extra inputs are
FUNCTIONS = {"retention": (False, False), "gated_linear_attention": (True, False), "delta_rule": (False, True),
             "gated_delta_rule": (False, True), "kimi_delta_attention": (True, True)}


@dataclass(frozen=True)
class Config:
    lengths: tuple[int, ...] = (1024, 2048, 4096, 8192, 16384, 32768)
    function: str = "gated_delta_rule"
    heads: int = 4
    head_dim: int = 64
    chunk_size: int = 64
    repeats: int = 5
    budget_s: float = 30.0  # per timed comparison: fewer rounds when one is slow (at least 1)
    max_gib: float = 8.0  # the parallel form is skipped when its estimate passes this


def _inputs(config: Config, length: int, *, grad: bool, seed: int = 0):
    """``(positional args, keyword args)`` of ``config.function`` on random ``(1, H, length, D)`` inputs."""
    g = torch.Generator().manual_seed(seed)
    h, d = config.heads, config.head_dim
    channel, delta = FUNCTIONS[config.function]
    q, k, v = (torch.randn(1, h, length, d, generator=g) for _ in range(3))
    extra = []
    if config.function == "retention":
        extra.append(torch.linspace(0.9, 0.999, h))  # a fixed decay per head, not learned here
    elif config.function != "delta_rule":
        extra.append(F.logsigmoid(torch.randn(1, h, length, *((d,) if channel else ()), generator=g) + 3))
    if delta:
        extra.append(torch.rand(1, h, length, generator=g))
    args = [t.requires_grad_(grad) for t in (q, k, v)] + [t.requires_grad_(grad and t.dim() > 1) for t in extra]
    return args, {"normalize_qk": True} if delta else {}


def _training_step(config: Config, length: int, form: str) -> Callable[[], object]:
    fn = getattr(linear, config.function)
    args, kwargs = _inputs(config, length, grad=True)

    def step():
        for t in args:
            t.grad = None
        out, state = fn(*args, form=form, chunk_size=config.chunk_size, **kwargs)
        (out.sum() + state.sum()).backward()
    return step


def _parallel_estimate(config: Config, length: int) -> float:
    """GiB the parallel form keeps for its backward: about six ``L x L (x G)`` float32 matrices per head."""
    return 6 * config.heads * length ** 2 * 4 / 2 ** 30


def _decode_steps(config: Config, length: int) -> dict[str, Callable[[], object]]:
    """One new token after ``length``: the recurrent form from a state, and softmax over a KV cache of ``length``."""
    fn = getattr(linear, config.function)
    args, kwargs = _inputs(config, 1, grad=False, seed=1)
    h, d = config.heads, config.head_dim
    state = torch.randn(1, h, d, d)
    cache = [torch.randn(1, h, length, d) for _ in range(2)]  # the keys and values decoded so far
    return {"recurrent step": lambda: fn(*args, form="recurrent", initial_state=state, **kwargs),
            "softmax step over the KV cache": lambda: attnkit.attention(args[0], *cache)}


def _timed(fns: dict[str, Callable[[], object]], config: Config) -> dict[str, float]:
    """Median seconds of each, interleaved (the one place this script times anything)."""
    return {name: t[0] for name, t in time_interleaved(fns, config.repeats, warmup=1, budget_s=config.budget_s).items()}


def _peak_bytes(config: Config, length: int, form: str) -> int:
    payload = {"config": dataclasses.asdict(config), "length": length, "form": form}
    return int(child_output(MODULE, payload, timeout=3600.0))


def child(spec: dict) -> int:
    """One forward + backward of one form in this fresh process: the peak resident bytes it added."""
    torch.set_num_threads(1)
    config = Config(**{**spec["config"], "lengths": tuple(spec["config"]["lengths"])})
    step = _training_step(config, spec["length"], spec["form"])
    base = reset_peak()
    step()
    return peak_bytes() - base


def run(config: Config, log: Callable[[str], None] = print) -> list[dict]:
    """One row per length: training times and peaks of both forms, decoding step times."""
    torch.set_num_threads(1)
    rows = []
    for length in config.lengths:
        forms = ["chunk"] + (["parallel"] if _parallel_estimate(config, length) <= config.max_gib else [])
        log(f"L = {length}: {', '.join(forms)}")
        row = {"length": length, "parallel_estimate_gib": _parallel_estimate(config, length)}
        row["train_s"] = _timed({form: _training_step(config, length, form) for form in forms}, config)
        row["peak_bytes"] = {form: _peak_bytes(config, length, form) for form in forms}
        row["decode_s"] = _timed(_decode_steps(config, length), config)
        rows.append(row)
    return rows


def _cell(values: dict, key: str, scale: float, unit: str) -> str:
    return f"{values[key] * scale:.3g} {unit}" if key in values else "skipped"


def table(config: Config, rows: list[dict]) -> str:
    """The rows as Markdown."""
    lines = [f"{config.function}: B = 1, H = {config.heads}, Dk = Dv = {config.head_dim}, float32, chunk "
             f"{config.chunk_size}, 1 thread (medians; parallel skipped past {config.max_gib:g} GiB)", "",
             "| L | chunk fwd+bwd | parallel fwd+bwd | chunk peak | parallel peak | recurrent step | softmax step "
             "(KV cache) |", "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['length']} | {_cell(r['train_s'], 'chunk', 1e3, 'ms')} | "
                     f"{_cell(r['train_s'], 'parallel', 1e3, 'ms')} | {_cell(r['peak_bytes'], 'chunk', 2**-20, 'MiB')}"
                     f" | {_cell(r['peak_bytes'], 'parallel', 2**-20, 'MiB')} | "
                     f"{_cell(r['decode_s'], 'recurrent step', 1e6, 'us')} | "
                     f"{_cell(r['decode_s'], 'softmax step over the KV cache', 1e6, 'us')} |")
    return "\n".join(lines)


def section(config: Config, rows: list[dict], argv: list[str]) -> str:
    """The table with the command that measured it and the machine, as BENCHMARKS.md's section holds it."""
    info = machine_info()
    command = shlex.join(["python", "benchmarks/linear_forms.py", *argv])
    return (f"Command: `{command}`, run {info['date']}; {info['cpu']}, {info['cores']} CPUs, torch {info['torch']}."
            f"\n\n{table(config, rows)}")


def main(argv: list[str] | None = None) -> list[dict]:
    if run_as_child(child, argv):  # a fresh child process: one measurement
        return []
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=list(Config.lengths))
    parser.add_argument("--function", choices=sorted(FUNCTIONS), default=Config.function)
    parser.add_argument("--heads", type=int, default=Config.heads)
    parser.add_argument("--head-dim", type=int, default=Config.head_dim)
    parser.add_argument("--chunk-size", type=int, default=Config.chunk_size)
    parser.add_argument("--repeats", type=int, default=Config.repeats)
    parser.add_argument("--budget", type=float, default=Config.budget_s, help="seconds per timed comparison")
    parser.add_argument("--max-gib", type=float, default=Config.max_gib)
    parser.add_argument("--json", help="write the numbers to this file")
    parser.add_argument("--write", metavar="FILE", help="write the section into FILE (BENCHMARKS.md)")
    args = parser.parse_args(argv)
    config = Config(tuple(args.lengths), args.function, args.heads, args.head_dim, args.chunk_size, args.repeats,
                    args.budget, args.max_gib)
    rows = run(config, log=lambda line: print(line, file=sys.stderr))
    print(table(config, rows))
    if args.write:
        write_section(Path(args.write), NAME, section(config, rows, sys.argv[1:] if argv is None else argv), TITLE)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": dataclasses.asdict(config), "rows": rows}, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
