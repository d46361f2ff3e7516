"""Path ``fixed-blocks``: ``causal() & fixed(b, c)`` and ``fixed(b, c)`` as blocks plus summary keys, merged by lse.

The oracle is written here: the fixed pattern from its definition (Child et al. 2019, Sec. 4.2) by index
arithmetic, and a dense masked softmax in float64 differentiated by autograd; it shares no code with the path.
"""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit import masks
from attnkit.functional.validate import validate
from attnkit.kernels import fixed_blocks, paths, pipeline, rules
from tests.helpers import rand_qkv

BLOCK, SUMMARY = 64, 8
MASK = masks.causal() & masks.fixed(BLOCK, SUMMARY)


def _allowed(length: int, block: int, summary: int, causal: bool = True) -> torch.Tensor:
    """``(L, L)`` bool: key j in i's block or among the last ``summary`` of its block, and (causal) j <= i."""
    i, j = torch.arange(length)[:, None], torch.arange(length)[None, :]
    return ((j <= i) | (not causal)) & ((i // block == j // block) | (j % block >= block - summary))


def _oracle(q, k, v, block=BLOCK, summary=SUMMARY, dout=None, scale=None, causal=True):
    """Output, lse and (with ``dout``) dq, dk, dv of float64 dense masked softmax attention."""
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    groups = q.shape[1] // k.shape[1]
    kr, vr = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    s = (q @ kr.transpose(-1, -2)) * (q.shape[-1] ** -0.5 if scale is None else scale)
    s = s.masked_fill(~_allowed(q.shape[2], block, summary, causal), float("-inf"))
    out = torch.softmax(s, -1) @ vr
    lse = torch.logsumexp(s, -1)
    grads = torch.autograd.grad(out, (q, k, v), dout.double()) if dout is not None else None
    return out.detach(), lse.detach(), grads


def _run(q, k, v, mask=MASK, **kw):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = attnkit.attention(q, k, v, mask=mask, **kw)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(11), dtype=out.dtype)
    return out, torch.autograd.grad(out, (q, k, v), dout), dout


@pytest.fixture
def ran(monkeypatch):
    """The problems the path ran (its ``run`` wrapped)."""
    seen = []
    run = fixed_blocks.run
    monkeypatch.setattr(fixed_blocks, "run", lambda p: seen.append(p) or run(p))
    return seen


@pytest.mark.parametrize("length", [128, 200, 256, 257, 300])  # whole blocks, a partial last one
@pytest.mark.parametrize("hkv", [4, 2, 1])
def test_equals_the_float64_oracle_forward_and_backward(ran, length, hkv):
    q, k, v = rand_qkv(2, 4, length, length, 16, hkv=hkv, dtype=torch.float64, seed=length + hkv)
    out, grads, dout = _run(q, k, v)
    want, _, want_grads = _oracle(q, k, v, dout=dout)
    assert ran, "the path did not run"
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-12)
    for what, got, exp in zip("qkv", grads, want_grads, strict=True):
        torch.testing.assert_close(got, exp, rtol=1e-10, atol=1e-12, msg=f"d{what}")


def test_float32_within_the_tolerance_of_float32_kernels(ran):
    q, k, v = rand_qkv(1, 4, 333, 333, 32, hkv=2, seed=2)
    out, grads, dout = _run(q, k, v)
    want, _, want_grads = _oracle(q, k, v, dout=dout)
    assert ran
    torch.testing.assert_close(out.double(), want, rtol=0, atol=2e-6)
    for got, exp in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(got.double(), exp, rtol=0, atol=2e-5)


