"""FoX attention against a float64 transcription of its equations (Lin et al. 2025, arXiv:2503.02130, eq. 3-5)
and, where flash-linear-attention imports, against its pure-torch reference."""

import pytest
import torch
import torch.nn.functional as F

import attnkit
from attnkit.errors import ShapeError
from attnkit.functional.forgetting import ForgetGateBias, forgetting_attention
from attnkit.masks import causal
from tests.helpers import assert_close_with_gradients

TOL = dict(rtol=0, atol=1e-10)


def oracle(q, k, v, log_f, scale=None):
    """o_i = sum_{j <= i} w_ij v_j, w_ij proportional to exp(q_i.k_j scale) prod_{l = j+1}^{i} f_l; the products
    of the gates themselves (not their log sums), queries the last Lq of the Lk positions, heads grouped."""
    b, h, lq, d = q.shape
    lk, groups = k.shape[2], h // k.shape[1]
    scale = d ** -0.5 if scale is None else scale
    f = log_f.double().exp()
    out = torch.zeros(b, h, lq, v.shape[-1], dtype=torch.float64)
    for i in range(lq):
        pos = i + lk - lq
        for head in range(h):
            kh, vh = k[:, head // groups].double(), v[:, head // groups].double()
            decay = torch.stack([f[:, head, j + 1:pos + 1].prod(-1) for j in range(pos + 1)], -1)  # (b, pos + 1)
            w = (q[:, head, i:i + 1].double() @ kh[:, :pos + 1].transpose(-1, -2))[:, 0] * scale
            w = (w - w.amax(-1, keepdim=True)).exp() * decay
            out[:, head, i] = ((w / w.sum(-1, keepdim=True))[:, :, None] * vh[:, :pos + 1]).sum(1)
    return out


def problem(b=2, h=4, hkv=2, lq=23, lk=23, d=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, lq, d, generator=g, dtype=torch.float64)
    k, v = (torch.randn(b, hkv, lk, d, generator=g, dtype=torch.float64) for _ in range(2))
    log_f = F.logsigmoid(torch.randn(b, h, lk, generator=g, dtype=torch.float64) + 1.5)
    return [t.requires_grad_() for t in (q, k, v, log_f)]


@pytest.mark.parametrize("backend", ["reference", "chunked", "auto"])
def test_equals_the_papers_equations_forward_and_backward(backend):
    inputs = problem()
    out = forgetting_attention(*inputs, backend=backend)
    want = oracle(*inputs)
    assert_close_with_gradients(out, want, inputs, **TOL)


def test_queries_after_cached_keys_are_the_last_rows():
    q, k, v, log_f = problem(lq=23)
    full = forgetting_attention(q, k, v, log_f)
    torch.testing.assert_close(forgetting_attention(q[:, :, -4:], k, v, log_f), full[:, :, -4:], **TOL)
    torch.testing.assert_close(forgetting_attention(q[:, :, -4:], k, v, log_f), oracle(q[:, :, -4:], k, v, log_f),
                               **TOL)


def test_long_sequences_run_on_a_chunked_path_with_the_gates_gradient():
    q, k, v, log_f = problem(b=1, h=2, hkv=1, lq=300, lk=300, d=4, seed=1)
    cumulative = log_f.cumsum(-1)
    explained = attnkit.explain(q, k, v, mask=causal(), bias=ForgetGateBias(cumulative))
    assert explained.backend == "chunked"  # O(L) memory: the L x L bias is never built
    dense = forgetting_attention(q, k, v, log_f, backend="reference")
    out = forgetting_attention(q, k, v, log_f)
    torch.testing.assert_close(out, dense, **TOL)
    gates, = torch.autograd.grad(out.square().sum(), [log_f])
    want, = torch.autograd.grad(dense.square().sum(), [log_f])
    torch.testing.assert_close(gates, want, **TOL)


def test_gates_of_one_are_causal_softmax_attention():
    q, k, v, _ = problem(hkv=4)
    out = forgetting_attention(q, k, v, torch.zeros(2, 4, 23, dtype=torch.float64))
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True), **TOL)


def test_the_gates_shape_is_checked():
    q, k, v, log_f = problem()
    with pytest.raises(ShapeError, match=r"log_fgate must have shape \(B, H, Lk\) = \(2, 4, 23\).*got \(2, 2, 23\)"):
        forgetting_attention(q, k, v, log_f[:, :2])


def test_equals_flash_linear_attentions_reference():
    naive = pytest.importorskip("fla.ops.forgetting_attn.naive")  # test-only oracle, computes in float32
    q, k, v, log_f = problem()
    theirs = naive.naive_forgetting_attn(*(t.transpose(1, 2) for t in (q, k, v, log_f))).transpose(1, 2)
    torch.testing.assert_close(forgetting_attention(q, k, v, log_f), theirs.double(), rtol=0, atol=1e-5)
