"""Shared sizes and inputs for the additive-attention family tests (additive, coverage, hard attention)."""

from __future__ import annotations

import torch

B, LQ, LK, DQ, DK, A, DV = 2, 5, 7, 11, 6, 4, 3  # distinct sizes, so swapped axes fail


def inputs(seed=0, dtype=torch.float64, requires_grad=False):
    """Queries (B, LQ, DQ), keys (B, LK, DK) and values (B, LK, DV), drawn in float64 from one generator."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, LQ, DQ, generator=g, dtype=torch.float64).to(dtype)
    k = torch.randn(B, LK, DK, generator=g, dtype=torch.float64).to(dtype)
    v = torch.randn(B, LK, DV, generator=g, dtype=torch.float64).to(dtype)
    return tuple(t.requires_grad_(requires_grad) for t in (q, k, v))