def test_lse_without_autograd_equals_the_oracle(ran):
    q, k, v = rand_qkv(2, 3, 250, 250, 8, dtype=torch.float64, seed=4)
    got = attnkit.attention(q, k, v, mask=MASK, return_lse=True)
    want, lse, _ = _oracle(q, k, v)
    assert ran
    torch.testing.assert_close(got.output, want, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(got.lse, lse, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("length", [64, 150, 300])
def test_reduces_to_dense_causal_attention(ran, length):
    """Summaries as long as the block (every earlier key), or one block holding every query: plain causal."""
    q, k, v = rand_qkv(1, 2, length, length, 16, dtype=torch.float64, seed=length)
    mask = masks.fixed(BLOCK, BLOCK) & masks.causal() if length > BLOCK else masks.causal() & masks.fixed(512, 32)
    out, grads, _ = _run(q, k, v, mask=mask, backend="blocksparse")  # auto: SDPA, as dense as causal
    want, want_grads = _run(q, k, v, mask=masks.causal())[:2]
    assert len(ran) == 1
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-12)
    for got, exp in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(got, exp, rtol=1e-10, atol=1e-12)


def test_the_mask_says_it_is_the_fixed_pattern_as_data():
    assert MASK.causal_fixed == (BLOCK, SUMMARY)
    assert (masks.fixed(128, 4) & masks.causal(align="top_left")).causal_fixed == (128, 4)
    assert masks.fixed(64, 8).causal_fixed is None and masks.causal().causal_fixed is None
    assert (MASK & masks.padding([10])).causal_fixed is None  # three parts: the gathered paths
    assert (masks.causal() | masks.fixed(64, 8)).causal_fixed is None
    assert masks.parse(MASK.text).causal_fixed == (BLOCK, SUMMARY)


def test_explain_names_the_path_its_density_and_its_cost():
    q, k, v = rand_qkv(1, 8, 4096, 4096, 64, seed=0)
    mask = masks.causal() & masks.fixed(512, 32)
    decision = attnkit.explain(q, k, v, mask=mask)
    assert decision.path == "fixed-blocks" and decision.backend == "blocksparse"
    pairs = 8 * (8 * 512 * 512 + 32 * 512 * 8 * 7 // 2)  # in-block squares (as torch's kernel computes) + summaries
    assert decision.cost.scores == pairs
    assert decision.block_density == pytest.approx(pairs / 8 / 4096**2)
    assert decision.flops == pytest.approx(2 * pairs * 128)
    assert "summary keys" in decision.reasons["fixed-blocks"]
    assert decision.reasons["blocksparse-fused"].startswith("able, not preferred")


@pytest.mark.parametrize(("mask", "lq", "lk", "why"), [
    (masks.causal() & masks.fixed(4, 1), 200, 200, "blocks of at least"),
    (masks.causal() & masks.fixed(64, 8), 100, 200, "Lq == Lk"),
    (masks.causal() & masks.fixed(64, 8) & masks.padding([150, 200]), 200, 200, "fixed pattern"),
    (masks.fixed(64, 8) & masks.padding([150, 200]), 200, 200, "key padding included"),
    (masks.fixed(4, 1), 200, 200, "blocks of at least"),
    (masks.fixed(64, 8), 100, 200, "Lq == Lk"),
])
def test_other_masks_are_refused_and_served_exactly_by_the_other_paths(ran, mask, lq, lk, why):
    q, k, v = rand_qkv(2, 2, lq, lk, 8, dtype=torch.float64, seed=6)
    decision = attnkit.explain(q, k, v, mask=mask)
    assert decision.reasons["fixed-blocks"].startswith("refused") and why in decision.reasons["fixed-blocks"]
    assert decision.path != "fixed-blocks"
    got = attnkit.attention(q, k, v, mask=mask)
    torch.testing.assert_close(got, attnkit.attention(q, k, v, mask=mask, backend="reference"))
    assert not ran


@pytest.mark.parametrize("kwargs", [dict(dropout_p=0.1), dict(score="cosine"), dict(bias=torch.zeros(128, 128))],
                         ids=["dropout", "cosine", "bias"])
def test_refuses_what_the_fused_kernel_cannot_compute(kwargs):
    q, k, v = rand_qkv(1, 3, 128, 128, 8, seed=1)
    assert validate(q, k, v, mask=MASK, **kwargs)  # a valid call
    assert paths.BY_NAME["fixed-blocks"].refusal(validate(q, k, v, mask=MASK, **kwargs)) is not None


def test_refuses_an_lse_under_autograd():
    q, k, v = rand_qkv(1, 3, 128, 128, 8, seed=1, requires_grad=True)
    assert rules.lse_without_grad in fixed_blocks.REFUSALS
    assert attnkit.explain(q, k, v, mask=MASK, return_lse=True).path != "fixed-blocks"


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("where", ["q", "k allowed", "k masked", "v masked"])
def test_non_finite_inputs_leave_the_path_and_keep_the_contract(ran, value, where):
    """docs/RELIABILITY.md rows 21-22: a NaN/inf reaches the rows that attend it, never a row that masks it."""
    q, k, v = rand_qkv(1, 2, 200, 200, 8, dtype=torch.float64, seed=3)
    row = {"q": (q, 150), "k allowed": (k, 63), "k masked": (k, 100), "v masked": (v, 100)}[where]
    row[0][0, 1, row[1], 0] = value  # key 63 is a summary key (every later row sees it); key 100 is not
    got = attnkit.attention(q, k, v, mask=MASK)
    want = attnkit.attention(q, k, v, mask=MASK, backend="reference")
    assert not ran  # torch's kernel zeroes NaN rows: the exact paths run
    torch.testing.assert_close(got, want, equal_nan=True)
    touched = ~torch.isfinite(got).all(-1)[0, 1]  # rows of head 1 with a non-finite output
    allowed = _allowed(200, BLOCK, SUMMARY)
    if where == "k masked":  # key 100 is seen by the rows 100..127 of its block only (a masked V: row 22 says
        # NaN may propagate, on every path alike; the comparison above holds it to the reference)
        assert not bool(touched[~allowed[:, 100]].any())
    elif where != "v masked" and value != value:  # NaN: every row attending it (an inf score may leave it finite)
        want_touched = torch.arange(200) == 150 if where == "q" else allowed[:, 63]
        assert bool((touched == want_touched).all())


def test_the_path_is_a_cpu_row_of_the_block_sparse_backend_before_the_gathered_ones():
    row = paths.BY_NAME["fixed-blocks"]
    assert row.backend == "blocksparse" and row.devices == ("cpu",)
    order = [p.name for p in paths.of_backend("blocksparse")]
    assert order.index("fixed-blocks") < order.index("blocksparse-fused")


def test_in_units_of_heads_gives_one_threads_bits_and_the_oracle(ran, monkeypatch):
    """Two torch threads: each run of heads on its own thread (kernels/pipeline.py, Units), the same bits."""
    monkeypatch.setattr(pipeline, "UNIT_WORK", 0)  # these small calls in units too
    counts, real = [], pipeline.Units
    monkeypatch.setattr(fixed_blocks, "Units", lambda count: counts.append(count) or real(count))
    q, k, v = rand_qkv(2, 4, 200, 200, 16, hkv=2, dtype=torch.float64, seed=8)
    before, runs = torch.get_num_threads(), []
    try:
        for threads in (2, 1):
            torch.set_num_threads(threads)
            out, grads, dout = _run(q, k, v)
            runs.append([out, *grads])
    finally:
        torch.set_num_threads(before)
    assert counts == [4, 4, 1, 1]  # forward and backward in four runs of heads on two threads, one on one
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a, b)
    want, _, want_grads = _oracle(q, k, v, dout=dout)
    for got, exp in zip(runs[0], (want, *want_grads), strict=True):
        torch.testing.assert_close(got, exp, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "not causal"])
