"""One dispatcher: which kernel ``backend="auto"`` runs, and why.

Policy, in order (each kernel first says whether it can honour every argument):

1. ``sdpa`` for softmax of dot products with no mask, causal, key padding or a
   user tensor mask, or any mask too dense for block skipping to pay.
2. ``blocksparse`` when the mask's block layout computes few enough blocks
   (``SPARSE_DENSITY``: under 70% on its fused path, under half otherwise).
3. ``reference`` when weights are asked for, the normaliser needs whole rows,
   or the problem is small (dense scores cost little there).
4. ``chunked`` otherwise: any score, bias or mask in O(L) memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import BackendError
from ..functional.masks import TensorMask, _Full
from ..functional.validate import Problem
from . import blocksparse, chunked, reference, sdpa

__all__ = ["KERNELS", "Decision", "decide", "pick", "estimate"]

KERNELS = {m.NAME: m for m in (sdpa, blocksparse, reference, chunked)}
# Block density under which skipping blocks beats SDPA with a dense mask. Measured at L = 4096, 1 thread,
# "causal() & strided(64)" (density 0.52): the fused slab path takes 0.60-0.65x of SDPA's time (forward,
# forward+backward), the hand-written one 0.88x (forward).
SPARSE_DENSITY = {"fused": 0.7, "hand-written": 0.5}
SMALL_SCORES = 1 << 16  # B*H*Lq*Lk under which dense reference scores are cheap


@dataclass
class Decision:
    """The dispatcher's answer: the backend, why each other one was not used, the cost."""

    backend: str
    reasons: dict[str, str] = field(default_factory=dict)
    block_density: float | None = None
    flops: float = 0.0
    peak_bytes: float = 0.0

    def __str__(self) -> str:
        lines = [f"backend: {self.backend}"]
        lines += [f"  {name:<11} {why}" for name, why in self.reasons.items()]
        if self.block_density is not None:
            lines.append(f"block density: {self.block_density:.3f}")
        lines.append(f"estimated FLOPs: {self.flops:.3g}   estimated extra memory: {self.peak_bytes / 2**20:.1f} MiB")
        return "\n".join(lines)


def _simple_mask(p: Problem) -> bool:
    """Masks SDPA takes without materialising a (Lq, Lk) tensor of our own."""
    m = p.mask
    return m is None or isinstance(m, (_Full, TensorMask)) or sdpa._causal_flag(p) or "q" not in m.uses


def _density(p: Problem) -> float | None:
    if p.mask is None or isinstance(p.mask, _Full) or p.sizes[2] == 0 or p.sizes[3] == 0:
        return None
    return blocksparse.union_layout(p, blocksparse.choose_block_size(p)).float().mean().item()


def estimate(p: Problem, backend: str, density: float | None) -> tuple[float, float]:
    """Estimated ``(FLOPs, extra bytes)`` of a backend (matmuls only; memory beyond q, k, v, out)."""
    batch, heads, lq, lk, d, dv = p.sizes
    pairs = batch * heads * lq * lk
    fraction = density if backend == "blocksparse" and density is not None else 1.0
    if backend == "sdpa" and sdpa._causal_flag(p):
        fraction = 0.5  # the fused causal kernel skips the upper triangle
    flops = 2.0 * pairs * (d + dv) * fraction
    item = 8 if p.compute_dtype.itemsize == 8 else 4
    if backend == "reference":
        extra = 3.0 * pairs * item
    elif backend == "chunked":
        extra = 3.0 * min(pairs, chunked.BUDGET) * item
    elif backend == "blocksparse":
        extra = 3.0 * min(pairs * fraction, blocksparse.BUDGET) * item + 2.0 * batch * heads * lk * (d + dv) * item
    else:
        extra = 0.0 if _simple_mask(p) and not isinstance(p.mask, TensorMask) else batch * lq * lk
    return flops, extra


def pick(p: Problem, backend: str = "auto") -> str:
    """The backend :func:`decide` chooses, without the reasons and costs that only explain() shows.

    ``attention()`` calls this on every call: when SDPA can take the problem as it
    is (the common dense, causal and padding cases) the other kernels are not asked.
    """
    if backend == "auto" and _simple_mask(p) and sdpa.refusal(p) is None:
        return "sdpa"  # rule 1 of decide(), reached without the other refusals
    return decide(p, backend).backend


def decide(p: Problem, backend: str = "auto") -> Decision:
    """Pick the kernel; a forced ``backend`` that cannot honour the call raises BackendError."""
    if backend != "auto":  # forced: only that kernel's answer matters
        refusals = {backend: KERNELS[backend].refusal(p)}
    else:
        refusals = {name: k.refusal(p) for name, k in KERNELS.items()}
    # Layouts cost a pass over the mask: build them only where the answer depends on them.
    needs_density = refusals.get("blocksparse", "") is None and (
        backend == "blocksparse" or (backend == "auto" and (refusals["sdpa"] or not _simple_mask(p))))
    density = _density(p) if needs_density else None
    if backend != "auto":
        if refusals[backend]:
            raise BackendError(f"attnkit.attention: backend={backend!r} cannot honour this call: {refusals[backend]}")
        chosen = backend
    else:
        batch, heads, lq, lk, _, _ = p.sizes
        sparse = density is not None and density < SPARSE_DENSITY[
            "fused" if blocksparse.blocksparse_fused.applies(p) is None else "hand-written"]
        if not refusals["sdpa"] and (_simple_mask(p) or not sparse):
            chosen = "sdpa"
        elif not refusals["blocksparse"] and sparse:
            chosen = "blocksparse"
        elif refusals["chunked"] or batch * heads * lq * lk <= SMALL_SCORES:
            chosen = "reference"
        else:
            chosen = "chunked"
    reasons = {name: ("chosen" if name == chosen else f"refused: {why}" if why else "able, not preferred")
               for name, why in refusals.items()}
    describe = getattr(KERNELS[chosen], "describe", None)
    if describe is not None:
        reasons[chosen] = f"chosen: {describe(p)}"
    flops, extra = estimate(p, chosen, density)
    return Decision(chosen, reasons, density, flops, extra)
