"""Deliberately broken attention kernels, used only by tests/contract/test_properties.py.

Each property check must catch at least one of these, so a property that can
never fail is noticed. Every function has a kernel's signature,
``fn(q, k, v, *, mask=None, return_weights=False)``, and returns the output
``(B, H, Lq, Dv)``, or ``(output, weights)`` when ``return_weights`` is set.
:func:`dense` is the correct control (a plain float64-friendly transcription of
``softmax(q k^T / sqrt(D)) v`` with select masking); every other function has
exactly one bug, named in its docstring.
"""

from __future__ import annotations

import math

import torch

__all__ = ["dense", "forgets_mask", "weak_sentinel", "leaks_future", "wrong_axis", "first_sample_mask",
           "ignores_alignment", "drops_last_block", "BROKEN"]


def _allowed(mask, q, k, q_len=None):
    """Dense bool ``(B|1, H|1, Lq, Lk)``, True = attend (all True without a mask)."""
    b, h, lq = q.shape[:3]
    lq = lq if q_len is None else q_len
    if mask is None:
        return torch.ones(1, 1, lq, k.shape[2], dtype=torch.bool, device=q.device)
    return torch.broadcast_to(mask.materialize(lq, k.shape[2], batch=b, heads=h, device=q.device),
                              (b if "b" in mask.uses else 1, h if "h" in mask.uses else 1, lq, k.shape[2]))


def _scores(q, k):
    return q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (B, H, Lq, Lk)


def _finish(scores, allowed, v, return_weights, dim=-1):
    """Select-mask, softmax over ``dim``, rows with no allowed key -> 0, aggregate."""
    weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=dim).nan_to_num(0.0)
    out = weights @ v  # (B, H, Lq, Dv)
    return (out, weights) if return_weights else out


def dense(q, k, v, *, mask=None, return_weights=False):
    """Correct: the control every check must accept."""
    return _finish(_scores(q, k), _allowed(mask, q, k), v, return_weights)


def forgets_mask(q, k, v, *, mask=None, return_weights=False):
    """Bug: the mask argument is accepted and never applied."""
    return dense(q, k, v, mask=None, return_weights=return_weights)


def weak_sentinel(q, k, v, *, mask=None, return_weights=False):
    """Bug: masks by adding a finite sentinel (-10) instead of selecting, so masked keys keep weight."""
    allowed = _allowed(mask, q, k)
    scores = _scores(q, k) + torch.where(allowed, 0.0, -10.0).to(q.dtype)
    return _finish(scores, torch.ones_like(allowed), v, return_weights)


def leaks_future(q, k, v, *, mask=None, return_weights=False):
    """Bug: off by one, every query also sees the key just after its last allowed key."""
    allowed = _allowed(mask, q, k).clone()
    allowed[..., 1:] |= allowed[..., :-1].clone()
    return _finish(_scores(q, k), allowed, v, return_weights)


def wrong_axis(q, k, v, *, mask=None, return_weights=False):
    """Bug: softmax over the query axis (columns sum to 1) instead of over the keys."""
    return _finish(_scores(q, k), _allowed(mask, q, k), v, return_weights, dim=-2)


def first_sample_mask(q, k, v, *, mask=None, return_weights=False):
    """Bug: the first sample's mask is broadcast to the whole batch (per-sample padding lost)."""
    return _finish(_scores(q, k), _allowed(mask, q, k)[:1], v, return_weights)


def ignores_alignment(q, k, v, *, mask=None, return_weights=False):
    """Bug: assumes queries start at position 0 (top-left), the classic KV-cache decode bug.

    The mask is evaluated for ``max(Lq, Lk)`` queries and the first ``Lq`` rows are kept,
    so a single decode query against a cache of ``Lk`` keys sees only key 0 under causal().
    """
    lq, lk = q.shape[2], k.shape[2]
    allowed = _allowed(mask, q, k, q_len=max(lq, lk))[..., :lq, :]
    return _finish(_scores(q, k), allowed, v, return_weights)


def drops_last_block(q, k, v, *, mask=None, return_weights=False, block=4):
    """Bug: a chunked loop ``range(0, Lk - Lk % block, block)`` that never visits the partial tail block."""
    allowed = _allowed(mask, q, k).clone()
    allowed[..., k.shape[2] - k.shape[2] % block:] = False
    return _finish(_scores(q, k), allowed, v, return_weights)


BROKEN = {f.__name__: f for f in (forgets_mask, weak_sentinel, leaks_future, wrong_axis, first_sample_mask,
                                  ignores_alignment, drops_last_block)}
