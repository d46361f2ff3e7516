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
