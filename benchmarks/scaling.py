"""Scaling of every long-sequence mechanism against dense attention: forward+backward time and peak memory.

Covers every registry entry of family "long-sequence" (``attnkit.registry.entries()``) plus
dense attention (``attnkit.attention`` with no mask, and torch SDPA). For every mechanism and
length L (B=1, H=8, D=64, float32; modules at width 512) a fresh child process builds the
inputs, runs one untimed forward+backward (warm-up: mask layouts are cached then), times
``--repeats`` more and reports their median, and the peak resident memory above its level
just before the warm-up (Linux: ``/proc/self/clear_refs`` resets ``VmHWM``, which is then read
against ``VmRSS``). The exponent ``p`` of ``time ~ L^p`` is a least-squares fit on log-log.
A child that runs past ``--timeout`` is killed and shown as "timeout"; longer L of that
mechanism are then skipped. A Markdown table goes to stdout and, with ``--write FILE``, into
FILE between ``<!-- scaling:start -->`` and ``<!-- scaling:end -->``.

Module rows include the module's own projections (linear in L); the two dense rows are
attention alone on ``(1, 8, L, 64)`` tensors.

Usage::

    python benchmarks/scaling.py --threads 1 --write BENCHMARKS.md   # L = 1024 ... 16384
    python benchmarks/scaling.py 512 1024 --only local longformer
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

BATCH, HEADS, HEAD_DIM = 1, 8, 64
DIM = HEADS * HEAD_DIM
LINEAR_LIMIT = 1.15
START, END = "<!-- scaling:start -->", "<!-- scaling:end -->"

# row name -> (registry entry or None for dense, configuration shown in the table)
CASES = {
    "dense attnkit.attention": (None, "no mask (auto backend)"),
    "dense torch SDPA": (None, "F.scaled_dot_product_attention, no mask"),
    "bigbird": ("bigbird", "block 64, window 3, global 2, random 3 blocks (paper's ITC)"),
    "block-sparse": ("block-sparse", "block 64; layout: band of 3 blocks + block column 0"),
    "lambda-layer": ("lambda-layer", "global context (max_len = L), key dim 16, 8 heads, value dim 64"),
    "lambda-layer-local": ("lambda-layer-local", "local context r = 257 (as local window 128), key dim 16, 8 heads"),
    "linear-attention": ("linear-attention", "elu+1 features, bidirectional"),
    "linear-attention causal": ("linear-attention", "elu+1 features, causal, chunk 64"),
    "linformer": ("linformer", "k = 256, headwise sharing, max_len = L"),
    "local window": ("local", "window half-width 128 (257 keys)"),
    "local blocks": ("local", "blocks of 128"),
    "longformer": ("longformer", "window w = 512 (256 per side), dilation 1, global token 0"),
    "perceiver-attention": ("perceiver-attention", "256 latents (input, grad) cross-attend, 8 heads x 64"),
    "perceiver-encoder": ("perceiver-encoder", "256 latents x 512, cross 8 heads, 1 latent block"),
    "performer": ("performer", "256 positive orthogonal features, bidirectional"),
    "performer causal": ("performer", "256 features, causal, chunk 128"),
    "reformer": ("reformer", "bucket size 64 (L/64 buckets), chunk 64, 2 hashes"),
    "sparse-transformer strided": ("sparse-transformer", "stride l = isqrt(L) (paper: l ~ sqrt(n)), causal"),
    "sparse-transformer fixed": ("sparse-transformer", "l = isqrt(L), c = l // 4 (enwik8: 128, 32), causal"),
}


def _build_module(name: str, length: int):
    """The module of row ``name`` for length ``length`` (width 512, 8 heads of 64)."""
    from attnkit import nn as ak

    l = math.isqrt(length)
    if name == "bigbird":
        return ak.BigBirdAttention(DIM, HEADS, block_size=64, window_blocks=3, global_blocks=2, random_blocks=3)
    if name == "block-sparse":
        import torch

        idx = torch.arange(-(-length // 64))
        layout = (idx[:, None] - idx[None, :]).abs() <= 1
        layout[:, 0] = True
        return ak.BlockSparseAttention(DIM, HEADS, layout, block_size=64)
    if name.startswith("lambda-layer"):
        context = {"local_context": 257} if name.endswith("local") else {"max_len": length}
        return ak.LambdaLayer(DIM, key_dim=16, num_heads=HEADS, **context)
    if name.startswith(("linear-attention", "performer")):
        causal = name.endswith("causal")
        if name.startswith("performer"):
            return ak.PerformerAttention(DIM, HEADS, num_features=256, causal=causal)
        return ak.LinearAttention(DIM, HEADS, causal=causal)
    if name == "linformer":
        return ak.LinformerAttention(DIM, HEADS, max_len=length, k_proj_dim=256)
    if name.startswith("local"):
        return ak.LocalAttention(DIM, HEADS, 128, mode=name.split()[-1])
    if name == "longformer":
        layer = ak.LongformerAttention(DIM, HEADS, window=512)
        return lambda x: layer(x, global_tokens=[0]), layer
    if name == "perceiver-encoder":
        return ak.PerceiverEncoder(DIM, num_latents=256, latent_dim=DIM, depth=1, cross_heads=HEADS,
                                   latent_heads=HEADS, head_dim=HEAD_DIM)
    if name == "reformer":
        return ak.ReformerAttention(DIM, HEADS, n_buckets=max(2, 2 * (length // 128)), n_hashes=2, chunk_size=64)
    if name.startswith("sparse-transformer"):
        return ak.SparseTransformerAttention(DIM, HEADS, name.split()[-1], stride=l, summary=max(1, l // 4))
    raise KeyError(f"no benchmark configuration for {name!r}")


def _build(name: str, length: int):
    """``(run, leaves)``: ``run(*inputs)`` is one forward; ``leaves`` = inputs, then the parameters."""
    import torch
    import torch.nn.functional as F

    import attnkit
    from attnkit.nn import PerceiverAttention

    torch.manual_seed(0)
    if name.startswith("dense"):
        qkv = [torch.randn(BATCH, HEADS, length, HEAD_DIM, requires_grad=True) for _ in range(3)]
        return (attnkit.attention if "attnkit" in name else F.scaled_dot_product_attention), qkv, qkv
    inputs = [torch.randn(BATCH, length, DIM, requires_grad=True)]
    if name == "perceiver-attention":
        module = PerceiverAttention(DIM, DIM, num_heads=HEADS, head_dim=HEAD_DIM)
        inputs.insert(0, torch.randn(BATCH, 256, DIM, requires_grad=True))  # latents
    else:
        module = _build_module(name, length)
    fn, module = module if isinstance(module, tuple) else (module, module)
    return fn, inputs, inputs + list(module.parameters())


def _child(name: str, length: int, repeats: int, threads: int | None) -> dict:
    import torch

    from attnkit.analysis.memory import reset_peak, resident_bytes
    from attnkit.runtime import retain_freed_memory

    if threads:
        torch.set_num_threads(threads)
    retain_freed_memory()  # every row alike: freed buffers are reused instead of page-faulted afresh
    fn, inputs, leaves = _build(name, length)
    reset_peak()
    base = resident_bytes("VmRSS")
    times = []
    for i in range(repeats + 1):
        start = time.perf_counter()
        fn(*inputs).sum().backward()
        if i:  # run 0 is the warm-up
            times.append(time.perf_counter() - start)
        for t in leaves:
            t.grad = None
    return {"seconds": statistics.median(times), "peak_mib": (resident_bytes("VmHWM") - base) / 2**20}


def _measure(name: str, length: int, args) -> dict | str:
    """The child's result, or "timeout" / "failed"."""
    cmd = [sys.executable, __file__, "--child", name, str(length), "--repeats", str(args.repeats)]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, check=False)
    except subprocess.TimeoutExpired:
        print(f"# {name} at L={length}: timed out after {args.timeout:g} s", file=sys.stderr)
        return "timeout"
    if done.returncode:
        print(f"# {name} at L={length} failed (exit {done.returncode}):\n{done.stderr[-2000:]}", file=sys.stderr)
        return "failed"
    return json.loads(done.stdout.strip().splitlines()[-1])


