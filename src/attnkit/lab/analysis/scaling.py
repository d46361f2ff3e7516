"""Measured scaling with sequence length: time and peak memory of mechanisms over lengths L.

:func:`scaling` runs every ``(mechanism, L)`` in a fresh child process
(``python -m attnkit.lab.analysis.scaling``): the child builds the mechanism at length L
(:func:`attnkit.costing.analytic.build`) on the device, runs one untimed pass (warm-up: mask
layouts are cached then), times ``repeats`` more (:func:`attnkit.lab.analysis.timing.time_rounds`)
and reports their median and spread, and the peak memory above its level just before the
warm-up (:mod:`attnkit.lab.analysis.memory`: resident on the CPU, the allocator's on CUDA).
A child that runs past ``timeout`` seconds is killed; longer L of that mechanism are then
skipped. Nothing here asserts a time: the table reports, :meth:`ScalingTable.exponent`
fits ``time ~ L^p`` by least squares on log-log axes.
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from ...errors import ArgumentError

__all__ = ["Mechanism", "ScalingRow", "ScalingTable", "scaling", "fit_exponent", "DEFAULT_SIZES", "PowerFit",
           "power_fit", "exponent_text", "MIN_R_SQUARED", "MAX_RELATIVE_SPREAD"]

DEFAULT_SIZES = {"batch": 1, "heads": 8, "head_dim": 64, "dim": 512}  # given to each mechanism that accepts them


class Mechanism(NamedTuple):
    """A row of the table: ``label``, the mechanism ``name`` (registry name, "dense", "sdpa" or a mask
    expression) and its ``sizes`` (on top of the common ones; the length keys are set to L)."""

    label: str
    name: str
    sizes: Mapping[str, object] = {}


class ScalingRow(NamedTuple):
    """One measurement; ``status`` is "ok", "timeout", "failed" or "skipped" (a shorter L did not finish).

    ``error`` holds the end of a failed child's stderr.
    """

    mechanism: str
    length: int
    median_s: float | None
    spread: float | None  # max - min of the timed repeats, seconds
    peak_bytes: int | None
    status: str = "ok"
    error: str = ""


def fit_exponent(lengths: Sequence[float], values: Sequence[float | None]) -> float | None:
    """Least-squares slope of log(value) against log(L); None with fewer than two usable points."""
    pts = [(math.log(n), math.log(v)) for n, v in zip(lengths, values, strict=True) if v and v > 0]
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    var = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / var if var else None


MIN_R_SQUARED = 0.9
"""Below this, ``log time`` is not a straight line in ``log L``: no single exponent describes the points."""
MAX_RELATIVE_SPREAD = 0.5
"""A point whose repeats differ by more than half their median moves ``log time`` by up to ~0.4, more than
half of ``log 2`` (one doubling of L): the slope between neighbouring lengths could then be off by over 0.5,
enough to mistake linear for quadratic. Such a fit is "noisy"."""


class PowerFit(NamedTuple):
    """``value ~ L^exponent`` fitted by least squares on log-log axes; ``r_squared`` of that line."""

    exponent: float
    r_squared: float


def power_fit(lengths: Sequence[float], values: Sequence[float | None]) -> PowerFit | None:
    """The log-log least-squares line through the positive ``values`` (its slope from
    :func:`attnkit.lab.analysis.scaling.fit_exponent`); None with fewer than two distinct L.

    ``r_squared = 1 - SS_res / SS_tot`` of ``log value``; 1.0 when all values are equal (a flat, exact fit).
    """
    slope = fit_exponent(lengths, values)
    if slope is None:
        return None
    pts = [(math.log(n), math.log(v)) for n, v in zip(lengths, values, strict=True) if v and v > 0]
    mx, my = sum(x for x, _ in pts) / len(pts), sum(y for _, y in pts) / len(pts)
    ss_tot = sum((y - my) ** 2 for _, y in pts)
    ss_res = sum((y - my - slope * (x - mx)) ** 2 for x, y in pts)
    return PowerFit(slope, 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0)


def exponent_text(lengths: Sequence[float], values: Sequence[float | None],
                  spreads: Sequence[float | None] | None = None) -> str:
    """The fitted exponent as text (``"1.98"``), or ``"noisy (...)"`` when it cannot be trusted, or ``"n/a"``.

    Noisy: R^2 below :data:`MIN_R_SQUARED`, a point whose spread exceeds :data:`MAX_RELATIVE_SPREAD`
    of its value, or a value less than half of one at a shorter length (more positions never take
    less than half the time or memory: the shorter point was disturbed). Fewer than two usable points:
    ``"n/a"``. The tour's report and ``attnkit scaling`` both print this.

    Example:
        >>> exponent_text([1024, 2048, 4096], [0.1, 0.4, 1.6]), exponent_text([1024, 2048], [0.357, 0.108])
        ('2.00', 'noisy (L=2048 takes 30 % of L=1024)')
    """
    fit = power_fit(lengths, values)
    if fit is None:
        return "n/a"
    spread = max((s / v for v, s in zip(values, spreads or [None] * len(values), strict=True)
                  if s is not None and v), default=0.0)
    if spread > MAX_RELATIVE_SPREAD:
        return f"noisy (spread {100 * spread:.0f} % of the median)"
    if fit.r_squared < MIN_R_SQUARED:
        return f"noisy (R² {fit.r_squared:.2f} of a power law)"
    points = sorted((n, v) for n, v in zip(lengths, values, strict=True) if v and v > 0)
    falls = [(a, b, vb / va) for i, (a, va) in enumerate(points) for b, vb in points[i + 1:] if b > a and vb < va / 2]
    if falls:
        a, b, ratio = falls[0]
        return f"noisy (L={b} takes {100 * ratio:.0f} % of L={a})"
    return f"{fit.exponent:.2f}"


@dataclass(frozen=True)
class ScalingTable:
    """Measurements of several mechanisms over lengths: rows in mechanism order, then length order."""

    rows: tuple[ScalingRow, ...]
    lengths: tuple[int, ...]
    repeats: int = 3
    backward: bool = True

    def mechanisms(self) -> list[str]:
        return list(dict.fromkeys(r.mechanism for r in self.rows))

    def _of(self, mechanism: str) -> list[ScalingRow]:
        rows = [r for r in self.rows if r.mechanism == mechanism]
        if not rows:
            raise ArgumentError(f"ScalingTable: no mechanism {mechanism!r}; have {', '.join(self.mechanisms())}")
        return rows

    def exponent(self, mechanism: str) -> float | None:
        """The fitted ``p`` of ``time ~ L^p`` over the lengths measured (None: fewer than two)."""
        rows = self._of(mechanism)
        return fit_exponent([r.length for r in rows], [r.median_s for r in rows])

    def memory_exponent(self, mechanism: str) -> float | None:
        """The fitted ``p`` of ``peak memory ~ L^p`` (None without two positive peaks)."""
        rows = self._of(mechanism)
        return fit_exponent([r.length for r in rows], [r.peak_bytes for r in rows])

    def series(self) -> dict[str, list[tuple[int, float, int | None]]]:
        """``{mechanism: [(L, seconds, peak_bytes or None)]}`` of the finished rows (for ``viz.scaling_plot``)."""
        out = {m: [(r.length, r.median_s, r.peak_bytes) for r in self._of(m)
                   if r.status == "ok" and r.median_s is not None] for m in self.mechanisms()}
        return {m: points for m, points in out.items() if points}

    def exponent_text(self, mechanism: str, memory: bool = False) -> str:
        """The fitted exponent, or ``"noisy (...)"`` by the tour's rule (:func:`exponent_text`), or ``"n/a"``."""
        rows = self._of(mechanism)
        values = [r.peak_bytes if memory else r.median_s for r in rows]
        spreads = None if memory else [r.spread for r in rows]  # one memory measurement per point: no spread
        text = exponent_text([r.length for r in rows], values, spreads)
        got = sum(v is not None for v in values)
        return text + ("" if got == len(rows) or text == "n/a" else f" ({got} of {len(rows)} L)")

    def markdown(self, configurations: Mapping[str, str] | None = None, *, memory_exponent: bool = True) -> str:
        """A Markdown table: time (ms) and peak (MiB) per length, and the fitted exponents."""
        config = configurations is not None
        head = (["mechanism"] + (["configuration"] if config else []) + [f"L={n} ms" for n in self.lengths]
                + [f"L={n} MiB" for n in self.lengths] + ["time exponent"]
                + (["memory exponent"] if memory_exponent else []))
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for m in self.mechanisms():
            rows = {r.length: r for r in self._of(m)}
            cells = [_cell(rows.get(n), "median_s", 1e3) for n in self.lengths]
            cells += [_cell(rows.get(n), "peak_bytes", 2.0 ** -20) for n in self.lengths]
            cells.append(self.exponent_text(m))
            if memory_exponent:
                cells.append(self.exponent_text(m, memory=True))
            named = [configurations.get(m, "")] if configurations is not None else []
            lines.append("| " + " | ".join([m, *named, *cells]) + " |")
        return "\n".join(lines)


