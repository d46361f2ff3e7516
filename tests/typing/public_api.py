"""Checked by mypy in ``make lint``: the public API's types as a user sees them (nothing here runs)."""

from __future__ import annotations

from typing import assert_type

import torch

import attnkit
from attnkit import masks
from attnkit.core import AttentionOutput
from attnkit.kernels.dispatch import Decision


def check_public_api() -> None:
    """Never called: mypy reads it."""
    q = k = v = torch.randn(2, 4, 16, 8)
    assert_type(attnkit.attention(q, k, v), torch.Tensor)
    assert_type(attnkit.attention(q, k, v, mask=masks.causal() & masks.sliding_window(4)), torch.Tensor)
    assert_type(attnkit.attention(q, k, v, return_lse=True), torch.Tensor | AttentionOutput)
    assert_type(attnkit.explain(q, k, v, mask=masks.causal()), Decision)
    decision = attnkit.explain(q, k, v)
    assert_type(decision.path, str)
    attnkit.attention(q, k, v, mask=3)  # type: ignore[call-overload]  # a mask is a Mask, a bool tensor or None
    attnkit.attention(q, k, v, scale="big")  # type: ignore[call-overload]
