"""Sigmoid attention, softpick and stick-breaking (functional/blockwise.py) on every path that runs them.

Each normaliser is checked against a float64 transcription of its paper's equation written here with
loops over the keys (no code shared with the library); the chunked path (key blocks, forward; row
slabs under autograd) and the gathered block-sparse path equal the dense reference in float64,
forward and backward, with small blocks so that every row spans several; masked keys never leak.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

import attnkit
from attnkit import masks
from attnkit.functional import blockwise
from attnkit.functional.normalize import NORMALIZERS
from attnkit.kernels import online_softmax
from tests.helpers import rand_qkv

NAMES = ("sigmoid", "sigmoid_log_n", "softpick", "stick_breaking")


def _paper(name, s, allowed):
    """One row of weights from the paper's equation, key by key (float64)."""
    n = len(s)
    keys = [j for j in range(n) if allowed[j]]
    w = [0.0] * n
    for j in keys:
        x = float(s[j])
        if name == "sigmoid":  # Ramapuram et al. 2024: sigmoid(s)
            w[j] = 1 / (1 + math.exp(-x))
        elif name == "sigmoid_log_n":  # ... with b = -log n
            w[j] = 1 / (1 + math.exp(-(x - math.log(n))))
        elif name == "softpick":  # Zuhri et al. 2025: ReLU(e^x - 1) / (sum |e^x - 1| + eps)
            w[j] = max(math.exp(x) - 1, 0.0) / (sum(abs(math.exp(float(s[i])) - 1) for i in keys) + 1e-8)
        else:  # Tan et al. 2024: beta_j prod over the later allowed keys of (1 - beta_l)
            beta = lambda i: 1 / (1 + math.exp(-float(s[i])))
            w[j] = beta(j) * math.prod(1 - beta(i) for i in keys if i > j)
    return w


@pytest.mark.parametrize("name", NAMES)
def test_each_normaliser_is_its_papers_equation_in_float64(name):
    g = torch.Generator().manual_seed(1)
    scores = 3 * torch.randn(3, 5, 7, generator=g, dtype=torch.float64)
    allowed = torch.rand(3, 5, 7, generator=g) < 0.7
    allowed[0, 0] = False  # a row with no key
    got = NORMALIZERS[name](scores, allowed)
    for a, b in itertools.product(range(3), range(5)):
        want = torch.tensor(_paper(name, scores[a, b], allowed[a, b]), dtype=torch.float64)
        torch.testing.assert_close(got[a, b], want, rtol=1e-13, atol=1e-15)
    assert not got[0, 0].any() and not got[~allowed].any()


def test_sigmoid_log_n_is_sigmoid_with_the_papers_bias():
    q, k, v = rand_qkv(2, 3, 5, 7, 11, dtype=torch.float64)
    bias = torch.full((7,), -math.log(7), dtype=torch.float64)
    got = attnkit.attention(q, k, v, normalize="sigmoid_log_n")
    torch.testing.assert_close(got, attnkit.attention(q, k, v, normalize="sigmoid", bias=bias), rtol=0, atol=1e-14)


def test_stick_breaking_weights_sum_to_at_most_one_and_the_last_key_breaks_first():
    g = torch.Generator().manual_seed(2)
    s = torch.randn(4, 9, generator=g, dtype=torch.float64)
    w = blockwise.stick_breaking(s)
    assert (w.sum(-1) <= 1).all() and (w >= 0).all()
    torch.testing.assert_close(w[:, -1], torch.sigmoid(s[:, -1]))
    rest = torch.prod(1 - torch.sigmoid(s), -1)  # what no key took
    torch.testing.assert_close(w.sum(-1) + rest, torch.ones(4, dtype=torch.float64))


