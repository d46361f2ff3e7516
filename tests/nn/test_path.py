"""The PaTH layer against a float64 transcription of its equations (Yang et al. 2025, arXiv:2505.16381): the
parallel form, decoding step by step with the reflected key cache, gradients."""

import pytest
import torch
import torch.nn.functional as F

from attnkit.errors import ArgumentError, DTypeError
from attnkit.functional.path import CHUNK_FROM
from attnkit.nn import ForgetCache, PaTHAttention
from attnkit.registry import get

from ..functional.test_path import oracle

TOL = dict(rtol=0, atol=1e-10)


def _layer(kv_heads=2, forget_gate=True, **options):
    torch.manual_seed(0)
    layer = PaTHAttention(12, 4, num_kv_heads=kv_heads, forget_gate=forget_gate, **options).double()
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return layer


def _path(layer, x):
    """Projections, w = l2norm(x W_w), beta = 2 sigmoid(x W_beta + b), gates log sigmoid(x W_f + b_f), the oracle."""
    def heads(t, n):
        return t.unflatten(-1, (n, 3)).transpose(1, 2)
    g = layer.num_kv_heads
    q, k, v, w = (heads(x @ p.weight.T, n) for p, n in ((layer.q_proj, 4), (layer.k_proj, g), (layer.v_proj, g),
                                                          (layer.w_proj, g)))
    w = w / w.norm(dim=-1, keepdim=True)
    beta = 2 * torch.sigmoid(x @ layer.beta_proj.weight.T + layer.beta_proj.bias).transpose(1, 2)
    log_f = None
    if layer.fgate_proj is not None:
        log_f = torch.log(torch.sigmoid(x @ layer.fgate_proj.weight.T + layer.fgate_proj.bias)).transpose(1, 2)
    return oracle(q, k, v, w, beta, log_f).transpose(1, 2).flatten(2) @ layer.out_proj.weight.T


@pytest.mark.parametrize("form", ["parallel", "chunk"])
@pytest.mark.parametrize(("kv_heads", "forget_gate"), [(4, False), (2, True), (1, True)])
def test_matches_the_papers_equations_forward_and_backward(kv_heads, forget_gate, form):
    layer = _layer(kv_heads, forget_gate, form=form, chunk_size=3)
    x = torch.randn(2, 8, 12, dtype=torch.float64, requires_grad=True)
    out, want = layer(x), _path(layer, x)
    torch.testing.assert_close(out, want, **TOL)
    w = torch.randn_like(out)
    got = torch.autograd.grad((out * w).sum(), [x, *layer.parameters()])
    expected = torch.autograd.grad((want * w).sum(), [x, *layer.parameters()])
    for a, e in zip(got, expected, strict=True):
        torch.testing.assert_close(a, e, **TOL)


@pytest.mark.parametrize("form", ["parallel", "chunk"])
@pytest.mark.parametrize("forget_gate", [False, True])
def test_decoding_step_by_step_equals_the_prefill(forget_gate, form):
    layer, x = _layer(forget_gate=forget_gate, form=form, chunk_size=4), torch.randn(2, 10, 12, dtype=torch.float64)
    full = layer(x)
    cache = layer.new_cache(2, 10)
    parts = [layer(x[:, :4], cache=cache)] + [layer(x[:, t:t + 1], cache=cache) for t in range(4, 10)]
    torch.testing.assert_close(torch.cat(parts, 1), full, **TOL)
    assert len(cache) == 10


def test_decoding_with_gradients_equals_the_prefill():
    layer = _layer()
    x = torch.randn(1, 6, 12, dtype=torch.float64, requires_grad=True)
    cache = layer.new_cache(1, 6)
    steps = torch.cat([layer(x[:, t:t + 1], cache=cache) for t in range(6)], 1)
    torch.testing.assert_close(torch.autograd.grad(steps.sum(), x)[0], torch.autograd.grad(layer(x).sum(), x)[0],
                               **TOL)


def test_a_cache_without_reflections_is_refused():
    layer = _layer()
    with pytest.raises(DTypeError, match="cache must be a PathCache"):
        layer(torch.randn(1, 2, 12, dtype=torch.float64), cache=ForgetCache(1, 4, 2, 3, 4, dtype=torch.float64))


def test_bad_form_and_chunk_size_are_refused():
    with pytest.raises(ArgumentError, match="form must be 'auto', 'parallel' or 'chunk'"):
        PaTHAttention(12, 4, form="recurrent")
    with pytest.raises(ArgumentError, match="chunk_size must be an int >= 1"):
        PaTHAttention(12, 4, form="chunk", chunk_size=0)
    assert "form='chunk', chunk_size=5" in repr(PaTHAttention(12, 4, form="chunk", chunk_size=5))


@pytest.mark.parametrize("length", [CHUNK_FROM - 1, CHUNK_FROM])
def test_the_default_form_is_auto_and_equals_both_explicit_forms(length):
    layer = _layer(kv_heads=1)
    assert layer.form == "auto" and "form='auto'" in repr(layer)
    x = torch.randn(1, length, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(length))
    out = layer(x)
    for form in ("parallel", "chunk"):
        layer.form = form
        torch.testing.assert_close(layer(x), out, **TOL)
    runs = "chunk" if length >= CHUNK_FROM else "parallel"
    layer.form = runs
    assert torch.equal(layer(x), out)


def test_registry_entry_runs_its_example():
    module, inputs = get("path-attention").example()
    assert isinstance(module, PaTHAttention) and module(*inputs).shape == inputs[0].shape
    assert torch.isfinite(F.normalize(module(*inputs), dim=-1)).all()
