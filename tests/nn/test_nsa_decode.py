"""NSA's decoding step (nn/nsa_decode.py) against the paper transcribed by loops in float64 (tests/nn/test_nsa.py) and
the module's last row: GQA, caches not a multiple of the block, every forced-block count, the exact fallback."""

from __future__ import annotations

import math

import pytest
import torch

from attnkit.errors import ArgumentError, ShapeError
from attnkit.nn import NativeSparseAttention
from attnkit.nn import nsa_decode as step_module
from attnkit.nn.nsa_decode import nsa_decode
from tests.nn.test_nsa import _transcription
from tests.oracle import dense_attention


def _layer(kv_heads=2, num_selected=3, window=10, block=8):
    torch.manual_seed(0)
    return NativeSparseAttention(24, 4, kv_heads=kv_heads, compress_block=8, compress_stride=4, select_block=block,
                                 num_selected=num_selected, window=window).double()


def _caches(layer, x):
    """The query at the last position and the caches of every branch (as a decoding loop keeps them)."""
    with torch.no_grad():
        q, (k_c, v_c), (k_s, v_s), (k_w, v_w), _ = layer.branches(x)
    return q[:, :, -1:], (k_c, v_c, k_s, v_s, k_w, v_w)


def _options(layer):
    return dict(length=layer.compress_block, stride=layer.compress_stride, block=layer.select_block,
                count=layer.num_selected, window=layer.window)


def _gated(layer, x, branches):
    """Eq. 5 for the last token, then the output projection: ``(B, dim)``."""
    batch, h = x.shape[0], layer.num_heads
    with torch.no_grad():
        g = torch.sigmoid(layer.gate(x[:, -1:])).view(batch, 1, h, 3).permute(3, 0, 2, 1).unsqueeze(-1)
        out = sum(g[i] * branches[i] for i in range(3))
        return layer.out_proj(out.transpose(1, 2).reshape(batch, 1, layer.dim))[:, 0]


def _no_fallback(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the composed step ran")
    monkeypatch.setattr(step_module, "_composed", refuse)


@pytest.mark.parametrize("n,kv_heads,num_selected", [(61, 2, 3), (64, 4, 3), (77, 1, 4), (40, 2, 2), (45, 4, 1),
                                                     (7, 2, 3), (9, 1, 3), (100, 2, 50)])
def test_a_step_is_the_last_row_of_the_module_and_of_the_paper(n, kv_heads, num_selected, monkeypatch):
    """On torch's kernel (no fallback): the paper by loops in float64 and the module's whole-sequence call agree
    with the step. A count below 3 keeps some of the forced blocks, which the paper leaves open (the transcription
    keeps the first ones by position): the module and the step keep the own block, then the one before."""
    _no_fallback(monkeypatch)
    layer = _layer(kv_heads, num_selected)
    x = torch.randn(2, n, 24, dtype=torch.float64, generator=torch.Generator().manual_seed(n))
    q, caches = _caches(layer, x)
    got = _gated(layer, x, nsa_decode(q, *caches, **_options(layer)))
    if num_selected >= 3:
        torch.testing.assert_close(got, _transcription(layer, x)[:, -1], rtol=0, atol=1e-12)
    with torch.no_grad():
        torch.testing.assert_close(got, layer(x)[:, -1], rtol=0, atol=1e-12)


def test_every_block_selected_and_a_whole_window_are_dense_attention(monkeypatch):
    _no_fallback(monkeypatch)
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, 1, 8, dtype=torch.float64, generator=g)
    k_c, v_c = (torch.randn(2, 2, 9, 8, dtype=torch.float64, generator=g) for _ in range(2))
    k, v = (torch.randn(2, 2, 43, 8, dtype=torch.float64, generator=g) for _ in range(2))
    o_cmp, o_slc, o_win = nsa_decode(q, k_c, v_c, k, v, k, v, length=8, stride=4, block=8, count=6, window=43)
    dense = dense_attention(q, k, v)
    torch.testing.assert_close(o_slc, dense, rtol=0, atol=1e-12)
    torch.testing.assert_close(o_win, dense, rtol=0, atol=1e-12)
    torch.testing.assert_close(o_cmp, dense_attention(q, k_c, v_c), rtol=0, atol=1e-12)


def test_float32_is_the_float64_step_rounded():
    layer = _layer()
    x = torch.randn(2, 61, 24, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    q, caches = _caches(layer, x)
    want = nsa_decode(q, *caches, **_options(layer))
    got = nsa_decode(q.float(), *(c.float() for c in caches), **_options(layer))
    for a, b in zip(got, want, strict=True):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=1e-6)


