"""The dispatcher: which execution path runs a call, why the others do not, and running it.

:func:`choose` is the one decision, used by :func:`attnkit.attention` (through
:func:`execute`) and :func:`attnkit.explain` (through :func:`decide`, which adds
every other path's reason and the chosen path's cost). Policy for
``backend="auto"``, in order:

1. ``torch-sdpa`` when it is exact and the mask needs no picture of our own (no
   mask, causal in any alignment, key padding, a bool tensor): decided in O(1),
   with no block layout, no mask evaluation and no pass over the data.
2. The first block-sparse path that accepts the call, when the mask's block
   density is under that path's ``sparse_below`` (the plan is built once per mask
   and sizes and cached, bounded, on the mask).
3. ``torch-sdpa`` with the mask as a dense float mask, when it is exact.
4. ``dense-reference`` for small problems (``SMALL_SCORES``) or when no chunked
   path accepts (row normalisers, weights); else the first chunked path that
   accepts (an additive bias, a soft-cap, or the general online softmax).

A forced ``backend`` runs the first of its paths that accepts, or raises
:class:`~attnkit.errors.BackendError` with the most general path's reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import BackendError
from ..functional.masks import _Full
from ..functional.validate import Problem
from . import block_plan, rules, sdpa
from .path_cost import PathCost
from .paths import BY_NAME, PATHS, Path, of_backend
from .pipeline import KernelOutput, zero_padded_keys

__all__ = ["Decision", "choose", "decide", "execute", "SMALL_SCORES"]

SMALL_SCORES = 1 << 16  # B*H*Lq*Lk under which dense reference scores are cheap
_SDPA, _REFERENCE = BY_NAME["torch-sdpa"], BY_NAME["dense-reference"]


@dataclass
class Decision:
    """The dispatcher's answer: the path and its backend, why each other path was not taken, the cost."""

    backend: str
    path: str
    reasons: dict[str, str] = field(default_factory=dict)
    block_density: float | None = None
    flops: float = 0.0
    peak_bytes: float = 0.0
    cost: PathCost | None = None

    def __str__(self) -> str:
        lines = [f"path: {self.path} (backend {self.backend!r})"]
        lines += [f"  {name:<21} {why}" for name, why in self.reasons.items()]
        if self.block_density is not None:
            lines.append(f"block density: {self.block_density:.3f}")
        lines.append(f"estimated FLOPs: {self.flops:.3g}   estimated extra memory: {self.peak_bytes / 2**20:.1f} MiB")
        return "\n".join(lines)


@dataclass
class _Choice:
    path: Path
    density: float | None = None
    why_not: dict[str, str] = field(default_factory=dict)  # able paths not taken, and why


def _empty(p: Problem) -> bool:
    return 0 in p.q.shape or 0 in p.k.shape[:3]


def _first_able(paths, p: Problem) -> Path | None:
    return next((path for path in paths if path.refusal(p) is None), None)


def _forced(p: Problem, backend: str) -> _Choice:
    paths = of_backend(backend)
    chosen = _first_able(paths, p)
    if chosen is None:
        why = paths[-1].refusal(p)
        raise BackendError(f"attnkit.attention: backend={backend!r} cannot honour this call: {why}")
    return _Choice(chosen, why_not={path.name: f"not asked: backend={backend!r} was forced"
                                    for path in PATHS if path.backend != backend})


def _auto(p: Problem) -> _Choice:
    sdpa_able = _SDPA.refusal(p) is None
    if sdpa_able and sdpa.simple_mask(p):  # rule 1: O(1)
        return _Choice(_SDPA, why_not={"*": "torch's kernel takes this mask as it is"})
    sparse = None if p.mask is None or isinstance(p.mask, _Full) else _first_able(of_backend("blocksparse"), p)
    density = block_plan.plan_for(p).density if sparse is not None else None
    if sparse is not None and density < sparse.sparse_below:  # rule 2
        return _Choice(sparse, density, {_SDPA.name: f"block density {density:.3f} < {sparse.sparse_below}: "
                                                     "skipping empty blocks beats torch's kernel with a dense mask"})
    dense_why = (f"block density {density:.3f} >= {sparse.sparse_below}: too dense for block skipping to pay"
                 if sparse is not None else None)
    if sdpa_able:  # rule 3
        return _Choice(_SDPA, density, {"blocksparse": dense_why} if dense_why else {})
    chunked = _first_able(of_backend("chunked"), p)
    batch, heads, lq, lk, _, _ = p.sizes
    if chunked is None or batch * heads * lq * lk <= SMALL_SCORES:  # rule 4
        small = f"small problem (B*H*Lq*Lk <= {SMALL_SCORES}): dense scores cost little"
        return _Choice(_REFERENCE, density, {"blocksparse": dense_why, "chunked": small} if chunked else {})
    return _Choice(chunked, density, {"blocksparse": dense_why, "reference": "memory O(Lq Lk); chunked is O(L)"})


def choose(p: Problem, backend: str = "auto") -> _Choice:
    """The path that runs ``p``; empty problems (a zero size) take the reference path."""
    if _empty(p):
        return _Choice(_REFERENCE, why_not={"*": "a size is zero: the empty result, on the exact path"})
    return _auto(p) if backend == "auto" else _forced(p, backend)


def execute(p: Problem, backend: str = "auto") -> tuple[KernelOutput, Path]:
    """Run the chosen path; returns its output and the path that produced it.

    Paths that trust their inputs run after padded K/V rows holding NaN or inf are zeroed
    (RELIABILITY row 22); torch's kernel checks its own output and, when it finds NaN or inf,
    the call is decided again with the inputs' finiteness known (one exact pass over q, k, v,
    only then).
    """
    path = choose(p, backend).path
    if path is not _SDPA and zero_padded_keys(p):
        path = choose(p, backend).path  # the zeroed rows may have been the only non-finite ones
    try:
        return path.run(p), path
    except sdpa.NonFiniteInputs:
        p.learn_finiteness(None)
        zero_padded_keys(p)
        p.inputs_finite()
        path = choose(p, backend).path
        return path.run(p), path


def decide(p: Problem, backend: str = "auto") -> Decision:
    """:func:`choose`, with the reason of every path not taken and the chosen path's cost (explain())."""
    choice = choose(p, backend)
    chosen = choice.path
    reasons = {}
    for path in PATHS:
        if path is chosen:
            reasons[path.name] = f"chosen: {path.describe(p)} ({path.source})"
            continue
        why = path.refusal(p)
        reasons[path.name] = (f"refused: {why}" if why else "able, not preferred: " + (
            choice.why_not.get(path.name) or choice.why_not.get(path.backend) or choice.why_not.get("*")
            or _order_reason(path, chosen)))
    cost = chosen.cost(p, rules.needs_grad(p))
    return Decision(chosen.backend, chosen.name, reasons, choice.density, float(cost.flops),
                    float(cost.workspace_bytes), cost)


def _order_reason(path: Path, chosen: Path) -> str:
    if path.backend == chosen.backend:
        return f"{chosen.name} comes first in the table of paths"
    return f"the {chosen.backend} backend is preferred for this call"
