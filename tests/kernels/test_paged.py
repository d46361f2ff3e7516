"""Path paged-split-kv: attention through a page table, split-KV, equal bit for bit to the same keys stored in order."""

from __future__ import annotations

import math

import pytest
import torch

import attnkit
from attnkit import masks
from attnkit.errors import ArgumentError, DTypeError, ShapeError
from attnkit.kernels import selected


def _pool(keys, values, page_size, spare, seed):
    """The sequences' keys ``[(Hkv, L_b, D)]`` written on randomly permuted pages of a pool with ``spare`` extra
    pages (holding NaN), and the page table; unused lanes of last pages hold NaN too."""
    g = torch.Generator().manual_seed(seed)
    counts = [-(-k.shape[1] // page_size) for k in keys]
    pages = sum(counts) + spare
    order = torch.randperm(pages, generator=g)
    hkv, d, dv = keys[0].shape[0], keys[0].shape[2], values[0].shape[2]
    k_pool = torch.full((pages, page_size, hkv, d), math.nan, dtype=keys[0].dtype)
    v_pool = torch.full((pages, page_size, hkv, dv), math.nan, dtype=keys[0].dtype)
    table = torch.zeros(len(keys), max(counts), dtype=torch.long)
    used = 0
    for b, (k, v) in enumerate(zip(keys, values, strict=True)):
        mine = order[used:used + counts[b]]
        used += counts[b]
        table[b, :counts[b]] = mine
        for t in range(k.shape[1]):
            k_pool[mine[t // page_size], t % page_size] = k[:, t]
            v_pool[mine[t // page_size], t % page_size] = v[:, t]
    return k_pool, v_pool, table


def _contiguous(keys, values):
    """The same keys in a contiguous (B, Hkv, L_max, D) cache, NaN past each length."""
    longest = max(k.shape[1] for k in keys)
    pad = lambda t: torch.nn.functional.pad(t, (0, 0, 0, longest - t.shape[1]), value=math.nan)
    return torch.stack([pad(k) for k in keys]), torch.stack([pad(v) for v in values])


def _oracle(q, keys, values, window=None, empty=True):
    """Per sequence, float64: the last Lq positions of the sequence attend bottom-right causally (or a window);
    ``empty=False``: no row is empty, so NaN in the weights stays NaN."""
    outs = []
    for b, (k, v) in enumerate(zip(keys, values, strict=True)):
        lq, lk = q.shape[2], k.shape[1]
        i = torch.arange(lq)[:, None] + lk - lq
        j = torch.arange(lk)[None, :]
        allowed = (j <= i) if window is None else (j >= i - window) & (j <= i)
        group = q.shape[1] // k.shape[0]
        kk, vv = k.double().repeat_interleave(group, 0), v.double().repeat_interleave(group, 0)
        s = (q[b].double() @ kk.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(~allowed, -math.inf)
        w = torch.softmax(s, -1).nan_to_num(0.0) if empty else torch.softmax(s, -1)
        outs.append(w @ vv)
    return torch.stack(outs)


def _sequences(lengths, hkv=2, d=16, dv=16, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    keys = [torch.randn(hkv, n, d, generator=g).to(dtype) for n in lengths]
    values = [torch.randn(hkv, n, dv, generator=g).to(dtype) for n in lengths]
    return keys, values


@pytest.mark.parametrize("lq", [1, 7])
@pytest.mark.parametrize("page_size", [16, 48])
def test_paged_equals_the_contiguous_cache_bit_for_bit_for_permuted_pages_and_ragged_lengths(lq, page_size):
    lengths = [4096, 1, 777, 2049, lq]
    keys, values = _sequences(lengths)
    q = torch.randn(len(lengths), 6, lq, 16, generator=torch.Generator().manual_seed(9))
    k_pool, v_pool, table = _pool(keys, values, page_size, spare=5, seed=lq)
    seqused = torch.tensor(lengths)
    paged = attnkit.attention(q, k_pool, v_pool, block_table=table, seqused_k=seqused, mask=masks.causal())
    k, v = _contiguous(keys, values)
    contiguous = attnkit.attention(q, k, v, seqused_k=seqused, mask=masks.causal())
    assert torch.equal(paged, contiguous)
    torch.testing.assert_close(paged.double(), _oracle(q, keys, values), rtol=0, atol=2e-6)


def test_forked_prefixes_share_pages_and_give_the_bits_of_their_own_copies():
    keys, values = _sequences([300])
    extra_k, extra_v = _sequences([40, 90], seed=1)
    prefix = 288  # 18 pages of 16, shared
    forks_k = [torch.cat([keys[0][:, :prefix], e], 1) for e in extra_k]
    forks_v = [torch.cat([values[0][:, :prefix], e], 1) for e in extra_v]
    k_pool, v_pool, table = _pool(forks_k, forks_v, 16, spare=2, seed=3)
    shared = table.clone()
    shared[1, :18] = table[0, :18]  # the second fork reads the first one's prefix pages
    q = torch.randn(2, 4, 1, 16)
    seqused = torch.tensor([328, 378])
    paged = attnkit.attention(q, k_pool, v_pool, block_table=shared, seqused_k=seqused, mask=masks.causal())
    k, v = _contiguous(forks_k, forks_v)
    assert torch.equal(paged, attnkit.attention(q, k, v, seqused_k=seqused, mask=masks.causal()))


def test_explain_names_the_paged_path_and_its_split():
    keys, values = _sequences([1200, 5])
    k_pool, v_pool, table = _pool(keys, values, 16, spare=0, seed=0)
    q = torch.randn(2, 4, 1, 16)
    d = attnkit.explain(q, k_pool, v_pool, block_table=table, seqused_k=torch.tensor([1200, 5]),
                        mask=masks.causal())
    assert d.path == "paged-split-kv" and d.backend == "blocksparse"
    assert f"chunks of {selected.SPLIT_KEYS} positions" in d.reasons["paged-split-kv"]
    assert d.reasons["blocksparse-fused"].startswith("refused: keys selected per query")
    assert d.cost is not None and d.flops > 0


def test_windows_grouped_heads_and_gradients_in_float64():
    keys, values = _sequences([70, 33], d=11, dv=5, dtype=torch.float64)
    k_pool, v_pool, table = _pool(keys, values, 8, spare=3, seed=2)
    k_pool, v_pool = k_pool.nan_to_num(0.0), v_pool.nan_to_num(0.0)
    q = torch.randn(2, 6, 4, 11, dtype=torch.float64, requires_grad=True)
    out = attnkit.attention(q, k_pool, v_pool, block_table=table, seqused_k=torch.tensor([70, 33]),
                            mask=masks.sliding_window(9, 0))
    torch.testing.assert_close(out, _oracle(q, keys, values, window=9), rtol=0, atol=1e-12)
    dq, = torch.autograd.grad(out.sum(), (q,))
    exact, = torch.autograd.grad(_oracle_differentiable(q, keys, values, 9).sum(), (q,))
    torch.testing.assert_close(dq, exact, rtol=0, atol=1e-12)


def _oracle_differentiable(q, keys, values, window, sinks=None):
    """Float64 per sequence; ``sinks (H,)``: a logit per head joins each row's softmax and takes no value."""
    outs = []
    for b, (k, v) in enumerate(zip(keys, values, strict=True)):
        lq, lk = q.shape[2], k.shape[1]
        i = torch.arange(lq)[:, None] + lk - lq
        j = torch.arange(lk)[None, :]
        allowed = (j >= i - window) & (j <= i)
        kk, vv = k.repeat_interleave(3, 0), v.repeat_interleave(3, 0)
        s = (q[b] @ kk.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(~allowed, -math.inf)
        if sinks is not None:
            s = torch.cat([s, sinks.view(-1, 1, 1).expand(-1, lq, 1)], -1)
        outs.append(torch.softmax(s, -1)[..., :lk] @ vv)
    return torch.stack(outs)


def test_sinks_join_the_merged_splits_forward_and_backward():
    keys, values = _sequences([70, 33], d=11, dv=5, dtype=torch.float64, seed=4)
    k_pool, v_pool, table = _pool(keys, values, 8, spare=2, seed=3)
    k_pool, v_pool = k_pool.nan_to_num(0.0), v_pool.nan_to_num(0.0)
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 6, 3, 11, dtype=torch.float64, generator=g).requires_grad_()
    sinks = (2 * torch.randn(6, dtype=torch.float64, generator=g)).requires_grad_()
    call = dict(block_table=table, seqused_k=torch.tensor([70, 33]), mask=masks.sliding_window(40, 0), sinks=sinks)
    assert attnkit.explain(q, k_pool, v_pool, **call).path == "paged-split-kv"
    out = attnkit.attention(q, k_pool, v_pool, **call)
    want = _oracle_differentiable(q, keys, values, 40, sinks)
    torch.testing.assert_close(out, want, rtol=0, atol=1e-12)
    grad = torch.randn_like(out)
    got = torch.autograd.grad((out * grad).sum(), (q, sinks))
    exact = torch.autograd.grad((want * grad).sum(), (q, sinks))
    for a, b in zip(got, exact, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_paged_arguments_are_checked_with_their_names():
    keys, values = _sequences([20])
    k_pool, v_pool, table = _pool(keys, values, 8, spare=1, seed=0)
    q = torch.randn(1, 2, 1, 16)
    with pytest.raises(ArgumentError, match="block_table needs seqused_k"):
        attnkit.attention(q, k_pool, v_pool, block_table=table)
    with pytest.raises(ArgumentError, match=r"seqused_k must lie in \[0, max_pages \* page_size = 24\]"):
        attnkit.attention(q, k_pool, v_pool, block_table=table, seqused_k=torch.tensor([25]))
    with pytest.raises(ArgumentError, match=r"entries of the pages in use must lie in \[0, 4\)"):
        attnkit.attention(q, k_pool, v_pool, block_table=table + 9, seqused_k=torch.tensor([20]))
    with pytest.raises(ShapeError, match=r"key must be a pool of pages"):
        attnkit.attention(q, k_pool[0], v_pool, block_table=table, seqused_k=torch.tensor([20]))
    for mask in (None, masks.causal()):  # the paged lane too: a page of no positions is refused, not divided by
        with pytest.raises(ShapeError, match=r"a page must hold at least one position; got pools \(4, 0, 2, 16\)"):
            attnkit.attention(q, k_pool[:, :0], v_pool[:, :0], block_table=table, seqused_k=torch.tensor([0]),
                              mask=mask)
    with pytest.raises(ShapeError, match=r"block_table must have shape \(batch=1, max_pages\)"):
        attnkit.attention(q, k_pool, v_pool, block_table=table[0], seqused_k=torch.tensor([20]))
    with pytest.raises(DTypeError, match="block_table must be an integer tensor"):
        attnkit.attention(q, k_pool, v_pool, block_table=table.float(), seqused_k=torch.tensor([20]))
    with pytest.raises(ArgumentError, match="bias is not supported with block_table"):
        attnkit.attention(q, k_pool, v_pool, block_table=table, seqused_k=torch.tensor([20]),
                          bias=attnkit.bias.softcap(5.0))
    with pytest.raises(DTypeError, match="mask must be an attnkit mask"):
        attnkit.attention(q, k_pool, v_pool, block_table=table, seqused_k=torch.tensor([20]),
                          mask=torch.ones(1, 20, dtype=torch.bool))


def test_the_fast_lane_never_takes_a_paged_call(monkeypatch):
    from attnkit.kernels import lane

    monkeypatch.setattr(lane, "route", lambda *a, **k: pytest.fail("the lane was asked"))
    keys, values = _sequences([20])
    k, v = _contiguous(keys, values)
    attnkit.attention(torch.randn(1, 2, 1, 16), k, v, seqused_k=torch.tensor([20]))


@pytest.mark.parametrize("backend", ["auto", "reference", "chunked", "sdpa", "blocksparse"])
def test_minus_infinity_sinks_and_an_empty_sequence_give_the_oracles_gradients(backend):
    from attnkit.errors import BackendError
    from tests.oracle import dense_attention

    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(*shape, dtype=torch.float64, generator=g).requires_grad_()
               for shape in ((2, 4, 3, 8), (2, 2, 40, 8), (2, 2, 40, 8)))
    sinks = torch.tensor([float("-inf"), 1.2, float("-inf"), 0.3], dtype=torch.float64, requires_grad=True)
    used = torch.tensor([0, 40])  # the first sequence holds no key: its rows have none
    call = dict(seqused_k=used, mask=masks.causal(), sinks=sinks, backend=backend)
    try:
        out = attnkit.attention(q, k, v, **call)
    except BackendError:
        assert backend != "auto"
        return
    if backend == "auto":
        assert attnkit.explain(q, k, v, **call).path == "paged-split-kv"
    pos = torch.arange(3)[:, None] + used[:, None, None] - 3  # each sequence's queries end at its last key
    allowed = (torch.arange(40) <= pos) & (torch.arange(40) < used[:, None, None])
    want = dense_attention(q, k, v, mask=allowed[:, None], sinks=sinks, differentiable=True)
    torch.testing.assert_close(out, want, rtol=0, atol=1e-12)
    probe = torch.randn(out.shape, dtype=torch.float64, generator=g)
    got = torch.autograd.grad((out * probe).sum(), (q, k, v, sinks))
    exact = torch.autograd.grad((want * probe).sum(), (q, k, v, sinks))
    for a, b in zip(got, exact, strict=True):
        assert not a.isnan().any()
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


@pytest.mark.parametrize("backend", ["auto", "reference", "chunked", "sdpa", "blocksparse"])
def test_nan_on_pool_lanes_no_sequence_holds_reaches_no_output_or_gradient_on_any_backend(backend):
    from attnkit.errors import BackendError

    keys, values = _sequences([0, 5, 13], d=8, dv=8, dtype=torch.float64, seed=2)  # an empty sequence too
    k_pool, v_pool, table = _pool(keys, values, 4, spare=2, seed=1)  # spare pages and lanes past a length: NaN
    q = torch.randn(3, 4, 2, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(3), requires_grad=True)
    call = dict(block_table=table, seqused_k=torch.tensor([0, 5, 13]), mask=masks.causal(), backend=backend)
    try:
        out = attnkit.attention(q, k_pool, v_pool, **call)
    except BackendError:  # a forced backend may refuse (torch's kernel sees its NaN output); it says why
        assert backend == "sdpa"
        return
    want = torch.stack([_oracle(q[b:b + 1], [k], [v])[0] if k.shape[1] else torch.zeros(4, 2, 8, dtype=torch.float64)
                        for b, (k, v) in enumerate(zip(keys, values, strict=True))])
    torch.testing.assert_close(out, want, rtol=0, atol=1e-12)
    (grad,) = torch.autograd.grad(out.sum(), q)
    assert torch.isfinite(grad).all() and not grad[0].any()


def test_windows_without_autograd_over_many_chunks_equal_the_oracle():
    # chunks the window cuts, chunks it leaves whole, and chunks no query sees, in sequences of several chunks
    lengths = [1500, 1100, 3 * selected.SPLIT_KEYS]
    keys, values = _sequences(lengths, seed=7)
    k_pool, v_pool, table = _pool(keys, values, 16, spare=2, seed=4)
    for lq in (1, 5):
        q = torch.randn(len(lengths), 6, lq, 16, generator=torch.Generator().manual_seed(lq))
        for window, mask in ((None, masks.causal()), (600, masks.sliding_window(600, 0))):
            got = attnkit.attention(q, k_pool, v_pool, block_table=table, seqused_k=torch.tensor(lengths), mask=mask)
            torch.testing.assert_close(got.double(), _oracle(q, keys, values, window), rtol=0, atol=2e-6)


@pytest.mark.parametrize("where", ["q", "k", "v"])
@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_non_finite_values_the_keys_attend_propagate_as_in_the_oracle(where, value):
    # chunks every query sees whole run on torch's kernel without a mask: its answer must be the contract's
    lengths = [2 * selected.SPLIT_KEYS, 700]
    keys, values = _sequences(lengths, seed=3)
    q = torch.randn(2, 6, 1, 16, generator=torch.Generator().manual_seed(2))
    if where == "q":
        q[0, 1, 0, 3] = value
    elif where == "k":
        keys[1][0, 100, 5] = value
    else:
        values[0][1, 300, 2] = value  # in the first chunk, which every query sees whole
    k_pool, v_pool, table = _pool(keys, values, 16, spare=1, seed=5)
    got = attnkit.attention(q, k_pool, v_pool, block_table=table, seqused_k=torch.tensor(lengths),
                            mask=masks.causal())
    want = _oracle(q, keys, values, empty=False)
    torch.testing.assert_close(got.double(), want, rtol=0, atol=2e-6, equal_nan=True)
    assert not torch.isfinite(got).all()  # something was not finite, and it reached the output


def test_huge_queries_equal_the_oracle_over_pages():
    lengths = [2 * selected.SPLIT_KEYS + 3, 40]
    keys, values = _sequences(lengths, seed=8)
    q = 1e30 * torch.randn(2, 4, 2, 16, generator=torch.Generator().manual_seed(1))
    k_pool, v_pool, table = _pool(keys, values, 16, spare=0, seed=6)
    got = attnkit.attention(q, k_pool, v_pool, block_table=table, seqused_k=torch.tensor(lengths),
                            mask=masks.causal())
    torch.testing.assert_close(got.double(), _oracle(q, keys, values), rtol=0, atol=2e-6)


def test_calls_of_other_sizes_in_turn_reuse_the_chunk_buffers_safely():
    # the buffers the chunks are copied into outlive a call: a larger, then a smaller, then a larger call
    for lengths, d in (([1200, 900], 16), ([30], 8), ([1200, 900], 16), ([600, 600, 600], 16)):
        keys, values = _sequences(lengths, d=d, dv=d, seed=len(lengths))
        k_pool, v_pool, table = _pool(keys, values, 16, spare=1, seed=d)
        q = torch.randn(len(lengths), 4, 2, d, generator=torch.Generator().manual_seed(d))
        got = attnkit.attention(q, k_pool, v_pool, block_table=table, seqused_k=torch.tensor(lengths),
                                mask=masks.causal())
        torch.testing.assert_close(got.double(), _oracle(q, keys, values), rtol=0, atol=2e-6)


@pytest.mark.parametrize("case", ["nan query over few keys", "values near the largest float"])
def test_rows_torchs_kernel_answers_unlike_the_formula_run_on_the_exact_split(case):
    # a NaN query over fewer keys than torch's vector width (a row it zeroes), an overflow of its unnormalised sum
    lengths = [5, 5] if case.startswith("nan") else [700, 2 * selected.SPLIT_KEYS]  # chunks every query sees
    keys, values = _sequences(lengths, seed=11)
    q = torch.randn(2, 4, 1, 16, generator=torch.Generator().manual_seed(3))
    if case.startswith("nan"):
        q[0, 2, 0, 1] = math.nan
    else:
        values[1][0, :, 0] = 3e38  # finite, and so is the formula's answer
    k_pool, v_pool, table = _pool(keys, values, 16, spare=0, seed=2)
    got = attnkit.attention(q, k_pool, v_pool, block_table=table, seqused_k=torch.tensor(lengths),
                            mask=masks.causal())
    want = _oracle(q, keys, values, empty=False)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=2e-6, equal_nan=True)
    assert torch.isfinite(got).all() == torch.isfinite(want).all()


def _unmasked_oracle(q, keys, values):
    """Float64 per sequence: every query sees every key the sequence holds."""
    group = q.shape[1] // keys[0].shape[0]
    outs = []
    for b, (k, v) in enumerate(zip(keys, values, strict=True)):
        kk, vv = k.double().repeat_interleave(group, 0), v.double().repeat_interleave(group, 0)
        outs.append(torch.softmax(q[b].double() @ kk.transpose(-1, -2) / math.sqrt(q.shape[-1]), -1) @ vv)
    return torch.stack(outs)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("page_size", [16, 48, 1024])
@pytest.mark.parametrize("lq", [1, 16])
def test_whole_and_cut_chunks_of_ragged_grouped_sequences_equal_the_oracle_and_the_contiguous_cache(lq, page_size,
                                                                                                  causal):
    # GQA 8:2; chunks every query sees whole (copied a whole chunk of pages at a time when the page size divides
    # the split) for all or some sequences, chunks a sequence ends in, a last chunk shorter than the split, and the
    # last Lq keys each query sees causally
    split = selected.SPLIT_KEYS
    lengths = [2 * split, 2 * split + 16, 3 * split - 3, 2 * split + 1]
    keys, values = _sequences(lengths, seed=12)
    q = torch.randn(len(lengths), 8, lq, 16, generator=torch.Generator().manual_seed(13))
    k_pool, v_pool, table = _pool(keys, values, page_size, spare=3, seed=14)
    used, mask = torch.tensor(lengths), masks.causal() if causal else None
    paged = attnkit.attention(q, k_pool, v_pool, block_table=table, seqused_k=used, mask=mask)
    want = _oracle(q, keys, values) if causal else _unmasked_oracle(q, keys, values)
    torch.testing.assert_close(paged.double(), want, rtol=0, atol=2e-6)
    k, v = _contiguous(keys, values)
    assert torch.equal(paged, attnkit.attention(q, k, v, seqused_k=used, mask=mask))


@pytest.mark.parametrize("lq", [1, 5])
def test_ragged_causal_calls_run_on_the_segment_route_reading_only_the_keys_each_sequence_holds(lq, monkeypatch):
    from attnkit.kernels import page_segments

    monkeypatch.setattr(selected, "fused_pages", lambda *a: pytest.fail("the chunked route ran"))
    monkeypatch.setattr(page_segments, "SEQUENCE_BYTES", 0)  # chunks, not a call per sequence
    copied = []
    chunk = page_segments._Keys.chunk
    monkeypatch.setattr(page_segments._Keys, "chunk", lambda self, seqs, start, stop: copied.append(
        (None if seqs is None else seqs.tolist(), start, stop)) or chunk(self, seqs, start, stop))
    split = selected.SPLIT_KEYS
    lengths = [3 * split, split + 7, lq]  # the second ends inside its second chunk; the third has only its queries
    keys, values = _sequences(lengths, seed=21)
    q = torch.randn(len(lengths), 4, lq, 16, generator=torch.Generator().manual_seed(22))
    k_pool, v_pool, table = _pool(keys, values, 16, spare=1, seed=23)
    got = attnkit.attention(q, k_pool, v_pool, block_table=table, seqused_k=torch.tensor(lengths),
                            mask=masks.causal())
    torch.testing.assert_close(got.double(), _oracle(q, keys, values), rtol=0, atol=2e-6)
    shared = [n - lq + (0 if lq > 1 else 1) for n in lengths]  # keys every query of a sequence sees
    assert copied[-1][1] == 2 * split and copied[-1][0] == [0]  # the last chunk: the first sequence alone
    assert all(start < shared[b] for seqs, start, _ in copied if seqs is not None for b in seqs)


def test_one_sequence_of_whole_chunks_reduces_to_dense_attention():
    # every chunk whole and seen by the query: the merged splits are attention over all the keys
    keys, values = _sequences([4 * selected.SPLIT_KEYS], seed=15)
    q = torch.randn(1, 8, 1, 16, generator=torch.Generator().manual_seed(16))
    k_pool, v_pool, table = _pool(keys, values, 16, spare=0, seed=17)
    paged = attnkit.attention(q, k_pool, v_pool, block_table=table, seqused_k=torch.tensor([keys[0].shape[1]]))
    dense = attnkit.attention(q, keys[0][None], values[0][None])
    torch.testing.assert_close(paged, dense, rtol=0, atol=2e-6)


def test_a_chunk_torchs_kernel_answers_unlike_the_formula_is_recomputed_alone(monkeypatch):
    # the whole chunks' answers are checked together; only the chunk that fails runs on the exact split
    split = selected.SPLIT_KEYS
    lengths = [3 * split, 3 * split]
    keys, values = _sequences(lengths, seed=18)
    values[0][1, split:2 * split, 0] = 3e38  # the middle chunk of the first sequence: torch's sum overflows
    q = torch.randn(2, 4, 1, 16, generator=torch.Generator().manual_seed(19))
    k_pool, v_pool, table = _pool(keys, values, 16, spare=0, seed=20)
    calls = []
    exact = selected._split
    monkeypatch.setattr(selected, "_split", lambda *a: calls.append(a[5:7]) or exact(*a))
    got = attnkit.attention(q, k_pool, v_pool, block_table=table, seqused_k=torch.tensor(lengths),
                            mask=masks.causal())
    assert calls == [(split, 2 * split)]
    want = _oracle(q, keys, values, empty=False)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=2e-6)
    assert torch.isfinite(got).all()


def test_table_entries_past_a_sequences_pages_are_never_checked_or_read():
    keys, values = _sequences([20, 0], seed=24)
    k_pool, v_pool, table = _pool(keys, values, 8, spare=1, seed=25)
    table[0, 3:], table[1] = -1, -7  # no sequence uses these entries: any value
    table = torch.cat([table, torch.full((2, 2), 99)], 1)
    q = torch.randn(2, 2, 1, 16, generator=torch.Generator().manual_seed(26))
    got = attnkit.attention(q, k_pool, v_pool, block_table=table, seqused_k=torch.tensor([20, 0]),
                            mask=masks.causal())
    torch.testing.assert_close(got[:1].double(), _oracle(q[:1], keys[:1], values[:1]), rtol=0, atol=2e-6)
    assert not got[1].any()
    table[0, 1] = -3
    with pytest.raises(ArgumentError, match=r"must lie in \[0, 4\) \(the pool's pages\); got values in \[-3, "):
        attnkit.attention(q, k_pool, v_pool, block_table=table, seqused_k=torch.tensor([20, 0]))


@pytest.mark.parametrize(("dtype", "atol"), [(torch.bfloat16, 1e-2), (torch.float16, 1e-3), (torch.float64, 1e-12)])
@pytest.mark.parametrize("lq", [1, 4])
def test_pools_of_other_dtypes_equal_the_oracle_over_whole_and_cut_chunks(dtype, atol, lq):
    # half-precision pools are computed in float32 (the chunked route converts each chunk), float64 as it is
    lengths = [2 * selected.SPLIT_KEYS + 76, 600, 2 * selected.SPLIT_KEYS]
    keys, values = _sequences(lengths, dtype=dtype, seed=27)
    k_pool, v_pool, table = _pool(keys, values, 16, spare=1, seed=28)
    q = torch.randn(3, 4, lq, 16, generator=torch.Generator().manual_seed(29)).to(dtype)
    got = attnkit.attention(q, k_pool, v_pool, block_table=table, seqused_k=torch.tensor(lengths),
                            mask=masks.causal())
    assert got.dtype == dtype
    torch.testing.assert_close(got.double(), _oracle(q, keys, values), rtol=0, atol=atol)


def test_queries_cut_into_row_chunks_see_their_own_last_keys_causally(monkeypatch):
    # a small budget cuts the 7 queries into chunks of rows: each chunk's shared keys end where its first query's do
    monkeypatch.setattr(selected, "BUDGET", 3 * 2 * 4 * selected.SPLIT_KEYS)  # 3 rows of 2 sequences x 4 heads
    from attnkit.core import _prepare

    assert selected.plan(_prepare(torch.randn(2, 4, 7, 16), torch.randn(2, 2, 900, 16), torch.randn(2, 2, 900, 16),
                                  seqused_k=torch.tensor([900, 700]))).rows == 3
    monkeypatch.setattr(selected, "fused_pages", lambda *a: pytest.fail("the chunked route ran"))
    lengths = [selected.SPLIT_KEYS + 388, 700]
    keys, values = _sequences(lengths, seed=30)
    q = torch.randn(2, 4, 7, 16, generator=torch.Generator().manual_seed(31))
    k_pool, v_pool, table = _pool(keys, values, 16, spare=1, seed=32)
    used = torch.tensor(lengths)
    got = attnkit.attention(q, k_pool, v_pool, block_table=table, seqused_k=used, mask=masks.causal())
    torch.testing.assert_close(got.double(), _oracle(q, keys, values), rtol=0, atol=2e-6)
    k, v = _contiguous(keys, values)
    assert torch.equal(got, attnkit.attention(q, k, v, seqused_k=used, mask=masks.causal()))


@pytest.mark.parametrize(("lq", "causal", "contiguous"), [(1, True, False), (1, False, False), (16, True, False),
                                                        (3, False, False), (1, True, True), (16, True, True)])
def test_the_paged_lane_gives_the_bits_of_the_full_route(lq, causal, contiguous, monkeypatch):
    # paged.lane decides from attributes and runs the segment route with the path's split: the same bits as
    # validation and dispatch, for ragged lengths (a partial last page, a sequence holding only its queries)
    from attnkit.kernels import paged

    lengths = [2 * selected.SPLIT_KEYS + 5, lq, 700, 40]
    keys, values = _sequences(lengths, seed=33)
    q = torch.randn(len(lengths), 8, lq, 16, generator=torch.Generator().manual_seed(34))
    k_pool, v_pool, table = _pool(keys, values, 16, spare=2, seed=35)
    k, v = _contiguous(keys, values) if contiguous else (k_pool, v_pool)
    kwargs = dict(seqused_k=torch.tensor(lengths), mask=masks.causal() if causal else None,
                  block_table=None if contiguous else table)
    lane = paged.lane
    taken = []
    monkeypatch.setattr(paged, "lane", lambda *a: taken.append(1) or lane(*a))
    fast = attnkit.attention(q, k, v, **kwargs)
    assert taken
    monkeypatch.setattr(paged, "lane", lambda *a: None)
    assert torch.equal(fast, attnkit.attention(q, k, v, **kwargs))
    want = _oracle(q, keys, values) if causal else _unmasked_oracle(q, keys, values)
    torch.testing.assert_close(fast.double(), want, rtol=0, atol=2e-6)


def test_the_paged_lane_leaves_what_it_cannot_vouch_for_to_the_full_route():
    from attnkit.kernels import paged

    keys, values = _sequences([40, 9], seed=36)
    k_pool, v_pool, table = _pool(keys, values, 8, spare=1, seed=37)
    q, used = torch.randn(2, 4, 1, 16), torch.tensor([40, 9])
    args = dict(mask=masks.causal(), score="scaled_dot", scale=None, normalize="softmax", dropout_p=0.0,
                return_weights=False, return_lse=False, backend="auto", block_table=table, seqused_k=used)

    def lane(q=q, k=k_pool, v=v_pool, **changed):
        return paged.lane(q, k, v, *{**args, **changed}.values())
    assert lane() is not None
    padded = table.clone()
    padded[1, 2:] = -1  # entries past the second sequence's pages: the full route reads only the used ones
    refused = [dict(block_table=padded), dict(seqused_k=torch.tensor([41, 9])), dict(seqused_k=torch.tensor([0, 9])),
               dict(mask=masks.causal("top_left")), dict(mask=masks.sliding_window(4)), dict(return_lse=True),
               dict(backend="reference"), dict(scale=float("nan")), dict(q=q.half()),
               dict(q=q.clone().requires_grad_(True)), dict(k=k_pool[:, :, :1])]
    for changed in refused:
        assert lane(**changed) is None, changed
    got = attnkit.attention(q, k_pool, v_pool, block_table=padded, seqused_k=used, mask=masks.causal())
    torch.testing.assert_close(got.double(), _oracle(q, keys, values), rtol=0, atol=2e-6)


@pytest.mark.parametrize("page_size", [16, 48])
def test_a_decoding_step_reads_each_sequence_once_in_one_call_and_equals_the_oracle(page_size, monkeypatch):
    # B calls of the kernel where the chunks would take as many or more: each sequence's pages copied whole,
    # only its own length read (a partial last page, lengths unequal), no split and no merge
    from attnkit.kernels import page_segments

    monkeypatch.setattr(selected, "fused_pages", lambda *a: pytest.fail("the chunked route ran"))
    monkeypatch.setattr(page_segments._Keys, "chunk", lambda *a: pytest.fail("a chunk was copied"))
    monkeypatch.setattr(page_segments._Keys, "whole_chunk", lambda *a: pytest.fail("a chunk was copied"))
    calls = []
    flash = page_segments.rules.FLASH
    monkeypatch.setattr(page_segments.rules, "FLASH", lambda q, k, v, *a, **kw: calls.append(k.shape[2]) or flash(
        q, k, v, *a, **kw))
    lengths = [4 * selected.SPLIT_KEYS - 3, 1, 3 * selected.SPLIT_KEYS + 17]
    keys, values = _sequences(lengths, seed=38)
    q = torch.randn(3, 4, 1, 16, generator=torch.Generator().manual_seed(39))
    k_pool, v_pool, table = _pool(keys, values, page_size, spare=1, seed=40)
    got = attnkit.attention(q, k_pool, v_pool, block_table=table, seqused_k=torch.tensor(lengths),
                            mask=masks.causal())
    assert calls == lengths
    torch.testing.assert_close(got.double(), _oracle(q, keys, values), rtol=0, atol=2e-6)
    k, v = _contiguous(keys, values)
    assert torch.equal(got, attnkit.attention(q, k, v, seqused_k=torch.tensor(lengths), mask=masks.causal()))


def test_consecutive_pages_are_read_in_place_with_the_bits_of_copied_ones(monkeypatch):
    # the first and third sequences' pages run consecutively in the pool (read as a view), the second's are
    # scattered (copied): the same bits as scattered pages everywhere and as a contiguous cache, and the oracle's
    from attnkit.kernels import page_segments

    lengths = [3 * selected.SPLIT_KEYS + 9, 2 * selected.SPLIT_KEYS, 4 * selected.SPLIT_KEYS - 1]
    keys, values = _sequences(lengths, seed=41)
    q = torch.randn(3, 8, 1, 16, generator=torch.Generator().manual_seed(42))
    k_pool, v_pool, table = _pool(keys, values, 16, spare=2, seed=43)
    counts = [-(-n // 16) for n in lengths]
    order = torch.cat([table[0, :counts[0]], table[1, :counts[1]], table[2, :counts[2]], torch.tensor([0, 0])])
    spare = sorted(set(range(k_pool.shape[0])) - set(order[:-2].tolist()))
    order[-2:] = torch.tensor(spare)
    runs_k, runs_v = k_pool[order], v_pool[order]  # pool page i holds the scattered pool's page order[i]
    runs_table = torch.zeros_like(table)
    runs_table[0, :counts[0]] = torch.arange(counts[0])
    runs_table[1, :counts[1]] = torch.randperm(counts[1], generator=torch.Generator().manual_seed(44)) + counts[0]
    runs_k[counts[0]:counts[0] + counts[1]] = k_pool[table[1, :counts[1]]][runs_table[1, :counts[1]] - counts[0]]
    runs_v[counts[0]:counts[0] + counts[1]] = v_pool[table[1, :counts[1]]][runs_table[1, :counts[1]] - counts[0]]
    runs_table[1, :counts[1]] = runs_table[1, :counts[1]].argsort() + counts[0]
    runs_table[2, :counts[2]] = torch.arange(counts[2]) + counts[0] + counts[1]
    copies = []
    take = torch.index_select
    monkeypatch.setattr(page_segments.torch, "index_select", lambda *a, **kw: copies.append(1) or take(*a, **kw))
    used, mask = torch.tensor(lengths), masks.causal()
    got = attnkit.attention(q, runs_k, runs_v, block_table=runs_table, seqused_k=used, mask=mask)
    assert len(copies) == 2  # the second sequence's keys and values only
    monkeypatch.setattr(page_segments.torch, "index_select", take)
    assert torch.equal(got, attnkit.attention(q, k_pool, v_pool, block_table=table, seqused_k=used, mask=mask))
    k, v = _contiguous(keys, values)
    assert torch.equal(got, attnkit.attention(q, k, v, seqused_k=used, mask=mask))
    torch.testing.assert_close(got.double(), _oracle(q, keys, values), rtol=0, atol=2e-6)


@pytest.mark.parametrize("hkv", [1, 2])
def test_sequences_too_long_to_copy_are_read_in_place_from_runs_and_from_a_contiguous_cache(hkv, monkeypatch):
    # past SEQUENCE_BYTES a sequence is not copied: consecutive pages and a contiguous cache are read in place,
    # token-major and head-major, and give the same bits (torch's kernel reads either layout alike)
    from attnkit.kernels import page_segments

    monkeypatch.setattr(page_segments, "SEQUENCE_BYTES", 1024)
    monkeypatch.setattr(page_segments.torch, "index_select", lambda *a, **kw: pytest.fail("a page was copied"))
    lengths = [3 * selected.SPLIT_KEYS - 7, selected.SPLIT_KEYS + 33, 5]
    keys, values = _sequences(lengths, hkv=hkv, seed=45)
    q = torch.randn(3, 4, 1, 16, generator=torch.Generator().manual_seed(46))
    counts = [-(-n // 16) for n in lengths]
    firsts = [0, counts[0] + 3, counts[0] + counts[1] + 5]
    k_pool = torch.full((firsts[-1] + counts[-1] + 2, 16, hkv, 16), math.nan)
    v_pool = k_pool.clone()
    table = torch.zeros(3, max(counts), dtype=torch.long)
    for b, (k, v) in enumerate(zip(keys, values, strict=True)):
        table[b, :counts[b]] = torch.arange(counts[b]) + firsts[b]
        start = firsts[b] * 16
        k_pool.view(-1, hkv, 16)[start:start + lengths[b]] = k.transpose(0, 1)
        v_pool.view(-1, hkv, 16)[start:start + lengths[b]] = v.transpose(0, 1)
    used, mask = torch.tensor(lengths), masks.causal()
    got = attnkit.attention(q, k_pool, v_pool, block_table=table, seqused_k=used, mask=mask)
    torch.testing.assert_close(got.double(), _oracle(q, keys, values), rtol=0, atol=2e-6)
    k, v = _contiguous(keys, values)
    assert torch.equal(got, attnkit.attention(q, k, v, seqused_k=used, mask=mask))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shift", [1, 3])
def test_consecutive_pages_of_a_pool_not_aligned_in_memory_give_the_bits_of_an_aligned_copy(dtype, shift):
    # torch's kernel sums in another order when the keys start off a 16-byte boundary: a pool that is a view into a
    # larger buffer (one allocation cut into layers or into k and v) read in place must give the aligned bits
    lengths = [2 * selected.SPLIT_KEYS + 300, 77]  # as many chunks as sequences: each read in one call
    keys, values = _sequences(lengths, hkv=1, dtype=dtype, seed=47)
    q = torch.randn(2, 1, 1, 16, generator=torch.Generator().manual_seed(48), dtype=dtype)  # one row a head
    counts = [-(-n // 16) for n in lengths]
    k_pool = torch.full((sum(counts) + 3, 16, 1, 16), math.nan, dtype=dtype)
    v_pool = k_pool.clone()
    table = torch.zeros(2, max(counts), dtype=torch.long)
    first = 1
    for b, (k, v) in enumerate(zip(keys, values, strict=True)):  # consecutive pages: read in place
        table[b, :counts[b]] = torch.arange(counts[b]) + first
        k_pool.view(-1, 1, 16)[first * 16:first * 16 + lengths[b]] = k.transpose(0, 1)
        v_pool.view(-1, 1, 16)[first * 16:first * 16 + lengths[b]] = v.transpose(0, 1)
        first += counts[b] + 1

    def shifted(pool):  # the same values, contiguous, starting `shift` elements into a buffer
        buf = torch.empty(pool.numel() + shift, dtype=dtype)
        buf[shift:] = pool.flatten()
        return buf[shift:].view(pool.shape)

    used, mask = torch.tensor(lengths), masks.causal()
    got = attnkit.attention(q, shifted(k_pool), shifted(v_pool), block_table=table, seqused_k=used, mask=mask)
    assert torch.equal(got, attnkit.attention(q, k_pool, v_pool, block_table=table, seqused_k=used, mask=mask))
    k, v = _contiguous(keys, values)
    assert torch.equal(got, attnkit.attention(q, k, v, seqused_k=used, mask=mask))
    atol = 2e-6 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(got.double(), _oracle(q, keys, values), rtol=0, atol=atol)


@pytest.mark.parametrize("shift", [1, 3])
def test_a_contiguous_cache_too_long_to_copy_and_not_aligned_in_memory_gives_the_bits_of_an_aligned_copy(
        shift, monkeypatch):
    from attnkit.kernels import page_segments

    monkeypatch.setattr(page_segments, "SEQUENCE_BYTES", 1024)  # every sequence too long to copy
    g = torch.Generator().manual_seed(49)
    k, v = torch.randn(2, 2, 2, 1300, 16, generator=g)
    q = torch.randn(2, 2, 1, 16, generator=g)  # one row a head
    used, mask = torch.tensor([1300, 1299]), masks.causal()

    def shifted(t):
        buf = torch.empty(t.numel() + shift)
        buf[shift:] = t.flatten()
        return buf[shift:].view(t.shape)

    got = attnkit.attention(q, shifted(k), shifted(v), seqused_k=used, mask=mask)
    assert torch.equal(got, attnkit.attention(q, k, v, seqused_k=used, mask=mask))
    keys, values = [k[b, :, :n] for b, n in enumerate([1300, 1299])], [v[b, :, :n] for b, n in enumerate([1300, 1299])]
    torch.testing.assert_close(got.double(), _oracle(q, keys, values), rtol=0, atol=2e-6)


DENSE_BACKENDS = ("reference", "chunked", "sdpa", "blocksparse", "flex")


def test_a_page_named_twice_in_one_sequence_is_read_twice_or_refused_never_read_once():
    # the table defines sequence b's key t as pool key table[b, t // page_size] * page_size + t % page_size, so a
    # page named twice holds two of its positions; a path that sees the pool as one key axis under a mask can
    # hold each pool key once: it must refuse such a table, never answer as if the page were named once
    from attnkit.errors import BackendError

    g = torch.Generator().manual_seed(50)
    k_pool, v_pool = torch.randn(2, 6, 4, 2, 8, generator=g, dtype=torch.float64)
    table = torch.tensor([[3, 1, 3, 0], [2, 2, 2, 5]])
    lengths = [15, 16]
    q = torch.randn(2, 4, 3, 8, generator=g, dtype=torch.float64)
    keys = [k_pool[table[b]].reshape(-1, 2, 8)[:n].transpose(0, 1) for b, n in enumerate(lengths)]
    values = [v_pool[table[b]].reshape(-1, 2, 8)[:n].transpose(0, 1) for b, n in enumerate(lengths)]
    exact = _oracle(q, keys, values)
    used, mask = torch.tensor(lengths), masks.causal()
    got = attnkit.attention(q, k_pool, v_pool, block_table=table, seqused_k=used, mask=mask)
    torch.testing.assert_close(got, exact, rtol=0, atol=1e-12)
    full = attnkit.attention(q, k_pool, v_pool, block_table=table, seqused_k=used, mask=mask, return_lse=True)
    torch.testing.assert_close(full.output, exact, rtol=0, atol=1e-12)
    for backend in DENSE_BACKENDS:
        try:
            out = attnkit.attention(q, k_pool, v_pool, block_table=table, seqused_k=used, mask=mask, backend=backend)
        except BackendError:  # this one or another reason (flex: CUDA only)
            continue
        torch.testing.assert_close(out, exact, rtol=0, atol=1e-12, msg=backend)
    with pytest.raises(BackendError, match="block_table"):  # weights over the pool: no path can give them
        attnkit.attention(q, k_pool, v_pool, block_table=table, seqused_k=used, mask=mask, return_weights=True)


@pytest.mark.parametrize("lq", [1, 3])
def test_consecutive_pages_of_a_pool_strided_in_its_last_dim_give_the_bits_of_a_contiguous_copy(lq):
    # a pool read every other element (`buf[..., ::2]`) reshapes to a view of stride 2, which torch's kernel reads
    # in another order than the copies' stride 1: it must give the bits of the same pool made contiguous
    lengths = [2 * selected.SPLIT_KEYS + 300]
    keys, values = _sequences(lengths, hkv=1, seed=51)
    q = torch.randn(1, 1, lq, 16, generator=torch.Generator().manual_seed(52))  # one row a head
    counts = -(-lengths[0] // 16)
    k_pool = torch.full((counts + 2, 16, 1, 16), math.nan)
    v_pool = k_pool.clone()
    k_pool.view(-1, 1, 16)[16:16 + lengths[0]] = keys[0].transpose(0, 1)
    v_pool.view(-1, 1, 16)[16:16 + lengths[0]] = values[0].transpose(0, 1)
    table = (torch.arange(counts) + 1)[None]

    def strided(pool):
        buf = torch.full((*pool.shape[:3], 32), math.nan)
        buf[..., ::2] = pool
        return buf[..., ::2]

    used = torch.tensor(lengths)
    for mask in (None, masks.causal()):
        got = attnkit.attention(q, strided(k_pool), strided(v_pool), block_table=table, seqused_k=used, mask=mask)
        assert torch.equal(got, attnkit.attention(q, k_pool, v_pool, block_table=table, seqused_k=used, mask=mask))


@pytest.mark.parametrize("listed", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_equal_sequences_on_equally_spaced_pages_run_in_one_call_with_the_bits_of_one_call_each(dtype, listed,
                                                                                                 monkeypatch):
    # a decoding step over sequences of one length whose consecutive pages start equally spaced in the pool (in any
    # order) is one call of the kernel on a view of the pool (a batch stride); moving one sequence's pages a page
    # further gives one call per sequence: the same bits, the contiguous cache's and the float64 oracle's
    from attnkit.kernels import page_segments

    calls = []
    flash = page_segments.rules.FLASH

    def count_calls():  # (and the page table read as Python ints, or by tensor operators)
        monkeypatch.setattr(page_segments, "LISTED_PAGES", page_segments.LISTED_PAGES if listed else 0)
        monkeypatch.setattr(page_segments.rules, "FLASH", lambda q, k, v, *a, **kw: calls.append(k.shape[0]) or flash(
            q, k, v, *a, **kw))
    count_calls()
    monkeypatch.setattr(page_segments.torch, "index_select", lambda *a, **kw: pytest.fail("a page was copied"))
    n, ps, hkv = 3 * selected.SPLIT_KEYS + 5, 16, 2
    lengths = [n] * 3
    keys, values = _sequences(lengths, hkv=hkv, dtype=dtype, seed=60)
    q = torch.randn(3, 4, 1, 16, generator=torch.Generator().manual_seed(61), dtype=dtype)
    count = -(-n // ps)
    used, mask = torch.tensor(lengths), masks.causal()

    def pool(firsts):
        k_pool = torch.full((max(firsts) + count + 2, ps, hkv, 16), math.nan, dtype=dtype)
        v_pool = k_pool.clone()
        table = torch.zeros(3, count + 1, dtype=torch.long)  # a padding entry past the pages in use
        for b, (k, v) in enumerate(zip(keys, values, strict=True)):
            table[b, :count] = torch.arange(count) + firsts[b]
            k_pool.view(-1, hkv, 16)[firsts[b] * ps:firsts[b] * ps + n] = k.transpose(0, 1)
            v_pool.view(-1, hkv, 16)[firsts[b] * ps:firsts[b] * ps + n] = v.transpose(0, 1)
        return k_pool, v_pool, table

    spaced = [1, count + 3, 2 * count + 5]
    k_pool, v_pool, table = pool(spaced)
    got = attnkit.attention(q, k_pool, v_pool, block_table=table, seqused_k=used, mask=mask)
    assert calls == [3]
    calls.clear()
    k_pool, v_pool, table = pool([1, count + 3, 2 * count + 6])  # the third a page further: no batch stride
    assert torch.equal(got, attnkit.attention(q, k_pool, v_pool, block_table=table, seqused_k=used, mask=mask))
    assert calls == [1, 1, 1]
    calls.clear()
    monkeypatch.undo()  # (the queries' rows are put in the pool's order, and the outputs back)
    count_calls()
    k_pool, v_pool, table = pool([2 * count + 5, 1, count + 3])  # equally spaced in another order than the batch
    assert torch.equal(got, attnkit.attention(q, k_pool, v_pool, block_table=table, seqused_k=used, mask=mask))
    assert calls == [3]
    monkeypatch.undo()
    k, v = _contiguous(keys, values)
    assert torch.equal(got, attnkit.attention(q, k, v, seqused_k=used, mask=mask))
    atol = 2e-6 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(got.double(), _oracle(q, keys, values), rtol=0, atol=atol)
