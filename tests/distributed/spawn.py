"""Run a function on W gloo processes on this machine and collect what each rank returns.

``run(fn, world)`` starts ``world`` processes (torch.multiprocessing, see start_method), joins them in a
gloo process group (``backend="nccl"``: NCCL, rank r on GPU r) on 127.0.0.1 at a free port, calls
``fn(rank, world)`` on each and returns the list of their answers (rank order). An exception on any rank fails the call
with that rank's traceback; a rank stuck in a collective is ended by the group timeout.
"""

from __future__ import annotations

import datetime
import os
import pickle
import socket
import tempfile
import threading
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# A fork server imports these once; every later group forks from it (a fraction of a second, not the
# 5-10 s of fresh interpreters importing torch on a busy machine).
mp.set_forkserver_preload(["torch", "torch.distributed", "attnkit", "attnkit.distributed", "tests.distributed.cases"])


def start_method() -> str:
    """fork while this process runs one thread (the ranks start from its imports; the parent keeps one intra-op
    thread, see conftest); with other threads alive (a lock one holds would stay held in a forked child), the
    single-threaded fork server."""
    return "fork" if threading.active_count() == 1 else "forkserver"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, fn, folder, backend="gloo"):
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    try:
        answer = ("ok", fn(rank, world))
    except BaseException:  # reported to the parent, which fails the test with it
        answer = ("error", traceback.format_exc())
    with open(os.path.join(folder, f"{rank}.pkl"), "wb") as f:
        pickle.dump(answer, f)
    dist.destroy_process_group()


def run(fn, world: int, backend: str = "gloo"):
    """Answers of ``fn(rank, world)`` on every rank of a fresh group (``fn`` must be importable)."""
    with tempfile.TemporaryDirectory() as folder:
        # CUDA cannot be used in a forked child of a process that touched it: NCCL ranks start fresh
        method = "spawn" if backend == "nccl" else start_method()
        mp.start_processes(_worker, args=(world, free_port(), fn, folder, backend), nprocs=world, join=True,
                           start_method=method)
        answers = []
        for rank in range(world):
            with open(os.path.join(folder, f"{rank}.pkl"), "rb") as f:
                status, value = pickle.load(f)
            if status == "error":
                raise AssertionError(f"rank {rank} failed:\n{value}")
            answers.append(value)
    return answers
