"""BlockSparseAttention and BlockPattern against dense float64 attention over the same pattern."""

from functools import partial

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attnkit.nn.blocksparse as bs_module
from attnkit import masks
from attnkit.errors import ArgumentError, DTypeError, ShapeError
from attnkit.nn.blocksparse import BlockPattern, BlockSparseAttention
from attnkit.registry import get
from tests.nn.projected_reference import record_backends, reference, run_with_grad, seeded_input, seeded_layer

B, N, DIM, H = 2, 13, 12, 3  # head width 4; n = 13 is no multiple of the block sizes used

_x = partial(seeded_input, b=B, n=N, dim=DIM)
_layer = partial(seeded_layer, BlockSparseAttention)


def token_mask(layout, block, n):
    """allowed[..., i, j] = layout[..., i // block, j // block], by loops."""
    out = torch.zeros(layout.shape[:-2] + (n, n), dtype=torch.bool)
    for i in range(n):
        for j in range(n):
            out[..., i, j] = layout[..., i // block, j // block]
    return out


def _random_layout(*shape, seed=0):
    lay = torch.rand(*shape, generator=torch.Generator().manual_seed(seed)) < 0.4
    return lay | torch.eye(shape[-1], dtype=torch.bool)  # every query keeps a key


def test_all_ones_layout_is_dense_attention():
    layer = _layer(DIM, H, torch.ones(4, 4, dtype=torch.bool), block_size=4)
    expected = reference(layer, _x(), torch.ones(N, N, dtype=torch.bool))
    torch.testing.assert_close(layer(_x()), expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("block", [1, 3, 4, 13])
def test_layout_matches_dense_attention_over_its_token_mask(block):
    nb = -(-N // block)
    lay = _random_layout(nb, nb, seed=block)
    layer = _layer(DIM, H, lay, block_size=block)
    torch.testing.assert_close(layer(_x()), reference(layer, _x(), token_mask(lay, block, N)), rtol=1e-10, atol=1e-12)


def test_per_head_layout():
    lay = _random_layout(H, 5, 5, seed=3)
    layer = _layer(DIM, H, lay, block_size=3)
    expected = reference(layer, _x(), token_mask(lay, 3, N))
    torch.testing.assert_close(layer(_x()), expected, rtol=1e-10, atol=1e-12)


def test_any_attnkit_mask_and_its_causality():
    layer = _layer(DIM, H, masks.sliding_window(3, 1) & masks.causal())
    allowed = torch.tensor([[i - 3 <= j <= i for j in range(N)] for i in range(N)])
    torch.testing.assert_close(layer(_x()), reference(layer, _x(), allowed), rtol=1e-10, atol=1e-12)
    moved = _x().clone()
    moved[:, 9:] += 3.0
    torch.testing.assert_close(layer(moved)[:, :9], layer(_x())[:, :9], rtol=0, atol=1e-12)
    assert (layer(moved)[:, 9:] - layer(_x())[:, 9:]).abs().max() > 1e-3


def test_float32_is_close_to_the_float64_reference():
    lay = _random_layout(5, 5, seed=1)
    layer = _layer(DIM, H, lay, block_size=3)
    expected = reference(layer, _x(), token_mask(lay, 3, N))
    torch.testing.assert_close(layer.float()(_x().float()).double(), expected, rtol=1e-5, atol=1e-5)


def test_gradcheck_float64():
    torch.manual_seed(0)
    lay = torch.tensor([[1, 0, 0], [1, 1, 0], [0, 1, 1]], dtype=torch.bool)
    layer = BlockSparseAttention(4, 2, lay, block_size=3).double()
    x = torch.randn(2, 7, 4, dtype=torch.float64, requires_grad=True)  # 7: a partial last block
    assert torch.autograd.gradcheck(layer, (x,))


def test_state_dict_round_trip():
    lay = _random_layout(5, 5)
    layer, other = _layer(DIM, H, lay, block_size=3, seed=1), _layer(DIM, H, lay, block_size=3, seed=2)
    assert not torch.equal(layer(_x()), other(_x()))
    other.load_state_dict(layer.state_dict())
    torch.testing.assert_close(other(_x()), layer(_x()), rtol=0, atol=0)


def test_long_inputs_run_on_the_blocksparse_kernel(monkeypatch):
    seen = record_backends(monkeypatch, bs_module)
    idx = torch.arange(32)
    band = (idx[:, None] - idx[None, :]).abs() <= 1
    torch.manual_seed(0)
    BlockSparseAttention(8, 2, band, block_size=32)(torch.randn(1, 1024, 8))
    assert [backend for _, backend in seen] == ["blocksparse"]


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 6), st.integers(1, 6), st.integers(1, 9), st.integers(0, 40), st.integers(0, 40),
       st.integers(0, 2**31 - 1))
def test_block_pattern_layout_is_exact_for_any_kernel_block_size(block, kernel_block, heads, q_len, kv_len, seed):
    lay = torch.rand(1 + heads % 3, 5, 6, generator=torch.Generator().manual_seed(seed)) < 0.3
    mask = BlockPattern(lay, block)
    fast = mask.block_layout(q_len, kv_len, kernel_block)
    exact = mask.block_layout(q_len, kv_len, kernel_block, exact=True)
    assert torch.equal(fast.active, exact.active.expand_as(fast.active))
    assert torch.equal(fast.full, exact.full.expand_as(fast.full))


def test_bad_arguments_raise_named_errors():
    lay = torch.ones(2, 2, dtype=torch.bool)
    with pytest.raises(ArgumentError, match="block_size"):
        BlockSparseAttention(DIM, H, lay)
    with pytest.raises(ArgumentError, match="block_size"):
        BlockSparseAttention(DIM, H, masks.causal(), block_size=4)
    with pytest.raises(DTypeError, match="bool"):
        BlockSparseAttention(DIM, H, lay.float(), block_size=4)
    with pytest.raises(DTypeError, match="pattern"):
        BlockSparseAttention(DIM, H, [[True]], block_size=4)
    with pytest.raises(ShapeError, match="covers 8 positions"):
        BlockSparseAttention(DIM, H, lay, block_size=4)(torch.randn(B, 9, DIM))


def test_registry_entry_runs_and_cost_scales_with_density():
    entry = get("block-sparse")
    assert entry.target is BlockSparseAttention and entry.family == "long-sequence"
    fn, inputs = entry.example()
    assert fn(*inputs).shape == inputs[0].shape
    # random layouts of 16 x 16 blocks of 64; a full layout (density 1) is dense attention
    sizes = {"batch": 1, "length": 1024, "dim": 64, "heads": 2, "block_size": 64, "layout": "random"}
    sparse = [entry.cost(**sizes, density=d) for d in (0.1, 0.25, 0.5)]
    dense = entry.cost(**sizes, density=1.0)
    assert sparse[0].flops < sparse[1].flops < sparse[2].flops < dense.flops
    # on the block-sparse kernel the bytes grow with the active blocks (the dense layout runs torch's
    # fused SDPA, which writes no weights, so its bytes are not comparable)
    assert sparse[0].bytes_moved < sparse[1].bytes_moved < sparse[2].bytes_moved
    assert sparse[0].peak_bytes < sparse[1].peak_bytes < sparse[2].peak_bytes


@pytest.mark.parametrize("shape", [(2, 0, DIM), (0, 5, DIM), (2, 1, DIM)])
def test_empty_and_length_one_inputs(shape):
    layer = _layer(DIM, H, torch.ones(2, 2, dtype=torch.bool), block_size=3)
    x, out = run_with_grad(layer, shape)
    assert out.shape == shape and torch.isfinite(x.grad).all()
    if shape[1] == 1:  # softmax over one key: that key's value
        torch.testing.assert_close(out, reference(layer, x, torch.ones(1, 1, dtype=torch.bool)), rtol=1e-10, atol=1e-12)
