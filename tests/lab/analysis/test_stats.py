"""attnkit.lab.analysis.stats against hand float64 computations and known cases."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnkit.core import attention
from attnkit.errors import ArgumentError, DTypeError, ShapeError
from attnkit.lab.analysis.recorder import AttentionRecorder
from attnkit.lab.analysis.stats import (
    Summary,
    attention_distance,
    entropy,
    head_agreement,
    sparsity,
    summary,
    top_positions,
)
from tests.helpers import rand_qkv

B, H, LQ, LK = 2, 3, 5, 7


def _maps(seed=0, dtype=torch.float64, zero_rows=True):
    """Softmax maps (B, H, Lq, Lk) with a few masked keys and (optionally) some all-zero rows."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(B, H, LQ, LK, generator=g, dtype=torch.float64)
    keep = torch.rand(B, H, LQ, LK, generator=g) > 0.3
    w = torch.where(keep, scores.exp(), torch.zeros_like(scores))
    w = w / w.sum(-1, keepdim=True).clamp(min=1e-300)
    if zero_rows:
        w[0, 1, 2] = 0.0
        w[1, 2, 4] = 0.0
    return w.to(dtype)


def _live_rows(w):
    """Yield (b, h, [rows as python lists normalised to sum 1]) skipping all-zero rows."""
    for b in range(w.shape[0]):
        for h in range(w.shape[1]):
            rows = []
            for i in range(w.shape[2]):
                row = [float(x) for x in w[b, h, i]]
                total = sum(row)
                if total > 0:
                    rows.append([x / total for x in row])
            yield b, h, rows


def test_entropy_matches_a_hand_loop_and_ignores_zero_rows():
    w = _maps()
    got = entropy(w)
    assert got.shape == (B, H) and got.dtype == torch.float64
    for b, h, rows in _live_rows(w):
        want = sum(-sum(p * math.log(p) for p in row if p > 0) for row in rows) / len(rows)
        assert got[b, h].item() == pytest.approx(want, abs=1e-12)


def test_entropy_known_cases():
    one_hot = torch.nn.functional.one_hot(torch.tensor([[3, 0, 6, 2, 2]]), LK).double()  # (1, Lq, Lk)
    assert entropy(one_hot).item() == 0.0
    uniform = torch.full((H, LQ, LK), 1.0 / LK, dtype=torch.float64)
    torch.testing.assert_close(entropy(uniform), torch.full((H,), math.log(LK), dtype=torch.float64),
                               rtol=0, atol=1e-14)
    causal = torch.tril(torch.ones(LQ, LQ, dtype=torch.float64))
    causal = causal / causal.sum(-1, keepdim=True)  # row i uniform over i + 1 keys
    want = sum(math.log(i + 1) for i in range(LQ)) / LQ
    assert entropy(causal).item() == pytest.approx(want, abs=1e-14)


def test_rows_are_normalised_first_and_an_all_zero_head_is_nan():
    w = _maps(zero_rows=False)
    scaled = w * torch.linspace(0.5, 3.0, LQ, dtype=torch.float64)[:, None]  # unnormalised (sigmoid-like) rows
    for fn in (entropy, attention_distance, sparsity):
        torch.testing.assert_close(fn(scaled), fn(w), rtol=0, atol=1e-12)
    w[1, 0] = 0.0
    for fn in (entropy, attention_distance, sparsity):
        out = fn(w)
        assert torch.isnan(out[1, 0]) and not torch.isnan(out[0]).any() and not torch.isnan(out[1, 1:]).any()


def test_float32_in_float32_out():
    w = _maps(dtype=torch.float32)
    for fn in (entropy, attention_distance, sparsity):
        out = fn(w)
        assert out.dtype == torch.float32 and out.shape == (B, H)
        torch.testing.assert_close(out.double(), fn(w.double()), rtol=1e-6, atol=1e-6)
    assert head_agreement(w).dtype == torch.float32


def test_attention_distance_matches_a_hand_loop():
    w = _maps()
    got = attention_distance(w)
    for b, h, rows in _live_rows(w):
        live = [i for i in range(LQ) if float(w[b, h, i].sum()) > 0]
        want = sum(sum(p * abs(i - j) for j, p in enumerate(row)) for i, row in zip(live, rows, strict=True))
        assert got[b, h].item() == pytest.approx(want / len(rows), abs=1e-12)


