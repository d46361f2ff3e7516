"""BigBirdAttention: its block pattern by brute force, reproducible random blocks, float64 reference."""

from functools import partial

import pytest
import torch

import attnkit.nn.bigbird as bb_module
from attnkit.errors import ArgumentError
from attnkit.nn.bigbird import BigBirdAttention
from attnkit.registry import get
from tests.nn.projected_reference import record_backends, reference, run_with_grad, seeded_input, seeded_layer

B, N, DIM, H = 2, 13, 12, 3  # head width 4; n = 13 is no multiple of the block sizes used

_x = partial(seeded_input, b=B, n=N, dim=DIM)
_layer = partial(seeded_layer, BigBirdAttention, DIM, H)


def token_mask(layout, block, n):
    return torch.tensor([[bool(layout[i // block, j // block]) for j in range(n)] for i in range(n)])


CONFIGS = [dict(block_size=2, window_blocks=3, global_blocks=1, random_blocks=2),
           dict(block_size=3, window_blocks=1, global_blocks=0, random_blocks=1),
           dict(block_size=4, window_blocks=3, global_blocks=2, random_blocks=0),
           dict(block_size=2, window_blocks=5, global_blocks=9, random_blocks=3)]  # all global


@pytest.mark.parametrize("config", CONFIGS)
def test_output_equals_dense_attention_over_the_layout(config):
    layer = _layer(**config)
    expected = reference(layer, _x(), token_mask(layer.layout(N), config["block_size"], N))
    torch.testing.assert_close(layer(_x()), expected, rtol=1e-10, atol=1e-12)


def test_window_covering_the_sequence_is_dense_attention():
    layer = _layer(block_size=2, window_blocks=13, global_blocks=0, random_blocks=2)
    expected = reference(layer, _x(), torch.ones(N, N, dtype=torch.bool))
    torch.testing.assert_close(layer(_x()), expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_layout_follows_the_definition(seed):
    w, g, r = 3, 2, 3
    layer = BigBirdAttention(DIM, H, block_size=4, window_blocks=w, global_blocks=g, random_blocks=r, seed=seed)
    nb = 20
    lay = layer.layout(nb * 4 - 1)  # last block shorter
    assert lay.shape == (nb, nb)
    for i in range(nb):
        seen = {j for j in range(nb) if abs(i - j) <= w // 2} | set(range(g))
        if i < g:
            assert lay[i].all()  # global rows see everything
            continue
        extra = {j for j in range(nb) if lay[i, j]} - seen
        assert all(lay[i, j] for j in seen)
        assert len(extra) == min(r, nb - len(seen))  # exactly r random blocks outside window and globals


def test_random_blocks_are_reproducible():
    x = _x(n=40)
    a, b = _layer(block_size=2), _layer(block_size=2)
    torch.testing.assert_close(a(x), b(x), rtol=0, atol=0)  # same weights, same default seed
    gen = lambda s: torch.Generator().manual_seed(s)
    torch.testing.assert_close(a(x, generator=gen(5)), a(x, generator=gen(5)), rtol=0, atol=0)
    assert torch.equal(a.layout(40, gen(5)), a.layout(40, gen(5)))
    assert not torch.equal(a.layout(40, gen(5)), a.layout(40, gen(6)))
    other_seed = BigBirdAttention(DIM, H, block_size=2, seed=7)
    assert not torch.equal(a.layout(40), other_seed.layout(40))
    assert torch.equal(other_seed.layout(40), other_seed.layout(40, gen(7)))


def test_float32_is_close_to_the_float64_reference():
    layer = _layer(block_size=2, window_blocks=3, global_blocks=1, random_blocks=1)
    expected = reference(layer, _x(), token_mask(layer.layout(N), 2, N))
    torch.testing.assert_close(layer.float()(_x().float()).double(), expected, rtol=1e-5, atol=1e-5)


def test_gradcheck_float64():
    torch.manual_seed(0)
    layer = BigBirdAttention(4, 2, block_size=2, window_blocks=1, global_blocks=1, random_blocks=1).double()
    x = torch.randn(1, 7, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(layer, (x,))


def test_state_dict_round_trip():
    layer, other = _layer(seed=1, block_size=2), _layer(seed=2, block_size=2)
    assert not torch.equal(layer(_x()), other(_x()))
    other.load_state_dict(layer.state_dict())
    torch.testing.assert_close(other(_x()), layer(_x()), rtol=0, atol=0)


def test_long_inputs_run_the_non_global_rows_on_the_blocksparse_kernel(monkeypatch):
    seen = record_backends(monkeypatch, bb_module)
    torch.manual_seed(0)
    BigBirdAttention(8, 2, block_size=64)(torch.randn(1, 2048, 8))  # 8 of 32 blocks per row
    assert seen[0][0] == 128 and seen[1] == (2048 - 128, "blocksparse")


def test_bad_arguments_raise_named_errors():
    with pytest.raises(ArgumentError, match="odd"):
        BigBirdAttention(DIM, H, window_blocks=2)
    with pytest.raises(ArgumentError, match="block_size"):
        BigBirdAttention(DIM, H, block_size=0)
    with pytest.raises(ArgumentError, match="random_blocks"):
        BigBirdAttention(DIM, H, random_blocks=-1)


def test_registry_entry_runs_and_costs_grow_linearly():
    entry = get("bigbird")
    assert entry.target is BigBirdAttention and entry.family == "long-sequence"
    fn, inputs = entry.example()
    assert fn(*inputs).shape == inputs[0].shape
    small, large = (entry.cost(batch=1, length=n, dim=512, heads=8, block_size=64) for n in (4096, 8192))
    assert small.name == "bigbird" and small.flops > 0
    assert 1.9 < large.flops / small.flops < 2.1
    assert 1.9 < large.bytes_moved / small.bytes_moved < 2.1


@pytest.mark.parametrize("shape", [(2, 0, DIM), (0, 5, DIM), (2, 1, DIM)])
def test_empty_and_length_one_inputs(shape):
    layer = _layer(block_size=2, global_blocks=1)
    x, out = run_with_grad(layer, shape)
    assert out.shape == shape and torch.isfinite(x.grad).all()
    if shape[1] == 1:  # softmax over one key: that key's value
        torch.testing.assert_close(out, reference(layer, x, torch.ones(1, 1, dtype=torch.bool)), rtol=1e-10, atol=1e-12)
