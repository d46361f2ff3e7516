"""Attention over the previous K hidden states: the random access memory of Yogatama et al. 2018."""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ..core import attention
from ..costing.attend import attend
from ..costing.spec import Spec
from ..costing.tally import dtype_of, ones, randn, zeros
from ..errors import check_int
from ..registry.entry import Entry, register
from ._inputs import check_keep_mask, check_sequence, check_shape
from .pooling import POOL_SCORES

__all__ = ["MemoryAttention", "MemoryOutput"]

_WHO = "MemoryAttention"


class MemoryOutput(NamedTuple):
    """memory ``m_t`` ``(B, [T,] dim)``; weights ``(B, [T,] K)``, slot ``j`` holding ``h_{t-K+j}``."""

    memory: torch.Tensor
    weights: torch.Tensor


def _keep(mask, shape):
    """The ``shape`` bool mask (True = a real state), all True when None."""
    mask = check_keep_mask(_WHO, "mask", mask, *shape, true_means="a real state", dims="")
    return torch.ones(shape, dtype=torch.bool) if mask is None else mask


def _mix(logits, slots, allowed):
    """softmax(logits) over allowed slots, then the weighted sum: (N, K), (N, K, D), (N, K) -> (N, D), (N, K)."""
    zeros = slots.new_zeros(slots.shape[0], 1, 1)
    out = attention(zeros, slots.new_zeros(slots.shape[0], slots.shape[1], 1), slots, bias=logits[:, None, :],
                    mask=allowed[:, None, :], score="dot", return_weights=True)
    return out.output[:, 0], out.weights[:, 0]


class MemoryAttention(nn.Module):
    """Random access memory: attention over the previous ``K`` hidden states of an RNN.

    Yogatama et al. 2018, "Memory Architectures in Recurrent Neural Network Language
    Models", ICLR (OpenReview SkFqf0lAZ), Sec. 2, "Random access memory"::

        m_t = sum_{i=t-K}^{t-1} a_i h_i,   a_i proportional to exp(w_{m,i} h_i + w_{m,h} h_t)

    Notation: ``h_i`` = ``h[:, i]``; ``w_{m,i}`` = ``slot_weight[j]`` with
    ``j = i - (t - K)`` (one row vector per slot of the window, oldest first);
    ``w_{m,h}`` = ``state_weight``; ``a`` = ``weights``; ``m_t`` = ``memory[:, t]``.

    The ``w_{m,h} h_t`` term is the same for every slot, so it cancels in the
    normalisation: the weights depend on the slots' contents and positions, not on
    ``h_t`` (its gradient is zero up to rounding). It is kept exactly as written.

    Differences from the paper: all steps at once from given states (the paper
    computes ``m_t`` inside the recurrence; :meth:`step` does one step); a padding mask
    on states; the first steps see fewer than ``K`` states, and ``m_0 = 0`` (no state
    before it).

    Shapes:
        h ``(B, T, dim)``, mask ``(B, T)`` (True = a real state) -> memory ``(B, T, dim)``,
        weights ``(B, T, K)``.

    Complexity: ``O(B T K dim)`` time and memory (each step sees a window of ``K`` states).

    Args:
        dim: features of a hidden state.
        memory_size: ``K``, how many previous states each step attends over.

    Example:
        >>> import torch
        >>> from attnkit.nn.memory import MemoryAttention
        >>> _ = torch.manual_seed(0)
        >>> mem = MemoryAttention(6, 3)
        >>> memory, weights = mem(torch.randn(2, 5, 6))
        >>> memory.shape, weights.shape
        (torch.Size([2, 5, 6]), torch.Size([2, 5, 3]))
        >>> weights[0, 1].tolist()  # step 1 sees one state, h_0, in the newest slot
        [0.0, 0.0, 1.0]
    """

    def __init__(self, dim: int, memory_size: int):
        super().__init__()
        check_int(_WHO, "memory_size", memory_size, 1)
        self.dim, self.memory_size = dim, memory_size
        self.slot_weight = nn.Parameter(torch.randn(memory_size, dim) * dim ** -0.5)
        self.state_weight = nn.Parameter(torch.randn(dim) * dim ** -0.5)

    def forward(self, h: torch.Tensor, *, mask: torch.Tensor | None = None) -> MemoryOutput:
        """``m_t`` for every step ``t`` of ``h``."""
        check_sequence(_WHO, "h", h, self.dim, length="T", like=self)
        b, steps, _ = h.shape
        k = self.memory_size
        mask = _keep(mask, (b, steps)).to(h.device)
        rows = torch.arange(steps, device=h.device)[:, None] + torch.arange(k, device=h.device)  # (T, K)
        slot_scores = F.pad(h @ self.slot_weight.to(h.dtype).T, (0, 0, k, 0))  # (B, K + T, K): row K + i is h_i
        logits = slot_scores.gather(1, rows.expand(b, steps, k))  # (B, T, K): w_{m,j} h_{t-K+j}
        logits = logits + (h @ self.state_weight.to(h.dtype))[..., None]
        slots = F.pad(h, (0, 0, k, 0))[:, rows]  # (B, T, K, dim)
        allowed = F.pad(mask, (k, 0), value=False)[:, rows]  # (B, T, K): before step 0 is empty
        memory, weights = _mix(logits.reshape(b * steps, k), slots.reshape(b * steps, k, self.dim),
                               allowed.reshape(b * steps, k))
        return MemoryOutput(memory.reshape(b, steps, self.dim), weights.reshape(b, steps, k))

    def step(self, h_t: torch.Tensor, past: torch.Tensor, *, mask: torch.Tensor | None = None) -> MemoryOutput:
        """One step: ``h_t (B, dim)`` and the ``P <= K`` most recent states ``past (B, P, dim)``, oldest first.

        Returns memory ``(B, dim)`` and weights ``(B, P)``; equal to :meth:`forward` at that step.
        """
        check_shape(_WHO, "h_t", h_t, lambda t: t.dim() == 2 and t.shape[-1] == self.dim,
                    f"have shape (batch, {self.dim})")
        check_shape(_WHO, "past", past, lambda t: t.dim() == 3 and t.shape[0] == h_t.shape[0]
                    and t.shape[1] <= self.memory_size and t.shape[2] == self.dim,
                    f"have shape (batch={h_t.shape[0]}, P <= {self.memory_size}, {self.dim})")
        p = past.shape[1]
        mask = _keep(mask, tuple(past.shape[:2])).to(past.device)
        logits = (past * self.slot_weight[self.memory_size - p:].to(past.dtype)).sum(-1)  # (B, P)
        logits = logits + (h_t @ self.state_weight.to(h_t.dtype))[:, None]
        return MemoryOutput(*_mix(logits, past, mask))


