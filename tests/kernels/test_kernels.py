"""Every backend computes the float64 reference's function, forward and backward (DESIGN.md section 5)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import attnkit
from attnkit import masks
from tests.helpers import BACKENDS, assert_close_to_oracle, oracle, rand_qkv

MASKS = {
    "none": None,
    "causal": masks.causal(),
    "causal-top-left": masks.causal(align="top_left"),
    "window": masks.sliding_window(9, 3),
    "dilated": masks.dilated(3, 4),
    "strided-causal": masks.strided(11) & masks.causal(),
    "fixed": masks.fixed(16, 3),
    "global|window": masks.global_tokens([0, 70]) | masks.sliding_window(4, 4),
    "padding": masks.padding([90, 17]),
    "causal&padding": masks.causal() & masks.padding([0, 60]),
    "segments": masks.segments(torch.arange(100) // 23),
    "prefix": masks.prefix_lm(20),
    "not-window": ~masks.sliding_window(2, 2),
    "layout": masks.block_layout(torch.rand(2, 2).ge(0.4) | torch.eye(2, dtype=torch.bool), 64),
}


def _accepts(backend, **kwargs):
    q, k, v = rand_qkv(1, 1, 4, 4, 3)
    try:
        attnkit.explain(q, k, v, backend=backend, **kwargs)
    except attnkit.BackendError:
        return False
    return True


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(MASKS))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_forward_matches_float64_reference(backend, name, dtype):
    q, k, v = rand_qkv(2, 3, 100, 100, 11, 13, dtype=dtype, seed=1)
    got = attnkit.attention(q, k, v, mask=MASKS[name], backend=backend)
    assert got.dtype == dtype and got.shape == (2, 3, 100, 13)
    assert_close_to_oracle(got, q, k, v, mask=MASKS[name])


def _grads(q, k, v, **kwargs):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out = attnkit.attention(q, k, v, **kwargs)
    g = torch.Generator().manual_seed(5)
    out.backward(torch.randn(out.shape, generator=g, dtype=torch.float64).to(out.dtype))
    return [t.grad for t in (q, k, v)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["none", "causal", "window", "causal&padding", "segments", "global|window"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gradients_match_float64_reference(backend, name, dtype):
    """Gradient error vs float64 <= 3x the plain same-dtype reference's (DESIGN.md tolerance rule)."""
    q, k, v = rand_qkv(2, 3, 90, 100, 11, 13, dtype=dtype, seed=2)
    # Segment ids are per position: 90 query ids, 100 key ids (the same documents).
    mask = masks.segments(torch.arange(90) // 23, torch.arange(100) // 23) if name == "segments" else MASKS[name]
    got = _grads(q, k, v, mask=mask, backend=backend)
    exact = _grads(q.double(), k.double(), v.double(), mask=mask, backend="reference")
    plain = _grads(q, k, v, mask=mask, backend="reference")
    for g, e, p in zip(got, exact, plain, strict=True):
        err, base = (g.double() - e).abs().max().item(), (p.double() - e).abs().max().item()
        assert err <= 3 * base + 8 * torch.finfo(dtype).eps, (err, base)


@pytest.mark.parametrize("backend", BACKENDS)
def test_float64_gradcheck(backend):
    q, k, v = rand_qkv(1, 2, 5, 7, 3, dtype=torch.float64, requires_grad=True)
    mask = masks.causal() if backend != "sdpa" else None
    assert torch.autograd.gradcheck(lambda *t: attnkit.attention(*t, mask=mask, backend=backend), (q, k, v))


@pytest.mark.parametrize("backend", ["reference", "chunked", "blocksparse"])
def test_lse_matches_logsumexp_of_masked_scores(backend):
    q, k, v = rand_qkv(2, 3, 70, 80, 11, dtype=torch.float64)
    mask = masks.sliding_window(5, 5) & masks.padding([80, 30])
    res = attnkit.attention(q, k, v, mask=mask, backend=backend, return_lse=True)
    scores = (q @ k.transpose(-1, -2)) / 11**0.5
    expected = scores.masked_fill(~mask.materialize(70, 80, batch=2), float("-inf")).logsumexp(-1)
    torch.testing.assert_close(res.lse, expected)


@pytest.mark.parametrize("backend", ["reference", "chunked", "blocksparse"])
@pytest.mark.parametrize("score", ["dot", "cosine", "pairwise-callable"])
def test_scores_and_modifiers_on_every_kernel(backend, score):
    q, k, v = rand_qkv(2, 3, 75, 66, 11, dtype=torch.float32, seed=3)
    score_fn = (lambda a, b: -torch.cdist(a, b)) if score == "pairwise-callable" else score
    kwargs = dict(mask=masks.sliding_window(6, 1), score=score_fn, bias=attnkit.bias.alibi(3), scale=0.7)
    got = attnkit.attention(q, k, v, backend=backend, **kwargs)
    assert_close_to_oracle(got, q, k, v, **kwargs)


@pytest.mark.parametrize("backend", ["reference", "chunked", "blocksparse"])
def test_tensor_bias_on_every_kernel(backend):
    q, k, v = rand_qkv(2, 3, 40, 50, 11, dtype=torch.float32, seed=4)
    bias = torch.randn(3, 40, 50)
    got = attnkit.attention(q, k, v, bias=bias, mask=masks.causal(), backend=backend)
    assert_close_to_oracle(got, q, k, v, bias=bias, mask=masks.causal())


@pytest.mark.parametrize("normalize", ["sparsemax", "sigmoid", "hard"])
def test_row_normalisers_on_blocksparse_equal_reference(normalize):
    q, k, v = rand_qkv(2, 3, 130, 140, 11, dtype=torch.float64, seed=6)
    mask = masks.sliding_window(20, 20) & masks.padding([140, 3])
    ref = attnkit.attention(q, k, v, mask=mask, normalize=normalize, backend="reference")
    got = attnkit.attention(q, k, v, mask=mask, normalize=normalize, backend="blocksparse")
    torch.testing.assert_close(got, ref)


def test_causal_matches_torch_sdpa_is_causal():
    q, k, v = rand_qkv(2, 3, 64, 64, 11, seed=7)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    for backend in BACKENDS:
        got = attnkit.attention(q, k, v, mask=masks.causal(), backend=backend)
        torch.testing.assert_close(got, expected, atol=2e-6, rtol=2e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bottom_right_causal_with_fewer_queries_than_keys(backend):
    """Query i sees keys j <= i + Lk - Lq: with Lq=3, Lk=7 the last query sees all 7 keys."""
    q, k, v = rand_qkv(1, 2, 3, 7, 5, dtype=torch.float64, seed=8)
    got = attnkit.attention(q, k, v, mask=masks.causal(), backend=backend)
    for i in range(3):
        visible = 7 - 3 + i + 1
        expected = F.scaled_dot_product_attention(q[:, :, i:i + 1], k[:, :, :visible], v[:, :, :visible])
        torch.testing.assert_close(got[:, :, i:i + 1], expected)


@pytest.mark.parametrize("backend", BACKENDS)
def test_grouped_query_attention_equals_repeated_heads(backend):
    q, k, v = rand_qkv(2, 6, 33, 41, 11, hkv=2, seed=9)
    got = attnkit.attention(q, k, v, mask=masks.causal(), backend=backend)
    expected = attnkit.attention(q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1), mask=masks.causal(),
                                 backend="reference")
    torch.testing.assert_close(got, expected, atol=2e-6, rtol=2e-5)


def test_weights_are_per_head_post_normalisation():
    q, k, v = rand_qkv(2, 3, 5, 7, 11, dtype=torch.float64)
    res = attnkit.attention(q, k, v, mask=masks.causal(), return_weights=True)
    assert res.weights.shape == (2, 3, 5, 7)
    torch.testing.assert_close(res.output, res.weights @ v)
    expected = oracle(q, k, v, mask=masks.causal(), return_weights=True).weights
    torch.testing.assert_close(res.weights, expected)


def _explained(lq, **kwargs):
    q, k, v = rand_qkv(1, 2, lq, lq, 16)
    return attnkit.explain(q, k, v, **kwargs)


def test_dispatch_choices_and_reasons():
    assert _explained(512).backend == "sdpa"
    assert _explained(512, mask=masks.causal()).backend == "sdpa"
    assert _explained(512, mask=masks.padding([300])).backend == "sdpa"
    assert _explained(1024, mask=masks.sliding_window(32, 32)).backend == "blocksparse"
    assert _explained(512, return_weights=True).backend == "reference"
    assert _explained(1024, bias=attnkit.bias.alibi(2)).backend == "chunked"
    d = _explained(1024, bias=attnkit.bias.alibi(2))
    assert d.path == "bias-slabs"
    assert d.reasons["torch-sdpa"].startswith("refused: no bias")
    assert d.reasons["online-softmax"].startswith("able, not preferred: bias-slabs comes first in the table of paths")
    assert "path: bias-slabs (backend 'chunked')" in str(d) and d.flops > 0


def test_forced_backend_that_cannot_honour_the_call_raises():
    q, k, v = rand_qkv(requires_grad=True)  # torch's kernel gives its lse no gradient
    with pytest.raises(attnkit.BackendError, match=r"backend='sdpa'.*lse"):
        attnkit.attention(q, k, v, backend="sdpa", return_lse=True)
    q, k, v = rand_qkv()
    with pytest.raises(attnkit.BackendError, match=r"backend='chunked'.*sparsemax"):
        attnkit.attention(q, k, v, backend="chunked", normalize="sparsemax")


def test_small_chunks_and_blocks_change_nothing(monkeypatch):
    """Chunk-size invariance: tiny slabs exercise the checkpointed multi-slab paths."""
    from attnkit.kernels import block_plan, blocksparse_gathered, online_softmax
    q, k, v = rand_qkv(2, 3, 150, 170, 11, dtype=torch.float64, seed=10, requires_grad=True)
    mask = masks.sliding_window(30, 30)
    expected = _grads(q, k, v, mask=mask, backend="reference")
    monkeypatch.setattr(online_softmax, "BUDGET", 64)
    monkeypatch.setattr(online_softmax, "KV_BLOCK", 7)
    monkeypatch.setattr(blocksparse_gathered, "BUDGET", 64)
    monkeypatch.setattr(block_plan, "BLOCK_SIZES", (16,))
    for backend in ("chunked", "blocksparse"):
        for g, e in zip(_grads(q, k, v, mask=mask, backend=backend), expected, strict=True):
            torch.testing.assert_close(g, e)


@pytest.mark.slow
def test_chunked_runs_long_dense_attention_in_bounded_memory():
    """L = 65536 dense attention (B=1, H=1, D=64) forward and backward: under 2 GB peak."""
    from attnkit.lab.analysis.timing import Case, peak_memory
    case = Case(batch=1, heads=1, q_len=65536, head_dim=64, backward=True)
    assert peak_memory(case, "attnkit chunked", backends=("chunked",)) < 2 * 2**30


def test_compiles_with_fullgraph():
    """Under torch.compile the data-dependent kernels step aside; the traced path equals eager."""
    q, k, v = rand_qkv(2, 3, 40, 40, 8, seed=11)
    mask = masks.sliding_window(4, 4) & masks.padding([40, 10])
    compiled = torch.compile(lambda q, k, v: attnkit.attention(q, k, v, mask=mask), fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v), attnkit.attention(q, k, v, mask=mask, backend="reference"))


