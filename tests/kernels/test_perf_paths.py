"""The fast paths of the benchmark suite compute the float64 reference's function, forward and backward.

- attention() and explain() make one decision (``dispatch.choose``); the finiteness
  check (after torch's kernel) and the cached padding mask never change a result.
- ``kernels/bias_slabs.py``: additive biases (ALiBi, relative positions, float tensors)
  on torch's fused kernel, slab by slab, with its own backward.
- ``kernels/softcap_loop.py``: soft-capping with a fixed shift instead of a running max.

Outputs are checked against ``tests.helpers.oracle`` (the independent float64 oracle), gradients
against the float64 reference kernel, with the DESIGN.md tolerance rule; also rows with no
allowed key and explain().
"""

from __future__ import annotations

import math

import pytest
import torch

import attnkit
from attnkit import masks
from attnkit.bias import ALiBi, RelativePositionBias, Softcap
from attnkit.core import _prepare
from attnkit.kernels import bias_slabs, dispatch, softcap_grad, softcap_loop
from tests.helpers import assert_close_to_oracle, oracle, rand_qkv

B, H, LQ, LK, D = 2, 3, 5, 7, 11


def _relpos(mode="t5", seed=3, learn=False):
    mod = RelativePositionBias(H, mode=mode, num_buckets=8, max_distance=4)
    with torch.no_grad():
        mod.table.copy_(torch.randn(mod.table.shape, generator=torch.Generator().manual_seed(seed)))
    return mod.requires_grad_(learn)


def _tensor_bias(shape, seed=4, learn=False):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).requires_grad_(learn)


BIASES = {
    "alibi": lambda: ALiBi(H),
    "alibi-top-left": lambda: ALiBi(H, align="top_left"),
    "relpos-t5": lambda: _relpos("t5"),
    "relpos-clip": lambda: _relpos("clip"),
    "tensor-full": lambda: _tensor_bias((B, H, LQ, LK)),
    "tensor-heads": lambda: _tensor_bias((1, H, LQ, LK)),
    "tensor-2d": lambda: _tensor_bias((LQ, LK)),
    "tensor-keys": lambda: _tensor_bias((B, 1, 1, LK)),
}
MASKS = {
    "none": None,
    "causal": masks.causal(),
    "causal-top-left": masks.causal(align="top_left"),
    "padding": masks.padding([4, 0]),  # the second sample has no key at all
    "window": masks.sliding_window(1, 2),
}


@pytest.fixture
def small_slabs(monkeypatch):
    """Several slabs and blocks even at these sizes (slab and block boundaries are where bugs hide)."""
    monkeypatch.setattr(bias_slabs, "BUDGET", 1)
    monkeypatch.setattr(bias_slabs, "MIN_ROWS", 2)
    monkeypatch.setattr(softcap_loop, "FORWARD_BLOCKS", (2, 3, 2 * 3 * 2))  # (rows, keys, elements): 2 heads a block
    monkeypatch.setattr(softcap_grad, "BACKWARD_BLOCKS", (3, 2, 3 * 2 * 4))


def _grads(q, k, v, extra=(), **kwargs):
    """Gradients of a fixed random projection of the output w.r.t. q, k, v and ``extra`` tensors."""
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    out = attnkit.attention(*leaves, **kwargs)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64).to(out.dtype)
    return torch.autograd.grad(out, leaves + list(extra), g)


def _assert_grads_close(got, exact, plain, dtype):
    """DESIGN.md: gradient error vs float64 <= 3x the plain same-dtype reference's error."""
    for g, e, p in zip(got, exact, plain, strict=True):
        err, base = (g.double() - e).abs().max().item(), (p.double() - e).abs().max().item()
        assert err <= 3 * base + 8 * torch.finfo(dtype).eps * max(1.0, e.abs().max().item()), (err, base)


# ------------------------------------------------------------------ dispatch shortcut (target 1)

CALLS = [
    {}, {"mask": masks.causal()}, {"mask": masks.causal(align="top_left")}, {"mask": masks.padding([3, 7])},
    {"mask": masks.sliding_window(1, 1)}, {"mask": torch.ones(LQ, LK, dtype=torch.bool).tril()},
    {"bias": ALiBi(H)}, {"bias": Softcap(2.0)}, {"score": "cosine"}, {"normalize": "sparsemax"},
    {"return_lse": True}, {"return_weights": True}, {"dropout_p": 0.5}, {"backend": "reference"},
    {"backend": "chunked", "mask": masks.causal()}, {"backend": "sdpa"},
]