def _run_row(name: str, args) -> list:
    if name not in CASES:
        return ["not configured"] * len(args.lengths)
    row = []
    for length in args.lengths:
        if row and isinstance(row[-1], str):
            row.append("skipped")  # a shorter L already timed out or failed
            continue
        row.append(_measure(name, length, args))
        print(f"# {name} L={length}: {row[-1]}", file=sys.stderr, flush=True)
    return row


def fit_exponent(lengths, values) -> float | None:
    """Least-squares slope of log(value) against log(L); None with fewer than two usable points."""
    pts = [(math.log(n), math.log(v)) for n, v in zip(lengths, values, strict=True) if v and v > 0]
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    var = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / var if var else None


def is_linear(complexity: str) -> bool:
    """Whether a registry complexity class is linear in L: L appears once, with no power, root or log."""
    return len(re.findall(r"\bL\b", complexity)) == 1 and not re.search(r"L\^|sqrt\(L|log", complexity)


def _exponent(row, lengths) -> tuple[float | None, str]:
    secs = [r["seconds"] if isinstance(r, dict) else None for r in row]
    p = fit_exponent(lengths, secs)
    got = sum(s is not None for s in secs)
    text = "n/a" if p is None else f"{p:.2f}" + ("" if got == len(lengths) else f" ({got} of {len(lengths)} L)")
    return p, text


