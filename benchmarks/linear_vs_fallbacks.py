"""Linear attention against what users run on CPU today, and where each family's chunk form overtakes softmax.

Two sections of BENCHMARKS.md, both at one thread, timed interleaved
(:func:`attnkit.lab.analysis.timing.time_rounds`), each row the ratio ``attnkit time / other time`` per
round (median and range over the rounds):

- ``linear-vs-fallbacks``: the chunk forms of :func:`~attnkit.functional.recurrences.gated_delta_rule` and
  :func:`~attnkit.functional.recurrences.kimi_delta_attention` against the pure-torch chunked kernels that
  transformers runs on CPU for Qwen3-Next (``torch_chunk_gated_delta_rule``) and Kimi Linear
  (``chunk_kimi_delta_attention``) when flash-linear-attention's Triton kernels are not there; forward
  (no gradient) and forward+backward (of the output, as training), B = 1, H = 4, Dk = Dv = 128 (the models'
  head size), chunk 64 on both sides, L = 1024 and 4096; target <= 0.67x forward+backward at 4096. Same
  inputs in each side's layout (attnkit ``(B, H, L, D)``, transformers ``(B, L, H, D)``), the same
  conventions (q and k L2-normalised inside, q scaled by ``Dk^-1/2``, log decays ``g``, ``beta`` in (0, 1)).
  Before timing, both run the same inputs in float64 and must give the same output and final state
  (:func:`check`; the fallbacks cast to float32, which is made a no-op for the check).
- ``linear-crossover``: for each family with a chunk form, its forward+backward against dense causal SDPA
  (``F.scaled_dot_product_attention(is_causal=True)``) forward+backward with the same B, H, D, at L = 256,
  512, ... 16384, stopping at the first length where the chunk form is faster (median ratio < 1).

Usage::

    python benchmarks/linear_vs_fallbacks.py --rounds 5 --write BENCHMARKS.md
    python benchmarks/linear_vs_fallbacks.py --only fallbacks --lengths 1024 4096 --head-dim 64
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from attnkit.functional import recurrences as linear
from attnkit.lab.analysis.timing import time_rounds
from attnkit.lab.benchmarking.machine import machine_info
from attnkit.lab.benchmarking.sections import write_section

__all__ = ["FALLBACKS", "FAMILIES", "fallback", "inputs", "check", "compare", "crossover", "main"]

NAME, TITLE = "linear-vs-fallbacks", "Linear attention: attnkit's chunk forms against transformers' CPU fallbacks"
CROSS_NAME, CROSS_TITLE = "linear-crossover", "Linear attention: the length where each chunk form beats causal SDPA"
GOAL = 0.67  # forward+backward at L = 4096, against the fallback

# family -> (attnkit's function, the transformers module and function name of its CPU fallback, decay per channel)
FALLBACKS = {"gated_delta_rule": ("gated_delta_rule", "qwen3_next.modeling_qwen3_next", "torch_chunk_gated_delta_rule",
                                  False),
             "kimi_delta_attention": ("kimi_delta_attention", "kimi_linear.modeling_kimi_linear",
                                      "chunk_kimi_delta_attention", True)}


def fallback(family: str) -> tuple[object, Callable]:
    """``(module, function)``: transformers' pure-torch chunked kernel for ``family`` (undecorated: never a hub
    or flash-linear-attention kernel)."""
    import importlib
    _, module_name, function_name, _ = FALLBACKS[family]
    module = importlib.import_module(f"transformers.models.{module_name}")
    return module, inspect.unwrap(getattr(module, function_name))


def inputs(family: str, length: int, heads: int, dim: int, *, dtype=torch.float32, seed: int = 0):
    """``q, k, v, g, beta`` in attnkit's layout ``(B = 1, H, L, D)``: log decays ``g`` ``(1, H, L)`` (``(1, H, L, D)``
    per channel, KDA) from a log-sigmoid, ``beta`` a sigmoid."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, heads, length, dim, generator=gen, dtype=dtype) for _ in range(3))
    channel = FALLBACKS[family][3]
    g = F.logsigmoid(torch.randn(1, heads, length, *((dim,) if channel else ()), generator=gen, dtype=dtype) + 3)
    beta = torch.sigmoid(torch.randn(1, heads, length, generator=gen, dtype=dtype))
    return q, k, v, g, beta


