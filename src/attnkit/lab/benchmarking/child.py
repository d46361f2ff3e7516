"""A fresh Python process per measurement, and the peak memory of one side of a :class:`~.rows.Spec` in one.

:func:`child_output` runs ``python -m <module> <payload as JSON>`` with this interpreter
(so the same attnkit, installed or from a checkout) and reads its last line; in that module,
:func:`run_as_child` is the other end: one JSON argument means "you are the child", so it
measures and prints the answer as its last line. The memory
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
from collections.abc import Callable

import torch

from ..analysis.timing import Case

__all__ = ["side_peak", "child_output", "run_as_child"]


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


def run_as_child(measure: Callable[[dict], object], argv: list[str] | None = None) -> bool:
    """In a script that :func:`child_output` launches: when the command line (``argv``, default
    ``sys.argv[1:]``) is one JSON argument, this process is the fresh child: ``measure(payload)`` runs and
    what it returns is printed as the last line, for the parent to read. Returns whether it ran (False: an
    ordinary command line, for the script's own parser).

    Example (a script's ``main``)::

        if run_as_child(child, argv):
            return 0
    """
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or not argv[0].startswith("{"):
        return False
    print(measure(json.loads(argv[0])))
    return True


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
