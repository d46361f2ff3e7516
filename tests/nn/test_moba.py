"""MoBA: the paper's gate and block choice, transcribed per query in float64; dense attention when k covers all."""

from __future__ import annotations

import math

import torch

import attnkit
from attnkit import masks
from attnkit.nn import MoBA
from tests.helpers import randomized_float64


def _transcription(layer, x):
    """Lu et al. 2025, eq. 2-6, one query at a time: block means, the gate, top-k with the own block, causal."""
    q, k, v = (t.detach().double() for t in layer.project(x.double()))
    batch, heads, n, d = q.shape
    bs, top = layer.block_size, layer.top_k
    out = torch.zeros_like(q)
    for b in range(batch):
        for h in range(heads):
            blocks = [list(range(s, min(n, s + bs))) for s in range(0, n, bs)]
            means = torch.stack([k[b, h, ids].mean(0) for ids in blocks])
            for t in range(n):
                own = t // bs
                gate = {i: (math.inf if i == own else float(q[b, h, t] @ means[i])) for i in range(own + 1)}
                chosen = sorted(gate, key=gate.get, reverse=True)[:top]
                keys = [j for i in chosen for j in blocks[i] if j <= t]
                w = torch.softmax(k[b, h, keys] @ q[b, h, t] / math.sqrt(d), 0)
                out[b, h, t] = w @ v[b, h, keys]
    return layer.merge_heads(out)


def test_moba_equals_the_float64_transcription_of_the_paper():
    layer = randomized_float64(MoBA(12, 3, block_size=4, top_k=2))
    x = torch.randn(2, 23, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(layer(x), _transcription(layer, x), rtol=0, atol=1e-12)


def test_with_every_block_chosen_moba_is_dense_causal_attention_and_gradients_reach_every_projection():
    layer = randomized_float64(MoBA(12, 3, block_size=5, top_k=9))
    x = torch.randn(2, 29, 12, dtype=torch.float64, requires_grad=True)
    q, k, v = layer.project(x)
    dense = layer.merge_heads(attnkit.attention(q, k, v, mask=masks.causal(), backend="reference"))
    out = layer(x)
    torch.testing.assert_close(out, dense, rtol=0, atol=1e-12)
    out.sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in layer.parameters())


def test_moba_takes_the_gathered_path_when_few_blocks_are_chosen():
    layer = MoBA(16, 2, block_size=32, top_k=2)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 2, 2048, 8, generator=g), torch.randn(1, 2, 2048, 8, generator=g)
    chosen = attnkit.nn.moba.moba_blocks(q, k, 32, 2)
    mask = masks.selected_blocks(chosen, 32) & masks.causal()
    decision = attnkit.explain(q, k, k, mask=mask)
    assert decision.path == "blocksparse-gathered" and decision.block_density < 0.5
    assert layer(torch.randn(1, 512, 16)).shape == (1, 512, 16)


def test_an_empty_sequence_gives_an_empty_output_and_zero_gradients():
    layer = MoBA(16, 2, block_size=4, top_k=2)
    x = torch.randn(3, 0, 16, requires_grad=True)
    out = layer(x)
    assert out.shape == (3, 0, 16)
    out.sum().backward()
    assert x.grad.shape == (3, 0, 16)
    assert all(p.grad is None or not p.grad.any() for p in layer.parameters())
