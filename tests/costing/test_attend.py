"""costing.attend: one attention() call priced on the path the dispatcher picks, asked only when that is cheap."""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit import masks
from attnkit.costing.attend import QUESTION_LIMIT, attend, check_question
from attnkit.costing.tally import Tally
from attnkit.errors import ArgumentError


@pytest.mark.parametrize("mask", [None, masks.causal(), masks.sliding_window(16, 16)])
def test_the_count_is_the_cost_explain_reports(mask):
    b, h, n, d = 2, 3, 257, 11
    t = Tally(backward=False)
    backend = attend(t, "", b, h, n, n, d, d, mask=mask)
    q = torch.zeros(b, h, n, d)
    decision = attnkit.explain(q, q, q, mask=mask)
    assert backend == decision.backend and sum(t.terms.values()) == decision.flops


def test_a_masked_call_too_large_to_decide_is_refused_and_an_unmasked_one_is_priced():
    n = 10 ** 9
    t = Tally(backward=False)
    attend(t, "", 1, 8, n, n, 64, 64)
    attend(t, "causal: ", 1, 8, n, n, 64, 64, mask=masks.causal())  # torch's causal flag: decided in O(1)
    assert sum(t.terms.values()) == 2 * 2 * 8 * n * n * 128
    with pytest.raises(ArgumentError, match=r"the window call .* has a mask"):
        attend(t, "window: ", 1, 8, n, n, 64, 64, mask=masks.sliding_window(8, 8))
    with pytest.raises(ArgumentError, match="has a bias"):
        attend(t, "", 1, 8, n, n, 64, 64, bias=attnkit.bias.softcap(5.0))
    check_question((1, 1, 1, 1, 1, 1), "mask")  # small: asked
    with pytest.raises(ArgumentError, match=str(QUESTION_LIMIT)):
        check_question((1, 1, QUESTION_LIMIT, 1, 1, 1), "mask")


def test_an_attention_call_keeps_a_kv_cache_of_its_keys_and_values_per_token():
    from attnkit.costing.analytic import cost
    from attnkit.nn import MultiHeadAttention

    mha = MultiHeadAttention(12, 3, num_kv_heads=1, batch_first=True, dtype=torch.float64)
    cache = mha.new_cache(2, 7)
    mha.forward_step(torch.randn(2, 7, 12, dtype=torch.float64), cache)
    held = cache.keys.nbytes + cache.values.nbytes  # (2, 1, 7, 4) each
    c = cost(mha, batch=2, q_len=7)
    assert 2 * 7 * c.state_per_token == 2 * c.state_bytes == held and c.state_fixed == 0
    for name in ("scaled-dot-product", "causal", "sdpa"):
        c = cost(name, batch=1, heads=4, kv_heads=2, q_len=5, kv_len=9, head_dim=6, value_dim=3, dtype="bfloat16")
        assert (c.state_per_token, c.context, c.state_bytes) == (2 * (6 + 3) * 2, 9, 9 * 2 * (6 + 3) * 2), name
