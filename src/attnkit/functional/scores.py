"""Score stage: ``score(q, k) -> scores`` of shape ``(..., Lq, Lk)``.

Every score here is *pairwise*: entry ``(i, j)`` depends only on ``q_i`` and
``k_j``, which is what lets kernels compute it one block of keys at a time.
Inputs arrive already upcast (float32 for half types), so ``q @ k^T`` accumulates
in float32 or better and cannot overflow fp16's range (RELIABILITY row 23).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["dot", "cosine", "general", "additive", "SCORES"]


def dot(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Dot product ``q k^T`` (Luong et al. 2015 "dot"; Vaswani et al. 2017 before scaling)."""
    return q @ k.transpose(-1, -2)


def cosine(q: torch.Tensor, k: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Cosine similarity ``q k^T / (|q| |k|)`` in [-1, 1]; pass a temperature as ``scale``."""
    return F.normalize(q, dim=-1, eps=eps) @ F.normalize(k, dim=-1, eps=eps).transpose(-1, -2)


def general(q: torch.Tensor, k: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Luong et al. 2015 "general": ``q^T W k`` with ``W`` of shape ``(Dq, Dk)``."""
    return (q @ weight) @ k.transpose(-1, -2)


def additive(q: torch.Tensor, k: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor,
             v: torch.Tensor, *, max_elements: int = 1 << 24) -> torch.Tensor:
    """Bahdanau et al. 2015 (arXiv:1409.0473, eq. A.1.2): ``v^T tanh(W_q q_i + W_k k_j)``.

    Shapes: q ``(..., Lq, Dq)``, k ``(..., Lk, Dk)``, w_q ``(Dq, A)``, w_k ``(Dk, A)``,
    v ``(A,)`` -> scores ``(..., Lq, Lk)``. The broadcast ``(..., Lq, Lk, A)`` hidden
    tensor is built a band of keys at a time so it never exceeds ``max_elements``.
    """
    pq, pk = q @ w_q, k @ w_k  # (..., Lq, A), (..., Lk, A)
    hidden = pq.shape[-1]
    per_key = max(1, pq[..., 0].numel() * hidden)
    step = max(1, max_elements // per_key)
    parts = [torch.tanh(pq.unsqueeze(-2) + pk[..., j:j + step, :].unsqueeze(-3)) @ v
             for j in range(0, pk.shape[-2], step)]
    if not parts:
        return pq.new_zeros(pq.shape[:-1] + (0,))
    return torch.cat(parts, dim=-1)


SCORES = {"dot": dot, "scaled_dot": dot, "cosine": cosine}
