"""Shared by the benchmark tests: a tiny case with distinct sizes."""

from __future__ import annotations

from attnkit.lab.analysis.timing import Case


def tiny(mask="sliding_window(3, 2)", backward=False, **kw):
    return Case(batch=2, heads=3, q_len=40, head_dim=8, mask=mask, backward=backward, **kw)
