"""StreamingLLM, H2O, SnapKV and Quest: dense attention whenever the budget covers the sequence, and their errors.

Oracle: a float64 softmax written here (scores, causal mask, softmax, values), no attnkit path.
"""

from __future__ import annotations

import pytest
import torch

from attnkit.errors import ArgumentError, ShapeError
from attnkit.nn import RotaryEmbedding, kv_policies
from attnkit.nn.kv_policies import HeavyHitterCache, QuestCache, SinkWindowCache, SnapKVCache

quest_attention, quest_pages, snapkv = kv_policies.quest_attention, kv_policies.quest_pages, kv_policies.snapkv

B, H, HKV, D, L = 2, 4, 2, 8, 24


def _qkv(seed=0, n=L):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, n, D, generator=g, dtype=torch.float64),
            torch.randn(B, HKV, n, D, generator=g, dtype=torch.float64),
            torch.randn(B, HKV, n, D, generator=g, dtype=torch.float64))


def _dense(q, k, v):
    """Causal softmax of the last Lq positions over all keys, bottom-right."""
    kk, vv = (t.repeat_interleave(H // HKV, 1) for t in (k, v))
    lq, n = q.shape[2], k.shape[2]
    s = (q @ kk.transpose(-1, -2)) / D ** 0.5
    s = s.masked_fill(torch.arange(n)[None, :] > torch.arange(n - lq, n)[:, None], float("-inf"))
    return s.softmax(-1) @ vv


def test_streaming_llm_with_a_budget_covering_the_stream_is_dense_rope_attention_at_the_original_positions():
    q, k, v = _qkv()
    rope = RotaryEmbedding(D)
    cache = SinkWindowCache(L, 4, rotary=rope)
    outs = []
    for t in range(L):
        cache.append(k[:, :, t:t + 1], v[:, :, t:t + 1])
        outs.append(cache.attend(q[:, :, t:t + 1]))
    qr, kr = rope.rotate(q), rope.rotate(k)
    torch.testing.assert_close(torch.cat(outs, 2), _dense(qr, kr, v), rtol=0, atol=1e-12)
    assert cache.evicted == 0


def test_streaming_llm_keeps_the_sinks_and_the_window_at_positions_within_the_cache():
    q, k, v = _qkv(1)
    rope = RotaryEmbedding(D)
    cache = SinkWindowCache(10, 3, rotary=rope)
    for t in range(L):
        cache.append(k[:, :, t:t + 1], v[:, :, t:t + 1])
        out = cache.attend(q[:, :, t:t + 1])
        kept = list(range(min(t + 1, 3))) + list(range(max(3, t + 1 - 7), t + 1)) if t + 1 > 10 else list(
            range(t + 1))
        want = _dense(rope.rotate(q[:, :, t:t + 1], offset=len(kept) - 1), rope.rotate(k[:, :, kept]), v[:, :, kept])
        torch.testing.assert_close(out, want, rtol=0, atol=1e-12)
    assert len(cache) == 10 and cache.evicted == L - 10


def test_h2o_with_a_budget_covering_the_stream_is_dense_and_evicts_down_to_its_budget_keeping_the_recent():
    q, k, v = _qkv(2)
    full, small = HeavyHitterCache(L, 4), HeavyHitterCache(12, 4)
    outs = []
    for t in range(L):
        for cache in (full, small):
            cache.append(k[:, :, t:t + 1], v[:, :, t:t + 1])
        outs.append(full.attend(q[:, :, t:t + 1]))
        small.attend(q[:, :, t:t + 1])
    torch.testing.assert_close(torch.cat(outs, 2), _dense(q, k, v), rtol=0, atol=1e-12)
    assert len(small) == 12 and bool((small.positions[..., -4:] == torch.arange(L - 4, L)).all())
    assert bool((small.positions.diff(dim=-1) > 0).all())  # kept in order, no key twice


def test_snapkv_with_a_budget_covering_the_prompt_keeps_everything_and_otherwise_the_windows_votes():
    q, k, v = _qkv(3)
    ck, cv, kept = snapkv(q, k, v, L, window=4)
    assert ck is k and cv is v and kept.shape == (B, HKV, L)
    ck, cv, kept = snapkv(q, k, v, 10, window=4, kernel=1)
    assert ck.shape == (B, HKV, 10, D) and bool((kept[..., -4:] == torch.arange(L - 4, L)).all())
    kk = k.repeat_interleave(2, 1)  # the votes recomputed densely: top-6 earlier keys per key/value head
    w = ((q[:, :, -4:] @ kk.transpose(-1, -2)) / D ** 0.5).masked_fill(
        torch.arange(L)[None, :] > torch.arange(L - 4, L)[:, None], float("-inf")).softmax(-1)
    votes = w[..., :L - 4].unflatten(1, (HKV, 2)).sum((2, 3))
    assert torch.equal(kept[..., :6], votes.topk(6, -1).indices.sort(-1).values)
    torch.testing.assert_close(ck, k.gather(2, kept[..., None].expand(-1, -1, -1, D)), rtol=0, atol=0)
    padded = torch.nn.functional.pad(votes, (2, 2))  # the default: a mean over 5 positions, zeros past the ends
    smooth = sum(padded[..., i:i + L - 4] for i in range(5)) / 5
    _, _, kept = snapkv(q, k, v, 10, window=4)
    assert torch.equal(kept[..., :6], smooth.topk(6, -1).indices.sort(-1).values)


def test_quest_with_pages_covering_the_sequence_is_dense_and_reads_the_pages_of_highest_bound():
    q, k, v = _qkv(4)
    torch.testing.assert_close(quest_attention(q[:, :, -3:], k, v, 5, 5), _dense(q[:, :, -3:], k, v), rtol=0,
                               atol=1e-12)
    pages = quest_pages(q[:, :, -1:], k, 5, 2)
    assert pages.shape == (B, H, 1, 2)
    b, h = 1, 3
    page_keys = torch.nn.functional.pad(k[b, h // 2], (0, 0, 0, 1)).view(5, 5, D)[:4]  # the 4 whole pages
    bound = [float(torch.maximum(q[b, h, -1] * pk.amin(0), q[b, h, -1] * pk.amax(0)).sum()) for pk in page_keys]
    last = k[b, h // 2, 20:]
    bound.append(float(torch.maximum(q[b, h, -1] * last.amin(0), q[b, h, -1] * last.amax(0)).sum()))
    assert set(pages[b, h, 0].tolist()) == set(torch.tensor(bound).topk(2).indices.tolist())
    assert quest_pages(q, k, 5, 9)[..., 5:].eq(-1).all()  # fewer pages than the budget: unused slots


def _steps(policy, q, k, v, prompt, rotary=None):
    """``policy.step`` over a prompt chunk, then one token at a time: the outputs ``(B, H, L, D)``."""
    outs = [policy.step(q[:, :, :prompt], k[:, :, :prompt], v[:, :, :prompt], rotary=rotary)]
    outs += [policy.step(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], rotary=rotary) for t in range(prompt, L)]
    return torch.cat(outs, 2)


@pytest.mark.parametrize("policy", [SinkWindowCache(L, 4), HeavyHitterCache(L, 4), SnapKVCache(L, window=4),
                                    QuestCache(L, 4)], ids=lambda p: type(p).__name__)
def test_every_policy_steps_as_dense_rope_attention_when_its_budget_covers_the_sequence(policy):
    q, k, v = _qkv(5)
    rope = RotaryEmbedding(D)
    got = _steps(policy.fresh(), q, k, v, 10, rope)
    torch.testing.assert_close(got, _dense(rope.rotate(q), rope.rotate(k), v), rtol=0, atol=1e-12)
    fresh = policy.fresh()
    assert type(fresh) is type(policy) and fresh.seen == 0 and fresh.budget == policy.budget


def test_snapkv_cache_attends_the_prompt_densely_then_decodes_over_the_compressed_prompt_and_the_new_tokens():
    q, k, v = _qkv(6)
    cache = SnapKVCache(10, window=4, kernel=1)
    got = _steps(cache, q, k, v, 16)
    _, _, kept = snapkv(q[:, :, :16], k[:, :, :16], v[:, :, :16], 10, window=4, kernel=1)
    torch.testing.assert_close(got[:, :, :16], _dense(q[:, :, :16], k[:, :, :16], v[:, :, :16]), rtol=0, atol=1e-12)
    for b in range(B):
        for h in range(H):
            cols = kept[b, h // 2].tolist() + list(range(16, L))
            for t in range(16, L):
                rows = [c for c in cols if c <= t]
                s = (q[b, h, t] @ k[b, h // 2, rows].T) / D ** 0.5
                torch.testing.assert_close(got[b, h, t], s.softmax(-1) @ v[b, h // 2, rows], rtol=0, atol=1e-12)
    assert len(cache) == 10 + L - 16 and cache.seen == L
    assert torch.equal(cache.positions, torch.cat([kept, torch.arange(16, L).expand(B, HKV, -1)], -1))


def test_quest_cache_reads_each_decoded_querys_pages_of_highest_bound():
    q, k, v = _qkv(7)
    cache = QuestCache(9, 4)  # 2 pages of 4 keys per query
    got = _steps(cache, q, k, v, 12)
    assert len(cache) == L and cache.seen == L
    for t in range(12, L):
        pages = quest_pages(q[:, :, t:t + 1], k[:, :, :t + 1], 4, 2)
        for b in range(B):
            for h in range(H):
                rows = [j for p in pages[b, h, 0].tolist() for j in range(4 * p, min(4 * p + 4, t + 1))]
                s = (q[b, h, t] @ k[b, h // 2, rows].T) / D ** 0.5
                torch.testing.assert_close(got[b, h, t], s.softmax(-1) @ v[b, h // 2, rows], rtol=0, atol=1e-12)


def test_budgets_below_what_a_policy_keeps_get_attnkits_errors():
    with pytest.raises(ArgumentError, match=r"budget must exceed the sink count \(4\).*budget=4"):
        SinkWindowCache(4, 4)
    with pytest.raises(ArgumentError, match=r"budget must exceed recent \(8\).*budget=3"):
        HeavyHitterCache(3, 8)
    q, k, v = _qkv()
    with pytest.raises(ArgumentError, match=r"budget must exceed the observation window \(32\)"):
        snapkv(q, k, v, 16)
    with pytest.raises(ArgumentError, match="budget"):
        quest_pages(q, k, 4, 0)
    with pytest.raises(ArgumentError, match="pool must be 'avg' or 'max'; got 'min'"):
        snapkv(q, k, v, 16, window=4, pool="min")
    with pytest.raises(ArgumentError, match=r"budget must exceed the observation window \(8\).*budget=8"):
        SnapKVCache(8, window=8)
    with pytest.raises(ArgumentError, match=r"QuestCache: budget must be an int >= 16 \(a page of keys at least\)"):
        QuestCache(10, 16)
    with pytest.raises(ShapeError, match=r"QuestCache.step: q must be \(B, H, t, D\) over k"):
        QuestCache(16, 4).step(q[:, :, :3], k, v)
    cache = SinkWindowCache(6, 2)
    cache.append(k, v)
    with pytest.raises(ShapeError, match=r"1 <= Lq <= 4"):
        cache.attend(q[:, :, -5:])