@pytest.mark.parametrize("shape", [(3,), (2, 3, 1), (2, 3, 200)], ids=["head", "sample", "token"])
def test_sinks_join_the_merged_pair_exactly(ran, shape, causal):
    """A sink is one more column of each row's softmax, its weight dropped (gpt-oss): written out here."""
    q, k, v = rand_qkv(2, 3, 200, 200, 8, hkv=1, dtype=torch.float64, seed=9)
    summary = SUMMARY if causal else 3
    mask = MASK if causal else masks.fixed(BLOCK, summary)
    s = torch.randn(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).requires_grad_()
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = attnkit.attention(*leaves, mask=mask, sinks=s)
    assert ran
    dout = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(2))
    got = torch.autograd.grad(out, [*leaves, s], dout)
    q64, k64, v64 = (t.detach().clone().requires_grad_() for t in (q, k, v))
    s64 = s.detach().clone().requires_grad_()
    scores = (q64 @ k64.transpose(-1, -2)) * 8 ** -0.5
    scores = scores.masked_fill(~_allowed(200, BLOCK, summary, causal), float("-inf"))
    sink = (s64.view(1, 3, 1) if s64.dim() == 1 else s64.view(*s64.shape[:2], -1))[..., None]
    weights = torch.softmax(torch.cat([scores, sink.expand(*scores.shape[:3], 1)], -1), -1)[..., :-1]
    want_out = weights @ v64
    want = torch.autograd.grad(want_out, [q64, k64, v64, s64], dout)
    torch.testing.assert_close(out, want_out, rtol=1e-10, atol=1e-12)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(("block", "summary", "length"), [(1, 1, 7), (4, 2, 1), (4, 2, 3), (4, 4, 13), (5, 1, 23),
                                                          (8, 3, 40), (16, 7, 33)])
