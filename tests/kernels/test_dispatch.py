"""The dispatcher with symbolic sizes: no choice may read a size that torch traces as dynamic.

A traced comparison of a dynamic size becomes a guard: ``torch.export`` then refuses the
``Dim`` (its range no longer holds) and ``torch.compile(dynamic=True)`` recompiles per
size. The checks below fail on a dispatcher that decides on a size while tracing (the
``SMALL_SCORES`` rule pinned ``6 * L * L <= 65536``, so only L <= 104 exported).
"""

from __future__ import annotations

import torch

import attnkit
from attnkit import masks
from attnkit.kernels.dispatch import SMALL_SCORES, TRACING
from tests.helpers import assert_close_to_oracle, rand_qkv


class CausalAttention(torch.nn.Module):
    def forward(self, q, k, v):
        return attnkit.attention(q, k, v, mask=masks.causal())


class ExplainedCausalAttention(torch.nn.Module):
    """Records what explain() says while torch traces the call (in a list torch does not copy)."""

    def __init__(self, decisions: list):
        super().__init__()
        self.record = decisions.append

    def forward(self, q, k, v):
        self.record(attnkit.explain(q, k, v, mask=masks.causal()))
        return attnkit.attention(q, k, v, mask=masks.causal())


def test_export_with_a_dynamic_length_takes_the_traceable_path_and_explain_says_so():
    decisions = []
    module = ExplainedCausalAttention(decisions)
    length = torch.export.Dim("L", max=4096)
    q, k, v = rand_qkv(1, 2, 7, 7, 8, seed=1)
    exported = torch.export.export(module, (q, k, v), dynamic_shapes=({2: length},) * 3, strict=False)
    decision = decisions[-1]
    assert decision.path == "dense-reference" and decision.cost is None
    assert TRACING in decision.reasons["online-softmax"]
    assert "tracing: sizes symbolic" in str(decision) and "estimated cost: none" in str(decision)
    q, k, v = rand_qkv(1, 2, 300, 300, 8, seed=2)  # 2 * 300^2 > SMALL_SCORES: eager reads sizes here
    assert SMALL_SCORES < 2 * 300 * 300
    assert_close_to_oracle(exported.module()(q, k, v), q, k, v, mask=masks.causal())


def test_compile_with_dynamic_shapes_traces_one_graph_for_every_length():
    """A size read while tracing would add a guard, and a longer input would compile a second graph."""
    from torch._dynamo.testing import CompileCounter
    counter = CompileCounter()
    compiled = torch.compile(CausalAttention(), backend=counter, fullgraph=True, dynamic=True)
    for length in (7, 300, 600):
        q, k, v = rand_qkv(1, 2, length, length, 8, seed=length)
        got = compiled(q, k, v)
        torch.testing.assert_close(got, attnkit.attention(q, k, v, mask=masks.causal()), atol=2e-6, rtol=1e-5)
    assert counter.frame_count == 1


def test_concrete_sizes_keep_every_size_rule():
    """Eager calls never take the tracing branch: a small problem the reference, a large one the chunked path."""
    for length, path in ((20, "dense-reference"), (200, "online-softmax")):  # 2 * 200^2 > SMALL_SCORES
        q, k, v = rand_qkv(1, 2, length, length, 8, seed=length)
        decision = attnkit.explain(q, k, v, score="cosine")  # no torch kernel, no mask: only the size decides
        assert decision.path == path and decision.cost is not None
        assert TRACING not in str(decision)
