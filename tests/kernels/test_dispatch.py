"""kernels/dispatch.py: no choice reads a size torch traces as dynamic; execute() joins an output no input
produced to autograd; meta tensors give shapes.

A traced comparison of a dynamic size becomes a guard: ``torch.export`` then refuses the
``Dim`` (its range no longer holds) and ``torch.compile(dynamic=True)`` recompiles per
size. The symbolic-size checks fail on a dispatcher that decides on a size while tracing (the
``SMALL_SCORES`` rule pinned ``6 * L * L <= 65536``, so only L <= 104 exported).
"""

from __future__ import annotations

import re

import pytest
import torch

import attnkit
import attnkit.nn as N
from attnkit import masks
from attnkit.bias import softcap
from attnkit.errors import BackendError
from attnkit.kernels.custom_op import OPERATOR, RUN_TIME
from attnkit.kernels.dispatch import SMALL_SCORES, TRACING
from tests.helpers import BACKENDS, assert_close_to_oracle, rand_qkv


class CausalAttention(torch.nn.Module):
    def forward(self, q, k, v):
        return attnkit.attention(q, k, v, mask=masks.causal())


class ExplainedAttention(torch.nn.Module):
    """Records what explain() says while torch traces the call (in a list torch does not copy)."""

    def __init__(self, decisions: list, **kwargs):
        super().__init__()
        self.record, self.kwargs = decisions.append, kwargs

    def forward(self, q, k, v):
        self.record(attnkit.explain(q, k, v, **self.kwargs))
        return attnkit.attention(q, k, v, **self.kwargs)


def _export_dynamic(**kwargs):
    decisions = []
    length = torch.export.Dim("L", max=4096)
    q, k, v = rand_qkv(1, 2, 7, 7, 8, seed=1)
    exported = torch.export.export(ExplainedAttention(decisions, **kwargs), (q, k, v),
                                   dynamic_shapes=({2: length},) * 3, strict=False)
    return exported, decisions[-1]


def _dot(q, k):
    return q @ k.transpose(-1, -2)


def test_export_with_a_dynamic_length_takes_the_traceable_path_and_explain_says_so():
    """A call the custom operator cannot take (a score function) is traced on the dense exact path, reading no size."""
    kwargs = dict(mask=masks.causal(), score=_dot)
    exported, decision = _export_dynamic(**kwargs)
    assert decision.path == "dense-reference" and decision.cost is None
    assert TRACING in decision.reasons["online-softmax"]
    assert "tracing: sizes symbolic" in str(decision) and "estimated cost: none" in str(decision)
    q, k, v = rand_qkv(1, 2, 300, 300, 8, seed=2)  # 2 * 300^2 > SMALL_SCORES: eager reads sizes here
    assert SMALL_SCORES < 2 * 300 * 300
    assert_close_to_oracle(exported.module()(q, k, v), q, k, v, **kwargs)


@pytest.mark.parametrize("kwargs", [dict(mask=masks.causal()), dict(mask=masks.causal(), bias=softcap(5.0))],
                         ids=["causal", "softcap"])
def test_export_with_a_dynamic_length_keeps_the_operator_and_explain_says_so(kwargs):
    exported, decision = _export_dynamic(**kwargs)
    assert decision.path == RUN_TIME and decision.cost is None  # every rule reads a size: none is read
    assert OPERATOR in decision.compiled
    q, k, v = rand_qkv(1, 2, 300, 300, 8, seed=2)
    assert_close_to_oracle(exported.module()(q, k, v), q, k, v, **kwargs)


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


EMPTY_CALLS = {
    # an empty block layout: a window no key falls in, negated twice over
    "empty layout, soft-cap": dict(mask=~(masks.sliding_window(12, 69) & masks.sliding_window(12, 69)),
                                   bias=softcap(5.0)),
    "all-False mask, sparsemax": dict(mask=torch.zeros(2, 2, dtype=torch.bool), normalize="sparsemax"),
    "all-False mask, softmax": dict(mask=torch.zeros(2, 2, dtype=torch.bool)),
    "all-False mask, learned bias": dict(mask=torch.zeros(2, 2, dtype=torch.bool),
                                         bias=torch.zeros(2, 2, requires_grad=True)),
}


