"""A fresh Python process per measurement, and the peak memory of one side of a :class:`~.rows.Spec` in one.

:func:`child_output` runs ``python -m <module> <payload as JSON>`` with this interpreter
(so the same attnkit, installed or from a checkout) and reads its last line. The memory
child builds the inputs, resets the peak (:func:`attnkit.lab.analysis.memory.reset_peak`:
resident memory on the CPU, the allocator's on CUDA), then builds the side's method (so
a dense mask or bias SDPA needs counts: a user of that method holds it too) and calls
it once (forward, or forward+backward), and prints the bytes the peak grew by.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import torch

from ..analysis.timing import Case

__all__ = ["side_peak", "child_output"]


def child_output(module: str, payload: dict, timeout: float) -> str:
    """The last stdout line of ``python -m module <payload as JSON>``; RuntimeError (last stderr line) on failure."""
    try:
        done = subprocess.run([sys.executable, "-m", module, json.dumps(payload)],
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as err:
        raise RuntimeError(f"{module} ran past {timeout:g} s") from err
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(tail[0][:300])
    return lines[-1]


def side_peak(spec, side: str, timeout: float = 900.0) -> int | None:
    """Bytes the peak grows by for ``side`` ("ours" or a comparison kind) of a spec; None if the child failed."""
    payload = {"case": dataclasses.asdict(spec.case), "additive": spec.compare == ("additive",),
               "backend": spec.backend, "side": side}
    try:
        return int(child_output("attnkit.lab.benchmarking.child", payload, timeout))
    except RuntimeError:
        return None


def _measure(case: Case, additive: bool, backend: str, side: str) -> int:
    from ..analysis.memory import peak_bytes, reset_peak
    from .check import timed_call
    from .methods import ours, problem, theirs

    if additive:
        from .additive import additive_methods
        base = reset_peak(case.device)
        method = additive_methods(case)[0 if side == "ours" else 1]
    else:
        q, k, v, mask, modifier = problem(case)
        base = reset_peak(case.device)
        method = (ours(case, q, k, v, mask, modifier, backend) if side == "ours"
                  else theirs(side, case, q, k, v, mask, modifier))
    with torch.set_grad_enabled(case.backward):
        timed_call(method, case.backward)()
    return peak_bytes(case.device) - base


def main(payload: str) -> None:
    data = json.loads(payload)
    print(_measure(Case(**data["case"]), data["additive"], data["backend"], data["side"]))


if __name__ == "__main__":
    main(sys.argv[1])
