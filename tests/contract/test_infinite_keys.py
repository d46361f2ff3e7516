"""RELIABILITY row 21 (and adversarial finding 39): rows whose allowed keys all score ``-inf`` from infinite q or k.

Such a row attends a non-finite input, so it is NaN (row 21), never the ``0`` that rows the *mask* empties
get (row 1); ``-inf`` keys among finite ones get weight 0 (the finite keys' softmax). Checked on every
public backend and on every CPU path of :data:`attnkit.kernels.paths.PATHS` that takes the call, against
:func:`oracle`, float64 and written here (no attnkit code).
"""

from __future__ import annotations

import math

import pytest
import torch

import attnkit
from attnkit import BackendError, masks
from attnkit.core import _prepare
from attnkit.kernels import dispatch, lane, paths, sdpa

INF = math.inf


def oracle(q, k, v, allowed):
    """softmax(q k^T / sqrt(D)) v over the allowed keys, float64, differentiable.

    No allowed key: 0 (masked_fill's backward stops that row's NaN). Allowed keys all ``-inf``: 0 / 0 = NaN
    on those keys; a masked key's weight is 0 in every row, so no NaN reaches its dv.
    """
    scores = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~allowed, -INF)
    weights = torch.softmax(scores, -1)  # NaN on rows of -inf only, masked keys included
    weights = torch.where(allowed, weights, torch.zeros_like(weights))  # a masked key has weight 0 (select)
    return weights @ v.double()


def problem(case, lq=10, lk=8):
    """q, k, v with ``q[..., 0] = 1`` and key ``j`` holding ``-inf`` in feature 0 for the keys the case poisons."""
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(2, 2, n, 6, generator=g) for n in (lq, lk, lk))
    q[..., 0] = 1.0
    if case == "one key":  # the review's call: Lq = 5, Lk = 1, k = +inf and q < 0 in that feature
        q, k, v = q[:, :, :5], k[:, :, :1], v[:, :, :1]
        q[..., 0], k[..., 0] = -1.0, INF
    elif case == "every key":
        k[..., 0] = -INF
    elif case == "some keys":  # keys 0-4 -inf: causal rows up to key 4 see only them, later rows a mix
        k[:, :, :5, 0] = -INF
    return q, k, v


MASKS = {  # dense twins of each mask for the oracle (bottom-right: the leading Lq - Lk rows have no key)
    "causal": (lambda: masks.causal("bottom_right"), lambda lq, lk: torch.ones(lq, lk).tril(lk - lq).bool()),
    "window": (lambda: masks.sliding_window(2, 0),
               lambda lq, lk: (lambda d: (d <= 0) & (d >= -2))(torch.arange(lk)[None] - torch.arange(lq)[:, None]
                                                               - (lk - lq))),
}
CASES = ["one key", "every key", "some keys", "finite"]


