"""RWKV4TimeMixing: RWKV-4's time mixing, equal to transformers' layer and to a float64 transcription of the paper."""

import pytest
import torch

from attnkit.errors import DTypeError
from attnkit.nn import RWKV4TimeMixing

from .transformers_layers import rwkv_layer

FORMS = ("chunk", "recurrent", "parallel")


def _transcription(layer: RWKV4TimeMixing, x):
    """Float64, eq. 11-16 as written: the token shift, then each WKV_t as its two sums over j < t plus the bonus."""
    x = x.double()
    p = {k: v.double() for k, v in layer.named_parameters()}
    shifted = torch.cat([torch.zeros_like(x[:, :1]), x[:, :-1]], 1)
    mix = lambda mu: x * mu + shifted * (1 - mu)
    r = torch.sigmoid(mix(p["time_mix_receptance"]) @ p["receptance.weight"].T)
    k, v = mix(p["time_mix_key"]) @ p["key.weight"].T, mix(p["time_mix_value"]) @ p["value.weight"].T
    w, u = p["time_decay"].exp(), p["time_first"]
    wkv = []
    for t in range(x.shape[1]):
        weights = [torch.exp(-(t - 1 - j) * w + k[:, j]) for j in range(t)] + [torch.exp(u + k[:, t])]
        weights = torch.stack(weights, 1)  # (B, t + 1, C)
        wkv.append((weights * v[:, :t + 1]).sum(1) / weights.sum(1))
    return (r * torch.stack(wkv, 1)) @ p["output.weight"].T


def test_from_transformers_reproduces_prefill_in_every_form():
    theirs, _ = rwkv_layer()
    mine = RWKV4TimeMixing.from_transformers(theirs)
    x = torch.randn(2, 70, 16, generator=torch.Generator().manual_seed(1))  # two blocks of 64, the last cut
    with torch.no_grad():
        want = theirs(x)[0]
        for form in FORMS:
            torch.testing.assert_close(mine(x, form=form), want, rtol=1e-5, atol=1e-5)


def test_from_transformers_reproduces_decoding_with_transformers_state():
    theirs, config = rwkv_layer()
    mine = RWKV4TimeMixing.from_transformers(theirs)
    x = torch.randn(1, 11, 16, generator=torch.Generator().manual_seed(2))  # one sequence, as its state is read
    layers, inner = config.num_hidden_layers, theirs.attention_hidden_size
    state = [torch.zeros(1, 16, layers), torch.zeros(1, 16, layers), torch.zeros(1, inner, layers),
             torch.zeros(1, inner, layers), torch.full((1, inner, layers), -1e38)]  # as RwkvModel starts it
    with torch.no_grad():
        want = [theirs(x[:, :6], state=state, use_cache=True)[0]]
        want += [theirs(x[:, t:t + 1], state=state, use_cache=True)[0] for t in range(6, 11)]
        cache = mine.new_cache()
        got = [mine(x[:, :6], cache=cache)] + [mine.forward_step(x[:, t], cache)[:, None] for t in range(6, 11)]
    torch.testing.assert_close(torch.cat(got, 1), torch.cat(want, 1), rtol=1e-5, atol=1e-5)


def test_equals_the_papers_equations_in_float64_in_every_form():
    torch.manual_seed(0)
    layer = RWKV4TimeMixing(8, attention_dim=6, chunk_size=4).double()
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    x = torch.randn(2, 13, 8, dtype=torch.float64)
    want = _transcription(layer, x)
    for form in FORMS:
        torch.testing.assert_close(layer(x, form=form), want, rtol=0, atol=1e-10)
    cache = layer.new_cache()
    steps = [layer(x[:, :5], cache=cache)] + [layer.forward_step(x[:, t], cache)[:, None] for t in range(5, 13)]
    torch.testing.assert_close(torch.cat(steps, 1), want, rtol=0, atol=1e-10)


def test_gradients_equal_the_transcriptions():
    torch.manual_seed(1)
    layer = RWKV4TimeMixing(6, chunk_size=3).double()
    x = torch.randn(2, 7, 6, dtype=torch.float64, requires_grad=True)
    params = [x, layer.time_decay, layer.time_first, layer.time_mix_key, layer.key.weight]
    got = torch.autograd.grad(layer(x).square().sum(), params)
    want = torch.autograd.grad(_transcription(layer, x).square().sum(), params)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-10)


def test_from_transformers_refuses_other_layers():
    with pytest.raises(DTypeError, match="takes an RwkvSelfAttention; got Linear"):
        RWKV4TimeMixing.from_transformers(torch.nn.Linear(2, 2))
