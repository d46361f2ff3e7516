"""The block-sparse kernel's fused path (kernels/blocksparse_fused.py): one torch fused-kernel call per slab.

Checked against the float64 reference on every layout family of the softmax
path's tests (partial last blocks, grouped queries, masks that read the batch or
head index, rows that see no key), outputs and gradients; lse without autograd;
the bias cache; and the refusals that send a call back to the hand-written path.
"""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit import masks
from attnkit.functional.validate import validate
from attnkit.kernels import block_plan, blocksparse_fused, blocksparse_masked, pipeline, rules
from tests.helpers import rand_qkv
from tests.kernels.test_perf_sparse import LAYOUT_MASKS, _spy


@pytest.fixture(autouse=True)
def _fixed_layouts_on_the_block_paths(monkeypatch):
    """The fixed pattern's layouts run here, not on the more specialised fixed-blocks path."""
    monkeypatch.setattr(rules, "FIXED_MIN_BLOCK", 1 << 30)


def _outputs_and_grads(q, k, v, mask, backend):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out = attnkit.attention(q, k, v, mask=mask, backend=backend)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(7), dtype=out.dtype)
    (out * g).sum().backward()
    return [out, q.grad, k.grad, v.grad]


@pytest.mark.parametrize("name", list(LAYOUT_MASKS))
@pytest.mark.parametrize("slab", [1 << 21, 1])  # one slab, or one query block per slab
def test_fused_path_equals_float64_reference_forward_and_backward(monkeypatch, name, slab):
    monkeypatch.setattr(block_plan, "BLOCK_SIZES", (16,))
    monkeypatch.setattr(block_plan, "SLAB", slab)
    calls, fallback = _spy(monkeypatch, blocksparse_fused), _spy(monkeypatch, blocksparse_masked)
    q, k, v = rand_qkv(2, 3, 100, 100, 11, hkv=1 if name == "fixed" else 3, dtype=torch.float64, seed=5)
    mask = LAYOUT_MASKS[name]()
    got = _outputs_and_grads(q, k, v, mask, "blocksparse")
    exp = _outputs_and_grads(q, k, v, mask, "reference")
    for what, a, b in zip(("out", "dq", "dk", "dv"), got, exp, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10, msg=what)
    assert calls and not fallback, "the fused path did not run"


@pytest.mark.parametrize(("lq", "lk"), [(37, 90), (90, 37)])
def test_fused_path_lse_and_rectangular_problems(monkeypatch, lq, lk):
    """Lq != Lk with partial last blocks; lse (no autograd) is -inf exactly for rows with no allowed key."""
    monkeypatch.setattr(block_plan, "BLOCK_SIZES", (8,))
    calls = _spy(monkeypatch, blocksparse_fused)
    q, k, v = rand_qkv(2, 3, lq, lk, 5, dtype=torch.float64, seed=lq)
    mask = masks.strided(6) & masks.causal()  # bottom-right: with Lq > Lk the first rows see no key
    got = attnkit.attention(q, k, v, mask=mask, backend="blocksparse", return_lse=True)
    exp = attnkit.attention(q, k, v, mask=mask, backend="reference", return_lse=True)
    torch.testing.assert_close(got.output, exp.output, rtol=1e-9, atol=1e-10)
    assert torch.equal(torch.isneginf(got.lse), torch.isneginf(exp.lse))
    torch.testing.assert_close(got.lse, exp.lse, rtol=1e-9, atol=1e-10)
    assert calls
    if lq > lk:
        assert torch.isneginf(got.lse[..., 0]).all() and not got.output[..., 0, :].any()


def test_fused_path_float32_within_the_tolerance_rule():
    q, k, v = rand_qkv(2, 3, 150, 150, 16, seed=4)
    mask = masks.fixed(32, 4) & masks.causal()
    got = attnkit.attention(q, k, v, mask=mask, backend="blocksparse")
    exp = attnkit.attention(q.double(), k.double(), v.double(), mask=mask, backend="reference")
    torch.testing.assert_close(got.double(), exp, rtol=0, atol=1e-5)


