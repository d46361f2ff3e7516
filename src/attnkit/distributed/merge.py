"""Merging partial softmax results by their log-sum-exp (Milakov & Gimelshein 2018, arXiv:1805.02867).

Attention over keys ``K = K1 u K2`` from the parts' outputs and log-sum-exps::

    lse = log(exp(lse1) + exp(lse2))
    out = exp(lse1 - lse) * out1 + exp(lse2 - lse) * out2

Every exponent is ``<= 0``, so the merge is stable for logits of any size. A row
with no allowed key in either part has ``lse = -inf``; its weights are 0 (not
``exp(-inf + inf) = NaN``), so its output stays 0.
"""

from __future__ import annotations

import torch

__all__ = ["weight", "merge"]


def weight(part_lse: torch.Tensor, total_lse: torch.Tensor) -> torch.Tensor:
    """``exp(part_lse - total_lse)``: the share of a part in the merged row; 0 where the row allows nothing."""
    finite_total = torch.where(total_lse == float("-inf"), torch.zeros_like(total_lse), total_lse)
    return torch.exp(part_lse - finite_total)


def merge(acc, part):
    """``(out, lse)`` over the union of two disjoint key sets; ``acc`` None means the empty set.

    out ``(B, H, L, Dv)``, lse ``(B, H, L)``; the answer's out is in lse's dtype
    (float32, float64 for float64 inputs): accumulate there, cast once at the end.
    """
    out, lse = part
    out = out.to(lse.dtype)
    if acc is None:
        return out, lse
    acc_out, acc_lse = acc
    total = torch.logaddexp(acc_lse, lse)
    merged = weight(acc_lse, total).unsqueeze(-1) * acc_out + weight(lse, total).unsqueeze(-1) * out
    return merged, total