def _calls(family: str, tensors, chunk: int, *, state: bool = False):
    """``(attnkit's call, transformers' call)`` on the same ``tensors`` (attnkit's layout); each returns
    ``(output in attnkit's layout, final state or None)``."""
    ours = getattr(linear, FALLBACKS[family][0])
    theirs = fallback(family)[1]
    q, k, v, g, beta = tensors
    moved = [t.transpose(1, 2).contiguous().detach().requires_grad_(t.requires_grad) for t in tensors]

    def run_ours():
        return ours(q, k, v, g, beta, normalize_qk=True, chunk_size=chunk)

    def run_theirs():
        out, last = theirs(*moved[:3], g=moved[3], beta=moved[4], chunk_size=chunk, output_final_state=state,
                           use_qk_l2norm_in_kernel=True)
        return out.transpose(1, 2), last
    return (run_ours, run_theirs), [*tensors, *moved]


@contextlib.contextmanager
def _float64(module):
    """The fallbacks compute in float32 whatever they are given (``.to(torch.float32)``, ``.float()``): for the
    check, ``module``'s ``torch.float32`` reads float64 and ``Tensor.float`` keeps float64, so they compute in it."""
    class Torch:
        def __getattr__(self, name):
            return torch.float64 if name == "float32" else getattr(torch, name)
    saved, to_float = module.torch, torch.Tensor.float
    module.torch = Torch()
    torch.Tensor.float = lambda self, *args, **kwargs: self if self.dtype == torch.float64 else to_float(self)
    try:
        yield
    finally:
        module.torch, torch.Tensor.float = saved, to_float


def check(family: str, length: int = 150, heads: int = 2, dim: int = 16, chunk: int = 64) -> float:
    """Max |diff| of attnkit's and the fallback's output and final state on the same float64 inputs (two blocks
    and a part, so padding is covered); raises AssertionError past 1e-9."""
    tensors = inputs(family, length, heads, dim, dtype=torch.float64, seed=1)
    (ours, theirs), _ = _calls(family, tensors, chunk, state=True)
    with _float64(fallback(family)[0]):
        got, want = ours(), theirs()
    assert got[0].dtype == want[0].dtype == torch.float64, (got[0].dtype, want[0].dtype)
    diff = max((a - b).abs().max().item() for a, b in zip(got, want, strict=True))
    assert diff <= 1e-9, f"{family}: attnkit and transformers differ by {diff:.3g} in float64"
    return diff


def _ratios(fns: dict[str, Callable[[], object]], rounds: int) -> dict:
    """Median seconds of each side and the ratio ``first / second`` per round: median, min, max."""
    times = time_rounds(fns, rounds, warmup=1)
    ours, theirs = times.values()
    ratios = [a / b for a, b in zip(ours, theirs, strict=True)]
    return {"ours_s": statistics.median(ours), "theirs_s": statistics.median(theirs),
            "ratio": statistics.median(ratios), "lo": min(ratios), "hi": max(ratios)}


def _training(run: Callable, leaves: list[torch.Tensor]) -> Callable[[], None]:
    def step():
        for t in leaves:
            t.grad = None
        run()[0].sum().backward()
    return step


def compare(family: str, length: int, *, heads: int = 4, dim: int = 128, chunk: int = 64, rounds: int = 5) -> list:
    """Forward and forward+backward rows of ``family`` at ``length`` against its transformers fallback."""
    rows = []
    for backward in (False, True):
        tensors = [t.requires_grad_(backward) for t in inputs(family, length, heads, dim)]
        (ours, theirs), leaves = _calls(family, tensors, chunk)
        if backward:
            fns = {"attnkit": _training(ours, leaves), "transformers": _training(theirs, leaves)}
        else:
            fns = {"attnkit": torch.no_grad()(ours), "transformers": torch.no_grad()(theirs)}
        rows.append({"family": family, "length": length, "pass": "fwd+bwd" if backward else "fwd",
                     **_ratios(fns, rounds)})
    return rows


