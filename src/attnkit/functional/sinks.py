"""Learned attention sinks: a logit that joins a row's softmax denominator and takes no value.

gpt-oss (OpenAI 2025, arXiv:2508.10925) gives each head a learned logit in its softmax's
denominator; attention sinks are Xiao et al. 2023 (arXiv:2309.17453), whose StreamingLLM also
pre-trains a dedicated sink token. The logit may be one per head (gpt-oss), per sample and head, or
per query token (a model that computes its sink from the token's hidden state). With scores ``S``
of one row and that row's sink ``s``::

    out = softmax([S, s])[:-1] @ V = sum_j exp(S_j - lse_s) V_j,    lse_s = log(exp(s) + sum_j exp(S_j))

From the row's attention *without* the sink, ``(O, lse)``, the same row is::

    lse_s = logaddexp(lse, s),    O_s = f O,    f = exp(lse - lse_s) = sigmoid(lse - s)

(``f`` is the share of the real keys; the sink takes ``1 - f`` and adds nothing). The gradients,
with ``dlse_s`` what reaches a returned lse::

    d(scores) = P_s * (dO_s V^T - rowsum(dO_s * O_s) + dlse_s),     P_s = exp(S - lse_s) = f P
    ds        = -sum_rows (1 - f) * (rowsum(dO_s * O_s) - dlse_s)

so a fused backward that rebuilds ``P`` from a saved lse gives the sink call's exact ``dq, dk, dv``
when handed ``(O_s, lse_s)`` in place of ``(O, lse)`` (:func:`joined`, :func:`kernel_gradient`), and
any path whose backward takes an lse gradient is exact under :class:`Join`, the map above as an
autograd function. A row with no allowed key (``lse = -inf``) has ``f = 0``: output 0, lse_s = s
(the sink alone is its denominator), no gradient for q, k or v, and for ``s`` only what reaches
lse_s. ``s = -inf`` is plain softmax, and a row with no key under it has ``lse_s = -inf``: a fused
backward must not rebuild that row's weights as ``exp(-inf - (-inf))`` (torch-sdpa hands its kernel
the lse of 0 the kernel gives such rows). ``s = +inf`` is refused by validation.

Sinks are stored as ``(B|1, H|1, Lq|1)``; :func:`per_row` views them against ``(B, H, Lq, ...)``
tensors (and ``(B|1, H|1, nq|1, bs|1)`` block-layout sinks, :func:`to_blocks`, against
``(B, H, nq, bs, ...)``); :func:`rows` takes a path's slice of query rows.
"""

from __future__ import annotations

import torch

__all__ = ["per_row", "rows", "per_token", "to_blocks", "real_share", "joined", "kernel_gradient", "summed_to",
           "Join", "join"]

_NEG_INF = float("-inf")


