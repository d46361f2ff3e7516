"""The dispatcher: which execution path runs a call, why the others do not, and running it.

:func:`choose` is the one decision, used by :func:`attnkit.attention` (through
:func:`execute`) and :func:`attnkit.explain` (through :func:`decide`, which adds
every other path's reason and the chosen path's cost). Policy for
``backend="auto"``, in order:

1. ``torch-sdpa`` when it is exact and the mask is one it reads as it is (no mask,
   causal in either alignment, key padding, a bool tensor): decided in O(1), with no
   block layout, no pass over the data, and no mask evaluation beyond the small
   cached masks of :mod:`.sdpa` (a key-padding row, a bottom-right causal block).
2. The first block-sparse path that accepts the call, when the fraction of scores it
   computes is under that path's ``sparse_below`` (band windows from their window
   plan; gathered paths from the block plan, built once per mask and sizes and
   cached, bounded, on the mask).
3. ``torch-sdpa`` with the mask as a dense float mask, when it is exact.
4. ``dense-reference`` for small problems (``SMALL_SCORES``) or when no chunked
   path accepts (row normalisers, weights); else the first chunked path that
   accepts (an additive bias, a soft-cap, or the general online softmax).

Tracing (``torch.compile``, ``torch.export``): the rules above read data (finiteness,
torch's output check, block layouts), which fake tensors do not have. A call the fused
paths can serve becomes one ``attnkit::attention`` custom operator node, which runs this
same dispatcher at run time with the data in hand (:mod:`.custom_op`, :data:`OPERATOR`).
Other calls are traced as plain torch operations; with symbolic sizes (a ``Dim``,
``dynamic=True``) every rule also reads a size, and a traced comparison of a size pins
it, so ``auto`` takes ``dense-reference`` at once, without reading one: one graph, exact
for every size (:data:`TRACING`).

A forced ``backend`` runs the first of its paths that accepts, or raises
:class:`~attnkit.errors.BackendError` with the most general path's reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..errors import BackendError
from ..functional.validate import Problem
from ..masks import _Full
from . import custom_op, rules, sdpa
from .path_cost import PathCost
from .paths import BY_NAME, PATHS, Path, of_backend
from .pipeline import KernelOutput, in_graph, shapes_only, zero_padded_keys

__all__ = ["Decision", "choose", "decide", "execute", "SMALL_SCORES", "TRACING", "OPERATOR", "symbolic_sizes"]

SMALL_SCORES = 1 << 16  # B*H*Lq*Lk under which dense reference scores are cheap
TRACING = ("tracing: sizes symbolic, size-dependent choices skipped (the dense exact path traces for any size; "
           "the others loop over blocks or rows, which would pin the sizes)")
OPERATOR = (f"tracing: the call is one {custom_op.OPERATOR} operator node, which decides at run time, with the "
            "data, as eager attention does (this path is the one expected when traced)")
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
    cost: PathCost | None = None  # None (and the two numbers NaN) while the sizes are symbolic

    def __str__(self) -> str:
        lines = [f"path: {self.path} (backend {self.backend!r})"]
        lines += [f"  {name:<21} {why}" for name, why in self.reasons.items()]
        if self.block_density is not None:
            lines.append(f"block density: {self.block_density:.3f}")
        if self.cost is None:
            lines.append("estimated cost: none while the sizes are symbolic")
        else:
            lines.append(f"estimated FLOPs: {self.flops:.3g}   "
                         f"estimated extra memory: {self.peak_bytes / 2**20:.1f} MiB")
        return "\n".join(lines)


@dataclass
class _Choice:
    path: Path
    density: float | None = None
    why_not: dict[str, str] = field(default_factory=dict)  # able paths not taken, and why
    operator: str | None = None  # traced: the call is one custom operator node expecting this path


def _empty(p: Problem) -> bool:
    return 0 in p.q.shape or 0 in p.k.shape[:3]


def _first_able(paths, p: Problem) -> Path | None:
    return next((path for path in paths if path.refusal(p) is None), None)


_UNTRUSTED = "its output held NaN, inf or an lse of 0 it cannot explain, for this call"


def _forced(p: Problem, backend: str, untrusted: bool) -> _Choice:
    paths = of_backend(backend)
    chosen = _first_able((path for path in paths if not (untrusted and path is _SDPA)), p)
    if chosen is None:
        why = (rules.finite_inputs(p) or _UNTRUSTED) if untrusted and backend == "sdpa" else paths[-1].refusal(p)
        raise BackendError(f"attnkit.attention: backend={backend!r} cannot honour this call: {why}")
    return _Choice(chosen, why_not={path.name: f"not asked: backend={backend!r} was forced"
                                    for path in PATHS if path.backend != backend})


def _auto(p: Problem, untrusted: bool) -> _Choice:
    if not untrusted and sdpa.simple_mask(p) and _SDPA.refusal(p) is None:  # rule 1: O(1)
        return _Choice(_SDPA, why_not={"*": "torch's fused kernel takes this mask as it is (no mask, causal, key "
                                            "padding or a bool tensor) and is the fastest exact path for it"})
    sparse = None if p.mask is None or isinstance(p.mask, _Full) else _first_able(of_backend("blocksparse"), p)
    density = sparse.density(p) if sparse is not None else None
    if sparse is not None and density < sparse.sparse_below:  # rule 2
        every = (f"computes all Lq x Lk scores, {sparse.name} only the {density:.1%} in non-empty blocks "
                 f"(block density {density:.3f} < {sparse.sparse_below})")
        return _Choice(sparse, density, {_SDPA.name: f"block density {density:.3f} < {sparse.sparse_below}: "
                                                     "skipping empty blocks beats torch's kernel with a dense mask",
                                         "chunked": every, "reference": every})
    dense_why = (f"block density {density:.3f} >= {sparse.sparse_below}: too dense for block skipping to pay"
                 if sparse is not None else None)
    if not untrusted and _SDPA.refusal(p) is None:  # rule 3 (the sparse paths' rules may have learnt finiteness)
        fused = "torch's fused kernel with the mask as a dense float mask is exact here and faster than plain torch"
        return _Choice(_SDPA, density, {"blocksparse": dense_why, "chunked": fused, "reference": fused}
                       if dense_why else {"chunked": fused, "reference": fused})
    chunked = _first_able(of_backend("chunked"), p)
    batch, heads, lq, lk, _, _ = p.sizes
    if chunked is None or batch * heads * lq * lk <= SMALL_SCORES:  # rule 4
        small = f"small problem (B*H*Lq*Lk <= {SMALL_SCORES}): dense scores cost little"
        return _Choice(_REFERENCE, density, {"blocksparse": dense_why, "chunked": small} if chunked else {})
    return _Choice(chunked, density, {"blocksparse": dense_why, "reference": "memory O(Lq Lk); chunked is O(L)"})


def symbolic_sizes(p: Problem) -> bool:
    """Whether a size of ``p`` is symbolic: torch traces it as a ``torch.SymInt`` with dynamic shapes.

    Under dynamo a symbolic size passes for an ``int`` (``isinstance`` cannot tell), so
    there torch's own test of a static value decides, which dynamo reads without a guard.
    """
    if not torch.compiler.is_compiling():  # eager, or a tracer without the flag (make_fx)
        return any(isinstance(size, torch.SymInt) for size in p.sizes)
    try:
        from torch.fx.experimental.symbolic_shapes import has_static_value  # loaded by torch whenever it traces
    except ImportError:  # a torch without it: any size may be symbolic
        return True
    return not all(has_static_value(size) for size in p.sizes)


def choose(p: Problem, backend: str = "auto", *, untrusted: bool = False) -> _Choice:
    """The path that runs ``p``; empty problems (a zero size) take the reference path.

    With symbolic sizes, ``auto`` takes the reference path before any rule reads a size
    (:data:`TRACING`); a forced backend runs its first able path as always.
    ``untrusted``: torch's kernel has already run this call and its output could not be
    trusted (:class:`~.sdpa.UntrustedOutput`): choose among the other paths.
    """
    symbolic = symbolic_sizes(p)
    if (symbolic or torch.compiler.is_compiling()) and custom_op.accepts(p, backend):
        planned = custom_op.planned_path(p, static_sizes=not symbolic)
        return _Choice(BY_NAME.get(planned, BY_NAME["blocksparse-fused"]), operator=planned,
                       why_not={"*": OPERATOR})
    if backend == "auto" and symbolic:
        return _Choice(_REFERENCE, why_not={"*": TRACING})
    if _empty(p):
        return _Choice(_REFERENCE, why_not={"*": "a size is zero: the empty result, on the exact path"})
    if p.q.is_meta:
        return _Choice(_REFERENCE, why_not={"*": "meta tensors: the result's shapes only, no path runs"})
    return _auto(p, untrusted) if backend == "auto" else _forced(p, backend, untrusted)


def execute(p: Problem, backend: str = "auto") -> tuple[KernelOutput, Path]:
    """Run the chosen path; returns its output and the path that produced it.

    Padded K/V rows holding NaN or inf are zeroed first (RELIABILITY row 22), with one
    finiteness pass, except where torch's kernel checks its own output and no gradient
    is asked for (a padded ``-inf`` key gives a finite output, but ``0 * inf`` in dQ).
    When torch's kernel finds its output untrustworthy, the padded rows are zeroed and
    the call is decided again without it. Meta tensors get the result's shapes
    (:func:`.pipeline.shapes_only`). An output that no input produced (every row
    empty) is joined to autograd, so the backward gives zero gradients (:func:`.pipeline.in_graph`).
    """
    choice = choose(p, backend)
    if choice.operator is not None:
        return custom_op.run(p, choice.operator), choice.path
    path = choice.path
    if p.q.is_meta:
        return _differentiable(p, shapes_only(p)), path
    clean_padding_first = path is not _SDPA or not sdpa.checks_output(p) or rules.needs_grad(p)
    if clean_padding_first and zero_padded_keys(p):
        path = choose(p, backend).path  # the zeroed rows may have been the only non-finite ones
    try:
        return _differentiable(p, path.run(p)), path
    except sdpa.UntrustedOutput:
        pass
    zero_padded_keys(p)
    path = choose(p, backend, untrusted=True).path
    return _differentiable(p, path.run(p)), path


def _differentiable(p: Problem, result: KernelOutput) -> KernelOutput:
    if not rules.needs_grad(p):
        return result
    return in_graph(result, [t for t in (p.q, p.k, p.v, *rules.learned(p)) if t.requires_grad])


def decide(p: Problem, backend: str = "auto") -> Decision:
    """:func:`choose`, with the reason of every path not taken and the chosen path's cost (explain())."""
    choice = choose(p, backend)
    chosen = choice.path
    reasons = {}
    for path in PATHS:
        if path is chosen:
            reasons[path.name] = (f"chosen: {path.describe(p)} ({path.source})" if choice.operator is None else
                                  f"expected: the {custom_op.OPERATOR} operator decides at run time "
                                  "(kernels/custom_op.py)")
            continue
        why = None if p.q.is_meta else path.refusal(p)  # refusals may read data that meta tensors lack
        reasons[path.name] = (f"refused: {why}" if why else "able, not preferred: " + (
            choice.why_not.get(path.name) or choice.why_not.get(path.backend) or choice.why_not.get("*")
            or _order_reason(path, chosen)))
    if symbolic_sizes(p):  # the formulas would give expressions in the sizes; reading them as floats pins them
        return Decision(chosen.backend, chosen.name, reasons, choice.density, float("nan"), float("nan"), None)
    cost = chosen.cost(p, rules.needs_grad(p))
    return Decision(chosen.backend, chosen.name, reasons, choice.density, float(cost.flops),
                    float(cost.workspace_bytes), cost)


def _order_reason(path: Path, chosen: Path) -> str:
    if path.backend == chosen.backend:
        return f"{chosen.name} comes first in the table of paths: it is more specialised, so faster where it applies"
    return f"the {chosen.backend} backend is preferred for this call"
