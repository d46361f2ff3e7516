"""Export with any length: ``torch.export`` / ONNX graphs with a dynamic sequence length, exact at every length.

One program is exported at L = 7 with ``Dim("L", max=4096)`` and run at L = 7, 300 and
2048: against the eager call, and against a float64 answer that shares no code with
attnkit (tests/oracle.py for attention, ``torch.nn.MultiheadAttention`` in float64 for
the module).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import attnkit
from attnkit import masks
from attnkit.nn.multihead import MultiHeadAttention
from tests.helpers import assert_close_to_oracle, rand_qkv

LENGTHS = (7, 300, 2048)
E, H, N = 24, 3, 2  # head_dim 8
MAX_LEN = 4096


class CausalAttention(nn.Module):
    def forward(self, q, k, v):
        return attnkit.attention(q, k, v, mask=masks.causal())


class CausalSelfAttention(nn.Module):
    """attnkit's MultiHeadAttention as a causal self-attention layer (batch first)."""

    def __init__(self, mha: MultiHeadAttention):
        super().__init__()
        self.mha = mha

    def forward(self, x, key_padding_mask):
        return self.mha(x, x, x, key_padding_mask=key_padding_mask, need_weights=False, is_causal=True)[0]


def _length():
    return torch.export.Dim("L", max=MAX_LEN)


def _qkv(length):
    return rand_qkv(1, 2, length, length, 8, seed=length)


def _mha_pair():
    """attnkit's module in float32 and torch's in float64, with the same random weights (biases included)."""
    torch.manual_seed(0)
    theirs = nn.MultiheadAttention(E, H, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        for p in theirs.parameters():
            p.normal_(0, 0.3)
    ours = MultiHeadAttention.from_torch(theirs).float().eval()
    return ours, theirs.eval()


def _mha_inputs(length):
    g = torch.Generator().manual_seed(length)
    x = torch.randn(N, length, E, generator=g)
    pad = torch.zeros(N, length, dtype=torch.bool)
    pad[1, length - length // 3:] = True  # the second sequence is shorter
    return x, pad


def _torch_float64(theirs, x, pad):
    causal = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).triu(1)
    return theirs(x.double(), x.double(), x.double(), key_padding_mask=pad, attn_mask=causal, need_weights=False)[0]


def _check_mha(run, ours, theirs):
    for length in LENGTHS:
        x, pad = _mha_inputs(length)
        got, eager = run(x, pad), CausalSelfAttention(ours)(x, pad)
        torch.testing.assert_close(got, eager, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got.double(), _torch_float64(theirs, x, pad), atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def exported_attention():
    length = _length()
    return torch.export.export(CausalAttention(), _qkv(7), dynamic_shapes=({2: length},) * 3)


def test_exported_causal_attention_is_exact_at_every_length(exported_attention):
    run = exported_attention.module()
    for length in LENGTHS:
        q, k, v = _qkv(length)
        got = run(q, k, v)
        torch.testing.assert_close(got, attnkit.attention(q, k, v, mask=masks.causal()), atol=2e-6, rtol=1e-5)
        assert_close_to_oracle(got, q, k, v, mask=masks.causal())


def test_an_export_under_no_grad_keeps_the_operator_and_is_exact():
    """Inference export (grad mode off) holds attnkit's operator, as with gradients: no CPU-only kernel and no
    branch on the data in the program (it may run on another device)."""
    with torch.no_grad():
        program = torch.export.export(CausalAttention(), _qkv(7), dynamic_shapes=({2: _length()},) * 3)
    targets = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    assert "attnkit.attention.default" in targets
    assert not any("flash_attention_for_cpu" in t or "cond" in t for t in targets)
    for length in LENGTHS[:2]:
        q, k, v = _qkv(length)
        got = program.module()(q, k, v)
        torch.testing.assert_close(got, attnkit.attention(q, k, v, mask=masks.causal()), atol=2e-6, rtol=1e-5)


def test_the_exported_length_keeps_its_whole_range(exported_attention):
    """No guard narrowed the length: the program accepts every L up to the Dim's maximum."""
    ranges = list(exported_attention.range_constraints.values())
    assert ranges and all(r.upper == MAX_LEN for r in ranges)


def test_exported_multi_head_attention_is_exact_at_every_length():
    ours, theirs = _mha_pair()
    length = _length()
    x, pad = _mha_inputs(7)
    program = torch.export.export(CausalSelfAttention(ours), (x, pad), dynamic_shapes=({1: length}, {1: length}))
    _check_mha(program.module(), ours, theirs)


def _onnx_session(module, args, dynamic_shapes, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    program = torch.onnx.export(module, args, dynamo=True, dynamic_shapes=dynamic_shapes, verbose=False)
    path = tmp_path / "model.onnx"
    program.save(str(path))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    return lambda *tensors: torch.from_numpy(session.run(None, dict(zip(names, (t.numpy() for t in tensors),
                                                                         strict=True)))[0])


def test_onnx_export_of_causal_attention_runs_in_onnxruntime_at_every_length(tmp_path):
    length = _length()
    run = _onnx_session(CausalAttention(), _qkv(7), ({2: length},) * 3, tmp_path)
    for n in LENGTHS:
        q, k, v = _qkv(n)
        got = run(q, k, v)
        torch.testing.assert_close(got, attnkit.attention(q, k, v, mask=masks.causal()), atol=2e-6, rtol=1e-5)
        assert_close_to_oracle(got, q, k, v, mask=masks.causal())


@pytest.mark.slow
def test_onnx_export_of_multi_head_attention_runs_in_onnxruntime_at_every_length(tmp_path):
    ours, theirs = _mha_pair()
    length = _length()
    run = _onnx_session(CausalSelfAttention(ours), _mha_inputs(7), ({1: length}, {1: length}), tmp_path)
    _check_mha(run, ours, theirs)


@pytest.mark.slow
def test_compile_fullgraph_dynamic_matches_eager_at_every_length():
    """Inductor, one dynamic graph: the same module as exported above."""
    ours, theirs = _mha_pair()
    compiled = torch.compile(CausalSelfAttention(ours), fullgraph=True, dynamic=True)
    _check_mha(compiled, ours, theirs)
