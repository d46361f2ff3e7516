"""Time every scheme x layout on a local gloo group and count its bytes: ``attnkit bench --distributed``.

``measure(Spec(...))`` starts ``procs`` fresh processes (gloo on 127.0.0.1), each with
``threads`` intra-op threads; every rank runs each scheme and layout on its shards of
the same inputs. A call's time is the slowest rank's (all-reduced max), the median over
``repeats`` calls after one warm-up, each started behind a barrier. Bytes are this rank's,
counted on the collectives (:func:`~attnkit.distributed.count_bytes`) and predicted
by :func:`~attnkit.distributed.accounting.expected_bytes`; the table shows the largest
over ranks. Gloo on one machine moves bytes through loopback TCP: the times show the
schemes' overheads and compute balance here, not a cluster's links.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ...distributed.accounting import expected_bytes
from ...distributed.api import SCHEMES, attention
from ...distributed.comm import count_bytes
from ...distributed.layouts import LAYOUTS, shard
from ...masks import parse
from ..analysis.timing import time_rounds

__all__ = ["Spec", "measure", "rows_table", "pairs", "estimate_seconds"]

# What the committed table of BENCHMARKS.md ran at (W = 4 gloo processes on a 2-core CPU, L = 1024, H = 8, D = 32,
# forward+backward: about 0.7 s per call): the attention's FLOPs per second of all ranks together, and the seconds
# one rank's process takes to start (Python, torch, the process group). An estimate, not a promise.
RATE = 5e9
START_SECONDS = 3.0


@dataclass(frozen=True)
class Spec:
    """The problem every rank times (global sizes; ``mask`` in :func:`attnkit.masks.parse` syntax)."""

    procs: int = 4
    batch: int = 1
    heads: int = 8
    length: int = 4096
    head_dim: int = 64
    dtype: str = "float32"
    mask: str | None = "causal()"
    backward: bool = True
    repeats: int = 5
    threads: int = 1


def pairs(spec: Spec) -> list[tuple[str, str]]:
    """The (scheme, layout) rows :func:`measure` times: every scheme x layout, Ulysses only when W divides H."""
    return [(scheme, layout) for scheme in SCHEMES for layout in LAYOUTS
            if scheme != "ulysses" or spec.heads % spec.procs == 0]


def estimate_seconds(spec: Spec) -> float:
    """About how long :func:`measure` runs: its calls' dense attention FLOPs at :data:`RATE`, plus the starts.

    Example:
        >>> round(estimate_seconds(Spec(procs=4, length=1024, head_dim=32, repeats=3)))
        42
    """
    flops = 4 * spec.batch * spec.heads * spec.length ** 2 * spec.head_dim * (3.5 if spec.backward else 1.0)
    calls = len(pairs(spec)) * (spec.repeats + 2)  # a warm-up, the timed rounds, the counted call
    return calls * flops / RATE + START_SECONDS * spec.procs


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _timed(call, repeats):
    times = time_rounds({"call": call}, repeats, warmup=1, before=dist.barrier)["call"]
    slowest = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return statistics.median(slowest.tolist())


def _largest(values):
    t = torch.tensor(values, dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def _row(spec: Spec, scheme, layout, full, mask):
    local = [shard(t, layout=layout) for t in full]
    leaves = lambda: [t.detach().requires_grad_(spec.backward) for t in local]

    def call():
        out = attention(*leaves(), mask=mask, scheme=scheme, layout=layout)
        if spec.backward:
            out.sum().backward()
    seconds = _timed(call, spec.repeats)
    tensors = leaves()
    with count_bytes() as forward:
        out = attention(*tensors, mask=mask, scheme=scheme, layout=layout)
    with count_bytes() as backward:
        if spec.backward:
            out.sum().backward()
    want = expected_bytes(*tensors, mask=mask, scheme=scheme, layout=layout)
    got = _largest([forward.total, backward.total, *want])
    return {"scheme": scheme, "layout": layout, "ms": seconds * 1e3, "forward_bytes": got[0],
            "backward_bytes": got[1] if spec.backward else None, "formula_forward": got[2],
            "formula_backward": got[3] if spec.backward else None}


def _rank(rank, spec_dict, port, answer_path):
    spec = Spec(**spec_dict)
    torch.set_num_threads(spec.threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=spec.procs)
    g = torch.Generator().manual_seed(0)
    shape = (spec.batch, spec.heads, spec.length, spec.head_dim)
    full = [torch.randn(shape, generator=g).to(getattr(torch, spec.dtype)) for _ in range(3)]
    mask = parse(spec.mask) if spec.mask else None
    rows = []
    for scheme, layout in pairs(spec):
        rows.append(_row(spec, scheme, layout, full, mask))
        if rank == 0:
            with open(answer_path + ".progress", "a") as f:  # the parent's progress bar reads it
                f.write(f"{scheme} {layout}: {rows[-1]['ms']:.0f} ms\n")
    if rank == 0:
        with open(answer_path, "w") as f:
            json.dump(rows, f)
    dist.destroy_process_group()


def measure(spec: Spec, progress: Callable[[str], None] | None = None) -> list[dict]:
    """One row per scheme x layout: ``ms`` per call (slowest rank, median), bytes measured and by formula.

    ``progress(label)`` is called once per finished row (:func:`pairs` of them), as rank 0 finishes it.
    """
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "rows.json")
        context = mp.start_processes(_rank, args=(asdict(spec), _free_port(), path), nprocs=spec.procs, join=False,
                                     start_method="spawn")
        told = 0
        while True:
            done = context.join(timeout=0.5)
            if progress is not None and os.path.exists(path + ".progress"):
                with open(path + ".progress") as f:
                    lines = f.read().split("\n")[:-1]  # whole lines only: rank 0 may be writing the next
                for line in lines[told:]:
                    progress(line)
                told = len(lines)
            if done:
                break
        with open(path) as f:
            return json.load(f)


def rows_table(spec: Spec, rows: list[dict]) -> list[str]:
    """Markdown lines: the problem, then one row per scheme x layout."""
    what = "forward+backward" if spec.backward else "forward"
    lines = [f"{what}, W={spec.procs} gloo processes x {spec.threads} thread(s), B={spec.batch} H={spec.heads} "
             f"L={spec.length} D={spec.head_dim} {spec.dtype}, mask={spec.mask or 'none'}", "",
             "| scheme | layout | ms per call | KiB sent forward (formula) | KiB sent backward (formula) |",
             "|---|---|---|---|---|"]
    kib = lambda n: "-" if n is None else f"{n / 1024:.0f}"
    for r in rows:
        lines.append(f"| {r['scheme']} | {r['layout']} | {r['ms']:.1f} | {kib(r['forward_bytes'])} "
                     f"({kib(r['formula_forward'])}) | {kib(r['backward_bytes'])} ({kib(r['formula_backward'])}) |")
    return lines
