"""kernels/flex.py: the ``flex`` path, torch's FlexAttention with the call's block mask and score_mod.

On the CPU, where torch runs FlexAttention's forward (eager, and compiled), the path is
compared with the float64 oracle for masks, biases, modifiers, grouped heads and the lse;
its refusals, its cache of block masks and its cost are checked. On a CUDA GPU (tests
marked ``cuda``) ``attnkit.attention`` takes the path and its forward and backward are
compared with the oracle.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import attnkit
from attnkit import masks
from attnkit.bias import ALiBi, RelativePositionBias, Softcap
from attnkit.core import _prepare
from attnkit.kernels import flex
from tests.helpers import assert_close_to_oracle, on_device, oracle, rand_qkv
from tests.oracle import dense_attention

L = 300
CASES = {
    "causal window": {"mask": masks.causal() & masks.sliding_window(40)},
    "strided": {"mask": masks.causal() & masks.strided(17)},
    "documents": {"mask": masks.segments(torch.arange(L) // 70)},
    "padding": {"mask": masks.padding([L, 123])},
    "ALiBi": {"bias": ALiBi(4), "mask": masks.causal()},
    "soft-cap": {"bias": Softcap(5.0)},
    "relative positions": {"bias": RelativePositionBias(4)},
    "tensor bias": {"bias": torch.randn(1, 4, L, L, generator=torch.Generator().manual_seed(2)),
                    "mask": masks.prefix_lm(30)},
}


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():  # torch warns that eager FlexAttention is its slow reference
        warnings.simplefilter("ignore", UserWarning)
        yield


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("hkv", [4, 2], ids=["MHA", "GQA"])
def test_the_eager_forward_equals_the_oracle(name, hkv):
    q, k, v = rand_qkv(2, 4, L, L, 16, hkv=hkv, seed=1)
    result = flex.forward(_prepare(q, k, v, **CASES[name]), compiled=False)
    assert_close_to_oracle(result.out, q, k, v, **CASES[name])


def test_the_lse_is_the_oracle_lse_and_empty_rows_give_zero():
    q, k, v = rand_qkv(2, 4, L, L, 16, seed=4)
    mask = masks.causal() & masks.from_function(lambda b, h, i, j: i >= 10, "late") & masks.sliding_window(40)
    result = flex.forward(_prepare(q, k, v, mask=mask, return_lse=True), compiled=False)
    want = oracle(q, k, v, mask=mask, return_lse=True)
    assert torch.equal(result.lse[..., :10], torch.full_like(result.lse[..., :10], float("-inf")))
    assert torch.equal(result.out[..., :10, :], torch.zeros_like(result.out[..., :10, :]))
    torch.testing.assert_close(result.lse[..., 10:].double(), want.lse[..., 10:], rtol=1e-5, atol=1e-5)


def test_the_compiled_forward_equals_the_oracle():
    q, k, v = rand_qkv(1, 2, 256, 256, 16, hkv=1, seed=2)
    kwargs = dict(mask=masks.causal() & masks.sliding_window(64), bias=ALiBi(2))
    assert_close_to_oracle(flex.forward(_prepare(q, k, v, **kwargs)).out, q, k, v, **kwargs)


@pytest.mark.parametrize("kwargs, why", [
    (dict(return_weights=True), "weights"), (dict(dropout_p=0.1), "dropout"),
    (dict(normalize="sparsemax"), "softmax"), (dict(score="cosine"), "dot products")])
def test_it_refuses_what_flexattention_does_not_compute(kwargs, why):
    q, k, v = rand_qkv(1, 2, 64, 64, 16)
    assert why in attnkit.kernels.paths.BY_NAME["flex"].refusal(on_device(_prepare(q, k, v, **kwargs), "cuda"))


def test_it_refuses_float64_non_finite_inputs_and_a_cpu_backward():
    q, k, v = rand_qkv(1, 2, 64, 64, 16)
    row = attnkit.kernels.paths.BY_NAME["flex"]
    double = [t.double() for t in (q, k, v)]
    assert "float64" in row.refusal(on_device(_prepare(*double), "cuda"))
    k[0, 0, 3, 0] = float("nan")
    assert "non-finite" in row.refusal(on_device(_prepare(q, k, v), "cuda"))
    assert row.refusal(on_device(_prepare(q, k, v), "cuda"), data=False) is None
    grad = [t.detach().clone().requires_grad_() for t in rand_qkv(1, 2, 64, 64, 16)]
    assert "no backward" in attnkit.kernels.rules.first_refusal(_prepare(*grad), flex.REFUSALS)


def test_block_masks_are_built_once_per_mask_and_size_and_kept_bounded():
    mask = masks.causal() & masks.sliding_window(32)
    q = torch.zeros(1, 2, 200, 8)
    first = flex.block_mask(_prepare(q, q, q, mask=mask))
    assert flex.block_mask(_prepare(q.clone(), q, q, mask=mask)) is first
    for length in range(64, 64 + 12 * 8, 8):
        z = torch.zeros(1, 2, length, 8)
        flex.block_mask(_prepare(z, z, z, mask=mask))
    assert len(mask._cache_flex_block_masks) <= 8
    assert flex.block_mask(_prepare(q, q, q)) is None


def test_density_cost_and_description_read_the_block_mask():
    q, k, v = rand_qkv(1, 2, 1024, 1024, 16, hkv=1)
    p = _prepare(q, k, v, mask=masks.causal() & masks.sliding_window(128), bias=ALiBi(2))
    assert 0.15 < flex.density(p) < 0.3  # the diagonal tiles and their left neighbours of 8 x 8
    cost = flex.cost(p)
    assert cost.fused[0] == "attention (FlexAttention)" and not cost.materialized
    assert cost.scores == int(2 * 1024 * 1024 * flex.density(p))
    assert flex.describe(p) == "torch's FlexAttention, compiled with a block mask, a score_mod, grouped K/V heads"


# ------------------------------------------------------------------ on a GPU

@pytest.mark.cuda
@pytest.mark.parametrize("name, dtype", [(name, torch.bfloat16) for name in CASES] + [("ALiBi", torch.float32)])
def test_on_cuda_attention_takes_flex_and_trains_as_the_oracle(name, dtype):  # each case compiles: few of them
    q, k, v = (t.cuda() for t in rand_qkv(2, 4, L, L, 64, hkv=2, dtype=dtype, seed=3))
    kwargs = {key: value.cuda() if isinstance(value, torch.Tensor) else value for key, value in CASES[name].items()}
    if isinstance(kwargs.get("bias"), RelativePositionBias):
        kwargs["bias"] = kwargs["bias"].cuda()
    assert attnkit.explain(q, k, v, **kwargs).path == "flex"
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = attnkit.attention(*leaves, **kwargs)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, leaves, dout)
    exact_leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    exact = dense_attention(*exact_leaves, differentiable=True, **kwargs)
    exact_grads = torch.autograd.grad(exact, exact_leaves, dout.double())
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    for got, want in zip((out, *grads), (exact, *exact_grads), strict=True):
        torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)


@pytest.mark.cuda
def test_on_cuda_a_learned_bias_table_gets_its_gradient_through_flex():
    q, k, v = (t.cuda() for t in rand_qkv(1, 4, 256, 256, 64, seed=5))
    rel = RelativePositionBias(4).cuda()
    torch.nn.init.normal_(rel.table)
    assert attnkit.explain(q, k, v, bias=rel, mask=masks.causal()).path == "flex"
    attnkit.attention(q, k, v, bias=rel, mask=masks.causal()).square().sum().backward()
    got = rel.table.grad.clone()
    rel.table.grad = None
    dense_attention(q, k, v, bias=rel, mask=masks.causal(), dtype=torch.float32,
                    differentiable=True).square().sum().backward()
    torch.testing.assert_close(got, rel.table.grad, rtol=1e-3, atol=1e-3)


@pytest.mark.cuda
def test_on_cuda_second_derivatives_through_flex_are_the_references():
    q, k, v = (t.cuda().requires_grad_() for t in rand_qkv(1, 2, 256, 256, 64, seed=6))
    kwargs = dict(mask=masks.causal() & masks.sliding_window(64), bias=ALiBi(2))
    assert attnkit.explain(q, k, v, **kwargs).path == "flex"
    (dq,) = torch.autograd.grad(attnkit.attention(q, k, v, **kwargs).square().sum(), q, create_graph=True)
    (ddq,) = torch.autograd.grad(dq.sum(), q)
    (rq,) = torch.autograd.grad(attnkit.attention(q, k, v, backend="reference", **kwargs).square().sum(), q,
                                create_graph=True)
    (rdq,) = torch.autograd.grad(rq.sum(), q)
    torch.testing.assert_close(ddq, rdq, rtol=1e-3, atol=1e-3)
