"""Scaling of every long-sequence mechanism against dense attention: forward+backward time and peak memory.

Covers every registry entry of family "long-sequence" (``attnkit.registry.entries()``) plus
dense attention (``attnkit.attention`` with no mask, and torch SDPA). The measuring is
:func:`attnkit.lab.analysis.scaling.scaling`: for every mechanism and length L (B=1, H=8, D=64,
float32; modules at width 512) a fresh child process builds the inputs, runs one untimed
forward+backward (warm-up: mask layouts are cached then), times ``--repeats`` more and reports
their median, and the peak resident memory above its level just before the warm-up (Linux:
``/proc/self/clear_refs`` resets ``VmHWM``, which is then read against ``VmRSS``). The exponent
``p`` of ``time ~ L^p`` is a least-squares fit on log-log. A child that runs past ``--timeout``
is killed and shown as "timeout"; longer L of that mechanism are then skipped. A Markdown table
goes to stdout and, with ``--write FILE``, into FILE's scaling section
(:mod:`attnkit.lab.benchmarking.sections`).

Module rows include the module's own projections (linear in L); the two dense rows are
attention alone on ``(1, 8, L, 64)`` tensors.

Usage::

    python benchmarks/scaling.py --threads 1 --write BENCHMARKS.md   # L = 1024 ... 16384
    python benchmarks/scaling.py 512 1024 --only local longformer
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import shlex
import sys
from pathlib import Path

from attnkit.lab.analysis.scaling import DEFAULT_SIZES, Mechanism, fit_exponent, scaling
from attnkit.lab.benchmarking.sections import write_section

__all__ = ["CASES", "fit_exponent", "is_linear", "report", "main"]

LINEAR_LIMIT = 1.15
NAME, TITLE = "scaling", "Scaling of the long-sequence mechanisms"

# row name -> (mechanism, its sizes on top of DEFAULT_SIZES, configuration shown in the table)
CASES = {
    "dense attnkit.attention": ("dense", {}, "no mask (auto backend)"),
    "dense torch SDPA": ("sdpa", {}, "F.scaled_dot_product_attention, no mask"),
    "bigbird": ("bigbird", dict(block_size=64, window_blocks=3, global_blocks=2, random_blocks=3),
                "block 64, window 3, global 2, random 3 blocks (paper's ITC)"),
    "block-sparse": ("block-sparse", dict(block_size=64, layout="band", band=1, columns=1),
                     "block 64; layout: band of 3 blocks + block column 0"),
    "lambda-layer": ("lambda-layer", dict(key_dim=16),
                     "global context (max_len = L), key dim 16, 8 heads, value dim 64"),
    "lambda-layer-local": ("lambda-layer-local", dict(key_dim=16, local_context=257),
                           "local context r = 257 (as local window 128), key dim 16, 8 heads"),
    "linear-attention": ("linear-attention", dict(causal=False), "elu+1 features, bidirectional"),
    "linear-attention causal": ("linear-attention", dict(causal=True, chunk_size=64),
                                "elu+1 features, causal, chunk 64"),
    "linformer": ("linformer", dict(k_proj_dim=256), "k = 256, headwise sharing, max_len = L"),
    "local window": ("local", dict(size=128, mode="window"), "window half-width 128 (257 keys)"),
    "local blocks": ("local", dict(size=128, mode="blocks"), "blocks of 128"),
    "longformer": ("longformer", dict(window=512, dilation=1, global_tokens=(0,)),
                   "window w = 512 (256 per side), dilation 1, global token 0"),
    "perceiver-attention": ("perceiver-attention", dict(latents=256, query_dim=512, context_dim=512),
                            "256 latents (input, grad) cross-attend, 8 heads x 64"),
    "perceiver-encoder": ("perceiver-encoder", dict(input_dim=512, latents=256, latent_dim=512, depth=1,
                                                    cross_heads=8, latent_heads=8),
                          "256 latents x 512, cross 8 heads, 1 latent block"),
    "performer": ("performer", dict(num_features=256, causal=False), "256 positive orthogonal features, bidirectional"),
    "performer causal": ("performer", dict(num_features=256, causal=True, chunk_size=128),
                         "256 features, causal, chunk 128"),
    "reformer": ("reformer", dict(n_hashes=2, chunk_size=64, causal=False),
                 "bucket size 64 (L/64 buckets), chunk 64, 2 hashes"),
    "sparse-transformer strided": ("sparse-transformer", dict(pattern="strided"),
                                   "stride l = isqrt(L) (paper: l ~ sqrt(n)), causal"),
    "sparse-transformer fixed": ("sparse-transformer", dict(pattern="fixed"),
                                 "l = isqrt(L), c = l // 4 (enwik8: 128, 32), causal"),
}


def is_linear(complexity: str) -> bool:
    """Whether a registry complexity class is linear in L: L appears once, with no power, root or log."""
    return len(re.findall(r"\bL\b", complexity)) == 1 and not re.search(r"L\^|sqrt\(L|log", complexity)


def report(table, complexity: dict, args) -> str:
    """The section's table, its note and the verdicts on the linear-time mechanisms."""
    lines = [table.markdown({name: CASES.get(name, (None, None, "registry defaults"))[2] for name in complexity},
                            memory_exponent=False)]
    verdicts = []
    for name, cx in complexity.items():
        if cx and is_linear(cx):
            p, text = table.exponent(name), table.exponent_text(name)
            ok = "not measured" if p is None else ("yes" if p <= LINEAR_LIMIT else "NO")
            verdicts.append(f"- {name} ({cx}): exponent {text}; at most {LINEAR_LIMIT}: {ok}")
    note = (f"B={DEFAULT_SIZES['batch']}, H={DEFAULT_SIZES['heads']}, D={DEFAULT_SIZES['head_dim']} (modules: width "
            f"{DEFAULT_SIZES['dim']}), float32; forward+backward, median of {args.repeats} after one warm-up, each "
            "(mechanism, L) in a fresh process; peak = VmHWM above VmRSS just before the warm-up (reset through "
            "/proc/self/clear_refs); time exponent = least-squares slope of log time against log L. Module rows "
            "include their projections. \"timeout\": killed after "
            f"{args.timeout:g} s; \"skipped\": a shorter L timed out or failed.")
    checks = ["Linear-time mechanisms (by their registry complexity class), exponent as measured:", "", *verdicts]
    return "\n".join([*lines, "", note, "", *checks])