def test_a_rolling_window_token_major_caches_and_unended_compressed_blocks(monkeypatch):
    """A window cache of the last ``w`` positions only; token-major caches (rows copied one by one); a preallocated
    cache with room to spare; compressed blocks the query has not seen ended (NaN: never read)."""
    _no_fallback(monkeypatch)
    layer = _layer()
    x = torch.randn(2, 53, 24, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    q, (k_c, v_c, k_s, v_s, k_w, v_w) = _caches(layer, x)
    want = nsa_decode(q, k_c, v_c, k_s, v_s, k_w, v_w, **_options(layer))
    rolling = nsa_decode(q, k_c, v_c, k_s, v_s, k_w[:, :, -10:], v_w[:, :, -10:], **_options(layer))
    token_major = [c.transpose(1, 2).contiguous().transpose(1, 2) for c in (k_s, v_s)]
    tokens = nsa_decode(q, k_c, v_c, *token_major, k_w, v_w, **_options(layer))
    room = [torch.cat((c, torch.full_like(c, math.nan)), 2)[:, :, :53] for c in (k_s, v_s)]
    roomy = nsa_decode(q, k_c, v_c, *room, k_w, v_w, **_options(layer))
    unended = [torch.cat((c, torch.full_like(c[:, :, :3], math.nan)), 2) for c in (k_c, v_c)]
    later = nsa_decode(q, *unended, k_s, v_s, k_w, v_w, **_options(layer))
    for got in (rolling, tokens, roomy, later):
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_a_nan_in_a_selected_key_gives_the_composed_answer_and_unselected_ones_never_leak():
    layer = _layer(num_selected=2)  # the own block and the one before: blocks 0 .. 4 of 6 never read
    x = torch.randn(1, 48, 24, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    q, (k_c, v_c, k_s, v_s, k_w, v_w) = _caches(layer, x)
    want = nsa_decode(q, k_c, v_c, k_s, v_s, k_w, v_w, **_options(layer))
    k_s, v_s = k_s.clone(), v_s.clone()
    k_s[:, :, :32], v_s[:, :, :32] = math.nan, math.inf
    for a, b in zip(nsa_decode(q, k_c, v_c, k_s, v_s, k_w, v_w, **_options(layer)), want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    k_s[:, 0, 40] = math.nan  # selected by head group 0: torch's answer is refused, the composed step answers
    got = nsa_decode(q, k_c, v_c, k_s, v_s, k_w, v_w, **_options(layer))
    composed = step_module._composed(q, k_c, v_c, k_s, v_s, k_w[:, :, -10:], v_w[:, :, -10:], scale=6 ** -0.5,
                                     **{k: v for k, v in _options(layer).items() if k != "window"})
    for a, b in zip(got, composed, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
    assert got[1][:, :2].isnan().all() and not got[1][:, 2:].isnan().any()


def test_autograd_runs_the_composed_step_with_the_same_values():
    layer = _layer()
    x = torch.randn(2, 61, 24, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    q, caches = _caches(layer, x)
    want = nsa_decode(q, *caches, **_options(layer))
    q = q.clone().requires_grad_()
    got = nsa_decode(q, *caches, **_options(layer))
    sum(o.sum() for o in got).backward()
    assert q.grad is not None and q.grad.abs().sum() > 0
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a.detach(), b, rtol=0, atol=1e-12)


def test_the_step_reads_the_same_selection_as_the_whole_sequence():
    """The blocks read are those the module's mask gives the last query (its own block cut at the query)."""
    layer = _layer(num_selected=3)
    x = torch.randn(1, 61, 24, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    q, (k_c, v_c, k_s, v_s, k_w, v_w) = _caches(layer, x)
    with torch.no_grad():
        mask = layer.branches(x)[-1]
    o_slc = nsa_decode(q, k_c, v_c, k_s, v_s, k_w, v_w, **_options(layer))[1]
    allowed = mask.materialize(61, 61, batch=1, heads=4)[:, :, -1:]
    torch.testing.assert_close(o_slc, dense_attention(q, k_s, v_s, mask=allowed), rtol=0, atol=1e-12)


def test_bad_inputs_are_refused():
    g = torch.Generator().manual_seed(7)
    q = torch.randn(1, 4, 1, 8, generator=g)
    k = torch.randn(1, 2, 20, 8, generator=g)
    k_c = torch.randn(1, 2, 4, 8, generator=g)
    opts = dict(length=8, stride=4, block=8, count=3, window=5)
    with pytest.raises(ShapeError, match="q must be"):
        nsa_decode(q.expand(1, 4, 2, 8), k_c, k_c, k, k, k, k, **opts)
    with pytest.raises(ShapeError, match="share B and H_kv"):
        nsa_decode(q, k_c, k_c, k[:, :1], k[:, :1], k, k, **opts)
    with pytest.raises(ShapeError, match="hold the query"):
        nsa_decode(q, k_c, k_c, k[:, :, :0], k[:, :, :0], k, k, **opts)
    with pytest.raises(ArgumentError, match="count"):
        nsa_decode(q, k_c, k_c, k, k, k, k, **{**opts, "count": 0})


@pytest.mark.parametrize(("length", "stride", "block"), [(6, 4, 8), (4, 4, 6), (5, 2, 4)])
def test_blocks_that_are_not_multiples_of_the_stride_are_refused_as_the_module_refuses_them(length, stride, block):
    """Eq. 9 sums whole chunks of ``stride`` keys: the module refuses ``l`` or ``l'`` not a multiple of ``d``
    (NativeSparseAttention), and so does the step (it gave a selection from truncated chunk counts)."""
    g = torch.Generator().manual_seed(8)
    q, k, k_c = (torch.randn(1, *s, 8, generator=g) for s in ((4, 1), (2, 30), (2, 12)))
    with pytest.raises(ArgumentError, match="multiples of stride"):
        nsa_decode(q, k_c, k_c, k, k, k, k, length=length, stride=stride, block=block, count=3, window=5)
    with pytest.raises(ArgumentError, match="multiples of compress_stride"):
        NativeSparseAttention(24, 4, compress_block=length, compress_stride=stride, select_block=block)


@pytest.mark.parametrize("scale", [math.nan, math.inf, -math.inf])
def test_a_non_finite_scale_is_refused_naming_the_step(scale):
    """docs/RELIABILITY.md row 25: E for a non-finite scale, from the function the user called."""
    g = torch.Generator().manual_seed(9)
    q, k, k_c = (torch.randn(1, *s, 8, generator=g) for s in ((4, 1), (2, 30), (2, 12)))
    with pytest.raises(ArgumentError, match="nsa_decode: scale"):
        nsa_decode(q, k_c, k_c, k, k, k, k, length=4, stride=2, block=4, count=3, window=5, scale=scale)
