"""What every linear-recurrent layer promises (nn/_recurrent.py): one function in every form, decoding equal to
the full pass, padded positions inert, state_dict round trips and named errors."""

from __future__ import annotations

import pytest
import torch

from attnkit.errors import ArgumentError, DTypeError, ShapeError, UnsupportedFeature
from attnkit.nn import GatedDeltaNet, Mamba2Mixer, RecurrentCache
from attnkit.nn._recurrent_parts import GatedRMSNorm, ShortConvolution

from .recurrent_layers import DIM, LAYERS, OWN_RECURRENCE
from .recurrent_layers import layer as _layer

TOL = dict(rtol=0, atol=1e-10)


def _x(b=2, n=11, seed=1):
    return torch.randn(b, n, DIM, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("name", LAYERS)
def test_every_form_computes_the_same_layer_and_gradients(name):
    layer, x = _layer(name), _x()
    w = torch.randn_like(x)
    results = []
    for form in ("parallel", "chunk", "recurrent"):
        inp = x.clone().requires_grad_()
        out = layer(inp, form=form)
        grads = torch.autograd.grad((out * w).sum(), [inp, *layer.parameters()])
        results.append((out, grads))
    for out, grads in results[1:]:
        torch.testing.assert_close(out, results[0][0], **TOL)
        for a, b in zip(grads, results[0][1], strict=True):
            torch.testing.assert_close(a, b, **TOL)


@pytest.mark.parametrize("name", LAYERS)
def test_prefill_and_decoding_equal_the_full_pass(name):
    layer, x = _layer(name), _x()
    full = layer(x)
    cache = layer.new_cache()
    parts = [layer(x[:, :2], cache=cache), layer(x[:, 2:6], cache=cache, form="parallel")]
    parts += [layer.forward_step(x[:, t], cache)[:, None] for t in range(6, 11)]
    torch.testing.assert_close(torch.cat(parts, 1), full, **TOL)
    assert len(cache) == 11
    cache.reset()
    torch.testing.assert_close(layer(x[:, :3], cache=cache), full[:, :3], **TOL)


@pytest.mark.parametrize("name", LAYERS)
def test_an_empty_sequence_gives_an_empty_output_and_leaves_the_cache_as_it_was(name):
    layer, x = _layer(name), _x()
    cache = layer.new_cache()
    layer(x[:, :3], cache=cache)
    state, conv = cache.state.clone(), None if cache.conv is None else cache.conv.clone()
    for form in ("parallel", "chunk", "recurrent"):
        empty = x[:, :0].clone().requires_grad_()
        out = layer(empty, cache=cache, form=form)
        out.sum().backward()
        assert out.shape == (2, 0, DIM) and empty.grad.shape == (2, 0, DIM)
    assert len(cache) == 3 and torch.equal(cache.state, state)
    assert (conv is None and cache.conv is None) or torch.equal(cache.conv, conv)
    torch.testing.assert_close(layer(x[:, 3:], cache=cache), layer(x)[:, 3:], **TOL)  # and it continues


@pytest.mark.parametrize("name", LAYERS)
def test_left_padding_is_inert(name):
    layer, x = _layer(name), _x()
    keep = torch.ones(2, 11, dtype=torch.bool)
    keep[1, :4] = False
    bad = x.clone()
    bad[1, :4] = float("nan")
    bad.requires_grad_()
    out = layer(bad, key_keep_mask=keep)
    alone = layer(x[1:, 4:])
    torch.testing.assert_close(out[1:, 4:], alone, **TOL)
    torch.testing.assert_close(out[:1], layer(x[:1]), **TOL)
    (out[keep] ** 2).sum().backward()
    assert torch.isfinite(bad.grad).all() and (bad.grad[1, :4] == 0).all()
    assert all(torch.isfinite(p.grad).all() for p in layer.parameters())


@pytest.mark.parametrize("name", LAYERS)
def test_state_dict_round_trip_and_causality(name):
    layer, x = _layer(name), _x()
    twin = LAYERS[name](4).double()
    twin.load_state_dict(layer.state_dict())
    torch.testing.assert_close(twin(x), layer(x), rtol=0, atol=0)
    later = x.clone()
    later[:, 7:] += 1.0
    torch.testing.assert_close(layer(later)[:, :7], layer(x)[:, :7], **TOL)


@pytest.mark.parametrize("name", LAYERS)
def test_float32_layers_keep_a_float32_state(name):
    layer = LAYERS[name](4)
    cache = layer.new_cache()
    out = layer(_x().float(), cache=cache)
    assert out.dtype == torch.float32 and cache.state.dtype == torch.float32


FAMILY_FUNCTIONS = {"gla": ("gla", "gated_linear_attention"), "deltanet": ("deltanet", "delta_rule"),
                    "gated_deltanet": ("gated_deltanet", "gated_delta_rule"),
                    "kda": ("kimi_delta", "kimi_delta_attention"), "delta_product": ("delta_product", "delta_product"),
                    "retnet": ("retnet", "retention"), "lightning": ("lightning", "retention"),
                    "mamba2": ("mamba2", "ssd"), "comba": ("comba", "comba"),
                    "rwkv7": ("rwkv7", "generalized_delta_rule")}


@pytest.mark.parametrize("name", list(FAMILY_FUNCTIONS))
def test_a_layer_whose_family_has_a_public_function_calls_it(name, monkeypatch):
    """The layer's forward, padded or not, goes through its family's function of attnkit.functional.recurrences."""
    import importlib
    file, function = FAMILY_FUNCTIONS[name]
    module = importlib.import_module(f"attnkit.nn.{file}")
    calls = []
    real = getattr(module, function)
    monkeypatch.setattr(module, function, lambda *a, **kw: calls.append(kw.get("form")) or real(*a, **kw))
    built = _layer(name)
    x = torch.randn(2, 7, DIM, dtype=torch.float64)
    keep = torch.ones(2, 7, dtype=torch.bool)
    keep[0, :2] = False
    built(x)
    built(x, key_keep_mask=keep, form="recurrent")
    assert calls == ["chunk", "recurrent"]


def test_errors_name_the_argument():
    layer = _layer("gated_deltanet")
    with pytest.raises(ShapeError, match=r"GatedDeltaNet: x must have shape \(batch, n, 12\); got \(2, 11\)"):
        layer(torch.zeros(2, 11, dtype=torch.float64))
    with pytest.raises(DTypeError, match="cache must be a RecurrentCache"):
        layer(_x(), cache={})
    with pytest.raises(ShapeError, match=r"forward_step: x must have shape \(batch, dim=12\); got \(2, 1, 12\)"):
        layer.forward_step(_x(n=1), RecurrentCache())
    with pytest.raises(ShapeError, match="num_heads must be a multiple of num_key_heads; got 4 and 3"):
        GatedDeltaNet(DIM, 4, num_key_heads=3)
    with pytest.raises(ShapeError, match="must be a multiple of head_dim"):
        Mamba2Mixer(DIM, head_dim=5)


def test_short_convolution_is_causal_depthwise_with_context():
    conv = ShortConvolution(3, 4).double()
    x = torch.randn(2, 6, 3, dtype=torch.float64)
    y, tail = conv(x)
    padded = torch.nn.functional.pad(x.transpose(1, 2), (3, 0))
    want = torch.nn.functional.silu(torch.stack([(padded[..., t : t + 4] * conv.weight[:, 0]).sum(-1)
                                                 for t in range(6)], -1)).transpose(1, 2)
    torch.testing.assert_close(y, want)
    torch.testing.assert_close(tail, x[:, -3:].transpose(1, 2))
    second, _ = conv(x[:, 4:], x[:, 1:4].transpose(1, 2))
    torch.testing.assert_close(second, y[:, 4:])


def test_gated_rms_norm_gates_after_or_before():
    x, gate, w = torch.randn(5, 8, dtype=torch.float64), torch.randn(5, 8, dtype=torch.float64), torch.rand(8)
    norm = GatedRMSNorm(8, eps=1e-6, activation="sigmoid").double()
    norm.weight.data = w.double()
    rms = lambda t: t / (t.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt()
    torch.testing.assert_close(norm(x, gate), rms(x) * w * torch.sigmoid(gate))
    first = GatedRMSNorm(8, eps=1e-6, gate_first=True, groups=2).double()
    gated = x * torch.nn.functional.silu(gate)
    torch.testing.assert_close(first(x, gate), torch.cat([rms(gated[:, :4]), rms(gated[:, 4:])], -1))


def _random_tree(nodes: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return [-1] + [int(torch.randint(-1, i, (1,), generator=g)) for i in range(1, nodes)]


def _path(parents: list[int], node: int) -> list[int]:
    out = [node]
    while parents[out[-1]] >= 0:
        out.append(parents[out[-1]])
    return out[::-1]


TREE_LAYERS = [n for n in LAYERS
               if n not in ("retnet", "rwkv4", *OWN_RECURRENCE) and not n.startswith("delta_product")]


@pytest.mark.parametrize("name", TREE_LAYERS)
@pytest.mark.parametrize("nodes", [1, 7, 30])
def test_a_draft_tree_verified_in_one_call_gives_each_node_its_paths_decoding_and_commit_keeps_the_path(name, nodes):
    layer, x = _layer(name), _x(n=5 + nodes)
    parents = _random_tree(nodes, nodes)
    cache = layer.new_cache()
    layer(x[:, :5], cache=cache)
    prefix_state = (cache.conv.clone() if cache.conv is not None else None, cache.state.clone(), cache.length)
    out = layer(x[:, 5:], cache=cache, parents=parents)
    assert cache.length == 5 and torch.equal(cache.state, prefix_state[1])  # verification does not advance it
    for node in range(nodes):
        alone = layer.new_cache()
        path = _path(parents, node)
        decoded = layer(torch.cat([x[:, :5], x[:, 5:][:, path]], 1), cache=alone, form="recurrent")
        torch.testing.assert_close(out[:, node], decoded[:, -1], rtol=0, atol=1e-12)
    path = _path(parents, nodes - 1)
    cache.commit(path)
    plain = layer.new_cache()
    layer(torch.cat([x[:, :5], x[:, 5:][:, path]], 1), cache=plain)
    assert cache.length == plain.length == 5 + len(path)
    torch.testing.assert_close(cache.state, plain.state, rtol=0, atol=1e-12)
    if plain.conv is not None:
        torch.testing.assert_close(cache.conv, plain.conv, rtol=0, atol=1e-12)
    after = torch.randn(2, 1, DIM, dtype=torch.float64)
    torch.testing.assert_close(layer(after, cache=cache), layer(after, cache=plain), rtol=0, atol=1e-12)


def test_a_commit_that_is_not_a_root_to_node_path_or_without_a_tree_gets_attnkits_errors():
    layer, x = _layer("gated_deltanet"), _x(n=4)
    cache = layer.new_cache()
    with pytest.raises(ArgumentError, match="no draft tree to commit"):
        cache.commit([0])
    layer(x, cache=cache, parents=[-1, 0, 0, 2])
    with pytest.raises(ArgumentError, match=r"root-to-node path.*got \[0, 3\], the path to node 3 is \[0, 2, 3\]"):
        cache.commit([0, 3])
    with pytest.raises(ShapeError, match=r"parents must have shape \(4,\) or \(2, 4\)"):
        layer(x, cache=cache, parents=[-1, 0])
    with pytest.raises(ArgumentError, match="precede its node"):
        layer(x, parents=[-1, 1, 0, 0])
    with pytest.raises(UnsupportedFeature, match="rotary"):
        _layer("retnet")(x, parents=[-1, 0, 1, 2])
    with pytest.raises(UnsupportedFeature, match="predecessor's sums"):  # RWKV-4's sums read one token late
        _layer("rwkv4")(x, parents=[-1, 0, 1, 2])
    with pytest.raises(UnsupportedFeature, match="recurrence steps per token"):  # DeltaProduct: n_h steps a token
        _layer("delta_product")(x, parents=[-1, 0, 1, 2])
    with pytest.raises(UnsupportedFeature, match="a key of its own"):  # Comba's correction key p
        _layer("comba")(x, parents=[-1, 0, 1, 2])
    with pytest.raises(UnsupportedFeature, match="recurrence steps per token"):  # RWKV-7: two steps a token
        _layer("rwkv7")(x, parents=[-1, 0, 1, 2])