def test_softpick_gives_exact_zeros_to_non_positive_scores_and_survives_large_ones():
    s = torch.tensor([[-2.0, 0.0, 1.0, 3.0], [-1e4, -3.0, -1.0, -0.5], [200.0, 199.0, -5.0, 0.1]],
                     dtype=torch.float64)
    w = blockwise.softpick(s)
    assert torch.equal(w[0, :2], torch.zeros(2, dtype=torch.float64)) and not w[1].any()
    assert torch.isfinite(w).all() and w[2, 0] > w[2, 1] > 0 and (w.sum(-1) <= 1).all()


MASKS = {"none": None, "causal": masks.causal(), "window": masks.sliding_window(9, 4),
         "strided": masks.causal() & masks.strided(13), "padding": masks.padding([70, 41])}


@pytest.fixture
def small_blocks(monkeypatch):
    """Key blocks of 16 keys, slabs of 8 rows: every row of a chunked call spans several blocks."""
    monkeypatch.setattr(online_softmax, "KV_BLOCK", 16)
    monkeypatch.setattr(online_softmax, "ROWS", 8)
    monkeypatch.setattr(online_softmax, "BUDGET", 256)


def _grads(out, inputs, seed=0):
    probe = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype)
    return torch.autograd.grad((out * probe).sum(), inputs)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("mask", list(MASKS))
def test_chunked_equals_the_dense_reference_forward_and_backward(name, mask, small_blocks):
    q, k, v = rand_qkv(2, 3, 60, 70, 8, 5, hkv=1, dtype=torch.float64, seed=3, requires_grad=True)
    kwargs = dict(normalize=name, mask=MASKS[mask], scale=1.3)
    assert attnkit.explain(q, k, v, backend="chunked", **kwargs).path == "online-softmax"
    want = attnkit.attention(q, k, v, backend="reference", **kwargs)
    with torch.no_grad():  # key blocks of 16, in reverse order for stick-breaking
        torch.testing.assert_close(attnkit.attention(q, k, v, backend="chunked", **kwargs), want.detach(),
                                   rtol=0, atol=1e-13)
    got = attnkit.attention(q, k, v, backend="chunked", **kwargs)  # checkpointed slabs of rows
    torch.testing.assert_close(got, want, rtol=0, atol=1e-13)
    for g, w in zip(_grads(got, [q, k, v]), _grads(want, [q, k, v]), strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("mask", ["causal", "strided", "padding"])
def test_gathered_block_sparse_equals_the_dense_reference_forward_and_backward(name, mask):
    q, k, v = rand_qkv(2, 3, 300, 300, 8, dtype=torch.float64, seed=4, requires_grad=True)
    kwargs = dict(normalize=name, mask=MASKS[mask] if mask != "padding" else masks.padding([300, 171]))
    assert attnkit.explain(q, k, v, backend="blocksparse", **kwargs).path == "blocksparse-gathered"
    got = attnkit.attention(q, k, v, backend="blocksparse", **kwargs)
    want = attnkit.attention(q, k, v, backend="reference", **kwargs)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-13)
    for g, w in zip(_grads(got, [q, k, v]), _grads(want, [q, k, v]), strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("backend", ["reference", "chunked", "blocksparse"])
def test_nan_in_a_masked_key_reaches_no_earlier_query(name, backend, small_blocks):
    q, k, v = rand_qkv(1, 2, 50, 50, 8, dtype=torch.float64, seed=5, requires_grad=True)
    k_bad = k.detach().clone()
    k_bad[:, :, 40] = float("nan")  # seen by queries 40.. only, under the causal mask
    k_bad.requires_grad_()
    out = attnkit.attention(q, k_bad, v, normalize=name, mask=masks.causal(), backend=backend)
    assert torch.isfinite(out[:, :, :40]).all() and torch.isnan(out[:, :, 40:]).all()


def test_long_calls_take_the_chunked_path():
    q = torch.zeros(()).expand(1, 4, 16384, 64)
    for name in NAMES:
        assert attnkit.explain(q, q, q, normalize=name, read_data=False).path == "online-softmax"
        assert attnkit.explain(q, q, q, normalize=name, mask=masks.causal()).path == "online-softmax"
