"""attnkit.varlen_attn: torch's varlen call, per document, forward and backward, on the block-sparse path."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.attention.varlen

import attnkit
from attnkit import masks
from attnkit.errors import ArgumentError, DeviceError, DTypeError, ShapeError
from attnkit.kernels import paths


def _cu(lengths):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def _window_allowed(lq, lk, left, right):
    """torch/FlashAttention's window, bottom-right aligned, by index arithmetic (-1: unbounded)."""
    i = torch.arange(lq)[:, None] + lk - lq
    j = torch.arange(lk)[None, :]
    allowed = torch.ones(lq, lk, dtype=torch.bool)
    if left >= 0:
        allowed &= j >= i - left
    if right >= 0:
        allowed &= j <= i + right
    return allowed


def _per_document(q, k, v, cu_q, cu_k, window, scale=None, k_used=None):
    """Each document alone, densely in float64 (autograd kept): the oracle shares no code with attnkit."""
    outs, lses = [], []
    group = q.shape[1] // k.shape[1]
    for n in range(len(cu_q) - 1):
        qd = q[cu_q[n]:cu_q[n + 1]].transpose(0, 1)
        stop = cu_k[n + 1] if k_used is None else cu_k[n] + k_used[n]
        kd = k[cu_k[n]:stop].transpose(0, 1).repeat_interleave(group, 0)
        vd = v[cu_k[n]:stop].transpose(0, 1).repeat_interleave(group, 0)
        s = qd @ kd.transpose(-1, -2) * (scale or 1 / math.sqrt(q.shape[-1]))
        s = s.masked_fill(~_window_allowed(qd.shape[1], kd.shape[1], *window), -math.inf)
        lse = torch.logsumexp(s, -1)
        w = torch.exp(s - lse.clamp(min=-1e300)[..., None]).nan_to_num(0.0)
        outs.append((w @ vd).transpose(0, 1))
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses, -1)


WINDOWS = [(-1, -1), (-1, 0), (17, 0), (5, 9), (-1, 3), (0, -1)]


@pytest.mark.parametrize("window", WINDOWS)
def test_float64_equals_each_document_alone_forward_and_backward(window):
    g = torch.Generator().manual_seed(sum(window) + 7)
    lengths = torch.randint(1, 2049, (3,), generator=g).tolist() + [1, 64]
    cu = _cu(lengths)
    t = int(cu[-1])
    q = torch.randn(t, 6, 11, dtype=torch.float64, generator=g, requires_grad=True)
    k = torch.randn(t, 2, 11, dtype=torch.float64, generator=g, requires_grad=True)
    v = torch.randn(t, 2, 5, dtype=torch.float64, generator=g, requires_grad=True)
    out, lse = attnkit.varlen_attn(q, k, v, cu, cu, max(lengths), max(lengths), window_size=window, enable_gqa=True,
                                   return_aux=torch.nn.attention.varlen.AuxRequest(lse=True))
    exact, exact_lse = _per_document(q, k, v, cu.tolist(), cu.tolist(), window)
    torch.testing.assert_close(out, exact, rtol=0, atol=1e-12)
    torch.testing.assert_close(lse, exact_lse, rtol=0, atol=1e-12)
    w = torch.randn_like(out)
    got = torch.autograd.grad((out * w).sum(), (q, k, v))
    want = torch.autograd.grad((exact * w).sum(), (q, k, v))
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-11)


def test_float32_within_1e_5_with_different_query_and_key_documents():
    g = torch.Generator().manual_seed(0)
    q_lengths, k_lengths = [3, 200, 1, 77], [500, 200, 9, 1]
    cu_q, cu_k = _cu(q_lengths), _cu(k_lengths)
    q = torch.randn(int(cu_q[-1]), 4, 16, generator=g, requires_grad=True)
    k = torch.randn(int(cu_k[-1]), 4, 16, generator=g, requires_grad=True)
    v = torch.randn(int(cu_k[-1]), 4, 16, generator=g, requires_grad=True)
    out = attnkit.varlen_attn(q, k, v, cu_q, cu_k, 200, 500, window_size=(-1, 0))
    exact, _ = _per_document(q.double(), k.double(), v.double(), cu_q.tolist(), cu_k.tolist(), (-1, 0))
    torch.testing.assert_close(out.double(), exact, rtol=0, atol=1e-5)
    got = torch.autograd.grad(out.sum(), (q, k, v))
    want = torch.autograd.grad(exact.sum(), (q, k, v))
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a.double(), b.double(), rtol=0, atol=1e-5)