def test_small_blocks_any_length_equal_the_oracle_when_allowed(ran, monkeypatch, block, summary, length):
    """The decomposition at sizes the planner leaves to the gathered paths (rules.FIXED_MIN_BLOCK lowered):
    one-position blocks, a single partial block, summaries as long as the block, many blocks."""
    monkeypatch.setattr(rules, "FIXED_MIN_BLOCK", 1)
    q, k, v = rand_qkv(2, 4, length, length, 6, hkv=2, dtype=torch.float64, seed=block * 100 + length)
    out, grads, dout = _run(q, k, v, mask=masks.causal() & masks.fixed(block, summary), backend="blocksparse")
    want, _, want_grads = _oracle(q, k, v, block, summary, dout=dout)
    assert ran
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-12)
    for got, exp in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(got, exp, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("scale", [0.0, -0.5])
def test_a_scale_not_positive_is_refused_and_served_exactly(ran, scale):
    """torch's kernel with ``is_causal`` and a scale ``<= 0`` returns NaN for finite inputs (torch 2.13 CPU; the
    in-block call is causal): the path refused it and answered NaN; docs/RELIABILITY.md row 25 (0: the uniform
    average of the allowed keys, negative: exact) is the oracle's."""
    q, k, v = rand_qkv(1, 2, 100, 100, 8, dtype=torch.float64, seed=12)
    assert "scale" in attnkit.explain(q, k, v, mask=MASK, scale=scale).reasons["fixed-blocks"]
    got = attnkit.attention(q, k, v, mask=MASK, scale=scale)
    want = _oracle(q, k, v, scale=scale)[0]
    assert not ran
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


# ------------------------------------------------------------------ fixed(b, c) without causal()
@pytest.mark.parametrize("length", [128, 200, 257, 300])  # whole blocks, partial last ones (plain keys only, some)
@pytest.mark.parametrize("hkv", [4, 1])
@pytest.mark.parametrize("summary", [1, 8])
def test_not_causal_equals_the_float64_oracle_forward_and_backward(ran, length, hkv, summary):
    q, k, v = rand_qkv(2, 4, length, length, 16, hkv=hkv, dtype=torch.float64, seed=length + hkv + summary)
    out, grads, dout = _run(q, k, v, mask=masks.fixed(BLOCK, summary))
    want, _, want_grads = _oracle(q, k, v, BLOCK, summary, dout=dout, causal=False)
    assert ran, "the path did not run"
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-12)
    for what, got, exp in zip("qkv", grads, want_grads, strict=True):
        torch.testing.assert_close(got, exp, rtol=1e-10, atol=1e-12, msg=f"d{what}")