def _cell(row: ScalingRow | None, field: str, scale: float) -> str:
    if row is None:
        return "-"
    if row.status != "ok":
        return row.status
    value = getattr(row, field)
    return "n/a" if value is None else f"{value * scale:.1f}"


def _mechanisms(mechanisms) -> list[Mechanism]:
    if isinstance(mechanisms, (str, Mechanism)):
        mechanisms = [mechanisms]
    out = []
    for m in mechanisms:
        if isinstance(m, str):
            m = Mechanism(m, m, {})
        elif isinstance(m, tuple) and not isinstance(m, Mechanism):
            m = Mechanism(*m)
        if not isinstance(m, Mechanism):
            raise ArgumentError(f"scaling: a mechanism is a name or (label, name, sizes); got {m!r}")
        out.append(m)
    if len({m.label for m in out}) != len(out):
        raise ArgumentError(f"scaling: mechanism labels must be distinct; got {[m.label for m in out]}")
    return out


def _sizes_for(m: Mechanism, common: Mapping[str, object], length: int) -> dict:
    """The mechanism's sizes at length L, checked here (a bad size is an error, not a failed child)."""
    from ...costing.analytic import resolve, spec

    sp = spec(m.name)
    sizes = {k: v for k, v in common.items() if k in sp.defaults}
    sizes.update(m.sizes)
    sizes.update(dict.fromkeys(sp.length, length))
    resolve(sp, sizes)
    return sizes


