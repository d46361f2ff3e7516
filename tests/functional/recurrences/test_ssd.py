"""Mamba-2's SSD is the attention form with the segment-sum decay mask, and the selective SSM's recurrence."""

import pytest
import torch
import torch.nn.functional as F

from attnkit.errors import ShapeError
from attnkit.functional.recurrences import FORMS, ssd

TOL = dict(rtol=0, atol=1e-10)


def _inputs(seed=0, b=2, h=4, groups=2, n=11, state=5, p=3):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)
    return r(b, h, n, p), F.softplus(r(b, h, n)), -torch.rand(h, generator=g, dtype=torch.float64), \
        r(b, groups, n, state), r(b, groups, n, state), r(h)


@pytest.mark.parametrize("form", FORMS)
def test_ssd_is_masked_attention_with_the_decay_products(form):
    x, dt, a, bb, cc, d = _inputs()
    b, h, n, _ = x.shape
    heads = lambda t: t.repeat_interleave(h // t.shape[1], 1)
    mask = torch.zeros(b, h, n, n, dtype=torch.float64)
    for i in range(n):
        for j in range(i + 1):  # L_ij = prod_{j < s <= i} exp(dt_s A)
            mask[:, :, i, j] = torch.exp(dt[:, :, j + 1 : i + 1] * a[:, None]).prod(-1)
    want = ((heads(cc) @ heads(bb).transpose(-1, -2)) * mask) @ (x * dt[..., None]) + x * d[:, None, None]
    y, _ = ssd(x, dt, a, bb, cc, D=d, form=form, chunk_size=4)
    torch.testing.assert_close(y, want, **TOL)


def test_the_state_continues_a_split_sequence():
    x, dt, a, bb, cc, d = _inputs(1)
    whole, final = ssd(x, dt, a, bb, cc, D=d)
    first, mid = ssd(x[:, :, :6], dt[:, :, :6], a, bb[:, :, :6], cc[:, :, :6], D=d)
    second, end = ssd(x[:, :, 6:], dt[:, :, 6:], a, bb[:, :, 6:], cc[:, :, 6:], D=d, initial_state=mid,
                      form="recurrent")
    torch.testing.assert_close(torch.cat([first, second], 2), whole, **TOL)
    torch.testing.assert_close(end, final, **TOL)


def test_groups_must_divide_heads():
    x, dt, a, bb, cc, _ = _inputs(h=3, groups=2)
    with pytest.raises(ShapeError, match="x must have shape"):
        ssd(x, dt, a, bb, cc)


def test_out_dtype_keeps_the_computations_precision():
    """``out_dtype``: the float32 result before its rounding to x's dtype (None rounds it, as before)."""
    x, dt, a, bb, cc, d = (t.float() for t in _inputs(2))
    xb, bb16, cc16 = (t.to(torch.bfloat16) for t in (x, bb, cc))
    kept, _ = ssd(xb, dt, a, bb16, cc16, D=d, out_dtype=torch.float32)
    rounded, _ = ssd(xb, dt, a, bb16, cc16, D=d)
    assert kept.dtype == torch.float32 and rounded.dtype == torch.bfloat16
    assert torch.equal(kept.to(torch.bfloat16), rounded)
    want, _ = ssd(*(t.double() for t in (xb, dt, a, bb16, cc16)), D=d.double())
    torch.testing.assert_close(kept.double(), want, rtol=0, atol=1e-5)