def test_attention_distance_known_cases_and_positions():
    assert attention_distance(torch.eye(LK, dtype=torch.float64)[None]).item() == 0.0  # diagonal map
    causal = torch.tril(torch.ones(LQ, LQ, dtype=torch.float64))
    causal = causal / causal.sum(-1, keepdim=True)  # row i: mean of |i - j| over j <= i is i / 2
    assert attention_distance(causal).item() == pytest.approx(sum(i / 2 for i in range(LQ)) / LQ, abs=1e-14)
    w = _maps()[0, 0]  # (Lq, Lk)
    qp, kp = torch.tensor([0.0, 2, 4, 6, 8]), torch.tensor([1.0, 3, 5, 7, 9, 11, 13])
    want = sum(float(w[i, j]) / float(w[i].sum()) * abs(float(qp[i]) - float(kp[j]))
               for i in range(LQ) for j in range(LK) if float(w[i].sum()) > 0) / LQ
    assert attention_distance(w, q_positions=qp, k_positions=kp).item() == pytest.approx(want, abs=1e-12)
    with pytest.raises(ShapeError, match="k_positions"):
        attention_distance(w, k_positions=torch.arange(LQ))


def test_sparsity_matches_a_hand_count():
    w = _maps()
    for eps in (0.0, 0.05):
        got = sparsity(w, eps=eps)
        for b, h, rows in _live_rows(w):
            want = sum(sum(p <= eps for p in row) / LK for row in rows) / len(rows)
            assert got[b, h].item() == pytest.approx(want, abs=1e-12)
    one_hot = torch.nn.functional.one_hot(torch.tensor([1, 4, 0]), LK).double()
    assert sparsity(one_hot).item() == pytest.approx((LK - 1) / LK, abs=1e-15)
    assert sparsity(torch.full((LQ, LK), 1.0 / LK)).item() == 0.0
    with pytest.raises(ArgumentError, match="eps"):
        sparsity(w, eps=-1.0)


def test_top_positions_match_sorting_by_hand():
    w = _maps(zero_rows=False)
    idx, val = top_positions(w, 3)
    assert idx.shape == val.shape == (B, H, LQ, 3)
    for b in range(B):
        for h in range(H):
            for i in range(LQ):
                order = sorted(range(LK), key=lambda j, r=w[b, h, i]: -float(r[j]))[:3]
                assert idx[b, h, i].tolist() == order
                assert val[b, h, i].tolist() == [float(w[b, h, i, j]) for j in order]
    with pytest.raises(ArgumentError, match="k=8"):
        top_positions(w, LK + 1)
    with pytest.raises(ArgumentError, match="k"):
        top_positions(w, 0)


def test_head_agreement_is_the_cosine_of_flattened_maps():
    w = _maps(zero_rows=False)
    got = head_agreement(w)
    assert got.shape == (B, H, H)
    for b in range(B):
        for g in range(H):
            for h in range(H):
                x, y = w[b, g].flatten().tolist(), w[b, h].flatten().tolist()
                dot = sum(a * c for a, c in zip(x, y, strict=True))
                want = dot / math.sqrt(sum(a * a for a in x) * sum(c * c for c in y))
                assert got[b, g, h].item() == pytest.approx(want, abs=1e-12)


def test_head_agreement_known_cases():
    eye = torch.eye(4, dtype=torch.float64)
    shifted = torch.roll(eye, 1, dims=1)  # no (i, j) in common with eye
    maps = torch.stack([eye, 2 * eye, shifted, torch.zeros(4, 4, dtype=torch.float64)])
    got = head_agreement(maps)
    assert got[0, 1] == 1.0 and got[0, 2] == 0.0 and got[3, 0] == 0.0 and got[2, 3] == 0.0
    assert torch.equal(got.diagonal(), torch.ones(4, dtype=torch.float64))
    assert torch.equal(got, got.T)
    with pytest.raises(ShapeError, match="at least 3 dims"):
        head_agreement(eye)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 4), st.integers(1, 6), st.integers(0, 2**31 - 1))
def test_entropy_bounds_and_key_permutation_invariance(lq, lk, seed):
    g = torch.Generator().manual_seed(seed)
    w = torch.softmax(torch.randn(2, lq, lk, generator=g, dtype=torch.float64) * 3, -1)
    h = entropy(w)
    assert (h >= -1e-12).all() and (h <= math.log(lk) + 1e-12).all()
    perm = torch.randperm(lk, generator=g)
    torch.testing.assert_close(entropy(w[..., perm]), h, rtol=0, atol=1e-12)
    torch.testing.assert_close(sparsity(w[..., perm]), sparsity(w), rtol=0, atol=0)