def test_seqused_k_keeps_each_documents_first_keys():
    g = torch.Generator().manual_seed(1)
    cu = _cu([40, 30])
    q, k, v = (torch.randn(70, 2, 8, generator=g, dtype=torch.float64) for _ in range(3))
    used = torch.tensor([25, 30])
    k[25:40] = math.nan  # never read
    out = attnkit.varlen_attn(q, k, v, cu, cu, 40, 40, seqused_k=used)
    exact, _ = _per_document(q, k, v, cu.tolist(), cu.tolist(), (-1, -1), k_used=used.tolist())
    torch.testing.assert_close(out, exact, rtol=0, atol=1e-12)


def test_the_block_path_runs_and_its_cost_is_the_sum_of_the_documents_costs():
    g = torch.Generator().manual_seed(2)
    lengths = [128, 640, 64, 256]  # multiples of the block: no padding lanes
    cu = _cu(lengths)
    q, k, v = (torch.randn(int(cu[-1]), 3, 16, generator=g) for _ in range(3))
    d = attnkit.explain_varlen(q, k, v, cu, cu, 640, 640, block_size=64)
    assert d.backend == "blocksparse" and d.path in {p.name for p in paths.of_backend("blocksparse")}
    alone = [attnkit.explain(q[a:b].transpose(0, 1), k[a:b].transpose(0, 1), v[a:b].transpose(0, 1))
             for a, b in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)]
    assert d.flops == sum(x.flops for x in alone)  # each document alone: torch's kernel over its own scores
    causal = attnkit.explain_varlen(q, k, v, cu, cu, 640, 640, window_size=(-1, 0), block_size=64)
    singles = [attnkit.explain_varlen(q[a:b], k[a:b], v[a:b], _cu([b - a]), _cu([b - a]), b - a, b - a,
                                      window_size=(-1, 0), block_size=64)
               for a, b in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)]
    assert causal.path == singles[0].path and causal.flops == sum(x.flops for x in singles)
    total = int(cu[-1])
    assert causal.flops < 2 * 2 * 3 * total * total * 16 / 4  # far below one T x T attention


def test_the_document_plan_is_cached_by_its_boundaries(monkeypatch):
    """Equal boundaries (new tensors, another integer dtype) reuse the layout and its Documents mask, so the block
    plan cached on that mask is warm; other boundaries, another window or alignment build their own."""
    import attnkit.varlen as varlen
    from attnkit.masks.cache import BoundedCache

    builds = []
    layout = varlen._layout
    monkeypatch.setattr(varlen, "LAYOUTS", BoundedCache(max_entries=8))
    monkeypatch.setattr(varlen, "_layout", lambda *a: builds.append(a) or layout(*a))
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(300, 2, 8, generator=g, dtype=torch.float64) for _ in range(3))
    call = dict(window_size=(-1, 0))
    first = attnkit.varlen_attn(q, k, v, _cu([100, 120, 80]), _cu([100, 120, 80]), 120, 120, **call)
    again = attnkit.varlen_attn(q, k, v, _cu([100, 120, 80]).long(), _cu([100, 120, 80]), 120, 120, **call)
    assert len(builds) == 1 and torch.equal(first, again)
    masks_used = [varlen._prepare(q, k, v, _cu([100, 120, 80]), _cu([100, 120, 80]), 120, 120, scale=None,
                                  window_size=(-1, 0), enable_gqa=False, seqused_k=None, block_table=None,
                                  dropout_p=0.0, mask=None, bias=None, block_size=None).kwargs["mask"]
                  for _ in range(2)]
    assert masks_used[0] is masks_used[1] and len(builds) == 1
    other = attnkit.varlen_attn(q, k, v, _cu([120, 100, 80]), _cu([120, 100, 80]), 120, 120, **call)
    assert len(builds) == 2
    torch.testing.assert_close(other, _per_document(q, k, v, _cu([120, 100, 80]), _cu([120, 100, 80]), (-1, 0))[0])
    attnkit.varlen_attn(q, k, v, _cu([120, 100, 80]), _cu([120, 100, 80]), 120, 120, window_size=(7, 0))
    attnkit.varlen_attn(q, k, v, _cu([120, 100, 80]), _cu([120, 100, 80]), 120, 120, block_size=32, **call)
    assert len(builds) == 4


