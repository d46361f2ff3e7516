"""A decoding step over selected keys (kernels/selected_decode.py) against the float64 per-query oracle and the full
causal call whose last row it is."""

from __future__ import annotations

import math

import pytest
import torch

import attnkit
from attnkit import masks
from attnkit.core import _prepare
from attnkit.kernels import selected, selected_decode
from tests.helpers import rand_qkv
from tests.kernels.test_selected import _oracle

CASES = {  # name: (B, H, Hkv, Lk, index heads, slots n, block size)
    "DSA: top keys shared by the heads": (2, 4, 4, 37, 1, 9, 1),
    "DSA: grouped-query heads, odd cache": (1, 6, 2, 53, 1, 16, 1),
    "NSA: blocks per key/value group, cache not a block multiple": (2, 6, 2, 53, 2, 4, 5),
    "NSA: blocks per query head": (1, 4, 2, 41, 4, 3, 4),
    "blocks, one selection for every head": (2, 3, 3, 29, 1, 3, 8),
}


def _selection(lk, shape, bs, seed):
    """Distinct block ids per row (a top-k), some rows with -1 slots, the last block (part past the keys) included."""
    g = torch.Generator().manual_seed(seed)
    blocks = -(-lk // bs)
    idx = torch.rand(*shape[:-1], blocks, generator=g).argsort(-1)[..., :shape[-1]]
    idx[..., 0] = blocks - 1
    idx[..., -1] = torch.where(torch.rand(shape[:-1], generator=g) < 0.5, -1, idx[..., -1])
    return idx


def _mask(idx, bs, group):
    return masks.selected_blocks(idx, bs, group_size=group) if bs > 1 else masks.selected_keys(idx, group_size=group)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", list(CASES))
def test_a_decoding_step_equals_the_float64_oracle(name, causal):
    b, h, hkv, lk, hs, n, bs = CASES[name]
    q, k, v = rand_qkv(b, h, 1, lk, 8, hkv=hkv, dtype=torch.float64, seed=1)
    idx = _selection(lk, (b, hs, 1, n), bs, seed=2)
    group = h // hs
    mask = _mask(idx, bs, group)
    mask = mask & masks.causal() if causal else mask
    p = _prepare(q, k, v, mask=mask)
    assert selected_decode.applies(p)
    decision = attnkit.explain(q, k, v, mask=mask, backend="blocksparse")  # (dense selections: auto picks dense)
    assert decision.path == "blocksparse-gathered" and "a decoding step" in decision.reasons["blocksparse-gathered"]
    result = attnkit.attention(q, k, v, mask=mask, return_lse=True, backend="blocksparse")
    out, lse = _oracle(q, k, v, idx, bs, group, causal)
    torch.testing.assert_close(result.output, out, rtol=0, atol=1e-12)
    torch.testing.assert_close(result.lse, lse, rtol=0, atol=1e-12)
    q32, k32, v32 = (t.float() for t in (q, k, v))
    torch.testing.assert_close(attnkit.attention(q32, k32, v32, mask=mask, backend="blocksparse"), out.float(),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", list(CASES))
def test_a_decoding_step_is_the_last_row_of_the_full_causal_call(name):
    """Every query its own selection, the whole sequence at once (the training forward's call); the step reads the
    last query's selection over the same keys (the cache) and gives that row."""
    b, h, hkv, lk, hs, n, bs = CASES[name]
    q, k, v = rand_qkv(b, h, lk, lk, 8, hkv=hkv, dtype=torch.float64, seed=3)
    idx = _selection(lk, (b, hs, lk, n), bs, seed=4)
    full = attnkit.attention(q, k, v, mask=_mask(idx, bs, h // hs) & masks.causal())
    last = _mask(idx[:, :, -1:], bs, h // hs) & masks.causal()
    assert selected_decode.applies(_prepare(q[:, :, -1:], k, v, mask=last))
    step = attnkit.attention(q[:, :, -1:], k, v, mask=last, backend="blocksparse")
    torch.testing.assert_close(step, full[:, :, -1:], rtol=0, atol=1e-12)


def test_a_cache_with_room_to_spare_or_token_major_is_read_in_place():
    """A slice of a preallocated cache (head and batch strides past its length) or a token-major one: rows of the
    buffer, no copy."""
    q, _, _ = rand_qkv(2, 4, 1, 30, 8, hkv=2, dtype=torch.float64, seed=5)
    buffers = [torch.randn(2, 2, 64, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(s))
               for s in (6, 7)]
    k, v = (t[:, :, :30] for t in buffers)
    rows = selected_decode._rows(k)
    assert rows is not None and rows[0].data_ptr() == buffers[0].data_ptr() and rows[1:] == (2 * 64, 64, 1)
    idx = _selection(30, (2, 1, 1, 7), 1, seed=8)
    mask = masks.selected_keys(idx)
    out, _ = _oracle(q, k, v, idx, 1, 4)
    torch.testing.assert_close(attnkit.attention(q, k, v, mask=mask), out, rtol=0, atol=1e-12)
    token_major = k.transpose(1, 2).contiguous().transpose(1, 2)  # (B, L, H, E) seen as (B, H, L, E)
    assert selected_decode._rows(token_major)[1:] == (30 * 2, 1, 2)
    torch.testing.assert_close(attnkit.attention(q, token_major, v, mask=mask), out, rtol=0, atol=1e-12)
    strided = k.transpose(2, 3).contiguous().transpose(2, 3)  # no row view: advanced indexing, same answer
    assert selected_decode._rows(strided) is None
    torch.testing.assert_close(attnkit.attention(q, strided, v, mask=mask), out, rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["values in place", "fused"])
def test_no_step_reads_more_than_the_selected_rows(monkeypatch, dtype):
    """The keys copied are the selected rows, ``B hx n bs``, however long the cache; in the compute dtype the values
    are never copied: ``embedding_bag`` reads the selected rows of the cache itself, once per query row (here 2
    query heads per key/value head); on the fused route (half precision) the values' selected rows are copied too."""
    copied, bags = [], []
    real, bag = torch.index_select, torch.nn.functional.embedding_bag

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        copied.append(out.shape)
        return out

    def bag_spy(where, values, *args, **kwargs):
        bags.append((where.numel(), values.data_ptr()))
        return bag(where, values, *args, **kwargs)
    monkeypatch.setattr(torch, "index_select", spy)
    monkeypatch.setattr(torch.nn.functional, "embedding_bag", bag_spy)
    q, k, v = rand_qkv(1, 4, 1, 4000, 8, hkv=2, dtype=dtype)
    attnkit.attention(q, k, v, mask=masks.selected_blocks(_selection(4000, (1, 2, 1, 3), 64, seed=9), 64,
                                                          group_size=2))
    if dtype == torch.float32:
        assert copied == [torch.Size([2 * 3 * 64, 8])] and bags == [(2 * 2 * 3 * 64, v.data_ptr())]
    else:
        assert copied == [torch.Size([2 * 3 * 64, 8])] * 2 and not bags


def test_a_nan_in_a_selected_key_gives_the_exact_paths_answer_and_unselected_ones_never_leak():
    q, k, v = rand_qkv(1, 2, 1, 20, 8, dtype=torch.float64, seed=10)
    idx = torch.tensor([[[[1, 4, 7, -1]]]])
    k, v = k.clone(), v.clone()
    k[:, :, 10:], v[:, :, 10:] = math.nan, math.inf  # not selected: never read into a product
    out, lse = _oracle(q, k, v, idx, 1, 2)
    result = attnkit.attention(q, k, v, mask=masks.selected_keys(idx), return_lse=True)
    torch.testing.assert_close(result.output, out, rtol=0, atol=1e-12)
    torch.testing.assert_close(result.lse, lse, rtol=0, atol=1e-12)
    k[:, 0, 4] = math.nan  # selected by head 0: torch's answer is refused, the exact path answers
    p = _prepare(q, k, v, mask=masks.selected_keys(idx), return_lse=True)
    assert selected_decode.run(p) is None
    want = selected.run(p.with_inputs(mask=masks.selected_keys(idx.expand(1, 1, 2, 4))))  # no decode path
    got = attnkit.attention(q, k, v, mask=masks.selected_keys(idx), return_lse=True)
    torch.testing.assert_close(got.output, want.out[:, :, :1], rtol=0, atol=0, equal_nan=True)


def test_autograd_and_long_selections_take_the_general_path(monkeypatch):
    q, k, v = rand_qkv(1, 2, 1, 50, 8, requires_grad=True)
    mask = masks.selected_keys(_selection(50, (1, 1, 1, 6), 1, seed=11))
    assert not selected_decode.applies(_prepare(q, k, v, mask=mask))
    with torch.no_grad():
        assert selected_decode.applies(_prepare(q, k, v, mask=mask))
        monkeypatch.setattr(selected_decode, "BUDGET", 6 * 2 * 16 - 1)
        assert not selected_decode.applies(_prepare(q, k, v, mask=mask))


@pytest.mark.parametrize("n,kv_heads", [(61, 2), (64, 4), (77, 1)])
def test_an_nsa_decoding_step_over_its_caches_is_the_last_row_of_the_module(n, kv_heads):
    """NSA's step for the last token (as the benchmark's ``decode`` row runs it): the selection from the cached
    compressed keys (``nsa_blocks(start=)``), then the compressed, selected and window attentions over the caches,
    gated; the compressed keys of a prefix are the first compressed keys of the whole (a block, once ended, never
    changes: they are cached as the cache grows). GQA, caches not a multiple of the block."""
    from attnkit.masks.selected import SelectedKeys
    from attnkit.nn import NativeSparseAttention
    from attnkit.nn.nsa import nsa_blocks

    torch.manual_seed(0)
    layer = NativeSparseAttention(24, 4, kv_heads=kv_heads, compress_block=8, compress_stride=4, select_block=8,
                                  num_selected=3, window=10).double()
    x = torch.randn(2, n, 24, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = layer(x)[:, -1]
        q, (k_c, v_c), (k_s, v_s), (k_w, v_w), _ = layer.branches(x)
        k_cmp = layer.kv_proj(x[:, :n - 5]).view(2, n - 5, 6, kv_heads, 6)[:, :, 0].transpose(1, 2)  # 5 tokens ago
        prefix = layer.compress_k(k_cmp.contiguous())
        torch.testing.assert_close(prefix, k_c[:, :, :prefix.shape[2]], rtol=0, atol=1e-12)
        q_t, d = q[:, :, -1:], layer.head_dim
        chosen = nsa_blocks(q_t, k_c, length=8, stride=4, block=8, count=3, scale=d ** -0.5, start=n - 1)
        selection = SelectedKeys(chosen, 8, group_size=4 // kv_heads, distinct=True) & masks.causal()
        assert selected_decode.applies(_prepare(q_t, k_s, v_s, mask=selection))
        branches = (attnkit.attention(q_t, k_c, v_c), attnkit.attention(q_t, k_s, v_s, mask=selection),
                    attnkit.attention(q_t, k_w[:, :, -10:], v_w[:, :, -10:]))
        g = torch.sigmoid(layer.gate(x[:, -1:])).view(2, 1, 4, 3).permute(3, 0, 2, 1).unsqueeze(-1)
        out = sum(g[i] * branches[i] for i in range(3))
        got = layer.out_proj(out.transpose(1, 2).reshape(2, 1, 24))[:, 0]
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("n,top_k", [(37, 8), (64, 16), (40, 64)])
def test_a_dsa_decoding_step_over_its_caches_is_the_last_row_of_the_module(n, top_k):
    """DSA's step for the last token: the indexer's scores of that query over the cached indexer keys, their top-k,
    attention over those keys of the cache; ``top_k`` past the length: every key (dense attention)."""
    from attnkit.masks.selected import SelectedKeys
    from attnkit.nn import DSASparseAttention

    torch.manual_seed(0)
    layer = DSASparseAttention(24, 4, top_k=top_k, index_heads=2, index_dim=8).double()
    x = torch.randn(2, n, 24, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = layer(x)[:, -1:]
        q, k, v = layer.project(x)
        scores = layer.indexer.scores(x, start=n - 1)  # (B, 1, n): the last query over every cached key
        idx = scores.topk(min(top_k, n), -1, sorted=False).indices.unsqueeze(1)  # (B, 1, 1, k)
        mask = SelectedKeys(idx, distinct=True) & masks.causal()
        assert selected_decode.applies(_prepare(q[:, :, -1:], k, v, mask=mask))
        got = layer.merge_heads(attnkit.attention(q[:, :, -1:], k, v, mask=mask))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_consecutive_steps_copy_into_the_threads_buffers_and_earlier_answers_stay(monkeypatch):
    """On the fused route (half precision, or more query rows per head group than ``WEIGHTED_ROWS``) the selected rows
    go into this thread's buffers, kept from step to step (no fresh pages for every step); the answers are the
    kernel's own tensors, so a later step leaves an earlier one as it was."""
    from attnkit.kernels.page_chunks import workspace

    monkeypatch.setattr(selected_decode, "WEIGHTED_ROWS", 0)
    q, k, v = rand_qkv(1, 4, 1, 300, 8, hkv=2, dtype=torch.float64, seed=12)
    first, second = (_selection(300, (1, 2, 1, 3), 16, seed=s) for s in (13, 14))
    a = attnkit.attention(q, k, v, mask=_mask(first, 16, 2))
    held = workspace(k).buffers["decode keys"].data_ptr()
    kept = a.clone()
    b = attnkit.attention(q, k, v, mask=_mask(second, 16, 2))
    assert workspace(k).buffers["decode keys"].data_ptr() == held
    torch.testing.assert_close(a, kept, rtol=0, atol=0)
    for got, idx in ((a, first), (b, second)):
        out, _ = _oracle(q, k, v, idx, 16, 2)
        torch.testing.assert_close(got, out, rtol=0, atol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
def test_an_empty_selection_is_not_a_decoding_step_and_gives_empty_rows(causal):
    """Indices ``(B, 1, 1, 0)`` name no key: torch's kernel over zero keys raises SIGFPE on this build (the
    process dies; docs/RELIABILITY.md row 16: never an FPE), so the step is refused before the kernel and the
    rows answer as row 1: output 0, lse -inf."""
    q, k, v = rand_qkv(2, 4, 1, 20, 8, dtype=torch.float64, seed=15)
    mask = masks.selected_keys(torch.zeros(2, 1, 1, 0, dtype=torch.long))
    mask = mask & masks.causal() if causal else mask
    assert not selected_decode.applies(_prepare(q, k, v, mask=mask))
    got = attnkit.attention(q, k, v, mask=mask, return_lse=True, backend="blocksparse")
    assert torch.equal(got.output, torch.zeros_like(got.output))
    assert torch.equal(got.lse, torch.full_like(got.lse, -math.inf))


@pytest.mark.parametrize("slots", [[1, 5, 7], [1, 5, -1]], ids=["every slot", "an unused slot"])
def test_a_selection_and_the_full_mask_is_the_selection(slots):
    """``selected_keys(idx) & full()``: the mask beside the selection allows every key (its answer broadcast; a
    0-d answer made the step index a dim it did not have)."""
    q, k, v = rand_qkv(2, 4, 1, 20, 8, hkv=2, dtype=torch.float64, seed=16)
    idx = torch.tensor([[[slots]]])
    mask = masks.selected_keys(idx) & masks.full()
    assert selected_decode.applies(_prepare(q, k, v, mask=mask))
    got = attnkit.attention(q, k, v, mask=mask, backend="blocksparse")
    out, _ = _oracle(q, k, v, idx, 1, 4)
    torch.testing.assert_close(got, out, rtol=0, atol=1e-12)


def _general(p):
    """The exact gathered path's answer for ``p`` (its selection seen as one per query: not a decoding step)."""
    sel = p.mask.selection
    shape = (*sel.indices.shape[:2], p.sizes[2], sel.indices.shape[3])
    return selected.run(p.with_inputs(mask=masks.selected_keys(sel.indices.expand(shape), group_size=sel.group_size)))


@pytest.mark.parametrize("route", ["in place", "fused"])
@pytest.mark.parametrize("lq,causal", [(1, False), (2, True), (2, False)])
def test_both_routes_equal_the_float64_oracle_for_small_query_counts(monkeypatch, route, lq, causal):
    """A few queries sharing one selection (a chunk of a decoding step, GQA 6:2, one index head per key/value group):
    each route equals the per-query float64 oracle, output and lse; in float32 to float32's rounding."""
    if route == "fused":
        monkeypatch.setattr(selected_decode, "WEIGHTED_ROWS", 0)
    q, k, v = rand_qkv(2, 6, lq, 45, 8, hkv=2, dtype=torch.float64, seed=20)
    idx = _selection(45, (2, 2, 1, 9), 1, seed=21)
    mask = masks.selected_keys(idx, group_size=3)
    mask = mask & masks.causal() if causal else mask
    p = _prepare(q, k, v, mask=mask)
    assert selected_decode.applies(p) and selected_decode._weighted_ok(p, 3) == (route == "in place")
    assert ("embedding_bag" in selected_decode.describe(p)) == (route == "in place")
    out, lse = _oracle(q, k, v, idx, 1, 3, causal)
    got = attnkit.attention(q, k, v, mask=mask, return_lse=True)
    torch.testing.assert_close(got.output, out, rtol=0, atol=1e-12)
    torch.testing.assert_close(got.lse, lse, rtol=0, atol=1e-12)
    got32 = attnkit.attention(*(t.float() for t in (q, k, v)), mask=mask, return_lse=True)
    torch.testing.assert_close(got32.output, out.float(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got32.lse, lse.float(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_selection_of_every_key_is_dense_attention(dtype):
    """Every key selected, in any order, once each: the step (in place) is dense attention over the cache."""
    q, k, v = rand_qkv(2, 4, 1, 33, 8, hkv=2, dtype=dtype, seed=22)
    idx = torch.stack([torch.randperm(33, generator=torch.Generator().manual_seed(s)) for s in (1, 2)])
    mask = masks.selected_keys(idx.view(2, 1, 1, 33))
    assert "embedding_bag" in attnkit.explain(q, k, v, mask=mask, backend="blocksparse").reasons[
        "blocksparse-gathered"]
    got = attnkit.attention(q, k, v, mask=mask, return_lse=True, backend="blocksparse")
    want = attnkit.attention(q, k, v, return_lse=True)
    tol = 1e-12 if dtype == torch.float64 else 1e-6
    torch.testing.assert_close(got.output, want.output, rtol=0, atol=tol)
    torch.testing.assert_close(got.lse, want.lse, rtol=0, atol=tol)


def _poison(where, k, v, q):
    """Non-finite values at one place of the inputs (a copy of each)."""
    q, k, v = q.clone(), k.clone(), v.clone()
    if where == "nan in a query":
        q[0, 1, 0, 3] = math.nan
    elif where == "nan in a selected key":
        k[1, 0, 4, 2] = math.nan
    elif where == "inf in a selected value":
        v[0, 1, 7, 0] = math.inf
    elif where == "-inf in a selected key":
        k[0, 0, 4, :] = -math.inf
    elif where == "nan where unused slots read (row 0), unselected keys":
        v[:, :, 0], k[:, :, 0] = math.nan, math.inf
        v[:, :, 12:], k[:, :, 12:] = math.nan, math.nan
    return q, k, v


@pytest.mark.parametrize("where", ["nan in a query", "nan in a selected key", "inf in a selected value",
                                   "-inf in a selected key", "nan where unused slots read (row 0), unselected keys"])
@pytest.mark.parametrize("route", ["in place", "fused"])
def test_non_finite_inputs_get_the_exact_paths_answer(monkeypatch, where, route):
    """NaN or inf in a query, a selected key or value, or where an unused slot's clamped row lies: each route answers
    as the exact gathered path does (NaN where it gives NaN), never with a value of its own; what is not selected
    never leaks."""
    if route == "fused":
        monkeypatch.setattr(selected_decode, "WEIGHTED_ROWS", 0)
    q, k, v = rand_qkv(2, 4, 1, 20, 8, hkv=2, dtype=torch.float64, seed=23)
    q, k, v = _poison(where, k, v, q)
    idx = torch.tensor([[[[4, 7, 9, -1, 3]]], [[[1, 4, -1, 7, 11]]]])
    for dtype in (torch.float64, torch.float32):
        args = [t.to(dtype) for t in (q, k, v)]
        mask = masks.selected_keys(idx)
        want = _general(_prepare(*args, mask=mask, return_lse=True))
        got = attnkit.attention(*args, mask=mask, return_lse=True)
        torch.testing.assert_close(got.output, want.out, rtol=0, atol=0, equal_nan=True)
        torch.testing.assert_close(got.lse, want.lse, rtol=0, atol=0, equal_nan=True)
    if where.startswith("nan where"):
        out, _ = _oracle(q, k, v, idx, 1, 2)
        torch.testing.assert_close(got.output.double(), out, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("route", ["in place", "fused"])
@pytest.mark.parametrize("causal", [False, True])
def test_unused_slots_repeats_and_rows_with_no_key(monkeypatch, route, causal):
    """Slots of -1, a key named twice (one key), and a batch row whose every slot is -1 (output 0, lse -inf, as the
    exact path): the float64 oracle on each route."""
    if route == "fused":
        monkeypatch.setattr(selected_decode, "WEIGHTED_ROWS", 0)
    q, k, v = rand_qkv(3, 2, 1, 16, 8, dtype=torch.float64, seed=24)
    idx = torch.tensor([[[[5, -1, 5, 2, 15]]], [[[-1, -1, -1, -1, -1]]], [[[0, 0, 0, 9, -1]]]])
    mask = masks.selected_keys(idx)
    mask = mask & masks.causal() if causal else mask
    p = _prepare(q, k, v, mask=mask, return_lse=True)
    assert selected_decode.applies(p)
    got = attnkit.attention(q, k, v, mask=mask, return_lse=True)
    out, lse = _oracle(q, k, v, idx, 1, 2, causal)
    torch.testing.assert_close(got.output, out, rtol=0, atol=1e-12)
    torch.testing.assert_close(got.lse, lse, rtol=0, atol=1e-12)
    assert torch.equal(got.output[1], torch.zeros_like(got.output[1])) and bool((got.lse[1] == -math.inf).all())
    want = _general(p)
    torch.testing.assert_close(got.output, want.out, rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_takes_the_fused_route_and_equals_the_oracle(dtype):
    q, k, v = rand_qkv(2, 4, 1, 40, 8, hkv=2, dtype=dtype, seed=25)
    idx = _selection(40, (2, 1, 1, 9), 1, seed=26)
    mask = masks.selected_keys(idx)
    p = _prepare(q, k, v, mask=mask)
    assert selected_decode.applies(p) and not selected_decode._weighted_ok(p, 2)
    out, _ = _oracle(q, k, v, idx, 1, 2)
    got = attnkit.attention(q, k, v, mask=mask)
    assert got.dtype == dtype
    torch.testing.assert_close(got.double(), out, rtol=0, atol=1e-2)


def test_values_with_no_rows_view_take_the_fused_route():
    """Keys with no rows view are copied and multiplied; values with none send the step to the fused route."""
    q, k, v = rand_qkv(1, 4, 1, 30, 8, hkv=2, dtype=torch.float64, seed=27)
    strided_k, strided_v = (t.transpose(2, 3).contiguous().transpose(2, 3) for t in (k, v))
    idx = _selection(30, (1, 1, 1, 7), 1, seed=28)
    mask = masks.selected_keys(idx)
    out, _ = _oracle(q, k, v, idx, 1, 2)
    assert selected_decode._weighted_ok(_prepare(q, strided_k, v, mask=mask), 2)
    assert not selected_decode._weighted_ok(_prepare(q, k, strided_v, mask=mask), 2)
    for kk, vv in ((strided_k, v), (k, strided_v), (strided_k, strided_v)):
        torch.testing.assert_close(attnkit.attention(q, kk, vv, mask=mask), out, rtol=0, atol=1e-12)


@pytest.mark.parametrize("expanded", ["k and v", "k"])
def test_a_cache_expanded_over_the_batch(expanded):
    """One cache shared by the batch (batch stride 0): its rows view repeats them, the float64 oracle's answer."""
    q, k, v = rand_qkv(3, 4, 1, 30, 8, hkv=2, dtype=torch.float64, seed=31)
    k, v = k[:1].expand(3, -1, -1, -1), (v[:1].expand(3, -1, -1, -1) if expanded == "k and v" else v)
    idx = _selection(30, (3, 1, 1, 7), 1, seed=32)
    out, _ = _oracle(q, k, v, idx, 1, 2)
    torch.testing.assert_close(attnkit.attention(q, k, v, mask=masks.selected_keys(idx)), out, rtol=0, atol=1e-12)


def _lane(q, k, v, mask, **kw):
    """What :func:`selected_decode.lane` answers for ``attention(q, k, v, mask=mask, **kw)``."""
    args = dict(bias=None, score="scaled_dot", scale=None, normalize="softmax", dropout_p=0.0, return_weights=False,
                return_lse=False, backend="auto", sinks=None)
    args.update(kw)
    return selected_decode.lane(q, k, v, mask, args["bias"], args["score"], args["scale"], args["normalize"],
                                args["dropout_p"], args["return_weights"], args["return_lse"], args["backend"],
                                args["sinks"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("slots", [[3, 17, 40, 8, 29], [3, -1, 40, 3, -1]], ids=["every slot", "unused and repeated"])
def test_the_lane_gives_the_paths_bits(dtype, slots):
    """A decoding step with one index head of single keys takes the lane, whose answer is the path's to the bit
    (GQA 6:2, a selection per sequence, a cache with room to spare), output and lse; both equal the float64 oracle."""
    q, _, _ = rand_qkv(2, 6, 1, 90, 8, hkv=2, dtype=dtype, seed=30)
    buffers = [torch.randn(2, 2, 128, 8, generator=torch.Generator().manual_seed(s)).to(dtype) for s in (31, 32)]
    k, v = (t[:, :, :90] for t in buffers)
    idx = torch.tensor([[[slots]], [[[s + 1 if s >= 0 else s for s in slots]]]])  # (2, 1, 1, 5)
    mask = masks.selected_keys(idx)
    step = _lane(q, k, v, mask, return_lse=True)
    assert step is not None
    p = _prepare(q, k, v, mask=mask, return_lse=True)
    path = selected_decode.run(p)
    assert torch.equal(step[0], path.out) and torch.equal(step[1], path.lse)
    got = attnkit.attention(q, k, v, mask=mask, return_lse=True)
    assert torch.equal(got.output, path.out) and torch.equal(got.lse, path.lse)
    out, lse = _oracle(q, k, v, idx, 1, 3)
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(got.output.double(), out, rtol=0, atol=tol)
    torch.testing.assert_close(got.lse.double(), lse, rtol=0, atol=tol)
    assert torch.equal(attnkit.attention(q, k, v, mask=mask, scale=0.3, score="dot"),
                       selected_decode.run(_prepare(q, k, v, mask=mask, scale=0.3, score="dot")).out)


def test_the_lane_refuses_what_it_does_not_serve():
    """Anything but the plain step goes the full route: autograd, other ranks or dtypes, blocks, index heads, a mask
    beside the selection, a forced backend, options, and selections of half the keys or more (the dispatcher
    prefers torch's kernel with a dense mask there)."""
    q, k, v = rand_qkv(1, 4, 1, 40, 8, hkv=2, seed=33)
    idx = torch.tensor([[[[1, 5, 9]]]])
    mask = masks.selected_keys(idx)
    assert _lane(q, k, v, mask) is not None
    refused = [
        _lane(q.clone().requires_grad_(), k, v, mask),
        _lane(q[0], k[0], v[0], mask),
        _lane(q.half(), k.half(), v.half(), mask),
        _lane(q, k, v, masks.selected_blocks(idx, 4)),
        _lane(q, k, v, masks.selected_keys(idx.expand(1, 2, 1, 3), group_size=2)),
        _lane(q, k, v, mask & masks.causal()),
        _lane(q, k, v, mask, backend="blocksparse"),
        _lane(q, k, v, mask, return_weights=True),
        _lane(q, k, v, mask, normalize="sigmoid"),
        _lane(q, k, v, mask, scale=math.inf),
        _lane(q, k, v, masks.selected_keys(torch.arange(20).view(1, 1, 1, 20))),
        _lane(q.expand(1, 4, 3, 8), k, v, mask),  # 6 query rows per key/value head: within WEIGHTED_ROWS
    ]
    assert [r is None for r in refused] == [True] * 11 + [False]
    half = masks.selected_keys(torch.arange(20).view(1, 1, 1, 20))
    assert attnkit.explain(q, k, v, mask=half).path == "torch-sdpa"
    torch.testing.assert_close(attnkit.attention(q, k, v, mask=half),
                               attnkit.attention(q, k[:, :, :20], v[:, :, :20]), rtol=1e-6, atol=1e-6)


def test_the_lane_raises_validations_errors():
    """An index past the last key is refused by the lane with validation's error; inputs the lane does not read as a
    step (mismatched shapes) reach validation and its error."""
    from attnkit.errors import ArgumentError, ShapeError

    q, k, v = rand_qkv(1, 4, 1, 40, 8, hkv=2, seed=34)
    with pytest.raises(ArgumentError, match=r"attnkit.attention: mask: .*indices must name a key in \[0, 40\)"):
        attnkit.attention(q, k, v, mask=masks.selected_keys(torch.tensor([[[[1, 40]]]])))
    with pytest.raises(ShapeError):
        attnkit.attention(q, k, v[:, :, :30], mask=masks.selected_keys(torch.tensor([[[[1, 4]]]])))
    with pytest.raises(ShapeError):
        attnkit.attention(q, k, v, mask=masks.selected_keys(torch.tensor([[[[1, 4]]]] * 3)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["values in place", "fused"])
def test_a_step_under_inference_mode_then_outside_it(dtype):
    """The thread's buffers made under ``torch.inference_mode`` are inference tensors, which no later step outside it
    may write: such a buffer is made afresh (it raised "Inplace update to inference tensor outside InferenceMode")."""
    q, k, v = rand_qkv(1, 4, 1, 300, 8, hkv=2, dtype=dtype, seed=35)
    mask = masks.selected_keys(_selection(300, (1, 1, 1, 20), 1, seed=36))
    with torch.inference_mode():
        first = attnkit.attention(q, k, v, mask=mask)
    with torch.no_grad():
        second = attnkit.attention(q, k, v, mask=mask)
    with torch.inference_mode():
        third = attnkit.attention(q, k, v, mask=mask)
    assert torch.equal(first, second) and torch.equal(second, third)