def _measure(m: Mechanism, length: int, sizes: dict, opts: dict, timeout: float) -> ScalingRow:
    job = json.dumps({"name": m.name, "sizes": sizes, **opts})
    try:
        done = subprocess.run([sys.executable, "-m", "attnkit.lab.analysis.scaling", job], capture_output=True,
                              text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return ScalingRow(m.label, length, None, None, None, "timeout")
    if done.returncode:
        return ScalingRow(m.label, length, None, None, None, "failed", done.stderr[-2000:])
    result = json.loads(done.stdout.strip().splitlines()[-1])
    times = result["times"]
    return ScalingRow(m.label, length, statistics.median(times), max(times) - min(times), result["peak_bytes"])


def scaling(mechanisms: Iterable, lengths: Sequence[int], *, repeats: int = 3, backward: bool = True,
            memory: bool = True, timeout: float = 120, progress: Callable[[str], None] | None = None,
            sizes: Mapping[str, object] | None = None, threads: int | None = None,
            device: str = "cpu") -> ScalingTable:
    """Time (median of ``repeats``) and peak memory of each mechanism at each length, each in a fresh process.

    Args:
        mechanisms: registry names, "dense" (attnkit.attention, no mask), "sdpa" (torch), mask expressions such as
            ``"sliding_window(128, 128)"``, or ``(label, name, sizes)`` rows.
        lengths: sequence lengths L (every length size of a mechanism is set to L).
        repeats: timed runs after one warm-up.
        backward: time forward + backward (else forward only).
        memory: measure the peak memory (resident, from Linux ``/proc``, on the CPU; the allocator's on CUDA).
        timeout: seconds per child.
        progress: called with a label before each measurement.
        threads: torch threads per child.
        device: where the inputs and the module live ("cpu", "cuda", "cuda:1").
        sizes: common sizes given to every mechanism that accepts them (default :data:`DEFAULT_SIZES`).

    Example:
        >>> from attnkit.lab.analysis.scaling import scaling
        >>> table = scaling(["dense"], [64, 128], repeats=1, sizes={"heads": 2, "head_dim": 8})  # doctest: +SKIP
        >>> table.series()["dense"][0][0]  # doctest: +SKIP
        64
    """
    from ...costing.analytic import spec

    rows_in, common = _mechanisms(mechanisms), dict(DEFAULT_SIZES if sizes is None else sizes)
    lengths = tuple(sorted(int(n) for n in lengths))
    if not lengths or lengths[0] < 1 or repeats < 1:
        raise ArgumentError(f"scaling: need lengths >= 1 and repeats >= 1; got {lengths}, repeats={repeats}")
    unused = set(common) - set(DEFAULT_SIZES) - {k for m in rows_in for k in spec(m.name).defaults}
    if unused:  # a typo would otherwise be dropped silently
        raise ArgumentError(f"scaling: no mechanism accepts the size(s) {', '.join(sorted(unused))}")
    rows, opts = [], {"repeats": repeats, "backward": backward, "memory": memory, "threads": threads, "device": device}
    for m in rows_in:
        stopped = False
        for n in lengths:
            if stopped:
                rows.append(ScalingRow(m.label, n, None, None, None, "skipped"))
                continue
            if progress:
                progress(f"{m.label} L={n}")
            rows.append(_measure(m, n, _sizes_for(m, common, n), opts, timeout))
            stopped = rows[-1].status != "ok"
    return ScalingTable(tuple(rows), lengths, repeats, backward)


def _child(job: dict) -> dict:
    """Runs in the child process: warm-up, ``repeats`` timed passes, peak memory above the start."""
    import torch

    from ...costing.analytic import build
    from ...runtime import retain_freed_memory
    from .memory import peak_bytes, reset_peak
    from .timing import time_rounds

    if job["threads"]:
        torch.set_num_threads(job["threads"])
    retain_freed_memory()  # every row alike: freed buffers are reused instead of page-faulted afresh
    device = job.get("device", "cpu")
    fn, inputs, _, module = build(job["name"], **job["sizes"])
    inputs = [t.to(device) for t in inputs]
    if module is not None:
        module.to(device)
    leaves = [t.requires_grad_(job["backward"]) for t in inputs if t.is_floating_point()]
    leaves += list(module.parameters()) if module is not None else []

    def one_pass():
        out = fn(*inputs)
        if job["backward"]:
            outs = [out] if isinstance(out, torch.Tensor) else [o for o in out if isinstance(o, torch.Tensor)]
            sum(o.float().sum() for o in outs if o.requires_grad).backward()

    def clear_grads():
        for t in leaves:
            t.grad = None

    base = reset_peak(device) if job["memory"] else 0
    with torch.set_grad_enabled(job["backward"]):
        times = time_rounds({"pass": one_pass}, job["repeats"], warmup=1, device=device, before=clear_grads)["pass"]
    peak = peak_bytes(device) - base if job["memory"] else None
    return {"times": times, "peak_bytes": peak}


if __name__ == "__main__":
    print(json.dumps(_child(json.loads(sys.argv[1]))))
