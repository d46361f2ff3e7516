"""Selected keys and pages as masks: their predicate, the dense picture the oracle reads, their block layouts."""

from __future__ import annotations

import pytest
import torch

from attnkit import masks
from attnkit.errors import DTypeError, ShapeError
from attnkit.masks.selected import Pages


def _membership(indices, block_size, lq, lk, heads, group):
    """(B, H, Lq, Lk) bool by Python loops: query i of head h sees the blocks listed for it."""
    batch = indices.shape[0]
    out = torch.zeros(batch, heads, lq, lk, dtype=torch.bool)
    for b in range(batch):
        for h in range(heads):
            s = 0 if indices.shape[1] == 1 else h // group
            for i in range(lq):
                for blk in indices[b, s, i if indices.shape[2] > 1 else 0].tolist():
                    if blk >= 0:
                        out[b, h, i, blk * block_size:min(lk, (blk + 1) * block_size)] = True
    return out


def test_selected_keys_allow_exactly_the_listed_keys_repeats_once_negatives_never():
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(-2, 7, (2, 5, 4), generator=g)  # repeats and negatives on purpose
    m = masks.selected_keys(idx)
    expected = _membership(idx[:, None], 1, 5, 7, 3, 1)
    assert torch.equal(m.materialize(5, 7, batch=2, heads=3).expand(2, 3, 5, 7), expected)
    assert m.kind == "selected" and m.selection is m and m.rest is None


def test_selected_blocks_per_head_group_share_one_selection():
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(-1, 4, (2, 2, 11, 3), generator=g)  # 2 index heads, each serving 3 query heads
    m = masks.selected_blocks(idx, 3, group_size=3)
    assert m.num_heads == 6
    assert torch.equal(m.materialize(11, 10, batch=2, heads=6), _membership(idx, 3, 11, 10, 6, 3))


def test_and_with_causal_keeps_the_kind_and_names_both_parts():
    idx = torch.tensor([[0, 3], [1, 2], [0, 2]])
    m = masks.selected_keys(idx) & masks.causal()
    assert m.kind == "selected" and m.rest.kind == "causal" and m.selection.kind == "selected"
    assert m.materialize(3, 4)[0, 0].int().tolist() == [[1, 0, 0, 0], [0, 1, 1, 0], [1, 0, 1, 0]]


@pytest.mark.parametrize("bs", [2, 3, 4])
def test_block_layouts_cover_every_allowed_entry(bs):
    g = torch.Generator().manual_seed(bs)
    idx = torch.randint(-1, 5, (1, 2, 13, 2), generator=g)
    m = masks.selected_blocks(idx, 3)
    dense = m.materialize(13, 14, heads=2)
    layout = m.block_layout(13, 14, bs, heads=2).active
    nq, nk = layout.shape[-2:]
    pad = torch.nn.functional.pad(dense, (0, nk * bs - 14, 0, nq * bs - 13))
    touched = pad.view(1, 2, nq, bs, nk, bs).any(5).any(3)
    assert not (touched & ~layout).any()


def test_pages_allow_each_sequences_own_positions_in_order():
    table = torch.tensor([[4, 1, 3], [0, 2, 0]])  # sequence 1 holds 5 keys on pages 0, 2
    pages = Pages(table, 2, torch.tensor([6, 3]), masks.causal())
    allowed = pages.materialize(2, 10, batch=2)  # 2 queries over a pool of 5 pages of 2
    for b, length in ((0, 6), (1, 3)):
        for i in range(2):
            position = length - 2 + i  # bottom-right in the sequence's own keys
            want = torch.zeros(10, dtype=torch.bool)
            for t in range(position + 1):
                want[table[b, t // 2] * 2 + t % 2] = True
            assert torch.equal(allowed[b, 0, i], want)


def test_selected_keys_refuse_float_and_wrong_rank_indices():
    with pytest.raises(DTypeError, match="indices must be an integer tensor"):
        masks.selected_keys(torch.zeros(3, 2))
    with pytest.raises(ShapeError, match=r"indices must have shape \(Lq, k\)"):
        masks.selected_keys(torch.zeros(3, dtype=torch.long))


@pytest.mark.parametrize("backend", ["auto", "reference", "chunked", "sdpa", "blocksparse"])
@pytest.mark.parametrize(("build", "last"), [(lambda idx: masks.selected_keys(idx), 9),
                                             (lambda idx: masks.selected_blocks(idx, 4) & masks.causal(), 2)])
def test_indices_past_the_last_key_or_block_are_refused_at_the_call_naming_indices(build, last, backend):
    import attnkit
    from attnkit.errors import ArgumentError

    q = torch.randn(1, 2, 3, 8)
    kv = torch.randn(1, 2, 10, 8)  # 10 keys: keys 0..9, blocks of 4: 0..2
    ok = build(torch.tensor([[0, last], [1, -1], [-5, 2]]))
    attnkit.attention(q, kv, kv, mask=ok, backend=backend)  # the last key (block) and unused slots are fine
    past = build(torch.tensor([[0, last + 1], [1, -1], [2, 2]]))
    words = rf"indices must name .* in \[0, {last + 1}\) for kv_len=10.*got {last + 1}"
    with pytest.raises(ArgumentError, match=words):
        attnkit.attention(q, kv, kv, mask=past, backend=backend)
    with pytest.raises(ArgumentError, match="indices must name"):
        past.materialize(3, 10)
    with pytest.raises(ArgumentError, match="indices must name"):
        masks.shifted(past, q0=0, k0=0, q_len=3, kv_len=10)
