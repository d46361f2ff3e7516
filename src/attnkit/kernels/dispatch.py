"""The dispatcher: which execution path runs a call, why the others do not, and running it.

:func:`choose` is the one decision over the table :data:`.paths.PATHS`, used by
:func:`attnkit.attention` (through :func:`execute`), by :func:`attnkit.explain`
(through :func:`decide`, which adds every other path's reason and the chosen path's
cost) and, at run time, by the compiled operator (:mod:`.custom_op`). Policy for
``backend="auto"``, in order:

1. ``torch-sdpa`` when it is exact and the mask is one it reads as it is (no mask,
   causal in either alignment, key-only masks, a bool tensor): decided from the
   problem's facts, with no block layout, no pass over the data, and no mask
   evaluation beyond the small cached masks of :mod:`.sdpa`.
1b. ``flex`` (compiled FlexAttention) when it is able, on the devices it serves (CUDA):
   every structured mask, bias, score modifier and lse request there, at any density.
2. The first block-sparse path that accepts the call, when the fraction of scores it
   computes is under that path's ``sparse_below`` (band windows from their window
   plan; gathered paths from the block plan, built once per mask and sizes and
   cached, bounded, on the mask).
3. ``torch-sdpa`` with the mask as a dense float mask, when it is exact.
4. ``dense-reference`` for small problems (``SMALL_SCORES``) or when no chunked
   path accepts (row normalisers, weights); else the first chunked path that
   accepts (an additive bias, a soft-cap, or the general online softmax).

Every rule asks only the paths that serve the problem's device (the table's ``devices``
column, :func:`.rules.serves`): on the CPU the CPU paths decide as they always did, and
on CUDA the CPU-tuned rows step aside for ``flex`` and torch's kernels. A forced
``backend`` runs the first of its paths that accepts, or raises
:class:`~attnkit.errors.BackendError` with the most general path's reason.

``data=False`` is the decision a traced call expects: rules that read the values of
the inputs (marked in :mod:`.rules`) are skipped, and so is a block density that
needs the mask's layout. Traced calls themselves (``p.tracing``) refuse the paths
whose plan or exactness reads data; with symbolic sizes ``auto`` takes the dense
reference at once, without reading a size (a traced comparison would pin it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..errors import BackendError
from ..functional.validate import Problem
from . import rules, sdpa
from .path_cost import PathCost
from .paths import BY_NAME, OF_BACKEND, PATHS, Path
from .pipeline import KernelOutput, in_graph, shapes_only, twice_differentiable, zero_padded_keys

__all__ = ["Decision", "Choice", "choose", "decide", "execute", "SMALL_SCORES", "TRACING", "symbolic_sizes"]

SMALL_SCORES = 1 << 16  # B*H*Lq*Lk under which dense reference scores are cheap
TRACING = ("tracing: sizes symbolic, size-dependent choices skipped (the dense exact path traces for any size; "
           "the others loop over blocks or rows, which would pin the sizes)")
_SDPA, _REFERENCE, _FLEX = BY_NAME["torch-sdpa"], BY_NAME["dense-reference"], BY_NAME["flex"]
_BLOCKSPARSE, _CHUNKED = OF_BACKEND["blocksparse"], OF_BACKEND["chunked"]
_UNTRUSTED = "its output held NaN, inf or an lse of 0 it cannot explain, for this call"


@dataclass
class Decision:
    """The dispatcher's answer: the path and its backend, why each other path was not taken, the cost.

    ``lane`` names the fast lane when the call takes it (torch's kernel called with only
    attribute checks before it, :mod:`.lane`); ``compiled`` says how the same call runs
    under ``torch.compile`` and ``torch.export``.
    """

    backend: str
    path: str
    reasons: dict[str, str] = field(default_factory=dict)
    block_density: float | None = None
    flops: float = 0.0
    peak_bytes: float = 0.0
    cost: PathCost | None = None  # None (and the two numbers NaN) while the sizes are symbolic
    lane: str | None = None
    compiled: str = ""
    kv_format: str | None = None  # quantized keys and values: their format (k_scale=, v_scale=)

    def __str__(self) -> str:
        lines = [f"path: {self.path} (backend {self.backend!r})"]
        if self.kv_format:
            lines.append(f"kv format: {self.kv_format}, dequantized one key block at a time")
        if self.lane:
            lines.append(f"lane: {self.lane}")
        lines += [f"  {name:<21} {why}" for name, why in self.reasons.items()]
        if self.block_density is not None:
            lines.append(f"block density: {self.block_density:.3f}")
        if self.compiled:
            lines.append(f"compiled: {self.compiled}")
        if self.cost is None:
            lines.append("estimated cost: none (the sizes are symbolic, or the mask's layout is read at run time)")
        else:
            lines.append(f"estimated FLOPs: {self.flops:.3g}   estimated extra memory: {_extra(self.peak_bytes)}")
        return "\n".join(lines)


def _extra(peak_bytes: float) -> str:
    """The memory a path holds besides q, k, v and the output, in words: ``"none"`` when it holds nothing more."""
    if peak_bytes <= 0:
        return "none beyond the inputs and the output"
    return f"{peak_bytes / 2**20:.1f} MiB" if peak_bytes >= 2**20 else f"{peak_bytes / 2**10:.1f} KiB"


@dataclass
class Choice:
    """A chosen path, the rule that chose it, and what that rule read (a block density, the sparse path).

    Only :func:`decide` turns these into sentences: running a call formats no text.
    """

    path: Path
    rule: str  # "simple mask", "flex", "sparse", "dense mask", "small", "chunked", "forced", "meta", "symbolic",
    # "empty"
    density: float | None = None
    sparse: Path | None = None  # the block-sparse path the density belongs to
    backend: str = "auto"


def _able(path: Path, p: Problem, data: bool) -> bool:
    return rules.first_refusal(p, path.module.REFUSALS, data, path.device_rule) is None


def _first_able(paths, p: Problem, data: bool) -> Path | None:
    return next((path for path in paths if _able(path, p, data)), None)


def _forced(p: Problem, backend: str, data: bool, untrusted: bool) -> Choice:
    paths = OF_BACKEND[backend]
    chosen = _first_able((path for path in paths if not (untrusted and path is _SDPA)), p, data)
    if chosen is None:
        why = ((rules.finite_inputs(p) or _UNTRUSTED) if untrusted and backend == "sdpa"
               else rules.first_refusal(p, paths[-1].module.REFUSALS, data, paths[-1].device_rule))
        raise BackendError(f"attnkit.attention: backend={backend!r} cannot honour this call: {why}")
    return Choice(chosen, "forced", backend=backend)


def _density(path: Path, p: Problem, data: bool) -> float | None:
    """The path's block density, or None when it needs the mask's layout and the decision may not read it."""
    density = path.module.density
    return None if not data and getattr(density, "reads_data", False) else density(p)


def _auto(p: Problem, data: bool, untrusted: bool) -> Choice:
    if not untrusted and rules.simple_mask(p) and _able(_SDPA, p, data):
        return Choice(_SDPA, "simple mask")  # rule 1
    if _able(_FLEX, p, data):  # rule 1b: its device column refuses at once off CUDA
        return Choice(_FLEX, "flex")
    sparse = None if p.mask is None or p.mask.kind == "full" else _first_able(_BLOCKSPARSE, p, data)
    density = _density(sparse, p, data) if sparse is not None else None
    if sparse is not None and (density is None or density < sparse.sparse_below):
        return Choice(sparse, "sparse", density, sparse)  # rule 2
    # rule 3, asked only now: the block-sparse rules may have learnt that the inputs are not finite
    if not untrusted and _able(_SDPA, p, data):
        return Choice(_SDPA, "dense mask", density, sparse)
    chunked = _first_able(_CHUNKED, p, data)
    batch, heads, lq, lk, _, _ = p.sizes
    if p.quant is not None:  # codes: read a key block at a time, whatever the size (rules.full_precision_kv)
        if chunked is None:
            why = rules.first_refusal(p, _CHUNKED[-1].module.REFUSALS, data, _CHUNKED[-1].device_rule)
            raise BackendError(f"attnkit.attention: no path reads these quantized keys and values: {why}")
        return Choice(chunked, "chunked", density, sparse)
    if chunked is None or batch * heads * lq * lk <= SMALL_SCORES:  # rule 4
        return Choice(_REFERENCE, "small" if chunked else "no chunked path", density, sparse)
    return Choice(chunked, "chunked", density, sparse)


def _why_not(choice: Choice) -> dict[str, str]:
    """Why each able path was not taken, by path name, backend or ``"*"``: the sentences of :func:`decide`."""
    rule, density, sparse = choice.rule, choice.density, choice.sparse
    if rule == "forced":
        return {path.name: f"not asked: backend={choice.backend!r} was forced"
                for path in PATHS if path.backend != choice.backend}
    fixed = {"meta": "meta tensors: the result's shapes only, no path runs", "symbolic": TRACING,
             "empty": "a size is zero: the empty result, on the exact path",
             "simple mask": "torch's fused kernel takes this mask as it is (no mask, causal, key-only or a bool "
                            "tensor) and is the fastest exact path for it"}
    if rule in fixed:
        return {"*": fixed[rule]}
    if rule == "flex":
        return {"*": "compiled FlexAttention serves every structured mask and bias here: it skips empty tiles and "
                     "reads the mask and bias as functions, never as dense (Lq, Lk) tensors"}
    if rule == "sparse":
        measured = (f"block density {density:.3f} < {sparse.sparse_below}" if density is not None
                    else "block density read at run time, from the mask's layout")
        every = f"computes all Lq x Lk scores, {sparse.name} only those in non-empty blocks ({measured})"
        return {_SDPA.name: f"{measured}: skipping empty blocks beats torch's kernel with a dense mask",
                "chunked": every, "reference": every}
    why = {} if sparse is None else {
        "blocksparse": f"block density {density:.3f} >= {sparse.sparse_below}: too dense for block skipping to pay"}
    if rule == "dense mask":
        fused = "torch's fused kernel with the mask as a dense float mask is exact here and faster than plain torch"
        return {**why, "chunked": fused, "reference": fused}
    if rule == "small":
        return {**why, "chunked": f"small problem (B*H*Lq*Lk <= {SMALL_SCORES}): dense scores cost little"}
    return {**why, "reference": "memory O(Lq Lk); chunked is O(L)"} if rule == "chunked" else why


def symbolic_sizes(p: Problem) -> bool:
    """Whether a size of ``p`` is symbolic: torch traces it as a ``torch.SymInt`` with dynamic shapes.

    Under dynamo a symbolic size passes for an ``int`` (``isinstance`` cannot tell), so
    there torch's own test of a static value decides, which dynamo reads without a guard.
    """
    if not p.tracing:
        return False
    if not torch.compiler.is_compiling():  # a tracer without the flag (make_fx, jit)
        return any(isinstance(size, torch.SymInt) for size in p.sizes)
    try:
        from torch.fx.experimental.symbolic_shapes import has_static_value  # loaded by torch whenever it traces
    except ImportError:  # a torch without it: any size may be symbolic
        return True
    return not all(has_static_value(size) for size in p.sizes)


def choose(p: Problem, backend: str = "auto", *, data: bool = True, untrusted: bool = False) -> Choice:
    """The path that runs ``p``; empty problems (a zero size) and meta tensors take the reference path.

    ``data=False``: the decision expected before the data is seen (see the module's
    docstring). ``untrusted``: torch's kernel has already run this call and its output
    could not be trusted (:class:`~.sdpa.UntrustedOutput`): choose among the other paths.
    """
    if p.q.is_meta:
        return Choice(_REFERENCE, "meta")
    if backend == "auto" and symbolic_sizes(p):
        return Choice(_REFERENCE, "symbolic")
    if 0 in p.sizes[:4]:
        return Choice(_REFERENCE, "empty")
    return _auto(p, data, untrusted) if backend == "auto" else _forced(p, backend, data, untrusted)


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
    path = choose(p, backend).path
    if p.q.is_meta:
        return _differentiable(p, shapes_only(p), path), path
    if (path is not _SDPA or not sdpa.checks_output(p) or p.needs_grad) and not getattr(
            path.module, "READS_ONLY_ALLOWED_KEYS", False) and _may_pad(p):
        cleaned = zero_padded_keys(p)
        if cleaned is not None:  # the zeroed rows may have been the only non-finite ones: decide again
            p, path = cleaned, choose(cleaned, backend).path
    try:
        return _differentiable(p, path.module.run(p), path), path
    except sdpa.UntrustedOutput:
        pass
    p = zero_padded_keys(p) or p
    path = choose(p, backend, untrusted=True).path
    return _differentiable(p, path.module.run(p), path), path


def _may_pad(p: Problem) -> bool:
    """Whether :func:`.pipeline.zero_padded_keys` may zero rows of ``p``: its mask has a key-padding part
    (``Mask.pads_keys``, data once the mask has been asked), or the call is traced (the mask is asked there)."""
    mask = p.mask
    return mask is not None and (torch.compiler.is_compiling() or mask.pads_keys)


def _differentiable(p: Problem, result: KernelOutput, path: Path) -> KernelOutput:
    """The output joined to autograd (:func:`.pipeline.in_graph`), twice differentiable whatever path ran."""
    if not p.needs_grad:
        return result
    inputs = [t for t in (p.q, p.k, p.v, *p.learned, p.sinks) if t is not None and t.requires_grad]
    result = in_graph(result, inputs)
    differentiable = getattr(path.module, "backward_differentiable", None)
    if differentiable is None or differentiable(p) or not result.out.requires_grad:
        return result
    recompute = _REFERENCE.module.recomputed
    out, lse = twice_differentiable(result.out, result.lse, inputs, lambda *ts: recompute(p, inputs, ts))
    return result._replace(out=out, lse=lse)


def decide(p: Problem, backend: str = "auto", *, data: bool = True, lane: str | None = None,
           compiled: str = "") -> Decision:
    """:func:`choose`, with the reason of every path not taken and the chosen path's cost (explain())."""
    choice = choose(p, backend, data=data)
    chosen, why_not = choice.path, _why_not(choice)
    reasons = {}
    for path in PATHS:
        if path is chosen:
            reasons[path.name] = f"chosen: {chosen.describe(p)} ({path.source})"
            continue
        why = None if p.q.is_meta else path.refusal(p, data)  # refusals may read data that meta tensors lack
        if why is not None and not path.serves(rules.device_type(p)):
            why += f"; on {rules.device_type(p)}: {chosen.name}"
        reasons[path.name] = (f"refused: {why}" if why else "able, not preferred: " + (
            why_not.get(path.name) or why_not.get(path.backend) or why_not.get("*")
            or _order_reason(path, chosen)))
    layout_unread = not data and getattr(getattr(chosen.module, "density", None), "reads_data", False)
    kv_format = None if p.quant is None else str(p.quant.format)
    if symbolic_sizes(p) or layout_unread:  # symbolic: reading a formula as a float pins the sizes
        return Decision(chosen.backend, chosen.name, reasons, choice.density, float("nan"), float("nan"), None,
                        lane, compiled, kv_format)
    cost = chosen.module.cost(p, p.needs_grad)
    return Decision(chosen.backend, chosen.name, reasons, choice.density, float(cost.flops),
                    float(cost.workspace_bytes), cost, lane, compiled, kv_format)


def _order_reason(path: Path, chosen: Path) -> str:
    if path.backend == chosen.backend:
        return f"{chosen.name} comes first in the table of paths: it is more specialised, so faster where it applies"
    return f"the {chosen.backend} backend is preferred for this call"