def _example():
    g = torch.Generator().manual_seed(0)
    return MemoryAttention(8, 4), (torch.randn(2, 9, 8, generator=g),)


def _count(t, s, module=None):
    b, steps, d, k = s["batch"], s["length"], s["dim"], s["memory_size"]
    t.mm("slot scores: h W_m^T", 1, b * steps, d, k)
    t.ew("state score: h . w_mh (matrix-vector, not counted)", b * steps * d, 2)
    t.inter(b * steps * k, b * steps * k * d)
    attend(t, "", b * steps, 1, 1, k, 1, d, dtype=dtype_of(s), grads=(False, False, True), weights_grad=True,
           bias=zeros(dtype_of(s), b * steps, 1, 1, k), mask=ones(b * steps, 1, 1, k), **POOL_SCORES)


register(Entry("memory-attention", MemoryAttention,
               "Yogatama et al. 2018, ICLR, 'Memory Architectures in Recurrent Neural Network Language Models', "
               "Sec. 2 (random access memory)", "O(T K D)",
               "each step attends over the previous K hidden states, weights from per-slot vectors",
               family="module", example=_example,
               spec=Spec({"batch": 2, "length": 9, "dim": 8, "memory_size": 4, "dtype": "float32"}, _count,
                         lambda s, m: (m, (randn(s["batch"], s["length"], s["dim"], dtype=dtype_of(s)),)),
                         "slot scores 2 B T D K; weights @ slots 2 B T K D",
                         make=lambda s: MemoryAttention(s["dim"], s["memory_size"]).to(dtype_of(s)),
                         module_type=MemoryAttention, config=lambda m: {"dim": m.dim, "memory_size": m.memory_size})))