def test_not_causal_float32_and_the_lse_without_autograd(ran):
    q, k, v = rand_qkv(1, 4, 333, 333, 32, hkv=2, seed=5)
    out, grads, dout = _run(q, k, v, mask=masks.fixed(BLOCK, 3))
    want, _, want_grads = _oracle(q, k, v, BLOCK, 3, dout=dout, causal=False)
    torch.testing.assert_close(out.double(), want, rtol=0, atol=2e-6)
    for got, exp in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(got.double(), exp, rtol=0, atol=2e-5)
    q, k, v = (t.double() for t in (q, k, v))
    got = attnkit.attention(q, k, v, mask=masks.fixed(BLOCK, 3), return_lse=True)
    want, lse, _ = _oracle(q, k, v, BLOCK, 3, causal=False)
    assert len(ran) == 2
    torch.testing.assert_close(got.output, want, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(got.lse, lse, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(("block", "length"), [(512, 300), (512, 512), (64, 200)])
def test_not_causal_reduces_to_dense_attention(ran, block, length):
    """One block holding every query (``b >= L``), or summaries as long as the block: every key, no mask."""
    q, k, v = rand_qkv(1, 2, length, length, 16, hkv=1, dtype=torch.float64, seed=length)
    summary = 32 if block > length or length == 512 else block
    out, grads, _ = _run(q, k, v, mask=masks.fixed(block, summary), backend="blocksparse")  # auto: SDPA, as dense
    want, want_grads = _run(q, k, v, mask=None)[:2]
    assert len(ran) == 1
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-12)
    for got, exp in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(got, exp, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(("block", "summary", "length"), [(1, 1, 7), (4, 2, 1), (4, 2, 3), (4, 3, 6), (4, 4, 13),
                                                          (5, 1, 23), (8, 3, 40), (16, 7, 33), (16, 1, 47)])
def test_not_causal_small_blocks_any_length_equal_the_oracle_when_allowed(ran, monkeypatch, block, summary, length):
    """The non-causal split at sizes the planner leaves to the gathered paths (rules.FIXED_MIN_BLOCK lowered):
    a partial block of plain keys only, or of plain and summary keys; every key a summary; one-position blocks."""
    monkeypatch.setattr(rules, "FIXED_MIN_BLOCK", 1)
    q, k, v = rand_qkv(2, 4, length, length, 6, hkv=2, dtype=torch.float64, seed=block * 100 + length)
    out, grads, dout = _run(q, k, v, mask=masks.fixed(block, summary), backend="blocksparse")
    want, _, want_grads = _oracle(q, k, v, block, summary, dout=dout, causal=False)
    assert ran
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-12)
    for got, exp in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(got, exp, rtol=1e-10, atol=1e-12)


def test_not_causal_explain_names_the_path_its_density_and_its_cost():
    """The long tour's block-sparse mechanism: ``fixed(64, 1)`` at L = 2048, every key block holding a summary key."""
    q, k, v = rand_qkv(1, 8, 2048, 2048, 64, seed=0)
    decision = attnkit.explain(q, k, v, mask=masks.fixed(64, 1))
    assert decision.path == "fixed-blocks" and decision.backend == "blocksparse"
    pairs = 8 * (2048 * 63 + 2048 * 32)  # each row: its block's 63 plain keys and all 32 summary keys
    assert decision.cost.scores == pairs
    assert decision.block_density == pytest.approx(pairs / 8 / 2048**2)
    assert decision.flops == pytest.approx(2 * pairs * 128)
    assert "63 plain keys" in decision.reasons["fixed-blocks"]
    assert "summary keys" in decision.reasons["fixed-blocks"]


def test_the_rule_reads_both_forms_of_the_pattern_as_data():
    def terms(mask):
        q, k, v = rand_qkv(1, 1, 16, 16, 4)
        return rules.fixed_terms(validate(q, k, v, mask=mask))
    assert terms(masks.fixed(64, 8)) == (64, 8, False)
    assert terms(masks.parse(masks.fixed(64, 8).text)) == (64, 8, False)
    assert terms(MASK) == (BLOCK, SUMMARY, True)
    assert terms(~masks.fixed(64, 8)) is None and terms(masks.fixed(64, 8) & masks.padding([3])) is None
    assert terms(masks.fixed(64, 8) | masks.causal()) is None and terms(None) is None


@pytest.mark.parametrize("scale", [0.0, -0.5])
def test_not_causal_a_scale_not_positive_runs_exactly(ran, scale):
    """No ``is_causal`` call here: torch's kernel is exact with a scale ``<= 0`` (docs/RELIABILITY.md row 25)."""
    q, k, v = rand_qkv(1, 2, 100, 100, 8, dtype=torch.float64, seed=12)
    got = attnkit.attention(q, k, v, mask=masks.fixed(16, 2), scale=scale)
    assert ran
    torch.testing.assert_close(got, _oracle(q, k, v, 16, 2, scale=scale, causal=False)[0], rtol=1e-10, atol=1e-12)


def test_not_causal_in_units_of_heads_gives_one_threads_bits(ran, monkeypatch):
    """Two torch threads: each run of heads on its own thread (kernels/pipeline.py, Units), the same bits."""
    monkeypatch.setattr(pipeline, "UNIT_WORK", 0)
    q, k, v = rand_qkv(2, 4, 200, 200, 16, hkv=2, dtype=torch.float64, seed=8)
    before, runs = torch.get_num_threads(), []
    try:
        for threads in (2, 1):
            torch.set_num_threads(threads)
            out, grads, dout = _run(q, k, v, mask=masks.fixed(BLOCK, 5))
            runs.append([out, *grads])
    finally:
        torch.set_num_threads(before)
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a, b)
    want, _, want_grads = _oracle(q, k, v, BLOCK, 5, dout=dout, causal=False)
    for got, exp in zip(runs[0], (want, *want_grads), strict=True):
        torch.testing.assert_close(got, exp, rtol=1e-10, atol=1e-12)
