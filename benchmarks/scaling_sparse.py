"""Scaling of the sparse-pattern modules against dense attention: forward+backward time and peak memory.

For every mechanism and every length L (B=1, H=8, D=64, float32) a fresh child process
builds the inputs, runs one untimed forward+backward (warm-up: mask layouts are cached
then), times ``--repeats`` more and reports their median and its peak resident memory
(``ru_maxrss``) above what it held just before the first run. The exponent ``p`` of
``time ~ L^p`` is fitted by least squares on log-log. A Markdown table goes to stdout.

Module rows include the module's own q/k/v/out projections (``8 L dim^2`` FLOPs forward,
linear in L); the two dense rows are attention alone on ``(1, 8, L, 64)`` tensors.

Usage::

    python benchmarks/scaling_sparse.py                    # L = 1024 2048 4096
    python benchmarks/scaling_sparse.py 1024 2048 4096 8192 16384 --threads 1
    python benchmarks/scaling_sparse.py 512 1024 --only local longformer
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import statistics
import subprocess
import sys
import time

BATCH, HEADS, HEAD_DIM = 1, 8, 64
DIM = HEADS * HEAD_DIM

CASES = {  # name -> configuration shown in the table
    "dense attnkit.attention": "no mask (auto backend)",
    "dense torch SDPA": "F.scaled_dot_product_attention",
    "block-sparse": "layout: band of 3 blocks + block 0, block 64",
    "sparse-transformer strided": "stride 128, causal",
    "sparse-transformer fixed": "stride 128, summary 8, causal",
    "longformer": "window 256, dilation 1, global token 0",
    "bigbird": "block 64, window 3, global 2, random 3 blocks",
    "local window": "size 128 (257 keys)",
    "local blocks": "blocks of 128",
}


def _build(name: str, length: int):
    """``(run, inputs)``: ``run(*inputs)`` is one forward whose output is summed for backward."""
    import torch
    import torch.nn.functional as F

    import attnkit
    from attnkit.nn.bigbird import BigBirdAttention
    from attnkit.nn.blocksparse import BlockSparseAttention
    from attnkit.nn.local import LocalAttention
    from attnkit.nn.longformer import LongformerAttention
    from attnkit.nn.sparse_transformer import SparseTransformerAttention

    torch.manual_seed(0)
    if name.startswith("dense"):
        qkv = [torch.randn(BATCH, HEADS, length, HEAD_DIM, requires_grad=True) for _ in range(3)]
        fn = attnkit.attention if "attnkit" in name else F.scaled_dot_product_attention
        return fn, qkv
    x = [torch.randn(BATCH, length, DIM, requires_grad=True)]
    if name == "block-sparse":
        nb = -(-length // 64)
        idx = torch.arange(nb)
        layout = (idx[:, None] - idx[None, :]).abs() <= 1
        layout[:, 0] = True
        return BlockSparseAttention(DIM, HEADS, layout, block_size=64), x
    if name.startswith("sparse-transformer"):
        pattern = name.split()[-1]
        return SparseTransformerAttention(DIM, HEADS, pattern, stride=128, summary=8, causal=True), x
    if name == "longformer":
        layer = LongformerAttention(DIM, HEADS, window=256)
        return (lambda t: layer(t, global_tokens=[0])), x
    if name == "bigbird":
        return BigBirdAttention(DIM, HEADS, block_size=64, window_blocks=3, global_blocks=2, random_blocks=3), x
    mode = name.split()[-1]
    return LocalAttention(DIM, HEADS, 128, mode=mode), x


def _child(name: str, length: int, repeats: int, threads: int | None) -> dict:
    import torch

    from attnkit.runtime import retain_freed_memory

    if threads:
        torch.set_num_threads(threads)
    retain_freed_memory()  # both sides alike: freed buffers are reused instead of page-faulted afresh
    fn, inputs = _build(name, length)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times = []
    for i in range(repeats + 1):
        start = time.perf_counter()
        fn(*inputs).sum().backward()
        if i:  # run 0 is the warm-up
            times.append(time.perf_counter() - start)
        for t in inputs:
            t.grad = None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {"seconds": statistics.median(times), "peak_mib": (peak - base) / 1024}


def _measure(name: str, length: int, args) -> dict | None:
    cmd = [sys.executable, __file__, "--child", name, str(length), "--repeats", str(args.repeats)]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, check=False)
    except subprocess.TimeoutExpired:
        print(f"# {name} at L={length}: timed out after {args.timeout} s", file=sys.stderr)
        return None
    if done.returncode:
        print(f"# {name} at L={length} failed:\n{done.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def fit_exponent(lengths, values) -> float | None:
    """Least-squares slope of log(value) against log(L); None with fewer than two usable points."""
    pts = [(math.log(n), math.log(v)) for n, v in zip(lengths, values, strict=True) if v and v > 0]
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    var = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / var if var else None


def _fmt(value, digits=0) -> str:
    return "failed" if value is None else f"{value:.{digits}f}"


def table(results: dict, lengths: list[int], repeats: int) -> str:
    head = (["mechanism", "configuration"] + [f"L={n} ms" for n in lengths] + ["time exponent"]
            + [f"L={n} MiB" for n in lengths])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, rows in results.items():
        secs = [r["seconds"] if r else None for r in rows]
        mib = [r["peak_mib"] if r else None for r in rows]
        p = fit_exponent(lengths, secs) if None not in secs else None
        cells = ([name, CASES[name]] + [_fmt(s * 1e3 if s else None, 1) for s in secs] + [_fmt(p, 2)]
                 + [_fmt(m, 1) for m in mib])
        lines.append("| " + " | ".join(cells) + " |")
    note = (f"\nB={BATCH}, H={HEADS}, D={HEAD_DIM}, float32; forward+backward, median of {repeats} after a "
            "warm-up; peak = ru_maxrss of a fresh process above its level before the first run; time exponent "
            "= least-squares slope of log time against log L. Module rows include their projections.")
    return "\n".join(lines) + "\n" + note


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lengths", nargs="*", type=int, default=[1024, 2048, 4096])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch threads in each child (default: torch's)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds allowed per child process")
    parser.add_argument("--only", nargs="+", default=None, help="substrings of the mechanism names to run")
    parser.add_argument("--child", nargs=2, metavar=("NAME", "L"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.child[0], int(args.child[1]), args.repeats, args.threads)))
        return
    names = [n for n in CASES if args.only is None or any(s in n for s in args.only)]
    results = {name: [_measure(name, n, args) for n in args.lengths] for name in names}
    print(table(results, args.lengths, args.repeats))


if __name__ == "__main__":
    main()
