"""LASER: attention that averages exponentiated values and returns their log (a log-sum-exp over the keys)."""

from __future__ import annotations

__all__ = ["laser_attention"]


def laser_attention(q, k, v, **options):
    """``log(softmax(scale q k^T + bias, mask) exp(V))``, per value channel.

    Duvvuri & Dhillon 2024, "LASER: Attention with Exponential Transformation", arXiv:2411.03493,
    eq. 4 (x-transformers' ``laser``): the output is a soft maximum of the values under the
    attention weights, whose gradient does not vanish where softmax saturates. With the largest
    value of each channel over the keys, ``m`` (``(B, Hkv, 1, Dv)``)::

        out = m + log(softmax(...) exp(V - m))

    so the exponentials are at most 1 and :func:`attnkit.attention` computes the average on
    whichever exact path serves the call (every option as there). ``m`` is a constant of the
    function (its gradient terms cancel), so it is taken without one.

    Differences from the paper: none. The shift is per key/value head and channel, not per query: a
    channel whose values over the keys a query attends to all lie more than ~87 (float32; ~708 in
    float64) below that channel's largest value underflows to ``-inf`` there.

    Shapes: as :func:`attnkit.attention` (``v`` ``(B, Hkv, Lk, Dv)``) -> ``(B, H, Lq, Dv)``.

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> q, k, v = torch.randn(3, 1, 2, 5, 4).unbind(0)
        >>> weights = torch.softmax(q @ k.transpose(-1, -2) / 2, -1)
        >>> torch.allclose(laser_attention(q, k, v), torch.log(weights @ v.exp()), atol=1e-5)
        True
    """
    from ..core import attention

    shift = v.detach().amax(-2, keepdim=True)  # (B, Hkv, 1, Dv)
    if q.dim() == 4 and q.shape[1] != v.shape[1]:  # grouped keys: each key/value head serves consecutive heads
        shift_q = shift.repeat_interleave(q.shape[1] // v.shape[1], 1)
    else:
        shift_q = shift
    return attention(q, k, (v - shift).exp(), **options).log() + shift_q
