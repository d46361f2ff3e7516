"""kernels/sdpa.py: torch's public SDPA (dropout, Dv != D) under torch.jit.trace, where sizes are traced tensors."""

from __future__ import annotations

import warnings

import pytest
import torch

import attnkit
import attnkit.nn


def _trace(fn, args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        return torch.jit.trace(fn, args, check_trace=False)


@pytest.mark.parametrize("hkv", [4, 2])
def test_grouped_heads_with_dropout_trace(hkv):
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(1, 4, 5, 8, generator=g), torch.randn(1, hkv, 5, 8, generator=g), torch.randn(1, hkv, 5, 6,
                                                                                                       generator=g)
    traced = _trace(lambda q, k, v: attnkit.attention(q, k, v, dropout_p=0.25, backend="sdpa"), (q, k, v))
    out = traced(q, k, v)
    assert out.shape == (1, 4, 5, 6) and torch.isfinite(out).all()


class _SelfAttention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = attnkit.nn.MultiHeadAttention(16, 4, num_kv_heads=2, dropout=0.1, batch_first=True)

    def forward(self, x):
        return self.attn(x, x, x, need_weights=False)[0]


def test_multi_head_attention_traces_in_training_and_eval():
    module, x = _SelfAttention(), torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(1))
    traced = _trace(module.train(), (x,))
    assert traced(x).shape == (2, 5, 16)
    module.eval()
    traced = _trace(module, (x,))
    torch.testing.assert_close(traced(x), module(x), rtol=0, atol=0)


@pytest.mark.parametrize("layout", ["cache view", "permuted heads", "innermost strided"])
@pytest.mark.parametrize("grad", [False, True])
def test_strided_inputs_give_the_oracle_answer_whether_copied_or_read_in_place(layout, grad):
    """Only a non-unit innermost stride is copied before torch's kernel (a KV cache's view is read in place)."""
    from tests.helpers import assert_close_to_oracle

    g = torch.Generator().manual_seed(1)
    if layout == "cache view":
        buffer = torch.randn(2, 4, 64, 16, generator=g)
        q, k, v = torch.randn(2, 4, 3, 16, generator=g), buffer[:, :, :37], buffer.flip(2)[:, :, :37]
    elif layout == "permuted heads":
        q, k, v = (torch.randn(2, 37, 4, 16, generator=g).permute(0, 2, 1, 3) for _ in range(3))
    else:
        q, k, v = (torch.randn(2, 4, 16, 37, generator=g).transpose(-1, -2) for _ in range(3))
    q, k, v = (t.requires_grad_(grad) for t in (q, k, v))
    assert not k.is_contiguous()
    causal = attnkit.masks.causal()
    assert attnkit.explain(q, k, v, mask=causal).path == "torch-sdpa"
    assert_close_to_oracle(attnkit.attention(q, k, v, mask=causal), q, k, v, mask=causal)


# ------------------------------------------------------------------ torch's public kernel off the CPU
# On CUDA and MPS the path runs torch's public SDPA and checks the sums of its output and inputs; the same code
# runs here on CPU tensors given the device type (tests.helpers.on_device), and on a GPU in the tests marked cuda.

PUBLIC = {  # lq, lk, hkv, mask
    "no mask": (9, 9, 4, None),
    "causal, GQA": (9, 9, 2, attnkit.masks.causal()),
    "decode": (1, 9, 2, attnkit.masks.causal()),
    "chunked prefill": (4, 9, 4, attnkit.masks.causal()),
    "Lq > Lk: empty rows": (12, 9, 4, attnkit.masks.causal()),
    "a sample with no key": (9, 9, 4, attnkit.masks.padding([9, 0])),
}


def _problem(lq, lk, hkv, mask, device="cuda", seed=2, grad=False):
    from attnkit.core import _prepare
    from tests.helpers import on_device, rand_qkv

    q, k, v = rand_qkv(2, 4, lq, lk, 16, hkv=hkv, seed=seed, requires_grad=grad)
    return on_device(_prepare(q, k, v, mask=mask), device), (q, k, v)


