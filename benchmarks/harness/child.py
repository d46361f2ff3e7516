"""Peak memory of one side of a :class:`~benchmarks.harness.rows.Spec`, in a fresh child process.

The child builds the inputs, resets the peak resident size (Linux
``/proc/self/clear_refs``), then builds the side's method (so a dense mask or
bias SDPA needs counts: a user of that method holds it too) and calls it once
(forward, or forward+backward), and prints the bytes the peak grew by.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

__all__ = ["side_peak", "child_output"]


ROOT = Path(__file__).resolve().parents[2]  # the folder holding benchmarks/: on the children's import path


def child_output(module: str, payload: dict, timeout: float) -> str:
    """The last stdout line of ``python -m module <payload as JSON>``; RuntimeError (last stderr line) on failure.

    The child finds ``benchmarks.harness`` through ``PYTHONPATH`` (the repository root put first).
    """
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    try:
        done = subprocess.run([sys.executable, "-m", module, json.dumps(payload)],
                              capture_output=True, text=True, timeout=timeout, env={**os.environ, "PYTHONPATH": path})
    except subprocess.TimeoutExpired as err:
        raise RuntimeError(f"{module} ran past {timeout:g} s") from err
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(tail[0][:300])
    return lines[-1]


def side_peak(spec, side: str, timeout: float = 900.0) -> int | None:
    """Bytes the peak resident size grows by for ``side`` ("ours" or a comparison kind); None if the child failed."""
    try:
        return int(child_output("benchmarks.harness.child", {"spec": spec.to_json(), "side": side}, timeout))
    except RuntimeError:
        return None


def _measure(spec, side: str) -> int:
    from attnkit.analysis.memory import reset_peak, resident_bytes

    from .check import timed_call
    from .methods import ours, problem, theirs

    case = spec.case
    if spec.compare == ("additive",):
        from .additive import additive_methods
        reset_peak()
        before = resident_bytes("VmRSS")
        method = additive_methods(case)[0 if side == "ours" else 1]
    else:
        q, k, v, mask, modifier = problem(case)
        reset_peak()
        before = resident_bytes("VmRSS")
        method = (ours(case, q, k, v, mask, modifier, spec.backend) if side == "ours"
                  else theirs(side, case, q, k, v, mask, modifier))
    with torch.set_grad_enabled(case.backward):
        timed_call(method, case.backward)()
    return resident_bytes("VmHWM") - before


def main(payload: str) -> None:
    from .rows import Spec
    data = json.loads(payload)
    print(_measure(Spec.from_json(data["spec"]), data["side"]))


if __name__ == "__main__":
    main(sys.argv[1])
