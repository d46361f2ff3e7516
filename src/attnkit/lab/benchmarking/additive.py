"""Additive attention (Bahdanau et al. 2014, arXiv:1409.0473) against the broadcast-then-tanh implementation.

The case's sizes are read as: ``batch`` = B, ``q_len`` = Lq, ``kv_len`` = Lk,
``head_dim`` = the width of queries, keys and the hidden layer (``heads`` is
unused). Both sides share one :class:`~attnkit.nn.additive.AdditiveAttention`'s
parameters; the keys are also the values. The broadcast side is what the paper's
equation reads as in plain torch: the whole ``(B, Lq, Lk, hidden)`` tensor
``tanh(W q_i + U k_j)`` at once.
"""

from __future__ import annotations

import torch

from .side import Method

__all__ = ["additive_methods", "additive_flops"]


def _module(width: int, device):
    from ...nn.additive import AdditiveAttention
    torch.manual_seed(0)
    return AdditiveAttention(width, width, width).to(device)


def _inputs(case):
    g = torch.Generator().manual_seed(0)
    lk = case.kv_len or case.q_len
    query = torch.randn(case.batch, case.q_len, case.head_dim, generator=g).to(case.device)
    key = torch.randn(case.batch, lk, case.head_dim, generator=g).to(case.device)
    return query.requires_grad_(case.backward), key.requires_grad_(case.backward)


def additive_methods(case) -> tuple[Method, Method]:
    """``(attnkit AdditiveAttention, broadcast-then-tanh)`` on the same inputs and parameters."""
    module = _module(case.head_dim, case.device)
    query, key = _inputs(case)
    leaves = (query, key, *module.parameters())

    def broadcast():
        q, k = module.query_proj(query), module.key_proj(key)  # (B, Lq, A), (B, Lk, A)
        scores = torch.tanh(q.unsqueeze(2) + k.unsqueeze(1)) @ module.v  # (B, Lq, Lk, A) -> (B, Lq, Lk)
        return torch.softmax(scores, -1) @ key

    ours = Method("attnkit AdditiveAttention", lambda: module(query, key, need_weights=False).context, leaves)
    return ours, Method("broadcast-then-tanh (plain torch)", broadcast, leaves)


def additive_flops(case) -> float:
    """Forward: projections ``2 B (Lq + Lk) W A``, hidden ``4 B Lq Lk A`` (add, tanh, multiply-add), ``2 B Lq Lk W``.

    With ``W = A = head_dim``; forward+backward counts 3x the forward, as for attention.
    """
    lk = case.kv_len or case.q_len
    w = case.head_dim
    forward = 2 * case.batch * (case.q_len + lk) * w * w + 4 * case.batch * case.q_len * lk * w
    forward += 2 * case.batch * case.q_len * lk * w
    return float(forward * (3 if case.backward else 1))