def test_mask_dropout_and_bias_are_read_inside_each_document():
    g = torch.Generator().manual_seed(3)
    cu = _cu([9, 14])
    q, k, v = (torch.randn(23, 2, 8, generator=g, dtype=torch.float64) for _ in range(3))
    alibi = attnkit.bias.alibi(2)
    out = attnkit.varlen_attn(q, k, v, cu, cu, 14, 14, mask=masks.sliding_window(2, 2), bias=alibi)
    for a, b in ((0, 9), (9, 23)):
        alone = attnkit.attention(q[a:b].transpose(0, 1)[None], k[a:b].transpose(0, 1)[None],
                                  v[a:b].transpose(0, 1)[None], mask=masks.sliding_window(2, 2), bias=alibi,
                                  backend="reference")
        torch.testing.assert_close(out[a:b], alone[0].transpose(0, 1), rtol=0, atol=1e-12)
    torch.manual_seed(0)
    dropped = attnkit.varlen_attn(q, k, v, cu, cu, 14, 14, dropout_p=0.5)
    assert not torch.allclose(dropped, attnkit.varlen_attn(q, k, v, cu, cu, 14, 14))


def test_paged_keys_through_a_block_table_with_ragged_queries():
    g = torch.Generator().manual_seed(4)
    k_pool, v_pool = torch.randn(20, 8, 2, 11, generator=g, dtype=torch.float64), torch.randn(
        20, 8, 2, 11, generator=g, dtype=torch.float64)
    table = torch.randperm(20, generator=g)[:15].view(3, 5)
    used, q_lengths = torch.tensor([33, 2, 40]), [2, 1, 6]
    cu = _cu(q_lengths)
    q = torch.randn(int(cu[-1]), 4, 11, generator=g, dtype=torch.float64)
    out = attnkit.varlen_attn(q, k_pool, v_pool, cu, None, 6, 40, window_size=(-1, 0), enable_gqa=True,
                              seqused_k=used, block_table=table)
    keys = torch.cat([k_pool[table[n]].reshape(-1, 2, 11)[:used[n]] for n in range(3)])
    values = torch.cat([v_pool[table[n]].reshape(-1, 2, 11)[:used[n]] for n in range(3)])
    exact, _ = _per_document(q, keys, values, cu.tolist(), _cu(used.tolist()).tolist(), (-1, 0))
    torch.testing.assert_close(out, exact, rtol=0, atol=1e-12)