def test_custom_score_sees_four_dimensional_blocks_on_blocksparse():
    """A score written for (B, H, L, D) inputs works on the block-sparse kernel too."""
    q, k, v = rand_qkv(1, 2, 300, 300, 8, seed=12)
    def einsum_score(a, b):
        return torch.einsum("bhqd,bhkd->bhqk", a, b)
    mask = masks.sliding_window(16, 16)
    got = attnkit.attention(q, k, v, mask=mask, score=einsum_score, backend="blocksparse")
    assert_close_to_oracle(got, q, k, v, mask=mask, score=einsum_score)


def test_width_groups_keep_wide_rows_apart():
    """A global row gets its own group; the result still equals the reference."""
    from attnkit.kernels import block_plan
    q, k, v = rand_qkv(1, 2, 700, 700, 8, seed=13, dtype=torch.float64)
    mask = masks.global_tokens([0]) | masks.sliding_window(8, 8)
    p = attnkit.functional.validate.validate(q, k, v, mask=mask)
    assert len(block_plan.width_groups(block_plan.layouts(p, 64)[0])) > 1
    torch.testing.assert_close(attnkit.attention(q, k, v, mask=mask, backend="blocksparse"),
                               oracle(q, k, v, mask=mask))


def test_explain_names_the_backend_attention_runs():
    """NaN past a padding length: torch's kernel sees it in its output, the rows are zeroed, and it runs again."""
    q, k, v = rand_qkv(1, 2, 8, 8, 4)
    k[0, 0, 6:] = float("nan")
    mask = masks.padding([6])
    assert attnkit.explain(q, k, v, mask=mask).backend == "sdpa"
    assert attnkit.attention(q, k, v, mask=mask).isfinite().all()