@pytest.mark.parametrize("kwargs", CALLS, ids=lambda kw: ",".join(f"{k}={v!r}"[:30] for k, v in kw.items()) or "none")
@pytest.mark.parametrize("poison", [None, "q", "v"])
def test_attention_runs_what_explain_names_and_nan_never_returns_torchs_answer(kwargs, poison):
    q, k, v = rand_qkv(B, H, LQ, LK, D)
    if poison:
        {"q": q, "v": v}[poison][1, 2, 3, 4] = float("nan")
    backend = kwargs.get("backend", "auto")

    def outcome(fn):
        try:
            return fn(_prepare(q, k, v, **kwargs), backend)
        except attnkit.BackendError as err:  # a forced backend that cannot honour the call
            return str(err)
    explained = outcome(lambda p, b: dispatch.decide(p, b).path)
    ran = outcome(lambda p, b: dispatch.execute(p, b)[1].name)
    if poison is None or explained != "torch-sdpa":
        assert ran == explained
    else:  # torch's kernel saw NaN in its output: the call was decided again, knowing the inputs
        assert ran != "torch-sdpa" or backend == "sdpa"


@pytest.mark.parametrize("where", ["q", "k", "v"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_inputs_finite_sees_every_non_finite_value(where, value):
    q, k, v = rand_qkv(B, H, LQ, LK, D)
    assert _prepare(q, k, v).inputs_finite()
    {"q": q, "k": k, "v": v}[where][0, 1, 2, 3] = value
    assert not _prepare(q, k, v).inputs_finite()
    shared = q.clone()
    shared[1, 0, 0, 0] = value
    assert not _prepare(shared, shared, shared).inputs_finite()  # q is k is v: summed once, still seen


def test_overflowing_finite_sum_is_a_cautious_false_and_the_result_stays_exact():
    q, k, v = rand_qkv(B, H, LQ, LQ, D)
    v = v.clone()
    v[:, :, :, 0] = 3e38  # finite, but the float32 sum overflows
    assert not _prepare(q, k, v).inputs_finite()
    p = _prepare(q, k, v)
    assert dispatch.execute(p, "auto")[1].name != "torch-sdpa"  # the output's sum overflowed too: decided again
    got = attnkit.attention(q, k, v)
    assert torch.isfinite(got).all()
    assert_close_to_oracle(got, q, k, v)


def test_nan_query_row_propagates_through_the_dense_fast_path():
    q, k, v = rand_qkv(B, H, LQ, LK, D)
    q[1, 2, 3, 0] = float("nan")
    got = attnkit.attention(q, k, v)
    assert torch.isnan(got[1, 2, 3]).all() and not torch.isnan(got[0]).any()


def test_cached_padding_mask_follows_sizes_and_batches():
    mask = masks.padding([3, 7])
    for lk in (7, 9, 7):
        q, k, v = rand_qkv(B, H, LQ, lk, D, seed=lk)
        got = attnkit.attention(q, k, v, mask=mask)
        assert attnkit.explain(q, k, v, mask=mask).backend == "sdpa"
        assert_close_to_oracle(got, q, k, v, mask=mask)
    assert len(mask._cache_sdpa) == 2  # one entry per (Lk, batch, heads, dtype, device)
    for lk in range(10, 20):
        attnkit.attention(*rand_qkv(B, H, LQ, lk, D), mask=mask)
    assert len(mask._cache_sdpa) <= 8


# ------------------------------------------------------------------ additive biases on the fused kernel

@pytest.mark.parametrize("bias_name", list(BIASES))
@pytest.mark.parametrize("mask_name", list(MASKS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bias_slabs_forward_matches_float64_reference(bias_name, mask_name, dtype, small_slabs):
    q, k, v = rand_qkv(B, H, LQ, LK, D, dtype=dtype, seed=1)
    bias, mask = BIASES[bias_name](), MASKS[mask_name]
    assert bias_slabs.refusal(_prepare(q, k, v, bias=bias, mask=mask)) is None
    got = attnkit.attention(q, k, v, bias=bias, mask=mask, backend="chunked")
    assert got.dtype == dtype and got.shape == (B, H, LQ, D)
    assert_close_to_oracle(got, q, k, v, bias=bias, mask=mask)
    if mask_name == "padding":
        assert torch.equal(got[1], torch.zeros_like(got[1]))  # no allowed key: output exactly 0


@pytest.mark.parametrize("bias_name", ["alibi", "relpos-t5", "tensor-heads", "tensor-keys"])
@pytest.mark.parametrize("mask_name", ["none", "causal", "padding"])
def test_bias_slabs_gradients_match_float64_reference(bias_name, mask_name, small_slabs):
    q, k, v = rand_qkv(B, H, LQ, LK, D, seed=2)
    bias, mask = BIASES[bias_name](), MASKS[mask_name]
    kw = {"bias": bias, "mask": mask}
    got = _grads(q, k, v, backend="chunked", **kw)
    exact = _grads(q.double(), k.double(), v.double(), backend="reference", **kw)
    plain = _grads(q, k, v, backend="reference", **kw)
    _assert_grads_close(got, exact, plain, torch.float32)
    if mask_name == "padding":
        assert torch.equal(got[0][1], torch.zeros_like(got[0][1]))  # a row with no key: zero gradient


@pytest.mark.parametrize("make", [lambda: _relpos(learn=True), lambda: _tensor_bias((1, H, LQ, LK), learn=True),
                                  lambda: _tensor_bias((B, 1, 1, LK), learn=True)], ids=["table", "tensor", "keys"])
@pytest.mark.parametrize("mask_name", ["none", "causal", "padding"])
def test_learned_bias_gets_the_reference_gradient(make, mask_name, small_slabs):
    q, k, v = rand_qkv(B, H, LQ, LK, D, seed=6)
    mask = MASKS[mask_name]

    def grads(dtype, backend):
        bias = make()
        param = bias.table if isinstance(bias, RelativePositionBias) else bias
        if dtype == torch.float64:
            bias = bias.double() if isinstance(bias, RelativePositionBias) else bias.detach().double().requires_grad_()
            param = bias.table if isinstance(bias, RelativePositionBias) else bias
        qd, kd, vd = (t.to(dtype) for t in (q, k, v))
        return _grads(qd, kd, vd, extra=[param], bias=bias, mask=mask, backend=backend)

    got, exact, plain = grads(torch.float32, "chunked"), grads(torch.float64, "reference"), grads(torch.float32,
                                                                                                     "reference")
    assert "built per slab" in bias_slabs.describe(_prepare(q, k, v, bias=make(), mask=mask))
    _assert_grads_close(got, exact, plain, torch.float32)


def test_bias_slabs_float64_gradcheck(small_slabs):
    q, k, v = rand_qkv(1, H, 4, 6, 3, dtype=torch.float64, requires_grad=True)
    fn = lambda *t: attnkit.attention(*t, bias=ALiBi(H), mask=masks.causal(), backend="chunked")
    assert torch.autograd.gradcheck(fn, (q, k, v))  # torch's fused backward, slab by slab
    bias = _tensor_bias((1, H, 4, 6), learn=True).double()
    fn = lambda q, k, v, b: attnkit.attention(q, k, v, bias=b, mask=masks.causal(), backend="chunked")
    assert torch.autograd.gradcheck(fn, (q, k, v, bias))  # the learned path: dS reaches the bias


def test_grouped_query_heads_and_lse_without_grad(small_slabs):
    q, _, _ = rand_qkv(B, H, LQ, LK, D, seed=7)
    _, k, v = rand_qkv(B, 1, LQ, LK, D, seed=8)
    bias = ALiBi(H)
    got = attnkit.attention(q, k, v, bias=bias, mask=masks.causal(), return_lse=True, backend="chunked")
    exact = oracle(q, k, v, bias=bias, mask=masks.causal(), return_lse=True)
    assert_close_to_oracle(got.output, q, k, v, bias=bias, mask=masks.causal())
    torch.testing.assert_close(got.lse.double(), exact.lse, atol=1e-5, rtol=1e-5)


def test_rows_without_keys_give_zero_output_and_minus_inf_lse():
    q, k, v = rand_qkv(B, H, 9, 4, 4, seed=9)  # bottom-right causal, Lq > Lk: five leading rows see nothing
    for bias in (ALiBi(H), _tensor_bias((1, H, 9, 4))):
        got = attnkit.attention(q, k, v, bias=bias, mask=masks.causal(), return_lse=True, backend="chunked")
        assert torch.equal(got.output[:, :, :5], torch.zeros_like(got.output[:, :, :5]))
        assert torch.isneginf(got.lse[:, :, :5]).all() and torch.isfinite(got.lse[:, :, 5:]).all()
        assert_close_to_oracle(got.output, q, k, v, bias=bias, mask=masks.causal())


def test_minus_inf_in_a_tensor_bias_is_exact_and_nan_or_plus_inf_is_refused():
    q, k, v = rand_qkv(B, H, LQ, LK, D, seed=10)
    bias = _tensor_bias((1, H, LQ, LK))
    bias[0, 1, 2] = -math.inf  # a whole row
    bias[0, 0, :, 3] = -math.inf  # a key column
    assert bias_slabs.refusal(_prepare(q, k, v, bias=bias)) is None
    got = attnkit.attention(q, k, v, bias=bias, backend="chunked")
    assert torch.equal(got[:, 1, 2], torch.zeros_like(got[:, 1, 2]))
    assert_close_to_oracle(got, q, k, v, bias=bias)
    for value in (math.nan, math.inf):
        bad = bias.clone()
        bad[0, 2, 1, 1] = value
        assert "NaN or +inf" in bias_slabs.refusal(_prepare(q, k, v, bias=bad))
        got = attnkit.attention(q, k, v, bias=bad, backend="chunked")
        torch.testing.assert_close(got, oracle(q, k, v, bias=bad).float(), equal_nan=True, atol=1e-5, rtol=1e-5)


def test_non_finite_inputs_leave_the_fused_kernel():
    q, k, v = rand_qkv(B, H, LQ, LK, D, seed=11)
    q[0, 1, 2, 3] = math.nan
    assert "non-finite" in bias_slabs.refusal(_prepare(q, k, v, bias=ALiBi(H)))
    got = attnkit.attention(q, k, v, bias=ALiBi(H), backend="chunked")
    assert torch.isnan(got[0, 1, 2]).all() and torch.isfinite(got[1]).all()  # NaN propagates, not zeroed


def test_refusals_name_what_the_fused_kernel_cannot_do():
    q, k, v = rand_qkv(B, H, LQ, LK, D)
    _, _, v13 = rand_qkv(B, H, LQ, LK, D, dv=13)
    assert "Dv == D" in bias_slabs.refusal(_prepare(q, k, v13, bias=ALiBi(H)))
    assert "dropout" in bias_slabs.refusal(_prepare(q, k, v, bias=ALiBi(H), dropout_p=0.5))
    assert "additive" in bias_slabs.refusal(_prepare(q, k, v, bias=Softcap(3.0)))
    bad = ALiBi(slopes=torch.tensor([0.5, math.nan, 0.25]))
    assert "parameters" in bias_slabs.refusal(_prepare(q, k, v, bias=bad))
    lse_grad = _prepare(*(t.requires_grad_() for t in (q, k, v)), bias=ALiBi(H), return_lse=True)
    assert "lse" in bias_slabs.refusal(lse_grad)


def test_explain_names_the_bias_path():
    q, k, v = rand_qkv(1, 2, 300, 300, 8)
    viewed = str(attnkit.explain(q, k, v, bias=ALiBi(2)))
    assert "path: bias-slabs (backend 'chunked')" in viewed and "kernels/bias_slabs.py" in viewed
    assert "viewed from one vector" in viewed
    built = attnkit.explain(q, k, v, bias=torch.randn(300, 300)).reasons["bias-slabs"]
    assert built.startswith("chosen:") and "built per slab" in built
    dropped = attnkit.explain(q, k, v, bias=ALiBi(2), dropout_p=0.1)
    assert dropped.path == "online-softmax" and dropped.reasons["bias-slabs"] == "refused: no dropout"


# ------------------------------------------------------------------ soft-capping without a running max

SOFTCAP_MASKS = ["none", "causal", "padding", "window"]


@pytest.mark.parametrize("cap", [0.5, 30.0])
@pytest.mark.parametrize("mask_name", SOFTCAP_MASKS)
def test_softcap_loop_matches_float64_reference(cap, mask_name, small_slabs):
    q, k, v = rand_qkv(B, H, LQ, LK, D, seed=12)
    q = q * 4  # scores well past the cap, so tanh saturates
    bias, mask = Softcap(cap), MASKS[mask_name]
    assert softcap_loop.refusal(_prepare(q, k, v, bias=bias, mask=mask)) is None
    got = attnkit.attention(q, k, v, bias=bias, mask=mask, return_lse=True, backend="chunked")
    assert_close_to_oracle(got.output, q, k, v, bias=bias, mask=mask)
    exact = oracle(q, k, v, bias=bias, mask=mask, return_lse=True).lse
    assert torch.equal(torch.isneginf(got.lse), torch.isneginf(exact))
    torch.testing.assert_close(got.lse.double().nan_to_num(neginf=0), exact.nan_to_num(neginf=0), atol=1e-5, rtol=0)


@pytest.mark.parametrize("mask_name", SOFTCAP_MASKS)
def test_softcap_loop_gradients_match_float64_reference(mask_name, small_slabs):
    q, k, v = rand_qkv(B, H, LQ, LK, D, seed=13)
    kw = {"bias": Softcap(2.0), "mask": MASKS[mask_name]}
    got = _grads(q * 3, k, v, backend="chunked", **kw)
    exact = _grads((q * 3).double(), k.double(), v.double(), backend="reference", **kw)
    plain = _grads(q * 3, k, v, backend="reference", **kw)
    _assert_grads_close(got, exact, plain, torch.float32)


def test_softcap_gradient_through_lse_and_gradcheck(small_slabs):
    q, k, v = rand_qkv(1, 2, 4, 6, 3, dtype=torch.float64, requires_grad=True)

    def fn(*t):
        res = attnkit.attention(*t, bias=Softcap(1.5), mask=masks.causal(), return_lse=True, backend="chunked")
        return res.output, res.lse
    assert torch.autograd.gradcheck(fn, (q, k, v))


def test_softcap_shift_keeps_saturated_rows_exact():
    """Every score far below -cap: the row's largest weight must not underflow (uniform weights)."""
    q, k, v = rand_qkv(1, 1, 3, 50, 4, seed=14)
    k = -q[:, :, :1].expand(1, 1, 50, 4) * 1e4  # q_i . k_j hugely negative for every key
    for cap in (5.0, 80.0):
        assert softcap_loop.shift(cap, 50, torch.float32) is not None
        got = attnkit.attention(q[:, :, :1], k, v, bias=Softcap(cap), backend="chunked")
        torch.testing.assert_close(got[0, 0, 0], v[0, 0].mean(0), atol=1e-5, rtol=1e-5)
    assert softcap_loop.shift(200.0, 50, torch.float32) is None
    assert softcap_loop.shift(200.0, 50, torch.float64) == 0.0


def test_softcap_with_a_nonzero_shift_matches_the_reference():
    """cap = 86 over 7 keys needs a shift > 0 in float32 (e^86 * 7 is near float32's max)."""
    q, k, v = rand_qkv(B, H, LQ, LK, D, seed=15)
    assert softcap_loop.shift(86.0, LK, torch.float32) > 0
    got = attnkit.attention(q * 40, k, v, bias=Softcap(86.0), return_lse=True, backend="chunked")
    exact = oracle(q * 40, k, v, bias=Softcap(86.0), return_lse=True)
    assert torch.isfinite(got.output).all()
    torch.testing.assert_close(got.output.double(), exact.output, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.lse.double(), exact.lse, atol=1e-4, rtol=1e-6)


def test_softcap_refusals_and_explain():
    q, k, v = rand_qkv(B, H, LQ, LK, D)
    assert "too large" in softcap_loop.refusal(_prepare(q, k, v, bias=Softcap(500.0)))
    assert "dropout" in softcap_loop.refusal(_prepare(q, k, v, bias=Softcap(5.0), dropout_p=0.3))
    assert "alone" in softcap_loop.refusal(_prepare(q, k, v, bias=ALiBi(H)))
    q, k, v = rand_qkv(1, 2, 300, 300, 8)
    assert "kernels/softcap_loop.py" in attnkit.explain(q, k, v, bias=Softcap(30.0)).reasons["softcap-loop"]
    got = attnkit.attention(q, k, v, bias=Softcap(500.0), backend="chunked")  # the general loop, still exact
    assert_close_to_oracle(got, q, k, v, bias=Softcap(500.0))