def test_bad_inputs_are_named():
    with pytest.raises(DTypeError, match="floating-point"):
        entropy(torch.ones(3, 4, dtype=torch.long))
    with pytest.raises(ShapeError, match="at least 2 dims"):
        entropy(torch.ones(4))
    with pytest.raises(ArgumentError, match="non-negative"):
        entropy(torch.tensor([[0.5, -0.5, 1.0]]))
    with pytest.raises(DTypeError, match="mapping"):
        summary([torch.eye(3)])
    with pytest.raises(ShapeError, match="'x'"):
        summary({"x": torch.ones(1, 1, 3, 3)})


def test_summary_rows_equal_the_functions_and_print_as_markdown():
    w = _maps(zero_rows=False)[0]  # (H, Lq, Lk)
    rows = summary({"enc": w, "dec": torch.eye(LQ)}, eps=0.01)
    assert isinstance(rows, Summary) and [(r.name, r.head) for r in rows] == [("enc", 0), ("enc", 1), ("enc", 2),
                                                                              ("dec", 0)]
    for r in rows[:H]:
        assert r.entropy == pytest.approx(entropy(w)[r.head].item(), abs=1e-12)
        assert r.distance == pytest.approx(attention_distance(w)[r.head].item(), abs=1e-12)
        assert r.sparsity == pytest.approx(sparsity(w, eps=0.01)[r.head].item(), abs=1e-12)
    assert (rows[-1].entropy, rows[-1].distance) == (0.0, 0.0)
    lines = str(rows).splitlines()
    assert len(lines) == 2 + len(rows) and lines[0].startswith("| map | head | entropy") and "0.01" in lines[0]
    assert lines[-1] == "| dec | 0 | 0.0000 | 0.0000 | 0.8000 |"


def test_summary_of_a_recorder_uses_one_sample():
    q, k, v = rand_qkv(b=B, h=H, lq=LQ, lk=LK, d=11)
    with AttentionRecorder() as rec:
        weights = attention(q, k, v, return_weights=True).weights
    rows = summary(rec, sample=1)
    assert [(r.name, r.head) for r in rows] == [("attention", h) for h in range(H)]
    got = torch.tensor([r.entropy for r in rows], dtype=torch.float64)
    torch.testing.assert_close(got, entropy(weights[1]).double(), rtol=0, atol=1e-6)


def test_a_row_holding_nan_or_inf_makes_its_head_nan_instead_of_being_dropped():
    w = _maps(zero_rows=False)
    w[0, 1, 3, 2] = float("nan")
    w[1, 0, 0, 5] = float("inf")
    for fn in (entropy, attention_distance, sparsity):
        out = fn(w)
        assert torch.isnan(out[0, 1]) and torch.isnan(out[1, 0]), fn.__name__
        nan = torch.zeros(B, H, dtype=torch.bool)
        nan[0, 1] = nan[1, 0] = True
        assert not torch.isnan(out[~nan]).any(), fn.__name__
        torch.testing.assert_close(out[~nan], fn(_maps(zero_rows=False))[~nan], rtol=0, atol=0)
    rows = summary({"x": w[0]})
    assert math.isnan(rows[1].entropy) and not math.isnan(rows[0].entropy)


def test_fully_masked_queries_of_a_batched_attention_call_are_left_out():
    q, k, v = rand_qkv(b=B, h=H, lq=LQ, lk=LK, d=11)
    allowed = torch.rand(B, 1, LQ, LK, generator=torch.Generator().manual_seed(1)) > 0.4
    allowed[0, :, 1] = False  # query 1 of sample 0 sees no key: its row of weights is all zero
    w = attention(q, k, v, mask=allowed, return_weights=True).weights.double()
    assert torch.equal(w[0, :, 1], torch.zeros(H, LK, dtype=torch.float64))
    keep = [0, 2, 3, 4]
    torch.testing.assert_close(entropy(w)[0], entropy(w[0, :, keep]), rtol=0, atol=1e-12)
    kept = attention_distance(w[0, :, keep], q_positions=torch.tensor(keep))
    torch.testing.assert_close(attention_distance(w)[0], kept, rtol=0, atol=1e-12)
    torch.testing.assert_close(entropy(w)[1], entropy(w[1]), rtol=0, atol=0)  # batched = one sample at a time


def test_one_key_maps():
    w = torch.ones(H, LQ, 1, dtype=torch.float64)  # Lk = 1: every query puts all weight on key 0
    assert torch.equal(entropy(w), torch.zeros(H, dtype=torch.float64))
    assert torch.equal(sparsity(w), torch.zeros(H, dtype=torch.float64))
    torch.testing.assert_close(attention_distance(w), torch.full((H,), sum(range(LQ)) / LQ, dtype=torch.float64))
    assert top_positions(w, 1).indices.eq(0).all()
