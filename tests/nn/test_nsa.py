"""NativeSparseAttention: eq. 5-12 transcribed per query in float64; the selection covering every block is dense."""

from __future__ import annotations

import math

import pytest
import torch

import attnkit
from attnkit import masks
from attnkit.errors import ArgumentError
from attnkit.nn import NativeSparseAttention
from attnkit.nn.nsa import compressed_attention, nsa_blocks
from tests.helpers import randomized_float64


def _attend(q, k, v, keys):
    if not keys:
        return torch.zeros(v.shape[-1], dtype=q.dtype)
    w = torch.softmax(k[keys] @ q / math.sqrt(q.shape[-1]), 0)
    return w @ v[keys]


@torch.no_grad()
def _transcription(layer, x):
    """Yuan et al. 2025, eq. 5-12, by loops (``__wrapped__``, with autograd: the gradients' oracle)."""
    x = x.double()
    batch, n, _ = x.shape
    h, hkv, d = layer.num_heads, layer.kv_heads, layer.head_dim
    l, stride, blk, w = layer.compress_block, layer.compress_stride, layer.select_block, layer.window
    group = h // hkv
    q = (x @ layer.q_proj.weight.T + layer.q_proj.bias).view(batch, n, h, d)
    kv = (x @ layer.kv_proj.weight.T + layer.kv_proj.bias).view(batch, n, 6, hkv, d)
    gates = torch.sigmoid(x @ layer.gate.weight.T + layer.gate.bias).view(batch, n, h, 3)
    blocks_c = (n - l) // stride + 1 if n >= l else 0

    def phi(module, keys):  # (l, D) -> D: the block plus its position embedding, mapped linearly
        return (keys + module.position).flatten() @ module.proj.weight.T + module.proj.bias

    out = torch.zeros(batch, n, h, d, dtype=torch.float64)
    for b in range(batch):
        for g in range(hkv):
            kc = [phi(layer.compress_k, kv[b, i * stride:i * stride + l, 0, g]) for i in range(blocks_c)]
            vc = [phi(layer.compress_v, kv[b, i * stride:i * stride + l, 1, g]) for i in range(blocks_c)]
            kc = torch.stack(kc) if kc else torch.zeros(0, d, dtype=torch.float64)
            vc = torch.stack(vc) if vc else torch.zeros(0, d, dtype=torch.float64)
            for t in range(n):
                ended = [i for i in range(blocks_c) if i * stride + l - 1 <= t]
                score = torch.zeros(-(-n // blk), dtype=torch.float64)
                o_cmp = []
                for head in range(g * group, (g + 1) * group):
                    o_cmp.append(_attend(q[b, t, head], kc, vc, ended))
                    p = torch.softmax(kc[ended] @ q[b, t, head] / math.sqrt(d), 0).detach() if ended else []
                    for j in range(len(score)):  # eq. 9: chunks of block j, the compressed blocks holding each
                        for s in range(j * blk // stride, (j + 1) * blk // stride):
                            score[j] += sum(float(p[ended.index(i)]) for i in ended if i <= s < i + l // stride)
                own = t // blk
                ranked = {j: (math.inf if j in (0, own, own - 1) else float(score[j])) for j in range(own + 1)}
                top = sorted(ranked, key=ranked.get, reverse=True)[:layer.num_selected]
                selected = [s for j in top for s in range(j * blk, (j + 1) * blk) if s <= t]
                nearby = list(range(max(0, t - w + 1), t + 1))
                for i, head in enumerate(range(g * group, (g + 1) * group)):
                    o_slc = _attend(q[b, t, head], kv[b, :, 2, g], kv[b, :, 3, g], selected)
                    o_win = _attend(q[b, t, head], kv[b, :, 4, g], kv[b, :, 5, g], nearby)
                    gate = gates[b, t, head]
                    out[b, t, head] = gate[0] * o_cmp[i] + gate[1] * o_slc + gate[2] * o_win
    return layer.out_proj(out.reshape(batch, n, h * d))


@pytest.mark.parametrize("config", [dict(kv_heads=2, compress_block=4, compress_stride=2, select_block=4),
                                    dict(kv_heads=1, compress_block=6, compress_stride=3, select_block=9),
                                    dict(kv_heads=4, compress_block=4, compress_stride=4, select_block=4)])
def test_nsa_equals_the_float64_transcription_of_the_paper(config):
    layer = randomized_float64(NativeSparseAttention(16, 4, num_selected=4, window=5, **config))
    x = torch.randn(2, 31, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    exact = _transcription(layer, x)
    torch.testing.assert_close(layer(x), exact, rtol=0, atol=1e-12)


def test_with_every_block_selected_the_selection_branch_is_dense_causal_attention():
    q = torch.randn(2, 4, 29, 4, dtype=torch.float64)
    k_c = torch.randn(2, 2, 13, 4, dtype=torch.float64)
    chosen = nsa_blocks(q, k_c, length=4, stride=2, block=4, count=100, scale=0.5)
    t = torch.arange(29)
    for own in range(8):  # every block up to the query's own, each once
        rows = chosen[:, :, t // 4 == own]
        assert sorted(rows[0, 0, 0][rows[0, 0, 0] >= 0].tolist()) == list(range(own + 1))
    k, v = torch.randn(2, 2, 29, 4, dtype=torch.float64), torch.randn(2, 2, 29, 4, dtype=torch.float64)
    mask = masks.selected_blocks(chosen, 4, group_size=2) & masks.causal()
    torch.testing.assert_close(attnkit.attention(q, k, v, mask=mask), attnkit.attention(q, k, v, mask=masks.causal()),
                               rtol=0, atol=1e-12)


def test_a_decoding_step_selects_as_the_last_query_of_the_whole_sequence():
    g = torch.Generator().manual_seed(5)
    q, k_c = torch.randn(2, 4, 29, 4, generator=g, dtype=torch.float64), torch.randn(2, 2, 13, 4, generator=g,
                                                                                      dtype=torch.float64)
    whole = nsa_blocks(q, k_c, length=4, stride=2, block=4, count=3, scale=0.5)
    for t in (0, 5, 28):  # the query at position t over the keys up to it
        step = nsa_blocks(q[:, :, t:t + 1], k_c[:, :, :max(0, (t - 4) // 2 + 1)], length=4, stride=2, block=4,
                          count=3, scale=0.5, start=t)
        assert torch.equal(step.sort(-1).values, whole[:, :, t:t + 1, :step.shape[-1]].sort(-1).values)


@pytest.mark.parametrize("n,length,stride", [(29, 4, 2), (31, 6, 3), (5, 4, 2), (3, 4, 2), (16, 4, 4)])
def test_the_compressed_branch_is_the_float64_masked_attention_forward_and_backward(n, length, stride):
    """One grouped causal call equals attention masked by ended blocks (``i d + l - 1 <= t``; no block: 0)."""
    from tests.oracle import dense_attention

    g = torch.Generator().manual_seed(n)
    blocks_c = (n - length) // stride + 1 if n >= length else 0
    q = torch.randn(2, 4, n, 5, dtype=torch.float64, generator=g, requires_grad=True)
    k, v = (torch.randn(2, 2, blocks_c, 5, dtype=torch.float64, generator=g, requires_grad=True) for _ in range(2))
    got = compressed_attention(q, k, v, length=length, stride=stride)
    ended = torch.arange(blocks_c) * stride + length - 1 <= torch.arange(n)[:, None]
    want = dense_attention(q, k, v, mask=ended, differentiable=True)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    if blocks_c:
        w = torch.randn_like(want)
        exact = torch.autograd.grad((want * w).sum(), (q, k, v))
        for a, b in zip(torch.autograd.grad((got * w).sum(), (q, k, v)), exact, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


@pytest.mark.parametrize("n,length,stride", [(29, 4, 2), (31, 6, 3), (16, 4, 4)])
def test_the_compressed_branch_computed_with_the_selection_is_the_masked_attention_and_the_same_blocks(
        n, length, stride, monkeypatch):
    """One softmax (chunks of 5 queries) gives the compressed branch, its lse and the blocks of :func:`nsa_blocks`;
    joined to autograd (the module's route), its gradients are the float64 oracle's."""
    from attnkit.nn import nsa
    from tests.oracle import dense_attention

    monkeypatch.setattr(nsa, "_TRIANGLE", 5)
    g = torch.Generator().manual_seed(n + 1)
    blocks_c = (n - length) // stride + 1
    q = torch.randn(2, 4, n, 5, dtype=torch.float64, generator=g, requires_grad=True)
    k, v = (torch.randn(2, 2, blocks_c, 5, dtype=torch.float64, generator=g, requires_grad=True) for _ in range(2))
    out, lse, chosen = nsa.compressed_and_blocks(q, k, v, length=length, stride=stride, block=2 * stride, count=3,
                                                 scale=5 ** -0.5)
    ended = torch.arange(blocks_c) * stride + length - 1 <= torch.arange(n)[:, None]
    want = dense_attention(q, k, v, mask=ended, differentiable=True)
    torch.testing.assert_close(out, want, rtol=0, atol=1e-12)
    scores = (q @ k.repeat_interleave(2, 1).transpose(-1, -2) * 5 ** -0.5).masked_fill(~ended, float("-inf"))
    torch.testing.assert_close(lse, torch.logsumexp(scores.detach(), -1), rtol=0, atol=1e-12)
    assert torch.equal(chosen, nsa_blocks(q, k, length=length, stride=stride, block=2 * stride, count=3,
                                          scale=5 ** -0.5))
    joined = nsa._CompressedBranch.apply(q, k, v, out, lse, length, stride, 5 ** -0.5)
    w = torch.randn_like(want)
    for a, b in zip(torch.autograd.grad((joined * w).sum(), (q, k, v)),
                    torch.autograd.grad((want * w).sum(), (q, k, v)), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_the_selection_is_the_same_in_chunks_of_queries(monkeypatch):
    """Each chunk scores only the compressed blocks its last query has seen: chunks of 3 queries choose as one."""
    from attnkit.nn import nsa

    g = torch.Generator().manual_seed(6)
    q, k_c = torch.randn(2, 4, 37, 4, generator=g, dtype=torch.float64), torch.randn(2, 2, 17, 4, generator=g,
                                                                                      dtype=torch.float64)
    whole = nsa_blocks(q, k_c, length=4, stride=2, block=4, count=3, scale=0.5)
    monkeypatch.setattr(nsa, "_TRIANGLE", 3)
    chunked = nsa_blocks(q, k_c, length=4, stride=2, block=4, count=3, scale=0.5)
    # the same blocks (a chunk scores fewer columns: the forced blocks, tied at +inf, may come in another order)
    torch.testing.assert_close(chunked.sort(-1).values, whole.sort(-1).values, rtol=0, atol=0)


def test_gradients_reach_every_parameter_and_the_selection_none():
    layer = randomized_float64(NativeSparseAttention(16, 4, kv_heads=2, compress_block=4, compress_stride=2,
                                                     select_block=4, num_selected=3, window=5))
    x = torch.randn(2, 23, 16, dtype=torch.float64, requires_grad=True)
    layer(x).square().sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in layer.parameters())


def test_block_sizes_must_be_multiples_of_the_stride():
    with pytest.raises(ArgumentError, match="multiples of compress_stride"):
        NativeSparseAttention(16, 4, compress_block=5, compress_stride=2)


def test_an_empty_sequence_gives_an_empty_output():
    layer = NativeSparseAttention(16, 4, kv_heads=2, compress_block=4, compress_stride=2, select_block=4,
                                  num_selected=3, window=5)
    x = torch.randn(2, 0, 16, requires_grad=True)
    out = layer(x)
    assert out.shape == (2, 0, 16)
    out.sum().backward()
    assert x.grad.shape == (2, 0, 16)


@pytest.mark.parametrize("config", [dict(kv_heads=2, compress_block=4, compress_stride=2, select_block=4),
                                    dict(kv_heads=4, compress_block=4, compress_stride=4, select_block=4)])
def test_gradients_equal_the_float64_transcription(config):
    """The backward's memory savings (per-branch key/value products, gates applied per branch with a contiguous
    gradient, phi recomputed from x) change no gradient: every parameter's and x's match the transcription's."""
    layer = randomized_float64(NativeSparseAttention(16, 4, num_selected=3, window=5, **config))
    x = torch.randn(2, 23, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(5), requires_grad=True)
    weight = torch.randn(2, 23, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    (layer(x) * weight).sum().backward()
    ours = [x.grad] + [p.grad for p in layer.parameters()]
    layer.zero_grad(set_to_none=True)
    x_ref = x.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        (_transcription.__wrapped__(layer, x_ref) * weight).sum().backward()
    exact = [x_ref.grad] + [p.grad for p in layer.parameters()]
    for got, want in zip(ours, exact, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