def test_mask_data_must_match_the_sequence_lengths():
    q, k, v = rand_qkv(2, 3, 5, 7, 4)
    with pytest.raises(attnkit.ShapeError, match="kv_len=6; got kv_len=7"):
        attnkit.attention(q, k, v, mask=masks.keys(torch.ones(2, 6, dtype=torch.bool)))
    with pytest.raises(attnkit.ShapeError, match="q_len=7; got q_len=5"):
        attnkit.attention(q, k, v, mask=masks.segments(torch.zeros(7, dtype=torch.long)))


@pytest.mark.parametrize("normalize", ["hard", "sparsemax", "softmax", "sigmoid"])
@pytest.mark.parametrize("backend", ["reference", "blocksparse"])
def test_row_biased_to_minus_infinity_outputs_zero(normalize, backend):
    """RELIABILITY row 6: a row that becomes all -inf through a bias follows the fully-masked rule."""
    if normalize == "sigmoid":
        pytest.skip("sigmoid weights are not normalised: exp(-inf) gives 0 anyway")
    q, k, v = rand_qkv(1, 2, 5, 7, 4, dtype=torch.float64)
    bias = torch.zeros(5, 7, dtype=torch.float64)
    bias[1] = float("-inf")
    out = attnkit.attention(q, k, v, bias=bias, normalize=normalize, mask=masks.full(), backend=backend)
    assert torch.equal(out[0, :, 1], torch.zeros(2, 4, dtype=torch.float64))
    assert out.isfinite().all()
