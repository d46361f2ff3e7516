"""The FoX layer against a float64 transcription of its equations (Lin et al. 2025, arXiv:2503.02130, eq. 3-5):
prefill, decoding step by step, padding, gradients."""

import pytest
import torch

from attnkit.errors import DTypeError
from attnkit.nn import ForgettingAttention, KVCache
from attnkit.registry import get

from ..functional.test_forgetting import oracle

TOL = dict(rtol=0, atol=1e-10)


def _layer(kv_heads=2):
    torch.manual_seed(0)
    layer = ForgettingAttention(12, 4, num_kv_heads=kv_heads, bias=True).double()
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return layer


def _fox(layer, x):
    """The layer's equations written out: projections, per-head gates f = sigmoid(x w_f + b_f), the oracle."""
    def heads(t, n):
        return t.unflatten(-1, (n, 3)).transpose(1, 2)
    q = heads(x @ layer.q_proj.weight.T + layer.q_proj.bias, 4)
    k = heads(x @ layer.k_proj.weight.T + layer.k_proj.bias, layer.num_kv_heads)
    v = heads(x @ layer.v_proj.weight.T + layer.v_proj.bias, layer.num_kv_heads)
    log_f = torch.log(torch.sigmoid(x @ layer.fgate_proj.weight.T + layer.fgate_proj.bias)).transpose(1, 2)
    out = oracle(q, k, v, log_f).transpose(1, 2).flatten(2)
    return out @ layer.out_proj.weight.T + layer.out_proj.bias


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_matches_the_papers_equations_forward_and_backward(kv_heads):
    layer = _layer(kv_heads)
    x = torch.randn(2, 11, 12, dtype=torch.float64, requires_grad=True)
    out, want = layer(x), _fox(layer, x)
    torch.testing.assert_close(out, want, **TOL)
    w = torch.randn_like(out)
    got = torch.autograd.grad((out * w).sum(), [x, *layer.parameters()])
    expected = torch.autograd.grad((want * w).sum(), [x, *layer.parameters()])
    for a, e in zip(got, expected, strict=True):
        torch.testing.assert_close(a, e, **TOL)


def test_decoding_step_by_step_equals_the_prefill():
    layer, x = _layer(), torch.randn(2, 11, 12, dtype=torch.float64)
    full = layer(x)
    cache = layer.new_cache(2, 11)
    parts = [layer(x[:, :4], cache=cache)] + [layer(x[:, t:t + 1], cache=cache) for t in range(4, 11)]
    torch.testing.assert_close(torch.cat(parts, 1), full, **TOL)
    assert len(cache) == 11


def test_decoding_with_gradients_equals_the_prefill():
    layer = _layer()
    x = torch.randn(1, 6, 12, dtype=torch.float64, requires_grad=True)
    cache = layer.new_cache(1, 6)
    steps = torch.cat([layer(x[:, t:t + 1], cache=cache) for t in range(6)], 1)
    torch.testing.assert_close(torch.autograd.grad(steps.sum(), x)[0], torch.autograd.grad(layer(x).sum(), x)[0],
                               **TOL)


def test_left_padding_is_inert():
    layer, x = _layer(), torch.randn(2, 9, 12, dtype=torch.float64)
    keep = torch.tensor([[False] * 3 + [True] * 6, [True] * 9])
    padded = layer(x, key_keep_mask=keep)
    torch.testing.assert_close(padded[0, 3:], layer(x[:1, 3:])[0], **TOL)
    torch.testing.assert_close(padded[1], layer(x[1:])[0], **TOL)


def test_a_plain_kv_cache_is_refused():
    layer = _layer()
    with pytest.raises(DTypeError, match="cache must be a ForgetCache"):
        layer(torch.randn(1, 2, 12, dtype=torch.float64), cache=KVCache(1, 4, 2, 3, dtype=torch.float64))


def test_registry_entry_runs_its_example():
    module, inputs = get("forgetting-attention").example()
    assert isinstance(module, ForgettingAttention) and module(*inputs).shape == inputs[0].shape
