"""The long-range suite's jobs, as run in a fresh process by :mod:`attnkit.tour.child`.

A job is JSON data with ``"suite": "long"`` and a ``"kind"``:

- ``{"kind": "train", "task", "mechanism", "seeds", "quick"}``: :func:`.train.train_pair`, one result per seed;
- ``{"kind": "speed", "mechanism", "length"}``: :func:`.speed.measure_speed`, one result.
"""

from __future__ import annotations

from ...errors import ArgumentError
from .speed import measure_speed
from .train import train_pair

__all__ = ["run_job", "train_job", "speed_job"]


def train_job(task: str, mechanism: str, seeds, quick: bool) -> dict:
    """The job that trains ``mechanism`` on ``task`` for ``seeds``."""
    return {"suite": "long", "kind": "train", "task": task, "mechanism": mechanism, "seeds": list(seeds),
            "quick": bool(quick)}


def speed_job(mechanism: str, length: int) -> dict:
    """The job that measures ``mechanism``'s speed and memory at ``length``."""
    return {"suite": "long", "kind": "speed", "mechanism": mechanism, "length": int(length)}


def run_job(job: dict, progress, emit) -> None:
    """Run ``job``, calling ``emit`` with each result (a :class:`Result` or a dict) and ``progress`` with labels."""
    kind = job.get("kind")
    if kind == "train":
        train_pair(job["task"], job["mechanism"], [int(s) for s in job["seeds"]], quick=bool(job["quick"]),
                   progress=progress, emit=emit)
    elif kind == "speed":
        emit(measure_speed(job["mechanism"], int(job["length"])))
    else:
        raise ArgumentError(f"long suite: unknown job kind {kind!r}; expected 'train' or 'speed'")