def _cells(row, key: str, scale: float) -> list[str]:
    return [f"{r[key] * scale:.1f}" if isinstance(r, dict) else r for r in row]


def report(results: dict, complexity: dict, args) -> str:
    lengths = args.lengths
    head = (["mechanism", "configuration"] + [f"L={n} ms" for n in lengths] + [f"L={n} MiB" for n in lengths]
            + ["time exponent"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    verdicts = []
    for name, row in results.items():
        p, text = _exponent(row, lengths)
        config = CASES[name][1] if name in CASES else "no benchmark configuration"
        lines.append("| " + " | ".join([name, config, *_cells(row, "seconds", 1e3), *_cells(row, "peak_mib", 1.0),
                                        text]) + " |")
        if complexity.get(name) and is_linear(complexity[name]):
            ok = "not measured" if p is None else ("yes" if p <= LINEAR_LIMIT else "NO")
            verdicts.append(f"- {name} ({complexity[name]}): exponent {text}; at most {LINEAR_LIMIT}: {ok}")
    note = (f"B={BATCH}, H={HEADS}, D={HEAD_DIM} (modules: width {DIM}), float32; forward+backward, median of "
            f"{args.repeats} after one warm-up, each (mechanism, L) in a fresh process; peak = VmHWM above VmRSS "
            "just before the warm-up (reset through /proc/self/clear_refs); time exponent = least-squares slope "
            "of log time against log L. Module rows include their projections. \"timeout\": killed after "
            f"{args.timeout:g} s; \"skipped\": a shorter L timed out or failed.")
    checks = ["Linear-time mechanisms (by their registry complexity class), exponent as measured:", "", *verdicts]
    return "\n".join([*lines, "", note, "", *checks])


def _rows(args) -> tuple[list[str], dict]:
    from attnkit.registry import entries

    complexity = {name: None for name, (entry, _) in CASES.items() if entry is None}
    for e in entries():
        if e.family != "long-sequence":
            continue
        names = [n for n, (entry, _) in CASES.items() if entry == e.name] or [e.name]
        if names == [e.name] and e.name not in CASES:
            print(f"# registry entry {e.name!r} has no benchmark configuration here", file=sys.stderr)
        complexity.update(dict.fromkeys(names, e.complexity))
    names = [n for n in complexity if args.only is None or any(s in n for s in args.only)]
    return names, complexity


def write_section(path: Path, text: str) -> None:
    """Replace the section between START and END in ``path``, or append it (creating the file)."""
    old = path.read_text() if path.exists() else "# Benchmarks\n"
    if START in old and END in old:
        head, rest = old.split(START, 1)
        new = head + text + rest.split(END, 1)[1]
    else:
        new = old.rstrip() + "\n\n" + text + "\n"
    path.write_text(new)


def _section(table: str, args) -> str:
    import torch

    exe = os.path.relpath(sys.executable)
    command = shlex.join([sys.executable if exe.startswith("..") else exe, *sys.argv])
    threads = args.threads or torch.get_num_threads()
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return "\n".join([START, "## Scaling of the long-sequence mechanisms (issue 4)", "",
                      f"Command: `{command}`, run {when}; torch {torch.__version__}, torch threads: {threads}, "
                      f"{os.cpu_count()} CPUs.", "", table, END])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lengths", nargs="*", type=int, default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch threads in each child (default: torch's)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds allowed per child process")
    parser.add_argument("--only", nargs="+", default=None, help="substrings of the row names to run")
    parser.add_argument("--write", metavar="FILE", default=None, help="write the section into FILE")
    parser.add_argument("--child", nargs=2, metavar=("NAME", "L"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.child[0], int(args.child[1]), args.repeats, args.threads)))
        return
    names, complexity = _rows(args)
    results = {name: _run_row(name, args) for name in names}
    table = report(results, complexity, args)
    print(table)
    if args.write:
        write_section(Path(args.write), _section(table, args))
        print(f"wrote {args.write}", file=sys.stderr)


if __name__ == "__main__":
    main()
