"""LongformerAttention against a float64 transcription of Beltagy et al. 2020, Sec. 3.1."""

from functools import partial

import pytest
import torch

import attnkit.nn.longformer as lf_module
from attnkit.errors import ArgumentError, DTypeError, ShapeError
from attnkit.nn.longformer import GlobalKeys, LongformerAttention
from attnkit.registry import get
from tests.nn.projected_reference import (
    output,
    project_heads,
    record_backends,
    run_with_grad,
    seeded_input,
    seeded_layer,
    softmax_attention,
)
from tests.nn.projected_reference import reference as dense_reference

B, N, DIM, H = 2, 13, 12, 3  # head width 4

_x = partial(seeded_input, b=B, n=N, dim=DIM)


def _layer(*args, seed=0, separate=True, **kwargs):
    """A float64 layer; with ``separate`` the global projections are moved away from the local ones."""
    layer = seeded_layer(LongformerAttention, *args, seed=seed, **kwargs)
    if separate:
        with torch.no_grad():
            for name in ("q_global", "k_global", "v_global"):
                for p in getattr(layer, name).parameters():
                    p.add_(0.3 * torch.randn_like(p))
    return layer


def reference(layer, x, is_global):
    """Eq. 1 per row: window rows over window ∪ global keys with Q_s, K_s, V_s; global rows over all with Q_g, K_g, V_g.

    ``is_global`` is a bool (b, n). The window is written by loops: keys i + t d, |t| <= w / 2.
    """
    x = x.detach().double()
    n = x.shape[1]
    half, d = layer.window // 2, layer.dilation
    window = torch.tensor([[any(j == i + t * d for t in range(-half, half + 1)) for j in range(n)] for i in range(n)])
    local_allowed = (window | is_global[:, None, :])[:, None]
    local = softmax_attention(*project_heads(layer, x, ("q_proj", "k_proj", "v_proj")), local_allowed)
    glob = softmax_attention(*project_heads(layer, x, ("q_global", "k_global", "v_global")))
    return output(layer, torch.where(is_global[:, None, :, None], glob, local))


def _flags(rows):
    flags = torch.zeros(len(rows), N, dtype=torch.bool)
    for r, positions in enumerate(rows):
        flags[r, positions] = True
    return flags


