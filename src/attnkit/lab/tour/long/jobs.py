"""The long-range suite's jobs, as run in a fresh process by :mod:`attnkit.lab.tour.child`.

A job is JSON data with ``"suite": "long"``, a ``"kind"``, the ``"scale"`` and the ``"device"``:

- ``{"kind": "train", "task", "mechanism", "seeds"}`` (and ``"lr_scale"``, default 1): :func:`.train.train_pair`,
  one result per seed;
- ``{"kind": "speed", "mechanism"}``: :func:`.speed.measure_speed` at the scale's speed length, one result.
"""

from __future__ import annotations

from ....errors import ArgumentError
from .speed import measure_speed
from .suite import plan
from .train import train_pair

__all__ = ["run_job", "train_job", "speed_job"]


def train_job(task: str, mechanism: str, seeds, scale: str, device: str = "cpu", lr_scale: float = 1.0) -> dict:
    """The job that trains ``mechanism`` on ``task`` for ``seeds`` at ``scale`` (and ``lr_scale`` times its rate)."""
    job = {"suite": "long", "kind": "train", "task": task, "mechanism": mechanism, "seeds": list(seeds),
           "scale": scale, "device": device}
    return job if lr_scale == 1.0 else {**job, "lr_scale": lr_scale}


def speed_job(mechanism: str, scale: str, device: str = "cpu") -> dict:
    """The job that measures ``mechanism``'s speed and memory at the scale's speed length."""
    return {"suite": "long", "kind": "speed", "mechanism": mechanism, "scale": scale, "device": device}


def run_job(job: dict, progress, emit) -> None:
    """Run ``job``, calling ``emit`` with each result (a :class:`Result` or a dict) and ``progress`` with labels."""
    kind, scale, device = job.get("kind"), job.get("scale", "default"), job.get("device", "cpu")
    if kind == "train":
        train_pair(job["task"], job["mechanism"], [int(s) for s in job["seeds"]], scale=scale, device=device,
                   progress=progress, emit=emit, lr_scale=float(job.get("lr_scale", 1.0)))
    elif kind == "speed":
        the_plan = plan(scale)
        emit(measure_speed(job["mechanism"], the_plan.speed_length, the_plan.speed_model,
                           batch=the_plan.speed_batch, device=device))
    else:
        raise ArgumentError(f"long suite: unknown job kind {kind!r}; expected 'train' or 'speed'")
