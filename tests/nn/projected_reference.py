"""Shared test helpers for projected multi-head attention layers, written once with plain torch ops.

A "projected" layer has ``q_proj``, ``k_proj``, ``v_proj`` and ``out_proj`` (nn.Linear, bias optional) and
``num_heads``; the float64 reference is softmax(q k^T / sqrt(d)) v per head over an ``allowed`` bool mask,
transcribed independently of attnkit's kernels.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

import attnkit

QKV = ("q_proj", "k_proj", "v_proj")


def seeded_input(*, b, n, dim, seed=0, dtype=torch.float64):
    """A seeded (b, n, dim) input, drawn in float64 and then cast to ``dtype``."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, n, dim, generator=g, dtype=torch.float64).to(dtype)


def seeded_layer(cls, *args, seed=0, **kwargs):
    """``cls(*args, **kwargs)`` in float64, its initial weights drawn after ``torch.manual_seed(seed)``."""
    torch.manual_seed(seed)
    return cls(*args, **kwargs).double()


def affine(module, t):
    """``module``'s weight and (optional) bias applied to ``t`` in ``t``'s dtype, detached from autograd."""
    bias = None if module.bias is None else module.bias.detach().to(t.dtype)
    return F.linear(t, module.weight.detach().to(t.dtype), bias)


def split_heads(t, h):
    """(b, n, h * d) -> (b, h, n, d)."""
    return t.unflatten(-1, (h, t.shape[-1] // h)).transpose(1, 2)


def merge_heads(t):
    """(b, h, n, d) -> (b, n, h * d)."""
    return t.transpose(1, 2).flatten(2)


def project_heads(layer, x, names=QKV):
    """The projections ``names`` of ``layer`` applied to ``x`` (b, n, dim), each split into (b, h, n, d)."""
    return tuple(split_heads(affine(getattr(layer, name), x), layer.num_heads) for name in names)


def softmax_attention(q, k, v, allowed=None):
    """softmax(q k^T / sqrt(d)) v per head; keys outside ``allowed`` get a score of -inf.

    ``allowed`` is None (every key) or a bool mask broadcastable to the scores (b, h, n, m):
    (n, m), (h, n, m), (b, h, n, m) or (b, 1, n, m).
    """
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.softmax(scores, -1) @ v


def output(layer, heads):
    """``layer.out_proj`` applied to the merged heads (b, h, n, d) -> (b, n, h * d)."""
    return affine(layer.out_proj, merge_heads(heads))


def reference(layer, x, allowed=None, dtype=torch.float64):
    """Multi-head softmax attention of ``layer`` over ``allowed``, computed in ``dtype`` (float64 by default).

    The number of heads is ``layer.num_heads``; ``allowed`` as in :func:`softmax_attention`.
    """
    x = x.detach().to(dtype)
    return output(layer, softmax_attention(*project_heads(layer, x), allowed))


def record_backends(monkeypatch, module):
    """Spy on ``module.attention``: the returned list gets (query length, chosen backend) for every call."""
    seen = []
    real = module.attention

    def spy(q, k, v, **kwargs):
        seen.append((q.shape[2], attnkit.explain(q, k, v, **kwargs).backend))
        return real(q, k, v, **kwargs)

    monkeypatch.setattr(module, "attention", spy)
    return seen


def run_with_grad(layer, shape, **kwargs):
    """Run ``layer`` on a fresh float64 input of ``shape`` that requires grad and backpropagate its sum.

    Returns (x, out); ``x.grad`` holds the gradient.
    """
    x = torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    out = layer(x, **kwargs)
    out.sum().backward()
    return x, out