@pytest.mark.parametrize("name", list(PUBLIC))
def test_off_the_cpu_the_public_kernel_runs_checked_and_empty_rows_are_zero(name):
    from attnkit.kernels import sdpa
    from tests.helpers import oracle

    lq, lk, hkv, mask = PUBLIC[name]
    p, (q, k, v) = _problem(lq, lk, hkv, mask, grad=True)
    assert sdpa.checks_output(p) and not sdpa.backward_differentiable(p)
    assert "public kernel on cuda" in sdpa.describe(p)
    out = sdpa.run(p).out
    torch.testing.assert_close(out.double(), oracle(q, k, v, mask=mask), rtol=1e-5, atol=1e-5)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    exact = [t.detach().double().requires_grad_() for t in (q, k, v)]
    from tests.oracle import dense_attention
    exact_grads = torch.autograd.grad(dense_attention(*exact, mask=mask, differentiable=True).sum(), exact)
    for got, want in zip(grads, exact_grads, strict=True):
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    assert p.memo["inputs_finite"]  # the sums passed: later checks need not read q, k, v again


@pytest.mark.parametrize("where", ["q", "k", "v"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_off_the_cpu_non_finite_inputs_make_the_output_untrusted(where, value):
    from attnkit.kernels import sdpa

    p, (q, k, v) = _problem(9, 9, 4, attnkit.masks.padding([9, 5]))
    {"q": q, "k": k, "v": v}[where].data[0, 1, 2, 3] = value
    with pytest.raises(sdpa.UntrustedOutput):
        sdpa.run(p)


def test_off_the_cpu_a_row_with_no_key_reaches_the_kernel_with_every_key_allowed():
    """No kernel sees a row of -inf: the float mask lets the row through, :func:`run` zeroes it after."""
    from attnkit.kernels import sdpa

    mask = torch.ones(9, 9, dtype=torch.bool)
    mask[4] = False
    on_cuda, _ = _problem(9, 9, 4, mask)
    opened = sdpa.kernel_mask(on_cuda, torch.float32)
    assert torch.isfinite(opened.float_mask).all() and opened.empty_rows.nonzero().tolist() == [[0, 0, 4]]
    on_cpu, _ = _problem(9, 9, 4, mask, device="cpu")
    assert torch.isinf(sdpa.kernel_mask(on_cpu, torch.float32).float_mask[..., 4, :]).all()  # the CPU kernel's own
    assert torch.equal(sdpa.run(on_cuda).out[..., 4, :], torch.zeros(2, 4, 16))


@pytest.mark.cuda
@pytest.mark.parametrize("name", list(PUBLIC))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_on_cuda_torch_sdpa_and_the_lane_train_as_the_oracle(name, dtype):
    from tests.helpers import rand_qkv
    from tests.oracle import dense_attention

    lq, lk, hkv, mask = PUBLIC[name]
    q, k, v = (t.cuda().requires_grad_() for t in rand_qkv(2, 4, lq, lk, 64, hkv=hkv, dtype=dtype, seed=2))
    decision = attnkit.explain(q, k, v, mask=mask)
    assert decision.path == "torch-sdpa"
    out = attnkit.attention(q, k, v, mask=mask)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    exact_leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    exact = dense_attention(*exact_leaves, mask=mask, differentiable=True)
    exact_grads = torch.autograd.grad(exact, exact_leaves, dout.double())
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    for got, want in zip((out, *grads), (exact, *exact_grads), strict=True):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)


@pytest.mark.cuda
@pytest.mark.parametrize("where", ["q", "k", "v"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_on_cuda_non_finite_inputs_give_the_exact_answer(where, value):
    from tests.helpers import rand_qkv

    q, k, v = (t.cuda() for t in rand_qkv(2, 2, 9, 9, 64, seed=3))
    {"q": q, "k": k, "v": v}[where][1, 0, 0, 3] = value
    for mask in (None, attnkit.masks.causal(), attnkit.masks.padding([9, 5])):
        got = attnkit.attention(q, k, v, mask=mask)
        torch.testing.assert_close(got, attnkit.attention(q, k, v, mask=mask, backend="reference"), equal_nan=True)
        assert torch.isfinite(got[0]).all()


@pytest.mark.cuda
def test_on_cuda_the_fast_lane_serves_decoding_and_says_so():
    from tests.helpers import rand_qkv

    q, k, v = (t.cuda() for t in rand_qkv(1, 8, 1, 300, 64, hkv=2, dtype=torch.bfloat16))
    decision = attnkit.explain(q, k, v, mask=attnkit.masks.causal())
    assert decision.lane is not None and "public SDPA on CUDA" in decision.lane


def _lse64(q, k, v, allowed):
    """The float64 log-sum-exp and output, written from the softmax's definition (GQA by repeating keys)."""
    rep = q.shape[1] // k.shape[1]
    k, v = (t.double().repeat_interleave(rep, 1) for t in (k, v))
    s = (q.double() @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    s = s.masked_fill(~allowed, float("-inf"))
    lse = s.logsumexp(-1)
    w = (s - lse[..., None]).exp().nan_to_num(0.0)
    return w @ v, lse


@pytest.mark.parametrize("hkv", [4, 2])
def test_lse_comes_from_the_cpu_kernel_without_a_gradient(hkv):
    """Without a gradient the call with ``return_lse`` stays on torch's CPU kernel, its lse exact; a row with no key
    has lse -inf and output 0 (the kernel itself says 0 there)."""
    g = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(2, 4, 9, 8, generator=g), torch.randn(2, hkv, 13, 8, generator=g), torch.randn(
        2, hkv, 13, 8, generator=g)
    allowed = torch.rand(2, 1, 9, 13, generator=g) > 0.4
    allowed[:, :, 3] = False
    assert attnkit.explain(q, k, v, mask=allowed, return_lse=True).path == "torch-sdpa"
    got = attnkit.attention(q, k, v, mask=allowed, return_lse=True)
    out, lse = _lse64(q, k, v, allowed)
    torch.testing.assert_close(got.lse.double(), lse, atol=1e-5, rtol=0)
    torch.testing.assert_close(got.output.double(), out, atol=1e-5, rtol=0)
    assert torch.isneginf(got.lse[:, :, 3]).all() and (got.output[:, :, 3] == 0).all()
    q.requires_grad_(True)  # the kernel's lse has no derivative: another exact path takes the call
    assert attnkit.explain(q, k, v, mask=allowed, return_lse=True).path != "torch-sdpa"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("heads", "kv_heads", "lq", "lk"), [(8, 2, 1, 300), (4, 1, 3, 256), (6, 3, 1, 1024)])
def test_grouped_heads_without_a_mask_run_as_rows_of_one_product_on_the_lane_and_the_path_alike(
        heads, kv_heads, lq, lk, dtype, monkeypatch):
    # a decoding step (one bottom-right causal query: no mask) or an unmasked call with grouped-query heads: the
    # query heads of a key/value head are rows of one kernel call; the lane and the torch-sdpa path give the same
    # bits, equal to the float64 formula; with a mask, under autograd or below sdpa.GROUPED_KEYS keys, the heads
    # stay heads
    import math

    from attnkit.kernels import rules, sdpa

    shapes = []
    kernel = rules.FLASH
    monkeypatch.setattr(rules, "FLASH", lambda q, *a, **kw: shapes.append(tuple(q.shape)) or kernel(q, *a, **kw))
    g = torch.Generator().manual_seed(70)
    q = torch.randn(2, heads, lq, 16, generator=g, dtype=dtype)
    k, v = (torch.randn(2, kv_heads, lk, 16, generator=g, dtype=dtype) for _ in range(2))
    mask = attnkit.masks.causal() if lq == 1 else None
    got = attnkit.attention(q, k, v, mask=mask)
    assert shapes == [(2, kv_heads, heads // kv_heads * lq, 16)]
    assert torch.equal(got, attnkit.attention(q, k, v, mask=mask, backend="sdpa"))
    group = heads // kv_heads
    kk, vv = (t.double().repeat_interleave(group, 1) for t in (k, v))
    want = torch.softmax(q.double() @ kk.transpose(-1, -2) / math.sqrt(16), -1) @ vv
    torch.testing.assert_close(got.double(), want, rtol=0, atol=2e-6 if dtype == torch.float32 else 1e-12)
    shapes.clear()
    attnkit.attention(q, k, v, mask=attnkit.masks.causal("top_left"))  # a mask: one row per head
    attnkit.attention(q.clone().requires_grad_(), k, v, mask=mask)  # a graph: the kernel's own node on q, k, v
    attnkit.attention(q, k[:, :, :sdpa.GROUPED_KEYS - 1], v[:, :, :sdpa.GROUPED_KEYS - 1], mask=mask)  # few keys
    assert shapes == [tuple(q.shape)] * 3
