"""``attnkit.core``: the one entry point, :func:`attention` (and :func:`explain`). Validate once, dispatch, return.

The pipeline every mechanism shares::

    score(q, k) * scale -> + bias / modifier -> mask (select) -> normalise -> dropout -> @ v

``attention()`` validates the call into a :class:`~attnkit.functional.validate.Problem`,
and :func:`attnkit.kernels.dispatch.execute` runs the execution path that
:func:`~attnkit.kernels.dispatch.choose` picks from the table in
:mod:`attnkit.kernels.paths`; ``explain()`` shows that choice and why no other path was taken.
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import torch

from . import recording
from .functional.validate import Problem, validate
from .kernels.dispatch import Decision, decide, execute

__all__ = ["attention", "explain", "AttentionOutput"]


class AttentionOutput(NamedTuple):
    """Returned when weights or lse are asked for; the fields not asked for are None.

    output: ``(..., Lq, Dv)`` in the input dtype. weights: ``(..., H, Lq, Lk)`` per
    head, post-normalisation, pre-dropout. lse: ``(..., Lq)`` log-sum-exp of the
    masked scaled scores, float32 (float64 for float64 inputs), ``-inf`` for rows
    with no allowed key.
    """

    output: torch.Tensor
    weights: torch.Tensor | None
    lse: torch.Tensor | None


def _autocast_inputs(q, k, v):
    """Under autocast, float32 q/k/v are cast to the autocast dtype, as torch's SDPA does.

    The kernels then run with autocast off, so the scores, softmax and lse are
    computed in float32 whatever the input dtype (RELIABILITY row 39).
    """
    tensors = (q, k, v)
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        return tensors  # validate() reports it
    device = q.device.type
    if not _autocast_enabled(device):
        return tensors
    low = torch.get_autocast_dtype(device)
    return tuple(t.to(low) if t.dtype == torch.float32 else t for t in tensors)


def _autocast_enabled(device_type: str) -> bool:
    try:
        return torch.is_autocast_enabled(device_type)
    except RuntimeError:  # a device type autocast does not know (meta): never enabled there
        return False


def _autocast_off(device_type: str):
    return torch.autocast(device_type, enabled=False) if _autocast_enabled(device_type) else contextlib.nullcontext()


def _prepare(q, k, v, **kwargs) -> Problem:
    """Everything before dispatch, shared by attention() and explain(): autocast, validation."""
    q, k, v = _autocast_inputs(q, k, v)
    return validate(q, k, v, **kwargs)


def _to_user_rank(t: torch.Tensor, rank: int) -> torch.Tensor:
    """Undo the 4-D view of :func:`~attnkit.functional.validate.validate`: (B, H, ...) back to the input's rank."""
    return t if rank == 4 else t.select(1, 0) if rank == 3 else t[0, 0]


def attention(q, k, v, *, mask=None, bias=None, score="scaled_dot", scale=None, normalize="softmax",
              dropout_p=0.0, return_weights=False, return_lse=False, backend="auto"):
    """Attention over keys and values: ``normalize(score(q, k) * scale + bias, mask) @ v``.

    Args:
        q: queries ``(L, D)``, ``(B, L, D)`` or ``(B, H, L, D)``.
        k: keys, same rank; ``(B, H_kv, Lk, D)`` with ``H % H_kv == 0`` (grouped queries).
        v: values ``(B, H_kv, Lk, Dv)``; Dv may differ from D.
        mask: an :mod:`attnkit.masks` mask or a bool tensor broadcastable to the scores
            ``(..., Lq, Lk)`` (last dim exactly Lk). True = attend. Never a float.
            Tensors broadcast right-aligned, as in torch's SDPA: with 4-D inputs a 3-D mask
            is ``(H, Lq, Lk)`` and a 2-D one ``(Lq, Lk)``; per-sample key padding is
            ``masks.padding(lengths)`` or ``masks.keys(keep)``.
        bias: a float tensor broadcastable like ``mask``, added to the scores in float32,
            or a modifier ``(scores, b, h, q_idx, kv_idx) -> scores`` (see :mod:`attnkit.bias`).
        score: "scaled_dot" (default), "dot", "cosine" or a pairwise ``(q, k) -> scores``.
        scale: multiplies the scores; default ``1/sqrt(D)`` for "scaled_dot", else 1.
        normalize: "softmax", "sparsemax", "sigmoid", "hard", "gumbel" or
            ``(scores, allowed) -> weights``.
        dropout_p: dropout on the weights; pass ``p if module.training else 0.0``.
        return_weights: also return per-head weights (forces an exact dense path).
        return_lse: also return the log-sum-exp of each row (softmax only).
        backend: "auto", "reference", "chunked", "sdpa" or "blocksparse".

    Returns:
        The output ``(..., Lq, Dv)`` in the input dtype, or an :class:`AttentionOutput`
        when ``return_weights`` or ``return_lse`` is set. A query row with no allowed
        key outputs 0 (lse ``-inf``, zero gradients); NaN in allowed inputs propagates.
        Keys masked for every query (padding) have their K/V rows zeroed, so nothing
        there can reach the output or the gradients. A key masked for some queries only
        (causal, windows) never changes the output, but NaN/inf in it can still reach
        ``dQ`` (through ``0 * NaN`` in ``dS @ K``) and NaN in its V row can reach the
        output of queries that do not attend it (``0 * NaN`` in ``weights @ V``).
        Under ``torch.autocast``, float32 inputs are cast to the autocast dtype (as
        torch's SDPA does) and the scores, softmax and lse stay float32.

    Example:
        >>> import torch, attnkit
        >>> q = k = v = torch.randn(2, 3, 5, 8)
        >>> out = attnkit.attention(q, k, v, mask=attnkit.masks.causal())
        >>> out.shape
        torch.Size([2, 3, 5, 8])
    """
    record = recording.is_recording()  # an AttentionRecorder listens: take the exact path that has the weights
    if record:
        backend = "reference"
    p = _prepare(q, k, v, mask=mask, bias=bias, score=score, scale=scale, normalize=normalize, dropout_p=dropout_p,
                 return_weights=return_weights or record, return_lse=return_lse, backend=backend)
    with _autocast_off(p.q.device.type):  # scores and softmax stay in float32
        result, _ = execute(p, backend)
    if record:
        recording.report(result.weights.to(p.q.dtype))
    rank, dtype = p.user_rank, p.q.dtype
    out = _to_user_rank(result.out if result.out.dtype == dtype else result.out.to(dtype), rank)
    if not (return_weights or return_lse):
        return out
    weights = _to_user_rank(result.weights.to(p.q.dtype), rank) if return_weights else None
    lse = _to_user_rank(result.lse, rank) if return_lse else None
    return AttentionOutput(out, weights, lse)


def explain(q, k, v, **kwargs) -> Decision:
    """Which execution path ``attention(q, k, v, **kwargs)`` would run, why no other path, and its cost.

    ``str()`` of the answer lists every path of :mod:`attnkit.kernels.paths` with the
    reason it was not taken (refused, or able but not preferred).

    Example:
        >>> import torch, attnkit
        >>> q = torch.randn(1, 2, 512, 16)
        >>> d = attnkit.explain(q, q, q, mask=attnkit.masks.sliding_window(32, 32))
        >>> d.backend, d.path
        ('blocksparse', 'band-windows')
    """
    p = _prepare(q, k, v, **kwargs)
    with _autocast_off(p.q.device.type):
        return decide(p, kwargs.get("backend", "auto"))
