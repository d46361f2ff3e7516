"""The shape of a path's cost formula: what each execution path reports about one problem.

Every path in :mod:`.paths` has a ``cost(p, grad)`` beside its code that returns a
:class:`PathCost`; the dispatcher's estimate (:func:`attnkit.explain`), ``attnkit
cost`` and :func:`attnkit.costing.analytic` all read it, so there is one formula per path.
Matmul FLOPs are counted as ``torch.utils.flop_counter.FlopCounterMode`` counts
them (``2 m k n`` per ``(m, k) @ (k, n)``; torch's fused kernels by their own formulas).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

__all__ = ["Product", "PathCost", "dense_products", "fused_attention", "itemsize"]


class Product(NamedTuple):
    """``batch`` products ``(m, k) @ (k, n)`` whose backward autograd derives.

    ``operands``: "scores" (the ``q k^T`` product: gradients for q and k) or "output"
    (``weights @ v``: gradients for the weights and v). ``recompute``: the backward runs
    the product once more first (a checkpointed slab).
    """

    label: str
    batch: int
    m: int
    k: int
    n: int
    operands: str
    recompute: bool = False

    @property
    def flops(self) -> int:
        return 2 * self.batch * self.m * self.k * self.n


@dataclass(frozen=True)
class PathCost:
    """One path's cost on one problem.

    Attributes:
        scores: score entries computed (padding lanes of blocks included).
        workspace_bytes: memory beyond q, k, v and the output while the forward runs.
        products: matmuls differentiated by autograd (general paths).
        fused: ``(label, forward FLOPs, backward FLOPs)`` of a kernel with its own backward, or None.
        materialized: whether the scores and weights exist in memory (not in a fused kernel's tiles).
    """

    scores: int
    workspace_bytes: float
    products: tuple[Product, ...] = ()
    fused: tuple[str, int, int] | None = None
    materialized: bool = True

    @property
    def flops(self) -> int:
        """Forward matmul FLOPs."""
        return sum(pr.flops for pr in self.products) + (self.fused[1] if self.fused else 0)


def itemsize(p) -> int:
    """Bytes per element of the compute dtype (float32 for half inputs)."""
    return p.compute_dtype.itemsize


def dense_products(p, *, recompute: bool = False) -> tuple[Product, ...]:
    """``Q K^T`` and ``weights @ V`` over all ``Lq x Lk`` pairs."""
    b, h, lq, lk, d, dv = p.sizes
    return (Product("scores (q k^T)", b * h, lq, d, lk, "scores", recompute),
            Product("weights @ v", b * h, lq, lk, dv, "output", recompute))


def fused_attention(label: str, pairs: int, d: int, dv: int) -> tuple[str, int, int]:
    """A fused softmax-attention kernel over ``pairs`` scores: forward ``2 pairs (D + Dv)``, backward
    ``2 pairs (3 D + 2 Dv)`` (the scores are recomputed from the saved lse: FlashAttention-2's backward)."""
    return label, 2 * pairs * (d + dv), 2 * pairs * (3 * d + 2 * dv)
