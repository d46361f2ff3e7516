"""Float64 transcriptions of the linear-recurrent layers' equations, from their parameters (no attnkit code).

The recurrence is :func:`tests.functional.recurrences.cases.oracle` (token by token, explicit matrices).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tests.functional.recurrences.cases import oracle

__all__ = ["oracle", "heads", "merge", "causal_conv", "rms", "unit", "linear", "assert_every_form",
           "assert_same_gradients"]


def linear(x, layer):
    """``x W^T (+ b)`` of a torch Linear, in float64."""
    out = x.double() @ layer.weight.double().T
    return out if layer.bias is None else out + layer.bias.double()


def heads(t, h):
    """(b, n, h*d) -> (b, h, n, d)."""
    b, n, _ = t.shape
    return t.reshape(b, n, h, -1).permute(0, 2, 1, 3)


def merge(t):
    """(b, h, n, d) -> (b, n, h*d)."""
    b, h, n, d = t.shape
    return t.permute(0, 2, 1, 3).reshape(b, n, h * d)


def causal_conv(x, weight, bias=None):
    """silu(depthwise causal convolution) of (b, n, c) with weight (c, 1, kernel), written as a sum of shifts."""
    kernel = weight.shape[-1]
    out = torch.zeros_like(x, dtype=torch.float64)
    for i in range(kernel):  # tap i reads the input i steps back
        shifted = F.pad(x.double(), (0, 0, i, 0))[:, : x.shape[1]]
        out = out + shifted * weight[:, 0, kernel - 1 - i].double()
    return F.silu(out if bias is None else out + bias.double())


def rms(t, eps):
    return t / (t.pow(2).mean(-1, keepdim=True) + eps).sqrt()


def unit(t):
    return t / (t.pow(2).sum(-1, keepdim=True) + 1e-6).sqrt()


def assert_every_form(layer, x, want) -> None:
    """``layer(x, form=...)`` equals ``want`` (1e-10) in the parallel, chunk and recurrent forms."""
    for form in ("parallel", "chunk", "recurrent"):
        torch.testing.assert_close(layer(x, form=form), want, rtol=0, atol=1e-10)


def assert_same_gradients(layer, x, transcription, form: str = "chunk") -> None:
    """The gradients of ``sum(w * out)`` for the input and every parameter: ``layer(x, form=form)`` against the
    float64 ``transcription(layer, x)`` differentiated by autograd (1e-10)."""
    w = torch.randn(*x.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    leaves = [x.clone().requires_grad_(), *layer.parameters()]
    ours = torch.autograd.grad((layer(leaves[0], form=form) * w).sum(), leaves, allow_unused=True)
    theirs = torch.autograd.grad((transcription(layer, leaves[0]) * w).sum(), leaves, allow_unused=True)
    for a, b in zip(ours, theirs, strict=True):
        if a is None or b is None:
            assert a is None or not a.any()
            assert b is None or not b.any()
        else:
            torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
