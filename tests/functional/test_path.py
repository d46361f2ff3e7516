"""PaTH attention against a float64 transcription of its equations (Yang et al. 2025, arXiv:2505.16381) and, where
flash-linear-attention imports, its pure-torch reference."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from attnkit.errors import ArgumentError, ShapeError
from attnkit.functional import path as path_module
from attnkit.functional.path import CHUNK_FROM, choose_form, path_attention, path_scores
from tests.helpers import assert_close_with_gradients

TOL = dict(rtol=0, atol=1e-10)


def oracle(q, k, v, w, beta, log_f=None, scale=None):
    """s_ij = q_i^T H_i ... H_{j+1} k_j with H_t = I - beta_t w_t w_t^T as explicit matrices; softmax over j <= i of
    scale s_ij + log(f_{j+1} ... f_i); each key head's transformations serve consecutive query heads."""
    b, h, n, d = q.shape
    groups = h // k.shape[1]
    scale = d ** -0.5 if scale is None else scale
    out = torch.zeros(b, h, n, v.shape[-1], dtype=torch.float64)
    eye = torch.eye(d, dtype=torch.float64)
    for head in range(h):
        g = head // groups
        hs = eye - beta[:, g, :, None, None].double() * w[:, g, :, :, None].double() * w[:, g, :, None, :].double()
        for i in range(n):
            product, scores = eye.expand(b, d, d), []
            for j in range(i, -1, -1):  # product = H_i ... H_{j+1}
                s = (q[:, head, i, None, :].double() @ product @ k[:, g, j, :, None].double())[:, 0, 0] * scale
                if log_f is not None:
                    s = s + log_f[:, head, j + 1:i + 1].double().sum(-1)
                scores.append(s)
                product = product @ hs[:, j]
            weights = torch.stack(scores[::-1], -1).softmax(-1)  # (b, i + 1), keys 0 .. i
            out[:, head, i] = (weights[:, :, None] * v[:, g, :i + 1].double()).sum(1)
    return out


def problem(b=2, h=4, hkv=2, n=11, d=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, n, d, generator=g, dtype=torch.float64)
    k, v, w = (torch.randn(b, hkv, n, d, generator=g, dtype=torch.float64) for _ in range(3))
    w = F.normalize(w, dim=-1)
    beta = 2 * torch.sigmoid(torch.randn(b, hkv, n, generator=g, dtype=torch.float64))
    log_f = F.logsigmoid(torch.randn(b, h, n, generator=g, dtype=torch.float64) + 1.5)
    return [t.requires_grad_() for t in (q, k, v, w, beta, log_f)]


@pytest.mark.parametrize("form", ["parallel", "chunk"])
@pytest.mark.parametrize("forget", [False, True])
def test_equals_the_papers_equations_forward_and_backward(forget, form):
    q, k, v, w, beta, log_f = problem()
    gates = log_f if forget else None
    out = path_attention(q, k, v, w, beta, log_fgate=gates, form=form, chunk_size=4)
    want = oracle(q, k, v, w, beta, gates)
    assert_close_with_gradients(out, want, [q, k, v, w, beta] + ([log_f] if forget else []), **TOL)


def test_reflections_at_beta_two_keep_the_keys_norms():
    # beta = 2, unit w: every H_t is a reflection, so the key read by query i, u_ij = H_i ... H_{j+1} k_j, keeps
    # |k_j|. Queries e_m (one batch row per m) read u_ij's components: s_ij = e_m^T u_ij.
    _, k, _, w, _, _ = problem(b=1, h=1, hkv=1, n=7)
    beta = torch.full((5, 7), 2.0, dtype=torch.float64)
    basis = torch.eye(5, dtype=torch.float64)[:, None, :].expand(5, 7, 5)  # (m, L, D): q_i = e_m
    u = path_scores(basis, k[0, 0].expand(5, 7, 5), w[0, 0].expand(5, 7, 5), beta)  # (m, i, j) = (u_ij)_m
    norms = u.detach().square().sum(0).sqrt()
    lower = torch.ones(7, 7, dtype=torch.bool).tril()
    torch.testing.assert_close(norms[lower], k[0, 0].detach().norm(dim=-1).expand(7, 7)[lower], **TOL)
    assert not torch.allclose(u[:, 6, 0], k[0, 0, 0].detach())  # the key was moved, not left alone


@pytest.mark.parametrize("form", ["parallel", "chunk"])
def test_beta_zero_is_causal_softmax_attention(form):
    q, k, v, w, _, _ = problem(hkv=4)
    out = path_attention(q, k, v, w, torch.zeros(2, 4, 11, dtype=torch.float64), form=form, chunk_size=3)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True), **TOL)


@pytest.mark.parametrize("forget", [False, True])
@pytest.mark.parametrize(("n", "chunk", "hkv"), [(11, 4, 2), (16, 4, 1), (5, 8, 4), (1, 4, 2), (1, 1, 2), (9, 1, 1),
                                                  (23, 6, 2)])
def test_chunk_form_equals_the_parallel_form_forward_and_backward(n, chunk, hkv, forget):
    q, k, v, w, beta, log_f = problem(n=n, hkv=hkv, seed=n + chunk)
    gates = log_f if forget else None
    leaves = [q, k, v, w, beta] + ([log_f] if forget else [])
    want = path_attention(q, k, v, w, beta, log_fgate=gates, form="parallel")
    out = path_attention(q, k, v, w, beta, log_fgate=gates, form="chunk", chunk_size=chunk)
    assert_close_with_gradients(out, want, leaves, **TOL)