def _rows(args) -> tuple[list[Mechanism], dict]:
    from attnkit.registry import entries

    complexity = {name: None for name, (mech, _, _) in CASES.items() if mech in ("dense", "sdpa")}
    rows = {}
    for e in entries():
        if e.family != "long-sequence":
            continue
        names = [n for n, (mech, _, _) in CASES.items() if mech == e.name] or [e.name]
        if names == [e.name] and e.name not in CASES:
            print(f"# registry entry {e.name!r} has no benchmark configuration here: registry defaults",
                  file=sys.stderr)
        complexity.update(dict.fromkeys(names, e.complexity))
    for name in complexity:
        mech, sizes, _ = CASES.get(name, (name, {}, ""))
        rows[name] = Mechanism(name, mech, sizes)
    keep = [n for n in complexity if args.only is None or any(s in n for s in args.only)]
    return [rows[n] for n in keep], {n: complexity[n] for n in keep}


def _section(table: str, args) -> str:
    import torch

    exe = os.path.relpath(sys.executable)
    command = shlex.join([sys.executable if exe.startswith("..") else exe, *sys.argv])
    threads = args.threads or torch.get_num_threads()
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return "\n".join([f"Command: `{command}`, run {when}; torch {torch.__version__}, torch threads: {threads}, "
                      f"{os.cpu_count()} CPUs.", "", table])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lengths", nargs="*", type=int, default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch threads in each child (default: torch's)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds allowed per child process")
    parser.add_argument("--only", nargs="+", default=None, help="substrings of the row names to run")
    parser.add_argument("--write", metavar="FILE", default=None, help="write the section into FILE")
    args = parser.parse_args(argv)
    mechanisms, complexity = _rows(args)
    table = scaling(mechanisms, args.lengths, repeats=args.repeats, timeout=args.timeout, threads=args.threads,
                    progress=lambda label: print(f"# {label}", file=sys.stderr, flush=True))
    for row in table.rows:
        if row.status == "failed":
            print(f"# {row.mechanism} at L={row.length} failed:\n{row.error}", file=sys.stderr)
    text = report(table, complexity, args)
    print(text)
    if args.write:
        write_section(Path(args.write), NAME, _section(text, args), TITLE)
        print(f"wrote {args.write}", file=sys.stderr)


if __name__ == "__main__":
    main()