@pytest.mark.parametrize("backend", ("auto", *BACKENDS))
@pytest.mark.parametrize("name", list(EMPTY_CALLS))
def test_a_call_with_no_allowed_key_has_zero_gradients(name, backend):
    kwargs = EMPTY_CALLS[name]
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 2, 33, generator=g, requires_grad=True)
    k, v = (torch.randn(1, 2, 2, 33, generator=g, requires_grad=True) for _ in range(2))
    try:
        out = attnkit.attention(q, k, v, backend=backend, **kwargs)
    except BackendError:
        assert backend != "auto"  # a forced backend that cannot honour the call says so, and nothing else
        return
    assert out.requires_grad and torch.equal(out, torch.zeros_like(out))
    inputs = [q, k, v] + ([kwargs["bias"]] if isinstance(kwargs.get("bias"), torch.Tensor) else [])
    grads = torch.autograd.grad((out * torch.randn(out.shape, generator=g)).sum(), inputs)
    for t, grad in zip(inputs, grads, strict=True):
        assert grad.shape == t.shape and torch.equal(grad, torch.zeros_like(grad))


def test_the_link_to_autograd_reads_no_value():
    # NaN in an input the mask hides from every query: the zero output and zero gradients stay NaN-free
    q = torch.full((1, 1, 3, 4), float("nan"), requires_grad=True)
    out = attnkit.attention(q, q, q, mask=torch.zeros(3, 3, dtype=torch.bool))
    (grad,) = torch.autograd.grad(out.sum(), [q])
    assert torch.equal(out, torch.zeros_like(out)) and torch.equal(grad, torch.zeros_like(grad))


META_CALLS = {
    "no mask": {},
    "causal": dict(mask=masks.causal()),
    "window and global tokens": dict(mask=(masks.causal() & masks.sliding_window(2)) | masks.global_tokens([1])),
    "padding": dict(mask=masks.padding([3, 7])),
    "bool tensor": dict(mask=torch.ones(5, 7, dtype=torch.bool, device="meta")),
    "bias tensor": dict(bias=torch.zeros(5, 7, device="meta")),
    "ALiBi": dict(bias=attnkit.bias.alibi(4)),
    "sparsemax": dict(normalize="sparsemax"),
}


@pytest.mark.parametrize("backend", ("auto", *BACKENDS))
@pytest.mark.parametrize("name", list(META_CALLS))
def test_meta_tensors_give_meta_results_of_the_right_shape(name, backend):
    q = torch.empty(2, 4, 5, 8, device="meta", requires_grad=True)
    k, v = torch.empty(2, 2, 7, 8, device="meta"), torch.empty(2, 2, 7, 6, device="meta")
    softmax = META_CALLS[name].get("normalize", "softmax") == "softmax"
    res = attnkit.attention(q, k, v, backend=backend, return_weights=True, return_lse=softmax, **META_CALLS[name])
    assert res.output.device.type == "meta" and res.output.shape == (2, 4, 5, 6)
    assert res.output.dtype == torch.float32 and res.output.requires_grad
    assert res.weights.shape == (2, 4, 5, 7)
    assert not softmax or res.lse.shape == (2, 4, 5)
    assert attnkit.explain(q, k, v, backend=backend, **META_CALLS[name]).path == "dense-reference"


def test_meta_inputs_of_every_rank():
    for shape in ((5, 8), (2, 5, 8)):
        q = torch.empty(shape, device="meta", dtype=torch.bfloat16)
        out = attnkit.attention(q, q, q, mask=masks.causal())
        assert out.shape == shape and out.device.type == "meta" and out.dtype == torch.bfloat16


