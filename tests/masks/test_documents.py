"""Documents aligned to blocks: the predicate, and a block-diagonal layout computed without a T x T evaluation."""

from __future__ import annotations

import pytest
import torch

from attnkit import masks
from attnkit.masks.documents import Documents


def _docs(within, q_lengths=(5, 9, 1, 0, 7), k_lengths=(7, 9, 3, 2, 7), bs=4):
    q_len, k_len = torch.tensor(q_lengths), torch.tensor(k_lengths)
    pad = lambda n: -(-n // bs) * bs
    q_first, k_first = torch.cumsum(pad(q_len), 0) - pad(q_len), torch.cumsum(pad(k_len), 0) - pad(k_len)
    return Documents(q_first, q_len, k_first, k_len, int(pad(q_len).sum()), int(pad(k_len).sum()), bs, within)


def _expected(docs, lq_total, lk_total, within):
    """By loops over documents: the document's own mask at local positions, placed at its rows and columns."""
    out = torch.zeros(lq_total, lk_total, dtype=torch.bool)
    for d in range(len(docs.q_lengths)):
        lq, lk = int(docs.q_lengths[d]), int(docs.k_lengths[d])
        q0, k0 = int(docs.q_starts[d]), int(docs.k_starts[d])
        local = torch.ones(lq, lk, dtype=torch.bool) if within is None else within.materialize(lq, lk)[0, 0]
        out[q0:q0 + lq, k0:k0 + lk] = local
    return out


@pytest.mark.parametrize("within", [None, masks.causal(), masks.sliding_window(2, 1), masks.strided(3)])
def test_each_document_sees_its_own_keys_under_its_own_mask(within):
    docs = _docs(within)
    expected = _expected(docs, docs.q_len, docs.kv_len, within)
    assert torch.equal(docs.materialize(docs.q_len, docs.kv_len)[0, 0], expected)


@pytest.mark.parametrize("within", [None, masks.causal(), masks.sliding_window(2, 1), masks.strided(3)])
def test_the_layout_at_the_alignment_equals_the_evaluated_one_without_evaluating_everything(within, monkeypatch):
    docs = _docs(within)
    exact = docs.block_layout(docs.q_len, docs.kv_len, 4, exact=True)
    monkeypatch.setattr(Documents, "_evaluated_layout", lambda *a: pytest.fail("a T x T evaluation"))
    layout = docs.block_layout(docs.q_len, docs.kv_len, 4)
    assert torch.equal(layout.active, exact.active) and torch.equal(layout.full, exact.full)