def _check(out, want):
    assert torch.equal(out.isnan(), want.isnan()), (out, want)
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("backend", ["auto", "reference", "chunked", "blocksparse", "sdpa"])
def test_backends_agree_with_the_oracle_forward_and_backward(backend, mask, case):
    q, k, v = problem(case)
    make, dense = MASKS[mask]
    allowed = dense(q.shape[2], k.shape[2])
    want = oracle(q, k, v, allowed)
    finite = all(t.isfinite().all() for t in (q, k, v))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    if backend == "sdpa" and not finite:
        with pytest.raises(BackendError, match="non-finite"):
            attnkit.attention(*leaves, mask=make(), backend=backend)
        return
    out = attnkit.attention(*leaves, mask=make(), backend=backend)
    _check(out, want)
    empty = ~allowed.any(-1)  # the mask's empty rows: 0, whatever the other rows hold (row 1)
    assert not out[:, :, empty].any()
    # Backward: the arithmetic of the infinite input, as the oracle's autograd gives it. dq is the oracle's,
    # NaN included: a NaN row's, and the infinite feature wherever a score's gradient 0 meets the infinite key
    # (0 * inf; a mask's empty row too, when the key is infinite and the mask is not key padding, row 22).
    # dk, dv: NaN wherever the oracle's are (the keys a NaN row allows); a NaN row's weights may also be NaN
    # on its masked keys (torch's softmax of a row of -inf), so NaN may reach more keys of its head: where a
    # path's dk, dv are finite they are the oracle's.
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
    (out * g).sum().backward()
    exact = [t.detach().double().requires_grad_() for t in (q, k, v)]
    (oracle(*exact, allowed) * g.double()).sum().backward()
    _check(leaves[0].grad, exact[0].grad)
    for got, ref in zip(leaves[1:], exact[1:], strict=True):
        assert got.grad[ref.grad.isnan()].isnan().all()
        kept = ~got.grad.isnan()
        torch.testing.assert_close(got.grad[kept].double(), ref.grad[kept], rtol=1e-5, atol=1e-5)
    if case == "finite":
        _check(leaves[1].grad, exact[1].grad)
        _check(leaves[2].grad, exact[2].grad)
    if finite:
        assert not leaves[0].grad[:, :, empty].any()


def _cpu_paths(p):
    """The CPU paths of the table that take ``p`` (their refusal reads the data, as the dispatcher's does)."""
    return [path for path in paths.PATHS if path.serves("cpu") and path.refusal(p, True) is None]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("mask", list(MASKS))
def test_every_cpu_path_that_takes_the_call_agrees_with_the_oracle(mask, case):
    q, k, v = problem(case)
    make, dense = MASKS[mask]
    want = oracle(q, k, v, dense(q.shape[2], k.shape[2]))
    ran = []
    for path in _cpu_paths(_prepare(q, k, v, mask=make())):
        try:
            result = path.module.run(_prepare(q, k, v, mask=make(), return_lse=True))
        except sdpa.UntrustedOutput:  # torch's kernel refuses its own output: the dispatcher decides again
            continue
        _check(result.out, want)
        if result.lse is not None:  # a NaN row's lse is -inf, the log of its empty sum, as a masked row's
            rows = want[..., 0].isnan() | ~dense(q.shape[2], k.shape[2]).any(-1)
            assert (result.lse[rows] == -INF).all() and result.lse[~rows].isfinite().all(), path.name
        ran.append(path.name)
    assert {"online-softmax", "dense-reference", "blocksparse-gathered"} <= set(ran)
    if mask == "window":
        assert "band-windows" in ran or q.shape[2] == 5


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("lq", [1, 8], ids=["decode", "prefill"])
def test_the_fast_lane_hands_such_rows_to_an_exact_path(lq, case):
    """Calls the lane takes (no empty row): torch's kernel answers a row of ``-inf`` scores with 0 and an lse of
    ``-inf``, which the lane's check refuses, so the exact path's NaN comes back."""
    q, k, v = problem(case, lq=8, lk=8)
    if case == "one key" and lq > 1:
        pytest.skip("one key: only a decoding step leaves no row empty")
    q = q[:, :, -lq:].contiguous()
    mask = masks.causal("bottom_right")
    assert lane.route(q, k, v, mask, None, "scaled_dot", None, "softmax", 0.0, False, False, "auto") is not None
    want = oracle(q, k, v, MASKS["causal"][1](lq, k.shape[2]))
    _check(attnkit.attention(q, k, v, mask=mask), want)


@pytest.mark.parametrize("poisoned", [0, 5, 128, 200, 299, 300])
@pytest.mark.parametrize("backend", ["auto", "reference", "chunked", "blocksparse"])
def test_split_kv_over_a_cache_merges_such_rows_as_the_oracle(backend, poisoned):
    """``paged-split-kv`` (auto, blocksparse) merges key chunks by their lse: a chunk whose keys all score
    ``-inf`` has weight 0 beside a finite chunk (the finite keys' softmax), and NaN rows stay NaN."""
    q, k, v = problem("finite", lq=4, lk=300)
    k[:, :, :poisoned, 0] = -INF
    want = oracle(q, k, v, MASKS["causal"][1](4, 300))
    call = dict(mask=masks.causal(), seqused_k=torch.tensor([300, 300]))
    if backend == "auto":
        assert dispatch.choose(_prepare(q, k, v, **call)).path.name == "paged-split-kv"
    _check(attnkit.attention(q, k, v, backend=backend, **call), want)