def test_modules_built_on_the_meta_device_give_meta_outputs():
    x = torch.empty(2, 5, 16, device="meta")
    keep = torch.ones(2, 5, dtype=torch.bool, device="meta")
    mha = N.MultiHeadAttention(16, 4, batch_first=True, device="meta")
    for out in (mha(x, x, x)[0], mha(x, x, x, key_padding_mask=~keep, need_weights=False)[0],
                N.PerformerAttention(16, 4).to("meta")(x, key_keep_mask=keep),
                N.PerceiverAttention(16, num_heads=2, head_dim=4).to("meta")(x, context_keep_mask=keep)):
        assert out.device.type == "meta" and out.shape == (2, 5, 16)


def test_the_explanation_says_none_for_a_path_that_holds_no_extra_memory():
    q = torch.randn(1, 2, 64, 8)
    text = str(attnkit.explain(q, q, q, mask=masks.causal()))
    assert "estimated extra memory: none beyond the inputs and the output" in text and "0.0 MiB" not in text
    chunked = str(attnkit.explain(q, q, q, backend="reference"))  # the reference path holds the scores
    assert re.search(r"estimated extra memory: \d+\.\d (KiB|MiB)$", chunked), chunked


# ------------------------------------------------------------------ padded keys, read as the mask's data
def _selected_oracle(q, k, v, idx, causal: bool, length: int):
    """float64 softmax attention over each query's selected keys (``idx (Lq, n)``), ``j <= i`` when ``causal``,
    ``j < length``; a row with no key gives 0. Written here: no attnkit code."""
    lq, lk = q.shape[2], k.shape[2]
    allowed = torch.zeros(lq, lk, dtype=torch.bool)
    allowed[torch.arange(lq)[:, None].expand_as(idx), idx] = True
    i, j = torch.arange(lq)[:, None], torch.arange(lk)[None, :]
    allowed &= (j < length) & ((j <= i) if causal else True)
    scores = (q.double() @ k.double().transpose(-1, -2)) / q.shape[-1] ** 0.5
    weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1).nan_to_num(0.0)
    return weights @ v.double().nan_to_num(0.0)  # padded V rows never count (their weight is 0)


@pytest.mark.parametrize("causal", [False, True])
def test_a_selected_mask_with_padding_still_has_its_padded_keys_zeroed(causal):
    """execute() reads ``Mask.pads_keys`` instead of asking the mask for its key padding each call: a mask with a
    padding part still gets its padded K/V rows zeroed (NaN there never leaks, RELIABILITY row 22)."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 12, 8, generator=g) for _ in range(3))
    idx = torch.randint(0, 12, (12, 4), generator=g)
    mask = masks.selected_keys(idx) & masks.padding([9])
    mask = mask & masks.causal() if causal else mask
    assert mask.pads_keys
    bad_k, bad_v = k.clone(), v.clone()
    bad_k[:, :, 9:], bad_v[:, :, 9:] = float("nan"), float("nan")
    for _ in range(2):  # the second call reads pads_keys as data
        out = attnkit.attention(q, bad_k, bad_v, mask=mask)
        torch.testing.assert_close(out.double(), _selected_oracle(q, k, v, idx, causal, 9), rtol=1e-5, atol=1e-5)


def test_a_mask_without_key_padding_is_not_asked_for_it_again(monkeypatch):
    g = torch.Generator().manual_seed(4)
    q = torch.randn(1, 2, 64, 8, generator=g)
    idx = torch.randint(0, 64, (64, 8), generator=g)
    mask = masks.selected_keys(idx) & masks.causal()
    first = attnkit.attention(q, q, q, mask=mask)
    assert not mask.pads_keys
    monkeypatch.setattr(type(mask), "key_padding", lambda self: pytest.fail("the mask was asked for its padding"))
    assert torch.equal(attnkit.attention(q, q, q, mask=mask), first)
    torch.testing.assert_close(first.double(), _selected_oracle(q, q, q, idx, True, 64), rtol=1e-5, atol=1e-5)
