"""LocalAttention against a float64 transcription of Luong's local-m window and of block-local attention."""

from functools import partial

import pytest
import torch

import attnkit.nn.local as local_module
from attnkit.errors import ArgumentError, DTypeError, ShapeError
from attnkit.nn.local import LocalAttention
from attnkit.registry import get
from tests.nn.projected_reference import record_backends, reference, run_with_grad, seeded_input, seeded_layer

B, N, DIM, H = 2, 13, 12, 3  # head width 4; n = 13 is no multiple of the sizes used

_x = partial(seeded_input, b=B, n=N, dim=DIM)
_layer = partial(seeded_layer, LocalAttention)


def luong_window(n, size, causal):
    """Luong local-m: query t sees s in [t - D, t + D] (t - D..t when causal), by loops."""
    return torch.tensor([[t - size <= s <= t + (0 if causal else size) for s in range(n)] for t in range(n)])


def blocks(n, size, causal):
    return torch.tensor([[t // size == s // size and (s <= t or not causal) for s in range(n)] for t in range(n)])


@pytest.mark.parametrize("causal", [False, True])
def test_window_at_least_the_length_is_dense_attention(causal):
    layer = _layer(DIM, H, N, causal=causal)
    full = torch.ones(N, N, dtype=torch.bool)
    allowed = torch.tril(full) if causal else full
    torch.testing.assert_close(layer(_x()), reference(layer, _x(), allowed), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("size", [0, 2, 5])
def test_window_matches_luong_local_m(size, causal):
    layer = _layer(DIM, H, size, causal=causal)
    torch.testing.assert_close(layer(_x()), reference(layer, _x(), luong_window(N, size, causal)),
                               rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("size", [1, 4, 13, 20])
def test_blocks_match_block_local_definition(size, causal):
    layer = _layer(DIM, H, size, mode="blocks", causal=causal)
    torch.testing.assert_close(layer(_x()), reference(layer, _x(), blocks(N, size, causal)), rtol=1e-10, atol=1e-12)


def test_float32_error_is_within_twice_the_plain_float32_error():
    layer = _layer(DIM, H, 3).float()
    x = _x()
    allowed = luong_window(N, 3, False)
    exact = reference(layer, x, allowed)
    plain = reference(layer, x, allowed, dtype=torch.float32)  # the plain float32 computation
    err = (layer(x.float()).double() - exact).abs().max().item()
    assert err <= 2 * (plain.double() - exact).abs().max().item() + 8 * torch.finfo(torch.float32).eps


@pytest.mark.parametrize("mode", ["window", "blocks"])
def test_causal_outputs_ignore_the_future(mode):
    layer = _layer(DIM, H, 4, mode=mode, causal=True)
    x = _x()
    moved = x.clone()
    moved[:, 7:] += 3 * torch.randn(B, N - 7, DIM, dtype=torch.float64)
    before, after = layer(x), layer(moved)
    torch.testing.assert_close(after[:, :7], before[:, :7], rtol=0, atol=1e-12)
    assert (after[:, 7:] - before[:, 7:]).abs().max() > 1e-3  # the future did change


def test_non_causal_window_sees_the_right_neighbours_only():
    layer = _layer(DIM, H, 2)
    x = _x()
    moved = x.clone()
    moved[:, 6] += 3.0
    changed = (layer(moved) - layer(x)).abs().amax((0, 2)) > 1e-9
    assert changed.tolist() == [4 <= t <= 8 for t in range(N)]


@pytest.mark.parametrize("mode", ["window", "blocks"])
def test_gradcheck_float64(mode):
    layer = _layer(4, 2, 2, mode=mode, causal=mode == "blocks")
    x = torch.randn(1, 5, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(layer, (x,))


def test_state_dict_round_trip():
    layer = _layer(DIM, H, 3, seed=1)
    other = _layer(DIM, H, 3, seed=2)
    assert not torch.equal(layer(_x()), other(_x()))
    other.load_state_dict(layer.state_dict())
    assert set(layer.state_dict()) == {f"{p}_proj.{w}" for p in "qkv" for w in ("weight", "bias")} | {
        "out_proj.weight", "out_proj.bias"}
    torch.testing.assert_close(other(_x()), layer(_x()), rtol=0, atol=0)


def test_dropout_only_in_training():
    layer = _layer(DIM, H, 3, dropout=0.5)
    x = _x()
    layer.eval()
    torch.testing.assert_close(layer(x), layer(x), rtol=0, atol=0)
    torch.testing.assert_close(layer(x), reference(layer, x, luong_window(N, 3, False)), rtol=1e-10, atol=1e-12)
    layer.train()
    assert not torch.allclose(layer(x), layer.eval()(x))


@pytest.mark.parametrize("mode", ["window", "blocks"])
def test_long_inputs_run_on_the_blocksparse_kernel(monkeypatch, mode):
    seen = record_backends(monkeypatch, local_module)
    torch.manual_seed(0)
    LocalAttention(8, 2, 32, mode=mode)(torch.randn(1, 1024, 8))
    assert [backend for _, backend in seen] == ["blocksparse"]


def test_bad_arguments_raise_named_errors():
    with pytest.raises(ArgumentError, match="mode"):
        LocalAttention(DIM, H, 3, mode="sliding")
    with pytest.raises(ArgumentError, match="size"):
        LocalAttention(DIM, H, 0, mode="blocks")
    with pytest.raises(ShapeError, match="num_heads"):
        LocalAttention(10, 3, 2)
    layer = LocalAttention(DIM, H, 3)
    with pytest.raises(ShapeError, match=r"\(batch, n, dim=12\)"):
        layer(torch.randn(B, N, DIM + 1))
    with pytest.raises(DTypeError, match="floating"):
        layer(torch.ones(B, N, DIM, dtype=torch.long))


def test_registry_entry_runs_and_costs_grow_linearly():
    entry = get("local")
    assert entry.target is LocalAttention and entry.family == "long-sequence"
    fn, inputs = entry.example()
    assert fn(*inputs).shape == inputs[0].shape
    costs = [entry.cost(length=n, size=64) for n in (2048, 4096, 8192)]  # the one cost model
    assert costs[0].name == "local" and costs[0].flops > 0
    assert costs[2].flops == 2 * costs[1].flops == 4 * costs[0].flops  # a fixed number of keys per query
    small, mid, big = (c.bytes_moved for c in costs)  # affine: the parameters are read once at any n
    assert big - mid == 2 * (mid - small) and mid > small > 0


@pytest.mark.parametrize("shape", [(2, 0, DIM), (0, 5, DIM), (2, 1, DIM)])
def test_empty_and_length_one_inputs(shape):
    layer = _layer(DIM, H, 2, mode="blocks", causal=True)
    x, out = run_with_grad(layer, shape)
    assert out.shape == shape and torch.isfinite(x.grad).all()
    if shape[1] == 1:  # softmax over one key: that key's value
        torch.testing.assert_close(out, reference(layer, x, torch.ones(1, 1, dtype=torch.bool)), rtol=1e-10, atol=1e-12)
