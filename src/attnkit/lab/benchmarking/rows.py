"""One row of the benchmark suite: attnkit against a comparison, timed interleaved in one run.

A :class:`Spec` names a case, the comparisons and their targets; :func:`run_spec`
times attnkit and every comparison interleaved on the same inputs, checks that
each pair computes the same function (max |diff| of the outputs and, for
forward+backward, of every input gradient), and returns one :class:`Row` per
comparison. The suite (``benchmarks/run.py`` of the repository) and ``attnkit bench
--compare`` both call it, so a row of BENCHMARKS.md is reproduced by the same code.

Achieved GFLOP/s count the work the pattern needs, whatever a kernel computes:
forward ``2 (D + Dv)`` flops per allowed (query, key) pair (``4 B H Lq Lk_active D``
for ``Dv = D``: the two matmuls); forward+backward 3x that (the backward's four
matmuls dV, dP, dQ, dK; recomputation of the scores is not useful work and is not
counted, so this is 0.5x above the 2.5x-backward convention).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ...core import explain
from ..analysis.patterns import active_pairs
from ..analysis.timing import Case, time_interleaved
from .check import max_diff, outputs_and_grads, timed_call, tolerance, verdict
from .methods import ours, problem, theirs
from .side import Method, Unavailable

__all__ = ["Spec", "Row", "run_spec", "verdict", "tolerance"]


@dataclass(frozen=True)
class Spec:
    """A case, the comparison kinds (see :mod:`.methods`, or ``("additive",)``) and their goals.

    ``goals[i]`` is the largest allowed ``attnkit time / comparison time`` (0.2 = at
    least 5x faster; None = reported, no target); ``mem_goal`` the same for peak memory.
    ``budget_s`` caps the timed rounds (judged from the warm-up round): fewer than
    ``repeats`` where one round is slow.
    """

    target: int
    label: str
    case: Case
    compare: tuple[str, ...]
    goals: tuple[float | None, ...] = ()
    repeats: int = 5
    warmup: int = 1
    budget_s: float | None = None
    memory: bool = False
    mem_goal: float | None = None
    backend: str = "auto"
    compiled: bool = False  # attnkit's side under torch.compile(fullgraph=True)

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "compare": list(self.compare), "goals": list(self.goals)}

    @classmethod
    def from_json(cls, data: dict) -> Spec:
        data = dict(data)
        return cls(**{**data, "case": Case(**data["case"]), "compare": tuple(data["compare"]),
                      "goals": tuple(data["goals"])})

    @property
    def key(self) -> str:
        """Stable id of the spec (the file name of its cached result)."""
        return hashlib.sha1(json.dumps(self.to_json(), sort_keys=True).encode()).hexdigest()[:12]

    def goal(self, i: int) -> float | None:
        return self.goals[i] if i < len(self.goals) else None


@dataclass
class Row:
    """One compared pair; times ``[median, min, max]`` seconds; memory in bytes; plain JSON types only."""

    target: int
    label: str
    sizes: str
    pass_: str
    ours: str
    theirs: str
    runs: int = 0
    ours_s: list[float] | None = None
    theirs_s: list[float] | None = None
    ratio: float | None = None
    goal: float | None = None
    verdict: str = "n/a"
    max_diff: float | None = None
    diff_ok: bool | None = None
    gflops: float | None = None
    ceiling_frac: float | None = None
    ours_mem: int | None = None
    theirs_mem: int | None = None
    mem_goal: float | None = None
    density: float | None = None
    length: int = 0
    dtype: str = "float32"
    notes: dict = field(default_factory=dict)
    profile: list[str] = field(default_factory=list)


def _sides(spec: Spec):
    """``(ours, {kind: Method or reason}, flops, density)`` of a spec."""
    case = spec.case
    if spec.compare == ("additive",):
        from .additive import additive_flops, additive_methods
        mine, other = additive_methods(case)
        return mine, {"additive": other}, additive_flops(case), None
    q, k, v, mask, modifier = problem(case)
    mine = ours(case, q, k, v, mask, modifier, spec.backend, spec.compiled)
    others = {}
    for kind in spec.compare:
        try:
            others[kind] = theirs(kind, case, q, k, v, mask, modifier)
        except Unavailable as err:
            others[kind] = str(err)
    pairs = active_pairs(mask, case.batch, case.heads, q.shape[2], k.shape[2])
    flops = 2.0 * (q.shape[-1] + v.shape[-1]) * pairs * (3 if case.backward else 1)
    return mine, others, flops, _density(q, k, v, mask)


def _density(q, k, v, mask) -> float | None:
    if mask is None:
        return None
    try:
        return explain(q, k, v, mask=mask, backend="blocksparse").block_density
    except ValueError:
        return None


def sizes_text(case: Case, additive: bool = False) -> str:
    """The sizes column: ``B=1 H=8 L=4096 D=64 float32`` (the device named when it is not the CPU)."""
    lk = case.kv_len or case.q_len
    device = "" if case.device == "cpu" else f" {case.device}"
    if additive:
        return f"B={case.batch} Lq={case.q_len} Lk={lk} hidden={case.head_dim} {case.dtype}{device}"
    length = f"L={case.q_len}" if lk == case.q_len else f"Lq={case.q_len} Lk={lk}"
    return f"B={case.batch} H={case.heads} {length} D={case.head_dim} {case.dtype}{device}"


def run_spec(spec: Spec, *, ceiling: dict | None = None, progress: Callable[[str], None] | None = None,
             profile_misses: bool = False) -> list[Row]:
    """Time, check and (``spec.memory``) measure peak memory of every pair of a spec; one Row per comparison."""
    step = progress or (lambda label: None)
    case = spec.case
    step(f"{spec.label}: building")
    mine, others, flops, density = _sides(spec)
    ready = {kind: m for kind, m in others.items() if isinstance(m, Method)}
    step(f"{spec.label}: timing")
    calls = {"ours": timed_call(mine, case.backward)}
    calls.update({kind: timed_call(m, case.backward) for kind, m in ready.items()})
    with torch.set_grad_enabled(case.backward):
        stats = time_interleaved(calls, spec.repeats, spec.warmup, spec.budget_s, device=case.device)
    step(f"{spec.label}: checking")
    reference = outputs_and_grads(mine, case.backward)
    rows = [_row(spec, i, kind, mine, others[kind], stats, reference, flops, density, ceiling)
            for i, kind in enumerate(spec.compare)]
    if spec.memory:
        _add_memory(spec, rows, ready, step)
    if profile_misses and any(row.verdict == "MISS" for row in rows):
        from .profiling import top_ops
        step(f"{spec.label}: profiling")
        ops = top_ops(timed_call(mine, case.backward), case.backward)  # attnkit's side is the same in every row
        for row in rows:
            row.profile = ops if row.verdict == "MISS" else []
    return rows


def _row(spec, i, kind, mine, other, stats, reference, flops, density, ceiling) -> Row:
    case = spec.case
    theirs_name = other.name if isinstance(other, Method) else kind
    row = Row(spec.target, spec.label, sizes_text(case, spec.compare == ("additive",)),
              "fwd+bwd" if case.backward else "fwd", mine.name, theirs_name, stats["ours"][3], list(stats["ours"][:3]),
              goal=spec.goal(i), mem_goal=spec.mem_goal, density=density, length=case.q_len, dtype=case.dtype)
    row.gflops = flops / stats["ours"][0] / 1e9
    peak = (ceiling or {}).get(case.dtype)
    row.ceiling_frac = row.gflops / peak if peak else None
    if not isinstance(other, Method):
        row.notes = {"n/a": other}
        return row
    row.notes = dict(other.notes or {})
    row.theirs_s = list(stats[kind][:3])
    row.ratio = row.ours_s[0] / row.theirs_s[0]
    if other.same:
        diff, scale = max_diff(reference, outputs_and_grads(other, case.backward))
        row.max_diff, row.diff_ok = diff, diff <= tolerance(case.dtype) * max(1.0, scale)
    else:
        row.notes["check"] = "not the same function: a throughput reference"
    row.verdict = verdict(row.ratio, row.goal, row.diff_ok, None, spec.mem_goal)  # memory: see _add_memory
    return row


def _add_memory(spec: Spec, rows: list[Row], ready: dict, step) -> None:
    from .child import side_peak
    step(f"{spec.label}: memory")
    mine = side_peak(spec, "ours")
    for row, kind in zip(rows, spec.compare, strict=True):
        row.ours_mem = mine
        if kind in ready and kind != "flex":
            row.theirs_mem = side_peak(spec, kind)
        mem_ratio = row.ours_mem / row.theirs_mem if row.ours_mem and row.theirs_mem else None
        row.verdict = verdict(row.ratio, row.goal, row.diff_ok, mem_ratio, row.mem_goal)