@pytest.mark.parametrize("n", [CHUNK_FROM - 1, CHUNK_FROM])
def test_auto_form_runs_the_chunk_form_from_its_crossover_and_equals_both_forms(monkeypatch, n):
    """The default ``form="auto"``: the parallel form below ``CHUNK_FROM`` (192) tokens, the chunk form from it on;
    the same numbers as the form it runs (bit for bit), and the other form's to 1e-10, forward and backward."""
    ran = []
    chunk_form = path_module._chunk_form
    monkeypatch.setattr(path_module, "_chunk_form", lambda *a: ran.append(a) or chunk_form(*a))
    q, k, v, w, beta, log_f = problem(b=1, h=2, hkv=1, n=n, d=4, seed=n)
    leaves = [q, k, v, w, beta, log_f]
    auto = path_attention(q, k, v, w, beta, log_fgate=log_f)
    assert bool(ran) == (n >= CHUNK_FROM)
    runs, other = ("chunk", "parallel") if n >= CHUNK_FROM else ("parallel", "chunk")
    same = path_attention(q, k, v, w, beta, log_fgate=log_f, form=runs)
    assert torch.equal(auto, same)
    assert_close_with_gradients(auto, path_attention(q, k, v, w, beta, log_fgate=log_f, form=other), leaves, **TOL)


def test_choose_form_keeps_explicit_forms_and_splits_auto_at_the_crossover():
    assert [choose_form("f", "auto", n) for n in (0, 1, CHUNK_FROM - 1, CHUNK_FROM, 4096)] == [
        "parallel", "parallel", "parallel", "chunk", "chunk"]
    assert [choose_form("f", form, n) for form in ("parallel", "chunk") for n in (1, 4096)] == [
        "parallel", "parallel", "chunk", "chunk"]


def test_chunk_form_in_float32_and_without_gradients():
    q, k, v, w, beta, log_f = (t.detach().float() for t in problem(n=13))
    with torch.no_grad():
        out = path_attention(q, k, v, w, beta, log_fgate=log_f, form="chunk", chunk_size=5)
    assert out.dtype == torch.float32
    want = path_attention(*(t.double() for t in (q, k, v, w, beta)), log_fgate=log_f.double())
    torch.testing.assert_close(out.double(), want, rtol=0, atol=1e-5)
    empty = path_attention(q[:, :, :0], k[:, :, :0], v[:, :, :0], w[:, :, :0], beta[:, :, :0], form="chunk")
    assert empty.shape == (2, 4, 0, 5)


class _Largest(TorchDispatchMode):
    """The largest number of elements of any tensor an operator returns (forward, recomputation and backward)."""

    def __init__(self):
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.numel = max([self.numel] + [t.numel() for t in tree_leaves(out) if isinstance(t, torch.Tensor)])
        return out


def _largest(n, form, chunk=16):
    q, k, v, w, beta, log_f = problem(b=1, h=2, hkv=1, n=n, d=4, seed=1)
    with _Largest() as mode:
        out = path_attention(q, k, v, w, beta, log_fgate=log_f, form=form, chunk_size=chunk)
        torch.autograd.grad(out.sum(), [q, k, v, w, beta, log_f])
    return mode.numel


def test_chunk_form_creates_no_quadratic_tensor_forward_or_backward():
    # per key head: the parallel form builds L x L scores; the chunk form nothing above L (c + D) per head
    assert _largest(256, "parallel") >= 2 * 256 * 256
    small, large = _largest(128, "chunk"), _largest(256, "chunk")
    assert large <= 2 * 256 * (16 + 4 + 4) < 256 * 256
    assert large <= 2 * small  # linear in L


def test_bad_form_and_chunk_size_are_refused():
    q, k, v, w, beta, _ = problem()
    with pytest.raises(ArgumentError, match="form must be 'auto', 'parallel' or 'chunk'"):
        path_attention(q, k, v, w, beta, form="recurrent")
    for bad in (0, -3, 2.0, True):
        with pytest.raises(ArgumentError, match="chunk_size must be an int >= 1"):
            path_attention(q, k, v, w, beta, form="chunk", chunk_size=bad)


def test_shapes_are_checked():
    q, k, v, w, beta, log_f = problem()
    with pytest.raises(ShapeError, match=r"beta must have shape \(B, Hkv, L\) = \(2, 2, 11\); got \(2, 4, 11\)"):
        path_attention(q, k, v, w, beta.repeat(1, 2, 1))
    with pytest.raises(ShapeError, match=r"log_fgate must have shape \(B, H, L\) = \(2, 4, 11\)"):
        path_attention(q, k, v, w, beta, log_fgate=log_f[:, :2])


def test_equals_flash_linear_attentions_reference():
    naive = pytest.importorskip("fla.ops.path_attn.naive")  # test-only oracle, computes in float32
    q, k, v, w, beta, log_f = problem(n=11)
    scale = 5 ** -0.5
    theirs = naive.naive_path_attn(*(t.transpose(1, 2) for t in (q, k, v, w, beta, log_f)), scale=scale,
                                   chunk_size=4).transpose(1, 2)
    # fla scales the forget-gate bias with the scores: its g is our log_fgate / scale
    ours = path_attention(q, k, v, w, beta, log_fgate=log_f * scale, scale=scale)
    torch.testing.assert_close(ours, theirs.double(), rtol=0, atol=1e-5)