def per_row(sinks: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``(B|1, H|1, Lq|1)`` sinks viewed to broadcast against ``like (B, H, Lq, ...)``, in ``like``'s dtype
    (block-layout sinks ``(B|1, H|1, nq|1, bs|1)`` against ``(B, H, nq, bs, ...)``)."""
    return sinks.to(like.dtype).view(*sinks.shape, *(1,) * (like.dim() - sinks.dim()))


def per_token(sinks: torch.Tensor) -> bool:
    """True when the sinks differ between query rows (``Lq > 1`` in ``(B|1, H|1, Lq|1)``)."""
    return sinks.shape[2] != 1


def rows(sinks: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """The sinks of query rows ``start:stop`` (all of them when the sinks do not depend on the row)."""
    return sinks[:, :, start:stop] if per_token(sinks) else sinks


def to_blocks(sinks: torch.Tensor, bs: int, lq: int) -> torch.Tensor:
    """``(B|1, H|1, Lq|1)`` sinks as ``(B|1, H|1, nq|1, bs|1)`` for ``(B, H, nq, bs, ...)`` block layouts,
    per-token sinks padded with ``-inf`` (plain softmax) past the last row; differentiable."""
    if not per_token(sinks):
        return sinks.unsqueeze(-1)
    n = -(-lq // bs)
    padded = torch.nn.functional.pad(sinks, (0, n * bs - lq), value=_NEG_INF)
    return padded.view(*sinks.shape[:2], n, bs)


def real_share(lse: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """``f = sigmoid(lse - s)``, 0 where the row has no key (``lse = -inf``, also when ``s = -inf`` too)."""
    return torch.sigmoid(lse - s).masked_fill(lse == _NEG_INF, 0.0)


def joined(out: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor):
    """``(O_s, lse_s)`` from a path's ``(O, lse)`` without the sink: what its forward returns and saves.

    A row of ``lse = -inf`` takes none of the weight, so its ``O_s`` is 0 even where ``O`` is NaN (its allowed
    keys all scored ``-inf`` from infinite q or k: ``0 / 0`` without the sink, exactly 0 beside it, as the
    reference's softmax with the sink's term gives; RELIABILITY row 21).
    """
    s = per_row(sinks, lse)
    share = out * real_share(lse, s).unsqueeze(-1).to(out.dtype)
    return share.masked_fill((lse == _NEG_INF).unsqueeze(-1), 0.0), torch.logaddexp(lse, s.expand_as(lse))


def summed_to(grads: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """Per-row sink gradients ``(B, H, Lq, ...)`` summed to the sinks' shape ``(B|1, H|1, Lq|1)`` and dtype."""
    grad = grads.flatten(sinks.dim()).sum(-1) if grads.dim() > sinks.dim() else grads
    dims = [d for d in range(sinks.dim()) if sinks.shape[d] == 1 and grad.shape[d] != 1]
    return (grad.sum(dims, keepdim=True) if dims else grad).to(sinks.dtype)


def kernel_gradient(dout: torch.Tensor, out_s: torch.Tensor, lse_s: torch.Tensor, sinks: torch.Tensor,
                    dlse: torch.Tensor | None = None) -> torch.Tensor:
    """``ds`` of a call whose forward saved ``(O_s, lse_s)`` (see the module's docstring)."""
    s = per_row(sinks, lse_s)
    sink_share = torch.exp(s - lse_s).masked_fill(lse_s == _NEG_INF, 0.0)  # 1 - f
    delta = (dout.to(out_s.dtype) * out_s).sum(-1).to(lse_s.dtype)
    if dlse is not None:
        delta = delta - dlse
    return summed_to(-sink_share * delta, sinks)


class Join(torch.autograd.Function):
    """``(O, lse, sinks) -> (O_s, lse_s)`` with its exact backward (gradients for O, lse and the sinks).

    Upstream ``(dO_s, dlse_s)`` become ``dO = f dO_s`` and ``dlse = f (1 - f) rowsum(dO_s O) + f dlse_s``
    for the path below, and ``ds = -sum (1 - f)(f rowsum(dO_s O) - dlse_s)``; rows with no key (f = 0)
    pass nothing down, whatever the path's lse gradient would do there.
    """

    @staticmethod
    def forward(ctx, out, lse, sinks):
        ctx.save_for_backward(out, lse, sinks)
        return joined(out, lse, sinks)

    @staticmethod
    def backward(ctx, dout_s, dlse_s):
        out, lse, sinks = ctx.saved_tensors
        f = real_share(lse, per_row(sinks, lse))
        g = (dout_s.to(out.dtype) * out).sum(-1).to(lse.dtype)  # rowsum(dO_s O)
        dlse_s = torch.zeros_like(lse) if dlse_s is None else dlse_s
        kept = f * (1 - f) * g
        dout = dout_s * f.unsqueeze(-1).to(dout_s.dtype)
        return dout, kept + f * dlse_s, summed_to((1 - f) * dlse_s - kept, sinks)


def join(out: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor):
    """:class:`Join` applied: ``(O_s, lse_s)``, differentiable in ``out``, ``lse`` and ``sinks``."""
    return Join.apply(out, lse, sinks)
