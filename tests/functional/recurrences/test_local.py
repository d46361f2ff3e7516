"""local.py's segment sums: each entry summed over its own segment (exact where prefix sums are not)."""

import pytest
import torch

from attnkit.functional.recurrences.local import decayed_products, segsum, split_decayed_products, suffix_sums


def test_entries_are_sums_over_their_segments_and_minus_inf_above():
    g = torch.randn(2, 6, 3, dtype=torch.float64)
    seg = segsum(g)
    assert seg.shape == (2, 6, 6, 3)
    for i in range(6):
        for j in range(6):
            want = g[:, j + 1 : i + 1].sum(1) if j <= i else torch.full((2, 3), float("-inf"), dtype=torch.float64)
            torch.testing.assert_close(seg[:, i, j], want, rtol=0, atol=1e-14)


def test_short_segments_stay_exact_after_long_prefixes():
    g = -1000 - torch.rand(1000, 1, generator=torch.Generator().manual_seed(0))  # prefix sums reach -1e6
    seg = segsum(g)
    one_step = seg.diagonal(-1, 0, 1)[0]  # seg[i, i - 1] = g_i, a sum of one term
    assert torch.equal(one_step, g[1:, 0])
    naive = g.cumsum(0)[1:, 0] - g.cumsum(0)[:-1, 0]  # the difference of prefix sums loses the low bits
    assert (naive - g[1:, 0]).abs().max() > 1e-3


def test_decayed_products_with_one_decay_or_one_per_channel():
    a, b = torch.randn(4, 3, dtype=torch.float64), torch.randn(5, 3, dtype=torch.float64)
    decay = torch.rand(4, 5, 3, dtype=torch.float64)
    want = torch.stack([torch.stack([(a[i] * b[j] * decay[i, j]).sum() for j in range(5)]) for i in range(4)])
    torch.testing.assert_close(decayed_products(a, b, decay), want)
    torch.testing.assert_close(decayed_products(a, b, decay[..., :1]), (a @ b.T) * decay[..., 0])


def test_suffix_sums_are_the_last_row_of_the_segment_sums():
    g = torch.randn(2, 7, 3, dtype=torch.float64)
    torch.testing.assert_close(suffix_sums(g), segsum(g)[:, -1], rtol=0, atol=1e-14)


def _reference(a, b, g, shift):
    """The products through the full ``T x T x D`` mask, row i - 1's mask for row i when shifted."""
    seg = segsum(g)
    if shift:
        seg = torch.cat([torch.full_like(seg[..., :1, :, :], float("-inf")), seg[..., :-1, :, :]], -3)
    return decayed_products(a, b, seg.exp())


@pytest.mark.parametrize("leaf", [1, 4])
@pytest.mark.parametrize("shift", [False, True])
@pytest.mark.parametrize("t", [1, 3, 4, 5, 17, 40])
def test_split_decayed_products_equal_the_full_mask(t, shift, leaf):
    gen = torch.Generator().manual_seed(t)
    a, b = (torch.randn(2, t, 5, generator=gen, dtype=torch.float64) for _ in range(2))
    g = -3 * torch.rand(2, t, 5, generator=gen, dtype=torch.float64)
    got = split_decayed_products(a, b, g, shift=shift, leaf=leaf)  # t = 17 padded to 32: 5 levels, or 3 and blocks of 4
    torch.testing.assert_close(got, _reference(a, b, g, shift), rtol=0, atol=1e-13)


def test_split_decayed_products_stay_finite_under_strong_decays():
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randn(1, 32, 4, generator=gen) for _ in range(2))
    g = -200 * torch.rand(1, 32, 4, generator=gen)  # exp of a prefix sum would underflow, its inverse overflow
    got = split_decayed_products(a, b, g)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), _reference(a.double(), b.double(), g.double(), False), rtol=0,
                               atol=1e-5)
