"""Speed and memory of each mechanism at the suite's longest length, in a fresh process at one thread.

LRA (Tay et al. 2020, arXiv:2011.04006, Sec. 4.2 and Table 3) compares the mechanisms' training
speed and memory at growing lengths; training every task at the longest length does not fit the
suite's budget, so this is a separate short measurement: the scale's speed model (same parameter
matching, :func:`.model.build`) on random token ids of length ``length``, one label per sequence, a
batch of ``batch``, one untimed warm-up step, then ``steps`` timed training steps (forward,
backward, AdamW), each timed on its own so the claims can weigh the spread (``step_seconds``).
``steps_per_second`` is ``steps / seconds``; ``peak_bytes`` the peak memory the steps add
(:class:`~attnkit.lab.tour.experiments.train.PeakMemory`; None off Linux).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ...analysis.timing import time_rounds
from ..experiments.train import PeakMemory, count_parameters
from .model import build
from .roster import Sizes, mechanism
from .suite import ModelSize

__all__ = ["measure_speed", "VOCAB", "CLASSES", "STEPS"]

VOCAB, CLASSES, STEPS = 64, 10, 5


def measure_speed(name: str, length: int, model: ModelSize, *, batch: int = 4, steps: int = STEPS, seed: int = 0,
                  device: str = "cpu") -> dict:
    """Training steps per second and peak memory of ``name`` at ``length`` (see the module docstring)."""
    threads, device = torch.get_num_threads(), torch.device(device)
    torch.set_num_threads(1)
    try:
        side = math.isqrt(length) if mechanism(name).images_only else None
        sizes = Sizes(length, model.dim, model.heads, side)
        peak = PeakMemory(device)
        peak.start()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            net = build(VOCAB, CLASSES, sizes, layers=model.layers, ff=model.ff, name=name).to(device)
            gen = torch.Generator().manual_seed(seed)
            inputs = torch.randint(1, VOCAB, (batch, length), generator=gen).to(device)
            targets = torch.randint(0, CLASSES, (batch,), generator=gen).to(device)
            opt = torch.optim.AdamW(net.parameters(), lr=1e-3)

            def step() -> None:
                loss = F.cross_entropy(net(inputs), targets)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()

            # one untimed warm-up step (allocations, kernel choice), then each step timed on its own
            step_seconds = time_rounds({"step": step}, repeats=steps, warmup=1, device=device)["step"]
    finally:
        torch.set_num_threads(threads)
    seconds = sum(step_seconds)
    return {"mechanism": name, "length": length, "batch": batch, "steps": steps, "seconds": seconds,
            "step_seconds": step_seconds, "steps_per_second": steps / seconds, "peak_bytes": peak.bytes(),
            "parameters": count_parameters(net), "device": str(device)}