def _family_inputs(name: str, n: int, h: int, d: int, gen: torch.Generator):
    """``(function, args, kwargs)`` of one family on random inputs with ``B = 1``, ``H = h``, ``D = d``."""
    def rand(*shape):
        return torch.randn(1, h, n, *shape, generator=gen)
    q, k, v = rand(d), rand(d), rand(d)
    gate, channel = F.logsigmoid(rand() + 3), F.logsigmoid(rand(d) + 3)
    beta = torch.sigmoid(rand())
    delta = {"normalize_qk": True}
    if name == "linear attention":
        return linear.retention, (q, k, v, torch.ones(h)), {}
    if name == "RetNet":
        return linear.retention, (q, k, v, torch.linspace(0.9, 0.999, h)), {}
    if name == "GLA":
        return linear.gated_linear_attention, (q, k, v, channel), {}
    if name == "Mamba-2 SSD":
        return linear.ssd, (v, F.softplus(rand()), -torch.rand(h, generator=gen), k, q), {}
    if name == "DeltaNet":
        return linear.delta_rule, (q, k, v, beta), delta
    if name == "Gated DeltaNet":
        return linear.gated_delta_rule, (q, k, v, gate, beta), delta
    if name == "KDA":
        return linear.kimi_delta_attention, (q, k, v, channel, beta), delta
    if name == "Comba":
        return linear.comba, (q, k, v, 0.1 * rand(d), gate, beta), delta
    if name == "DeltaProduct (2 steps)":
        two = torch.randn(1, h, 2 * n, d, generator=gen), torch.randn(1, h, 2 * n, d, generator=gen)
        return linear.delta_product, (q, *two, torch.rand(1, h, 2 * n, generator=gen)), {
            "num_householder": 2, "g": gate, **delta}
    if name == "RWKV-7":
        kappa = F.normalize(rand(d), dim=-1)
        decay = -0.6 * torch.sigmoid(rand(d))
        return linear.generalized_delta_rule, (q, k, v, decay, -kappa, kappa * torch.sigmoid(rand(d))), {}
    raise KeyError(name)


FAMILIES = ("linear attention", "RetNet", "GLA", "Mamba-2 SSD", "DeltaNet", "Gated DeltaNet", "KDA", "Comba",
            "DeltaProduct (2 steps)", "RWKV-7")


def crossover(name: str, lengths, *, heads: int = 4, dim: int = 64, rounds: int = 5,
              log: Callable[[str], None] = print) -> dict:
    """``name``'s chunk form (its default ``chunk_size``) forward+backward against causal SDPA's, at each length in
    turn until the first median ratio below 1: ``{"family", "chunk", "rows", "wins_at"}`` (``wins_at`` None when
    it never does)."""
    rows: list[dict] = []
    for n in lengths:
        gen = torch.Generator().manual_seed(n)
        fn, args, kwargs = _family_inputs(name, n, heads, dim, gen)
        leaves = [t.requires_grad_() for t in args if t.dim() > 1]
        q, k, v = (torch.randn(1, heads, n, dim, generator=gen).requires_grad_() for _ in range(3))

        def ours(fn=fn, args=args, kwargs=kwargs, leaves=leaves):
            for t in leaves:
                t.grad = None
            fn(*args, **kwargs)[0].sum().backward()

        def sdpa(q=q, k=k, v=v):
            for t in (q, k, v):
                t.grad = None
            F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
        rows.append({"length": n, **_ratios({"chunk": ours, "sdpa": sdpa}, rounds)})
        log(f"{name} L = {n}: {rows[-1]['ratio']:.2f}x")
        if rows[-1]["ratio"] < 1:
            break
    chunk = inspect.signature(_family_inputs(name, 1, 1, 1, torch.Generator())[0]).parameters["chunk_size"].default
    return {"family": name, "chunk": chunk, "rows": rows, "wins_at": rows[-1]["length"] if rows and
            rows[-1]["ratio"] < 1 else None}


def _ratio(r: dict) -> str:
    return f"{r['ratio']:.2f}x ({r['lo']:.2f}-{r['hi']:.2f})"


