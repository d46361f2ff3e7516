"""cascade_attention: the shared prefix read once, merged by log-sum-exp, equals the ordinary call per request.

Oracle: a dense float64 softmax written here over the concatenated keys with the mask built from
positions (no attnkit path), and attnkit.attention's ordinary call on the same concatenation.
"""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit import masks
from attnkit.errors import ArgumentError, ShapeError

H, HKV, D = 4, 2, 8


def _dense(q, k, v, window, sinks):
    """Softmax over keys ``(H, L, D)`` for queries at the last ``Lq`` positions, causal and windowed, sinks."""
    lq, lk = q.shape[-2], k.shape[-2]
    kk, vv = (t.repeat_interleave(H // HKV, 0) for t in (k, v))
    scores = q @ kk.transpose(-1, -2) / D ** 0.5
    pos, key = torch.arange(lk - lq, lk)[:, None], torch.arange(lk)[None, :]
    allowed = (key <= pos) & (True if window is None else key >= pos - window)
    scores = scores.masked_fill(~allowed, float("-inf"))
    if sinks is not None:
        scores = torch.cat([scores, sinks[:, None, None].expand(H, lq, 1)], -1)
    return (scores.softmax(-1)[..., :lk] @ vv)


@pytest.mark.parametrize("window", [None, 3, 20, 200])
@pytest.mark.parametrize("with_sinks", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
def test_cascade_equals_the_ordinary_call_for_random_prefixes_suffixes_windows_and_sinks(window, with_sinks, seed):
    g = torch.Generator().manual_seed(seed)
    n, p, s, lq = 3, int(torch.randint(1, 40, (1,), generator=g)), 9, int(torch.randint(1, 5, (1,), generator=g))
    lengths = torch.randint(lq, s + 1, (n,), generator=g)

    def r(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)
    q, pk, pv, sk, sv = r(n, H, lq, D), r(HKV, p, D), r(HKV, p, D), r(n, HKV, s, D), r(n, HKV, s, D)
    sinks = r(H) if with_sinks else None
    out, lse = attnkit.cascade_attention(q, pk, pv, sk, sv, suffix_lengths=lengths, window=window, sinks=sinks,
                                         return_lse=True)
    assert out.shape == (n, H, lq, D) and lse.shape == (n, H, lq)
    for i in range(n):
        k = torch.cat([pk, sk[i, :, :lengths[i]]], 1)
        v = torch.cat([pv, sv[i, :, :lengths[i]]], 1)
        torch.testing.assert_close(out[i], _dense(q[i], k, v, window, sinks), rtol=0, atol=1e-12)
        mask = masks.causal() if window is None else masks.sliding_window(window, 0)
        ordinary = attnkit.attention(q[i:i + 1], k[None], v[None], mask=mask, sinks=sinks, return_lse=True)
        torch.testing.assert_close(out[i:i + 1], ordinary.output, rtol=0, atol=1e-12)
        torch.testing.assert_close(lse[i:i + 1], ordinary.lse, rtol=0, atol=1e-12)


def test_explain_shows_the_prefix_read_once_and_only_the_keys_a_window_reaches():
    q, pk, sk = torch.randn(16, H, 1, D), torch.randn(HKV, 4096, D), torch.randn(16, HKV, 16, D)
    plan = attnkit.explain_cascade(q, pk, pk, sk, sk)
    assert (plan.prefix_from, plan.prefix_len, plan.stacked_rows, plan.prefix_reads_ordinary) == (0, 4096, 16,
                                                                                                   16 * 4096)
    assert "prefix keys [0, 4096) read once for 16 stacked query rows of 16 requests" in str(plan)
    windowed = attnkit.explain_cascade(q, pk, pk, sk, sk, window=20)  # query at 4096 + 15 reaches back to 4091
    assert windowed.prefix_from == 4096 + 15 - 20
    assert "no prefix call" in str(attnkit.explain_cascade(q, pk, pk, sk, sk, window=10))


def test_bad_cascade_input_gets_attnkits_errors():
    q, pk, sk = torch.randn(2, H, 3, D), torch.randn(HKV, 5, D), torch.randn(2, HKV, 4, D)
    with pytest.raises(ShapeError, match=r"suffix_k must have shape \(requests=2, H_kv=2, S, D=8\)"):
        attnkit.cascade_attention(q, pk, pk, sk[:1], sk[:1])
    with pytest.raises(ArgumentError, match=r"Lq <= suffix_lengths\[r\] <= S.*\[2, 4\]"):
        attnkit.cascade_attention(q, pk, pk, sk, sk, suffix_lengths=torch.tensor([2, 4]))
    with pytest.raises(ShapeError, match=r"sinks must have shape \(H=4,\)"):
        attnkit.cascade_attention(q, pk, pk, sk, sk, sinks=torch.zeros(3))
    with pytest.raises(ArgumentError, match="window"):
        attnkit.cascade_attention(q, pk, pk, sk, sk, window=-1)