def test_window_covering_the_sequence_is_dense_attention():
    layer = _layer(DIM, H, window=2 * N)
    expected = dense_reference(layer, _x(), torch.ones(N, N, dtype=torch.bool))
    torch.testing.assert_close(layer(_x()), expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(("window", "dilation"), [(0, 1), (2, 1), (4, 2), (6, 3)])
def test_dilated_window_without_globals(window, dilation):
    layer = _layer(DIM, H, window=window, dilation=dilation)
    expected = reference(layer, _x(), torch.zeros(B, N, dtype=torch.bool))
    torch.testing.assert_close(layer(_x()), expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(("window", "dilation"), [(2, 1), (4, 2)])
def test_global_positions_shared_by_the_batch(window, dilation):
    layer = _layer(DIM, H, window=window, dilation=dilation)
    expected = reference(layer, _x(), _flags([[0, 7, 12]] * B))
    torch.testing.assert_close(layer(_x(), global_tokens=[0, 7, 12]), expected, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(layer(_x(), global_tokens=torch.tensor([12, 0, 7, 7])), expected,
                               rtol=1e-10, atol=1e-12)


def test_per_sample_global_tokens_as_bool_tensor_equal_each_sample_alone():
    layer = _layer(DIM, H, window=2)
    flags = _flags([[1, 5, 6], [11]])
    out = layer(_x(), global_tokens=flags)
    torch.testing.assert_close(out, reference(layer, _x(), flags), rtol=1e-10, atol=1e-12)
    for r, positions in enumerate(([1, 5, 6], [11])):
        torch.testing.assert_close(out[r:r + 1], layer(_x()[r:r + 1], global_tokens=positions), rtol=1e-10, atol=1e-12)


def test_global_tokens_see_every_position_and_are_seen_by_every_position():
    layer = _layer(DIM, H, window=0)  # without globals each token would see only itself
    x = _x(b=1)
    base = layer(x, global_tokens=[4])
    for j in range(N):
        moved = x.clone()
        moved[0, j] += 2.0
        changed = ((layer(moved, global_tokens=[4]) - base).abs().amax((0, 2)) > 1e-9).tolist()
        # the global token 4 sees j; j itself changes; nobody else sees j, unless j is the global token
        assert changed == [t in (4, j) or j == 4 for t in range(N)], j


def test_global_rows_use_their_own_projections():
    layer = _layer(DIM, H, window=2, separate=False)
    for g, s in (("q_global", "q_proj"), ("k_global", "k_proj"), ("v_global", "v_proj")):
        assert torch.equal(getattr(layer, g).weight, getattr(layer, s).weight)  # paper: initialised equal
    before = layer(_x(), global_tokens=[3])
    with torch.no_grad():
        layer.q_global.weight.add_(0.5)
    changed = ((layer(_x(), global_tokens=[3]) - before).abs().amax((0, 2)) > 1e-9).tolist()
    assert changed == [t == 3 for t in range(N)]


def test_float32_is_close_to_the_float64_reference():
    layer = _layer(DIM, H, window=4, dilation=2)
    expected = reference(layer, _x(), _flags([[0, 9]] * B))
    got = layer.float()(_x().float(), global_tokens=[0, 9]).double()
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_gradcheck_float64():
    layer = _layer(4, 2, window=2, dilation=2)
    x = torch.randn(2, 6, 4, dtype=torch.float64, requires_grad=True)
    flags = torch.tensor([[1, 0, 0, 0, 1, 0], [0, 0, 1, 0, 0, 0]], dtype=torch.bool)
    assert torch.autograd.gradcheck(lambda t: layer(t, global_tokens=flags), (x,))


def test_state_dict_round_trip_includes_global_projections():
    layer, other = _layer(DIM, H, window=2, seed=1), _layer(DIM, H, window=2, seed=2)
    other.load_state_dict(layer.state_dict())
    assert {"q_global.weight", "k_global.weight", "v_global.weight", "out_proj.bias"} <= set(layer.state_dict())
    torch.testing.assert_close(other(_x(), global_tokens=[2]), layer(_x(), global_tokens=[2]), rtol=0, atol=0)


def test_long_inputs_run_window_rows_on_the_blocksparse_kernel(monkeypatch):
    seen = record_backends(monkeypatch, lf_module)
    torch.manual_seed(0)
    layer = LongformerAttention(8, 2, window=64)
    flags = torch.zeros(2, 1024, dtype=torch.bool)
    flags[0, [0, 500]] = True
    flags[1, 900] = True
    layer(torch.randn(2, 1024, 8), global_tokens=flags)
    assert seen[0] == (1024, "blocksparse")
    assert seen[1][0] == 2 and seen[1][1] != "blocksparse"  # two global rows at most per sample, dense


def test_global_keys_layout_is_exact():
    flags = torch.zeros(2, 50, dtype=torch.bool)
    flags[0, [3, 17]] = True
    flags[1, 40:50] = True
    mask = GlobalKeys(flags)
    for bs in (4, 7, 16):
        fast, exact = mask.block_layout(9, 50, bs), mask.block_layout(9, 50, bs, exact=True)
        assert torch.equal(fast.active, exact.active) and torch.equal(fast.full, exact.full)


def test_bad_arguments_raise_named_errors():
    with pytest.raises(ArgumentError, match="even"):
        LongformerAttention(DIM, H, window=3)
    with pytest.raises(ArgumentError, match="dilation"):
        LongformerAttention(DIM, H, window=2, dilation=0)
    layer = LongformerAttention(DIM, H, window=2)
    x = torch.randn(B, N, DIM)
    with pytest.raises(ArgumentError, match=r"\[0, 13\)"):
        layer(x, global_tokens=[13])
    with pytest.raises(ShapeError, match=r"\(batch, n\) = \(2, 13\)"):
        layer(x, global_tokens=torch.ones(N, B, dtype=torch.bool))
    with pytest.raises(DTypeError, match="integer positions"):
        layer(x, global_tokens=torch.tensor([0.0, 1.0]))


def test_registry_entry_runs_and_costs_grow_linearly():
    entry = get("longformer")
    assert entry.target is LongformerAttention and entry.family == "long-sequence"
    fn, inputs = entry.example()
    assert fn(*inputs).shape == inputs[0].shape
    costs = [entry.cost(length=n, window=256, dilation=1, global_tokens=()) for n in (2048, 4096, 8192)]
    assert costs[0].name == "longformer" and costs[0].flops > 0
    assert costs[2].flops == 2 * costs[1].flops == 4 * costs[0].flops  # window rows only: linear in n
    small, mid, big = (c.bytes_moved for c in costs)  # affine: the parameters are read once at any n
    assert big - mid == 2 * (mid - small) and mid > small > 0
    assert entry.cost(length=4096, window=256, dilation=1, global_tokens=(0,)).flops > costs[1].flops  # a global row


@pytest.mark.parametrize("shape", [(2, 0, DIM), (0, 5, DIM), (2, 1, DIM)])
def test_empty_and_length_one_inputs(shape):
    layer = _layer(DIM, H, window=2)
    x, out = run_with_grad(layer, shape, global_tokens=[0] if shape[1] else None)
    assert out.shape == shape and torch.isfinite(x.grad).all()
    if shape[1] == 1:  # softmax over one key: that key's value
        expected = reference(layer, x, torch.ones(shape[0], 1, dtype=torch.bool))  # token 0 is global
        torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-12)


def test_the_window_mask_reused_over_many_lengths_keeps_bounded_caches():
    layer = LongformerAttention(8, 2, window=32, dilation=2)
    with torch.no_grad():
        for n in range(300, 600, 5):
            layer(torch.randn(1, n, 8))
    caches = {name: len(c) for name, c in vars(layer._window).items() if name.startswith("_cache")}
    assert caches and all(0 < size <= 16 for size in caches.values()), caches