def fallback_table(rows: list[dict], checks: dict[str, float], heads: int, dim: int, chunk: int) -> str:
    lines = [f"B = 1, H = {heads}, Dk = Dv = {dim}, float32, chunk {chunk} on both sides, 1 thread; ratio = attnkit "
             "time / transformers time per interleaved round (median, range); fwd without gradients, fwd+bwd of the "
             "output. Float64 check (same inputs, max |diff| of output and final state): "
             + ", ".join(f"{f} {d:.1e}" for f, d in checks.items()) + ".", "",
             "| function | transformers fallback | L | pass | attnkit ms | transformers ms | ratio | target |",
             "|---|---|---:|---|---:|---:|---:|---|"]
    for r in rows:
        target = f"<= {GOAL}x: {'met' if r['ratio'] <= GOAL else 'missed'}" if (
            r["pass"] == "fwd+bwd" and r["length"] == 4096) else ""
        lines.append(f"| {r['family']} | {FALLBACKS[r['family']][2]} | {r['length']} | {r['pass']} | "
                     f"{r['ours_s'] * 1e3:.1f} | {r['theirs_s'] * 1e3:.1f} | {_ratio(r)} | {target} |")
    return "\n".join(lines)


def crossover_table(results: list[dict], heads: int, dim: int, lengths) -> str:
    lines = [f"B = 1, H = {heads}, D = {dim} (Dk = Dv = N = P), float32, 1 thread; each family's default chunk_size; "
             "ratio = chunk form fwd+bwd time / causal SDPA fwd+bwd time per interleaved round (median, range), "
             f"L = {lengths[0]}, {lengths[1]}, ... {lengths[-1]}, stopping at the first win.", "",
             "| family | chunk | beats causal SDPA from L = | ratio there | ratios below it |",
             "|---|---:|---:|---|---|"]
    for res in results:
        first = res["rows"][-1] if res["wins_at"] else None
        below = ", ".join(f"{r['length']}: {r['ratio']:.2f}x" for r in res["rows"][: -1 if first else None])
        lines.append(f"| {res['family']} | {res['chunk']} | {res['wins_at'] or f'> {lengths[-1]}'} | "
                     f"{_ratio(first) if first else ''} | {below} |")
    return "\n".join(lines)


def _header(argv: list[str]) -> str:
    info = machine_info()
    import shlex
    return (f"Command: `{shlex.join(['python', 'benchmarks/linear_vs_fallbacks.py', *argv])}`, run {info['date']}; "
            f"{info['cpu']}, {info['cores']} CPUs, torch {info['torch']}.")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=("fallbacks", "crossover"), help="one section (default: both)")
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096], help="against the fallbacks")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=128, help="against the fallbacks")
    parser.add_argument("--chunk-size", type=int, default=64, help="against the fallbacks")
    parser.add_argument("--cross-lengths", type=int, nargs="+", default=[256 << i for i in range(7)])
    parser.add_argument("--cross-dim", type=int, default=64)
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--write", type=Path, help="write the sections into this file (BENCHMARKS.md)")
    args = parser.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    torch.set_num_threads(1)
    log = lambda line: print(line, file=sys.stderr)
    done: dict = {}
    if args.only != "crossover":
        checks = {family: check(family) for family in FALLBACKS}
        rows = []
        for family in FALLBACKS:
            for n in args.lengths:
                rows += compare(family, n, heads=args.heads, dim=args.head_dim, chunk=args.chunk_size,
                                rounds=args.rounds)
                log(f"{family} L = {n}: " + ", ".join(f"{r['pass']} {r['ratio']:.2f}x" for r in rows[-2:]))
        text = f"{_header(argv)}\n\n{fallback_table(rows, checks, args.heads, args.head_dim, args.chunk_size)}"
        print(text)
        if args.write:
            write_section(args.write, NAME, text, TITLE)
        done["fallbacks"] = rows
    if args.only != "fallbacks":
        results = [crossover(name, args.cross_lengths, heads=args.heads, dim=args.cross_dim, rounds=args.rounds,
                             log=log) for name in args.families]
        text = f"{_header(argv)}\n\n{crossover_table(results, args.heads, args.cross_dim, args.cross_lengths)}"
        print(text)
        if args.write:
            write_section(args.write, CROSS_NAME, text, CROSS_TITLE)
        done["crossover"] = results
    return done


if __name__ == "__main__":
    main()