def test_torch_conventions_are_checked_with_named_arguments():
    q = torch.randn(10, 4, 8)
    k = torch.randn(10, 2, 8)
    cu = _cu([4, 6])
    with pytest.raises(ShapeError, match="same number of heads unless enable_gqa"):
        attnkit.varlen_attn(q, k, k, cu, cu, 6, 6)
    with pytest.raises(ShapeError, match="multiple of key/value heads"):
        attnkit.varlen_attn(q, torch.randn(10, 3, 8), torch.randn(10, 3, 8), cu, cu, 6, 6, enable_gqa=True)
    with pytest.raises(ArgumentError, match="cu_seq_q must start at 0"):
        attnkit.varlen_attn(q, q, q, _cu([4, 5]), cu, 6, 6)
    with pytest.raises(ArgumentError, match="max_q must be at least the longest sequence, 6"):
        attnkit.varlen_attn(q, q, q, cu, cu, 5, 6)
    for name, bad in (("max_q", -1), ("max_q", 6.0), ("max_k", True), ("max_k", None)):
        sizes = {"max_q": 6, "max_k": 6, name: bad}
        with pytest.raises(ArgumentError, match=rf"varlen_attn: {name} must be an int >= 0; got {bad!r}"):
            attnkit.varlen_attn(q, q, q, cu, cu, sizes["max_q"], sizes["max_k"])
    with pytest.raises(ArgumentError, match="window_size must be two ints >= -1"):
        attnkit.varlen_attn(q, q, q, cu, cu, 6, 6, window_size=(-2, 0))
    with pytest.raises(DTypeError, match="cu_seq_k must be a 1-D int32/int64 tensor"):
        attnkit.varlen_attn(q, q, q, cu, cu.float(), 6, 6)
    with pytest.raises(ArgumentError, match="block_table needs seqused_k"):
        attnkit.varlen_attn(q, torch.randn(3, 4, 4, 8), torch.randn(3, 4, 4, 8), cu, None, 6, 6,
                            block_table=torch.zeros(2, 1, dtype=torch.long))


def test_no_key_gives_zero_and_minus_inf():
    q, k = torch.randn(5, 2, 8), torch.randn(3, 2, 8)
    out, lse = attnkit.varlen_attn(q, k, k, _cu([2, 3]), _cu([0, 3]), 3, 3,
                                   return_aux=torch.nn.attention.varlen.AuxRequest(lse=True))
    assert (out[:2] == 0).all() and (lse[:, :2] == -math.inf).all() and torch.isfinite(out[2:]).all()


@pytest.mark.parametrize(("used", "error", "words"), [
    (torch.tensor([2.7, 5.2]), DTypeError, "seqused_k must be an integer tensor"),
    (torch.tensor([True, True]), DTypeError, "seqused_k must be an integer tensor"),
    (torch.tensor([-1, 5]), ArgumentError, "seqused_k must lie in [0"),
    (torch.tensor([2, 5], device="meta"), DeviceError, "seqused_k is on meta"),
    (torch.tensor([2, 5, 1]), ShapeError, "seqused_k must have shape (batch=2,)"),
])
def test_seqused_k_on_packed_documents_is_checked_as_attention_checks_it(used, error, words):
    q = torch.randn(10, 2, 8)
    cu = _cu([4, 6])
    with pytest.raises(error) as caught:
        attnkit.varlen_attn(q, q, q, cu, cu, 6, 6, seqused_k=used)
    assert words in str(caught.value)
    k = torch.randn(2, 2, 6, 8)  # attention(..., seqused_k=) gives the same error for the same lengths
    with pytest.raises(error) as same:
        attnkit.attention(torch.randn(2, 2, 1, 8), k, k, seqused_k=used)
    assert words in str(same.value)


@pytest.mark.parametrize("name", ["cu_seq_q", "cu_seq_k"])
def test_cumulative_lengths_on_another_device_are_refused_naming_them(name):
    q = torch.randn(10, 2, 8)
    cu = {"cu_seq_q": _cu([4, 6]), "cu_seq_k": _cu([4, 6])}
    cu[name] = cu[name].to("meta")
    with pytest.raises(DeviceError, match=f"{name} is on meta but query is on cpu"):
        attnkit.varlen_attn(q, q, q, cu["cu_seq_q"], cu["cu_seq_k"], 6, 6)


def test_the_explanation_says_varlen_chose_the_block_paths_not_that_the_user_forced_them():
    q = torch.randn(300, 2, 8)
    cu = _cu([100, 200])
    text = str(attnkit.explain_varlen(q, q, q, cu, cu, 200, 200, window_size=(-1, 0)))
    assert "was forced" not in text and "varlen_attn runs packed documents on the block-sparse paths" in text
