"""The bookkeeping of a cost count: a tally of named terms, and the stand-in tensors counts and runs use.

A spec's ``count(tally, sizes, module)`` (:class:`attnkit.costing.spec.Spec`) walks the
mechanism's forward pass and records every matrix product with :meth:`Tally.mm` (or
:meth:`Tally.conv`, :meth:`Tally.sdpa`), elementwise work with :meth:`Tally.ew`, and the
tensors it reads and writes with :meth:`Tally.io` / :meth:`Tally.inter`. Each product says
how many of its two operands need a gradient: its backward then costs that many times its
forward (one product per operand gradient), as ``torch.utils.flop_counter.FlopCounterMode``
counts it. Counting is arithmetic on the sizes; no tensor of a sequence's size is made.
"""

from __future__ import annotations

import torch

__all__ = ["Tally", "ITEMSIZE", "DTYPES", "dtype_of", "dropout_of", "zeros", "ones", "randn"]

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}
ITEMSIZE = {name: dtype.itemsize for name, dtype in DTYPES.items()}


class Tally:
    """Running totals of one cost: matmul FLOPs by term, elementwise FLOPs, bytes, peak.

    Args:
        backward: also count the backward pass (gradients of every input and parameter).
        itemsize: bytes per element of the mechanism's dtype.
    """

    def __init__(self, *, backward: bool, itemsize: int = 4):
        self.backward, self.itemsize = backward, itemsize
        self.terms: dict[str, int] = {}
        self.other: dict[str, int] = {}
        self.bytes = 0
        self.resident = 0  # bytes of intermediates kept alive so far
        self.peak = 0
        self.state_fixed = 0  # the decoding cache of one sequence: bytes whatever the context
        self.state_per_token = 0  # and bytes per token of context
        self.forms: dict[str, int] = {}  # matmul FLOPs of the same pass in each form the mechanism runs in

    def _add(self, table: dict, term: str, flops: int) -> None:
        table[term] = table.get(term, 0) + int(flops)

    def mm(self, term: str, batch: int, m: int, k: int, n: int, *, grads: int = 2, recompute: bool = False) -> None:
        """``batch`` products ``(m, k) @ (k, n)``: ``2 batch m k n`` FLOPs; backward ``grads`` times that.

        ``recompute``: the backward runs the product once more first (activation checkpointing).
        """
        flops = 2 * batch * m * k * n
        if self.backward:
            flops *= 1 + grads + int(recompute)
        self._add(self.terms, term, flops)

    def fused(self, term: str, forward: int, backward: int, *, grad: bool = True) -> None:
        """A fused kernel whose counted backward (``backward`` FLOPs) is not a multiple of its products."""
        self._add(self.terms, term, forward + (backward if self.backward and grad else 0))

    def sdpa(self, term: str, b: int, h: int, lq: int, lk: int, d: int, dv: int, *, flash: bool,
             grad: bool = True) -> None:
        """One call of torch's SDPA, counted with torch's formulas.

        Forward ``2 b h lq lk (d + dv)``. Backward: the fused kernel's formula (scores recomputed,
        ``2 b h lq lk (3 d + 2 dv)``) when ``flash``, else the math path's products (twice the forward).
        """
        fwd = 2 * b * h * lq * lk * (d + dv)
        self.fused(term, fwd, 2 * b * h * lq * lk * (3 * d + 2 * dv) if flash else 2 * fwd, grad=grad)

    def conv(self, term: str, batch: int, c_in: int, c_out: int, length: int, taps: int, *, grads: int = 2) -> None:
        """A 1-D convolution with ``length`` outputs per channel: ``2 batch c_out c_in length taps``."""
        self.mm(term, batch, c_out, c_in * taps, length, grads=grads)

    def ew(self, term: str, count: int, per: float = 1.0) -> None:
        """Elementwise work: ``per`` operations on each of ``count`` elements (backward: twice as many)."""
        self._add(self.other, term, round(count * per * (3 if self.backward else 1)))

    def io(self, *numels: int) -> None:
        """Inputs, outputs and parameters: read or written once."""
        self.bytes += sum(numels) * self.itemsize

    def inter(self, *numels: int, keep: bool = True) -> None:
        """Intermediates: each written once and read once. ``keep``: alive until the end of the forward."""
        size = sum(numels) * self.itemsize
        self.bytes += 2 * size
        self.peak = max(self.peak, self.resident + size)
        if keep:
            self.resident += size

    def decoding(self, *, fixed: int = 0, per_token: int = 0) -> None:
        """What a decoder keeps of this layer for one sequence: ``fixed`` bytes whatever the context (a recurrent
        state, a convolution's last inputs) plus ``per_token`` bytes per token of context (a KV cache)."""
        self.state_fixed += int(fixed)
        self.state_per_token += int(per_token)

    def transient(self, nbytes: float) -> None:
        """A set of temporaries alive at once on top of the kept intermediates (a kernel's workspace)."""
        self.peak = max(self.peak, self.resident + int(nbytes))


def dtype_of(sizes) -> torch.dtype:
    """The torch dtype a spec's ``dtype`` size names."""
    return DTYPES[sizes["dtype"]]


def dropout_of(module) -> float:
    """The dropout probability a module passes to attention() now (0 in eval mode)."""
    if module is None or not module.training:
        return 0.0
    return float(getattr(module, "dropout_p", getattr(module, "dropout", 0.0)))


def zeros(dtype: torch.dtype, *shape: int, requires_grad: bool = False) -> torch.Tensor:
    """An all-zero tensor of ``shape`` backed by one element (for decisions that read only shapes)."""
    return torch.zeros((), dtype=dtype, requires_grad=requires_grad).expand(*shape)


def ones(*shape: int) -> torch.Tensor:
    """An all-true bool tensor of ``shape`` backed by one element (a mask a module passes, all kept)."""
    return torch.ones((), dtype=torch.bool).expand(*shape)


def randn(*shape: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Seeded Gaussian inputs for a spec's ``inputs`` (drawn in float64, so every dtype sees the same values)."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)
