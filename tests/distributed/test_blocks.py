"""blocks.py: the chunk plan read off the mask's block layout; a block that allows nothing."""

from __future__ import annotations

import torch

from attnkit import bias, masks
from attnkit.distributed.blocks import Setting, block_attention, chunk_plan


def _dense_truth(mask, length, chunk, batch, heads):
    dense = torch.broadcast_to(mask.materialize(length, length, batch=batch, heads=heads),
                               (batch, heads, length, length))
    n = length // chunk
    blocks = dense.reshape(batch, heads, n, chunk, n, chunk)
    return blocks.any(5).any(3).any(1).any(0).tolist(), blocks.all(5).all(3).all(1).all(0).tolist()


def test_plan_never_misses_an_allowed_block_and_never_calls_a_partial_block_full():
    ids = torch.tensor([[0] * 7 + [1] * 17, [0] * 20 + [1] * 4])
    for mask in (masks.causal(), masks.causal() & masks.sliding_window(3), masks.segments(ids),
                 masks.padding([24, 5]), masks.from_function(lambda b, h, i, j: (i + j + h) % 4 == 0, "mod4")):
        active, full = chunk_plan(mask, 24, 4, 2, 3, None)
        want_active, want_full = _dense_truth(mask, 24, 4, 2, 3)
        for i in range(6):
            for j in range(6):
                assert active[i][j] or not want_active[i][j]
                assert want_full[i][j] or not full[i][j]


def test_causal_plan_is_exact_and_no_mask_is_all_full():
    active, full = chunk_plan(masks.causal(), 24, 6, 1, 1, None)
    assert active == tuple(tuple(j <= i for j in range(4)) for i in range(4))
    assert full == tuple(tuple(j < i for j in range(4)) for i in range(4))
    assert chunk_plan(None, 8, 4, 1, 1, None) == (((True, True),) * 2,) * 2


def test_a_block_that_allows_nothing_stays_in_the_graph_with_zero_gradients():
    """attnkit.attention answers such a block (a modifier with an all-masked mask) detached; the block is reattached."""
    nothing = masks.from_function(lambda b, h, i, j: i < 0, "nothing")
    active, full = chunk_plan(nothing, 8, 4, 1, 2, None)
    setting = Setting(mask=nothing, bias=bias.alibi(2), scale=0.5, length=8, chunk=4, active=active, full=full,
                      active_map=torch.zeros(2, 2, dtype=torch.bool), full_map=torch.zeros(2, 2, dtype=torch.bool))
    q, k, v = (torch.randn(1, 2, 4, 3, dtype=torch.float64, requires_grad=True) for _ in range(3))
    out, lse = block_attention(setting, q, k, v, q0=4, k0=0)
    assert out.requires_grad and torch.equal(out, torch.zeros_like(out))
    assert torch.equal(lse, torch.full_like(lse, float("-inf")))
    out.sum().backward()
    assert all(torch.equal(t.grad, torch.zeros_like(t)) for t in (q, k, v))
