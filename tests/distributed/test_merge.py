"""The lse merge (distributed/merge.py) against attention over all keys at once; stable and safe for -inf rows."""

from __future__ import annotations

import torch

from attnkit.distributed.merge import merge, weight


def _attend(scores, v):
    return torch.softmax(scores, -1).nan_to_num(0) @ v, torch.logsumexp(scores, -1)


def test_merge_of_parts_equals_attention_over_all_keys():
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(2, 3, 5, 11, dtype=torch.float64, generator=g) * 40  # logits far beyond exp's range
    scores[0, 0, 1] += 2000.0
    scores[1, 2, 3] = float("-inf")  # a row with no allowed key
    scores[1, 1, 2, :6] = float("-inf")  # a row whose first part is empty
    v = torch.randn(2, 3, 11, 4, dtype=torch.float64, generator=g)
    acc = None
    for cut in ((0, 6), (6, 9), (9, 11)):
        acc = merge(acc, _attend(scores[..., cut[0]:cut[1]], v[..., cut[0]:cut[1], :]))
    want_out, want_lse = _attend(scores, v)
    assert torch.isfinite(acc[0]).all()
    assert torch.allclose(acc[0], want_out, rtol=0, atol=1e-12)
    assert torch.equal(acc[1] == float("-inf"), want_lse == float("-inf"))
    finite = want_lse != float("-inf")
    assert torch.allclose(acc[1][finite], want_lse[finite], rtol=1e-15, atol=0)
    assert torch.equal(acc[0][1, 2, 3], torch.zeros(4, dtype=torch.float64))


def test_weight_is_zero_for_rows_that_allow_nothing():
    inf = float("-inf")
    assert weight(torch.tensor([inf, inf, 0.0]), torch.tensor([inf, 1.0, 0.0])).tolist() == [0.0, 0.0, 1.0]


def test_merge_accumulates_in_the_lse_dtype():
    out, _ = merge(None, (torch.ones(1, 2, dtype=torch.bfloat16), torch.zeros(1, dtype=torch.float32)))
    assert out.dtype == torch.float32