def test_the_paths_that_take_only_finite_inputs_are_not_reached():
    """torch's fused kernels without an output check (``blocksparse-fused``, ``fixed-blocks``, ``bias-slabs``,
    the ``sdpa`` backend itself) refuse non-finite inputs (``rules.finite_inputs``): the agreement above holds
    for them by construction."""
    q, k, v = problem("every key", lq=64, lk=64)
    for mask in (masks.causal() & masks.fixed(16, 2), masks.segments(torch.arange(64) // 16)):
        p = _prepare(q, k, v, mask=mask)
        for name in ("blocksparse-fused", "fixed-blocks", "bias-slabs"):
            assert paths.BY_NAME[name].refusal(p, True) is not None


@pytest.mark.parametrize("backend", ["reference", "chunked", "blocksparse"])
def test_a_bias_of_minus_infinity_still_empties_a_row_as_the_mask_does(backend):
    """Row 6 stands: with a bias (or a modifier, a custom score or sinks) ``-inf`` scores read as masking, so a
    row whose allowed scores are all ``-inf`` outputs 0, even where infinite keys made them so: a kernel cannot
    tell a ``-inf`` bias from a ``-inf`` product without another pass over the scores."""
    q, k, v = problem("every key")
    bias = torch.zeros(10, 8)
    out = attnkit.attention(q, k, v, bias=bias, mask=masks.causal("bottom_right"), backend=backend)
    assert torch.equal(out, torch.zeros_like(out))


def oracle_with_sink(q, k, v, allowed, sink):
    """softmax over the allowed keys and one more term ``sink`` that takes no value (gpt-oss), float64.

    The sink's term is in every row's sum, so a row whose allowed keys all score ``-inf`` outputs 0 (its
    weights are ``exp(-inf) / exp(s) = 0``); with ``s = -inf`` too, the empty sum gives 0, as row 51 states.
    """
    scores = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    scores = torch.cat([scores.masked_fill(~allowed, -INF), torch.full((*scores.shape[:-1], 1), sink)], -1)
    m = scores.amax(-1, keepdim=True)
    e = torch.exp(scores - m.masked_fill(m == -INF, 0))
    total = e.sum(-1, keepdim=True)
    return (e / total.masked_fill(total == 0, 1))[..., :-1] @ v.double()


@pytest.mark.parametrize("sink", [0.5, -INF])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("mask", list(MASKS))
def test_with_a_sink_such_rows_give_the_sinks_answer_on_every_path(mask, case, sink):
    """A sink is one more term of each row's softmax: beside it a row of ``-inf`` scores is exactly 0 (lse
    ``s``), on every CPU path that takes the call (those that join the sink after the call included) and backend."""
    q, k, v = problem(case)
    make, dense = MASKS[mask]
    sinks = torch.full((2,), sink)
    want = oracle_with_sink(q, k, v, dense(q.shape[2], k.shape[2]), sink)
    ran = []
    for path in _cpu_paths(_prepare(q, k, v, mask=make(), sinks=sinks)):
        try:
            result = path.module.run(_prepare(q, k, v, mask=make(), sinks=sinks, return_lse=True))
        except sdpa.UntrustedOutput:
            continue
        _check(result.out, want)
        ran.append(path.name)
    assert {"online-softmax", "dense-reference", "blocksparse-masked"} <= set(ran)
    for backend in ("auto", "reference", "chunked", "blocksparse"):
        _check(attnkit.attention(q, k, v, mask=make(), sinks=sinks, backend=backend), want)
