"""Speed and memory of each mechanism at the suite's longest length, in a fresh process at one thread.

LRA (Tay et al. 2020, arXiv:2011.04006, Sec. 4.2 and Table 3) compares the mechanisms' training
speed and memory at growing lengths; training every task at the longest length does not fit the
suite's budget, so this is a separate short measurement: the suite's model (same width, depth and
parameter matching, :func:`.model.build`) on random token ids of length ``length``, a batch of
``batch``, one untimed warm-up step, then ``steps`` timed training steps (forward, backward,
AdamW). ``steps_per_second`` is ``steps / seconds``; ``peak_bytes`` the growth of the process's peak
resident size over its size before the model was built (None off Linux).
"""

from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F

from ...analysis import memory
from ..experiments.train import count_parameters
from .model import build
from .roster import mechanism
from .suite import DIM, HEADS, LAYERS, Sizes

__all__ = ["measure_speed", "VOCAB", "CLASSES"]

VOCAB, CLASSES = 64, 10


def measure_speed(name: str, length: int, *, batch: int = 4, steps: int = 3, seed: int = 0) -> dict:
    """Training steps per second and peak memory of ``name`` at ``length`` (see the module docstring)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        side = math.isqrt(length) if mechanism(name).images_only else None
        sizes = Sizes(length, DIM, HEADS, side)
        try:
            memory.reset_peak()
            base = memory.resident_bytes("VmRSS")
        except (OSError, RuntimeError):
            base = None
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = build(VOCAB, CLASSES, sizes, layers=LAYERS, name=name)
            gen = torch.Generator().manual_seed(seed)
            inputs = torch.randint(1, VOCAB, (batch, length), generator=gen)
            targets = torch.randint(0, CLASSES, (batch,), generator=gen)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            seconds = 0.0
            for step in range(steps + 1):
                start = time.perf_counter()
                loss = F.cross_entropy(model(inputs), targets)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                if step:  # the first step warms up (allocations, kernel choice) and is not timed
                    seconds += time.perf_counter() - start
        peak = None if base is None else max(0, memory.resident_bytes("VmHWM") - base)
    finally:
        torch.set_num_threads(threads)
    return {"mechanism": name, "length": length, "batch": batch, "steps": steps, "seconds": seconds,
            "steps_per_second": steps / seconds, "peak_bytes": peak, "parameters": count_parameters(model)}