def test_biases_are_cached_per_size_on_masks_that_ignore_batch_and_head(monkeypatch):
    monkeypatch.setattr(block_plan, "BLOCK_SIZES", (8,))
    monkeypatch.setattr(blocksparse_fused, "BIAS_CACHE", 2)
    mask = masks.dilated(3, 2)
    for length in (40, 48, 40, 56):
        q, k, v = rand_qkv(1, 2, length, length, 4, dtype=torch.float64, seed=length)
        got = attnkit.attention(q, k, v, mask=mask, backend="blocksparse")
        torch.testing.assert_close(got, attnkit.attention(q, k, v, mask=mask, backend="reference"))
    cached = mask._cache_fused_biases
    assert [plan_key[:2] for plan_key, _ in cached] == [(40, 40), (56, 56)]  # least recently used (48) dropped
    p = validate(*rand_qkv(1, 2, 56, 56, 4, dtype=torch.float64), mask=mask)
    first = cached.get_or_build((block_plan.plan_key(p), torch.float64), lambda: None)
    assert first is not None
    assert blocksparse_fused.slab_biases(p, block_plan.plan_for(p).slabs, 8, torch.float64) is first  # reused
    per_batch = masks.padding([20]) & masks.sliding_window(2, 2) | masks.global_tokens([0])
    got = attnkit.attention(q, k, v, mask=per_batch, backend="blocksparse")
    torch.testing.assert_close(got, attnkit.attention(q, k, v, mask=per_batch, backend="reference"))
    assert "_cache_fused_biases" not in per_batch.__dict__  # reads b: built per call, never cached
    monkeypatch.setattr(blocksparse_fused, "BIAS_CACHE_BYTES", 100)
    big = masks.dilated(2, 3)
    got = attnkit.attention(q, k, v, mask=big, backend="blocksparse")
    torch.testing.assert_close(got, attnkit.attention(q, k, v, mask=big, backend="reference"))
    assert not big.__dict__.get("_cache_fused_biases")  # over the byte budget: built per call


def test_refusals_send_calls_to_the_hand_written_path(monkeypatch):
    fallback = _spy(monkeypatch, blocksparse_masked)
    q, k, v = rand_qkv(1, 2, 64, 64, 6, dtype=torch.float64, requires_grad=True)
    mask = masks.segments(torch.arange(64) // 20)
    p = validate(q, k, v, mask=mask, return_lse=True)
    assert "lse" in blocksparse_fused.refusal(p)  # grad mode with requires_grad inputs
    with torch.no_grad():
        assert blocksparse_fused.refusal(validate(q, k, v, mask=mask, return_lse=True)) is None
    qd, kd, vd = rand_qkv(1, 2, 64, 64, 6, 5, dtype=torch.float64)
    assert "Dv == D" in blocksparse_fused.refusal(validate(qd, kd, vd, mask=mask))
    bad = k.detach().clone()
    bad[:, :, 10] = float("nan")
    assert "non-finite" in blocksparse_fused.refusal(validate(q, bad, v, mask=mask))
    got = attnkit.attention(q.detach(), bad, v.detach(), mask=mask, backend="blocksparse")
    assert torch.isnan(got[:, :, :20]).all() and torch.isfinite(got[:, :, 20:]).all()  # NaN stays in its document
    assert fallback
    assert "fused torch kernel" in str(attnkit.explain(q, k, v, mask=mask, backend="blocksparse"))


def test_cached_biases_follow_the_plan_when_the_slab_size_changes(monkeypatch):
    mask = masks.causal() & masks.strided(64)
    q, k, v = rand_qkv(1, 2, 512, 512, 8, seed=9)
    first = attnkit.attention(q, k, v, mask=mask, backend="blocksparse")
    monkeypatch.setattr(block_plan, "SLAB", 1 << 14)  # other slabs: the cached biases must not be reused
    torch.testing.assert_close(attnkit.attention(q, k, v, mask=mask, backend="blocksparse"), first)
    assert len(mask._cache_fused_biases) == 2


@pytest.mark.parametrize("name", list(LAYOUT_MASKS))
def test_fused_path_in_units_of_heads_gives_one_threads_bits_and_the_reference(monkeypatch, name):
    """Two torch threads: each run of heads on its own thread (kernels/pipeline.py, Units), the same bits."""
    monkeypatch.setattr(block_plan, "BLOCK_SIZES", (16,))
    monkeypatch.setattr(pipeline, "UNIT_WORK", 0)  # these small calls in units too
    counts, real = [], pipeline.Units
    monkeypatch.setattr(blocksparse_fused, "Units", lambda count: counts.append(count) or real(count))
    q, k, v = rand_qkv(2, 3, 100, 100, 11, hkv=1 if name == "fixed" else 3, dtype=torch.float64, seed=5)
    mask = LAYOUT_MASKS[name]()
    before, runs = torch.get_num_threads(), []
    try:
        for threads in (2, 1):
            torch.set_num_threads(threads)
            lse = attnkit.attention(q, k, v, mask=mask, backend="blocksparse", return_lse=True).lse
            runs.append([lse, *_outputs_and_grads(q, k, v, mask, "blocksparse")])
    finally:
        torch.set_num_threads(before)
    assert counts[:3] == [3, 3, 3] and set(counts[3:]) == {1}  # lse call, forward, backward in three runs of heads
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a, b)
    exp = _outputs_and_grads(q, k, v, mask, "reference")
    for what, a, b in zip(("out", "dq", "dk", "dv"), runs[0][1:], exp, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10, msg=what)
