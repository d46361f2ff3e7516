"""LinearAttention and PerformerAttention against float64 transcriptions of their papers' equations."""

import math
from functools import partial

import pytest
import torch
import torch.nn.functional as F

import attnkit
from attnkit.errors import ArgumentError, DTypeError, ShapeError
from attnkit.nn.linear import (
    LinearAttention,
    PerformerAttention,
    feature_map_attention,
    orthogonal_random_features,
)
from tests.nn.projected_reference import output, project_heads, seeded_input

B, N, DIM, H = 2, 13, 12, 3  # dim_head = 4; n not a multiple of the chunk sizes used

_x = partial(seeded_input, b=B, n=N, dim=DIM)


def _quadratic(phi_q, phi_k, v, causal, eps, keep=None):
    """Eq. 2 written out: V'_i = sum_j sim(i, j) v_j / (sum_j sim(i, j) + eps), loops over i."""
    b, h, n, _ = phi_q.shape
    out = torch.zeros(b, h, n, v.shape[-1], dtype=torch.float64)
    for i in range(n):
        js = [j for j in range(n) if (not causal or j <= i)]
        sim = torch.einsum("bhf,bhjf->bhj", phi_q[:, :, i], phi_k[:, :, js])
        if keep is not None:
            sim = sim * keep[:, None, js]
        out[:, :, i] = torch.einsum("bhj,bhjd->bhd", sim, v[:, :, js]) / (sim.sum(-1, keepdim=True) + eps)
    return out


@pytest.mark.parametrize("causal", [False, True])
def test_linear_equals_explicit_quadratic_form(causal):
    layer = LinearAttention(DIM, H, causal=causal, chunk_size=4).double()
    x = _x()
    q, k, v = project_heads(layer, x)
    ref = output(layer, _quadratic(F.elu(q) + 1, F.elu(k) + 1, v, causal, layer.eps))
    torch.testing.assert_close(layer(x), ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
def test_masked_keys_are_zeroed_and_cannot_leak(causal):
    layer = LinearAttention(DIM, H, causal=causal, chunk_size=4).double()
    x = _x()
    keep = torch.ones(B, N, dtype=torch.bool)
    keep[1, 9:] = False
    q, k, v = project_heads(layer, x)
    ref = output(layer, _quadratic(F.elu(q) + 1, F.elu(k) + 1, v, causal, layer.eps, keep.double()))
    bad = x.clone()
    bad[1, 9:] = float("nan")
    got = layer(bad, key_keep_mask=keep)
    torch.testing.assert_close(got[:, :9], ref[:, :9], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(got[0], ref[0], rtol=1e-10, atol=1e-12)
    alone = layer(x[1:, :9])  # a padded sample equals the same sample run alone
    torch.testing.assert_close(got[1:, :9], alone, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("cls", [LinearAttention, PerformerAttention])
def test_all_keys_masked_gives_zero_attention(cls):
    layer = cls(DIM, H).double()
    out = layer(_x(), key_keep_mask=torch.zeros(B, N, dtype=torch.bool))
    torch.testing.assert_close(out, layer.out_proj.bias.expand_as(out), rtol=0, atol=0)


@pytest.mark.parametrize("cls", [LinearAttention, PerformerAttention])
def test_causal_variants_are_causal(cls):
    layer = cls(DIM, H, causal=True, chunk_size=4).double()
    x = _x()
    moved = x.clone()
    moved[:, 6:] = 5 * torch.randn(B, N - 6, DIM, dtype=torch.float64)
    a, b = layer(x), layer(moved)
    torch.testing.assert_close(a[:, :6], b[:, :6], rtol=1e-12, atol=1e-12)
    assert not torch.allclose(a[:, 6:], b[:, 6:])


def test_causal_chunk_size_invariance():
    layer = LinearAttention(DIM, H, causal=True, chunk_size=1).double()
    x = _x()
    ref = layer(x)
    for chunk in (2, 5, 64):
        layer.chunk_size = chunk
        torch.testing.assert_close(layer(x), ref, rtol=1e-12, atol=1e-12)


def test_sums_accumulate_in_float32():
    # each phi(k) v term is 9e4 > fp16 max: an fp16 accumulation would overflow to inf
    phi = torch.full((1, 1, 6, 2), 300.0)
    v = torch.full((1, 1, 6, 3), 300.0)
    v[..., 0] = 1.0
    for causal in (False, True):
        out = feature_map_attention(phi.half(), phi.half(), v.half(), causal=causal, chunk_size=4)
        assert out.dtype == torch.float16
        torch.testing.assert_close(out.float(), v, rtol=1e-3, atol=0)


def _favor_reference(layer, x):
    """Lemma 1 in float64: phi(x) = (exp(W x - |x|^2 / 2) + eps) / sqrt(m) on x = d^(-1/4) q, no stabilisers."""
    q, k, v = project_heads(layer, x)
    w = layer.projection.double()

    def phi(t):
        t = t / layer.head_dim ** 0.25
        return (torch.exp(t @ w.T - (t * t).sum(-1, keepdim=True) / 2) + layer.eps) / math.sqrt(w.shape[0])
    return output(layer, _quadratic(phi(q), phi(k), v, layer.causal, 0.0))


@pytest.mark.parametrize("eps", [0.0, 1e-3])
@pytest.mark.parametrize("causal", [False, True])
def test_performer_matches_favor_plus_transcription(causal, eps):
    layer = PerformerAttention(DIM, H, num_features=9, causal=causal, eps=eps, chunk_size=4).double()
    x = _x()
    torch.testing.assert_close(layer(x), _favor_reference(layer, x), rtol=1e-9, atol=1e-11)


def test_performer_causal_keys_far_apart_do_not_underflow_earlier_ones():
    # a later chunk whose key logits are ~1000 above the earlier ones must not zero the earlier outputs
    layer = PerformerAttention(4, 1, num_features=8, causal=True, eps=0.0, chunk_size=2).double()
    x = _x(b=1, n=4, dim=4)
    big = x.clone()
    big[:, 2:] = 300 * x[:, 2:]
    torch.testing.assert_close(layer(big)[:, :2], layer(x)[:, :2], rtol=1e-12, atol=1e-12)
    assert torch.isfinite(layer(big)).all()


def test_performer_error_decreases_with_features():
    x = _x(n=24, dim=16, seed=3) * 0.5
    errors = []
    for m in (8, 64, 512):
        err = 0.0
        for seed in range(4):
            layer = PerformerAttention(16, 2, num_features=m, seed=seed).double()
            q, k, v = project_heads(layer, x)
            exact = output(layer, attnkit.attention(q, k, v, backend="reference"))
            err += (layer(x) - exact).abs().mean().item() / 4
        errors.append(err)
    assert errors[0] > errors[1] > errors[2], errors
    assert errors[2] < 0.35 * errors[0], errors  # Monte Carlo rate would give sqrt(8 / 512) = 0.125


def test_orthogonal_features_are_orthogonal_within_blocks():
    w = orthogonal_random_features(10, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert w.shape == (10, 4)
    gram = w[:4] @ w[:4].T
    torch.testing.assert_close(gram - torch.diag(gram.diag()), torch.zeros(4, 4, dtype=torch.float64),
                               rtol=0, atol=1e-12)


def test_performer_redraw_is_deterministic_given_generator():
    a, b = PerformerAttention(DIM, H, seed=7), PerformerAttention(DIM, H, seed=7)
    assert torch.equal(a.projection, b.projection)
    before = a.projection.clone()
    a.redraw(torch.Generator().manual_seed(11))
    b.redraw(torch.Generator().manual_seed(11))
    assert torch.equal(a.projection, b.projection)
    assert not torch.equal(a.projection, before)


@pytest.mark.parametrize("cls", [LinearAttention, PerformerAttention])
@pytest.mark.parametrize("causal", [False, True])
def test_gradcheck(cls, causal):
    layer = cls(6, 2, causal=causal, chunk_size=2).double()
    x = _x(b=1, n=5, dim=6).requires_grad_()
    keep = torch.tensor([[True, True, True, False, True]])
    assert torch.autograd.gradcheck(lambda t: layer(t, key_keep_mask=keep), (x,))


@pytest.mark.parametrize("cls", [LinearAttention, PerformerAttention])
def test_state_dict_round_trip(cls):
    a = cls(DIM, H).double()
    kwargs = {"seed": 5} if cls is PerformerAttention else {}
    b = cls(DIM, H, **kwargs).double()
    b.load_state_dict(a.state_dict())
    x = _x()
    assert torch.equal(a(x), b(x))


def test_bad_inputs_raise():
    layer = LinearAttention(DIM, H)
    with pytest.raises(ShapeError, match="x must have shape"):
        layer(torch.randn(B, N, DIM + 1))
    with pytest.raises(DTypeError, match="key_keep_mask"):
        layer(torch.randn(B, N, DIM), key_keep_mask=torch.ones(B, N))
    with pytest.raises(ShapeError, match=r"\(2, 13\)"):
        layer(torch.randn(B, N, DIM), key_keep_mask=torch.ones(N, B, dtype=torch.bool))
    with pytest.raises(ShapeError, match="multiple"):
        LinearAttention(10, 3)
    with pytest.raises(ArgumentError, match="eps"):
        LinearAttention(DIM, H, eps=-1.0)


@pytest.mark.parametrize("name", ["linear-attention", "performer"])
def test_registry_entry_runs_and_cost_is_linear(name):
    entry = attnkit.registry.get(name)
    fn, inputs = entry.example()
    assert fn(*inputs).shape == inputs[0].shape
    costs = [entry.cost(length=n) for n in (1024, 2048, 4096)]  # the one cost model
    assert all(c.name == name for c in costs)
    for key in ("flops", "bytes_moved"):  # affine in n, and growing
        small, mid, big = (getattr(c, key) for c in costs)
        assert big - mid == pytest.approx(2 * (mid - small), rel=1e-9) and mid > small > 0


@pytest.mark.parametrize("cls", [LinearAttention, PerformerAttention])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n", [0, 1])
def test_empty_and_length_one_sequences(cls, causal, n):
    layer = cls(DIM, H, causal=causal, eps=0.0).double()
    x = _x(n=n).requires_grad_()
    out = layer(x)
    assert out.shape == (B, n, DIM) and torch.isfinite(out).all()
    out.sum().backward()
    if n == 1:  # one key: the output is its value, projected
        v = layer.v_proj(x.detach())
        torch.testing.assert_close(out, layer.out_proj(v), rtol=1e-10, atol=1e-12)


def test_bad_constructor_and_call_arguments_raise_attnkit_errors():
    import attnkit
    from attnkit.nn import BigBirdAttention, LambdaLayer, LinearAttention, LongformerAttention
    with pytest.raises(attnkit.ArgumentError, match="chunk_size"):
        LinearAttention(8, 2, causal=True, chunk_size=2.5)
    with pytest.raises(attnkit.ArgumentError, match="key_dim"):
        LambdaLayer(8, key_dim=0, num_heads=2, max_len=5)
    with pytest.raises(attnkit.DTypeError, match="generator"):
        BigBirdAttention(8, 2, block_size=2)(torch.randn(1, 12, 8), generator=5)
    with pytest.raises(attnkit.DTypeError, match="global_tokens"):
        LongformerAttention(8, 2, window=4)(torch.randn(2, 12, 8), global_tokens=[[0], [3, 4]])


# ------------------------------------------------------------------ Lemma 1 holds for the drawn features
def _positive_feature(w, x):
    """``exp(w.x - |x|^2 / 2)`` for each row w of ``w`` (Lemma 1's positive random feature)."""
    return torch.exp(w @ x - x.dot(x) / 2)


def _within(samples, target, sigmas=5.0):
    """The sample mean is within ``sigmas`` standard errors of ``target`` (the samples' own spread)."""
    err = samples.std() / math.sqrt(samples.numel())
    return abs(samples.mean().item() - target) <= sigmas * err.item(), (samples.mean().item(), target, err.item())


def test_orthogonal_features_are_unbiased_at_every_row_of_a_block():
    # Every row of a block must be N(0, I) on its own: with the QR signs unfixed, the first row of every
    # block leans one way and E[exp(w.x - |x|^2/2)] is about 0.62 there instead of 1.
    d, blocks = 8, 1024
    w = orthogonal_random_features(d * blocks, d, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    g = torch.Generator().manual_seed(1)
    for x in (0.5 * torch.eye(d, dtype=torch.float64)[0], 0.6 * F.normalize(torch.randn(d, generator=g,
                                                                                      dtype=torch.float64), dim=0)):
        for row in range(d):
            for sign in (1.0, -1.0):
                ok, info = _within(_positive_feature(w[row::d], sign * x), 1.0)
                assert ok, (row, sign, info)


def test_lemma_1_estimator_mean_is_the_softmax_kernel():
    # E_w[exp(w.x - |x|^2/2) exp(w.y - |y|^2/2)] = exp(x.y), for orthogonal features as for i.i.d. ones.
    d = 8
    g = torch.Generator().manual_seed(2)
    w = orthogonal_random_features(d * 2048, d, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    for _ in range(4):
        x, y = (0.7 * torch.randn(d, generator=g, dtype=torch.float64) / math.sqrt(d) for _ in range(2))
        ok, info = _within(_positive_feature(w, x) * _positive_feature(w, y), math.exp(x.dot(y).item()))
        assert ok, info


def test_performer_error_falls_like_one_over_sqrt_of_the_features():
    # Monte Carlo rate: the mean attention error against exact softmax scales as m^(-1/2). Biased features
    # stall (a slope near -0.2); the bound leaves room for seed noise on both sides of -0.5.
    x = _x(b=1, n=24, dim=16, seed=3) * 0.5
    sizes, errors = (16, 64, 256, 1024, 4096), []
    for m in sizes:
        err = 0.0
        for seed in range(6):
            layer = PerformerAttention(16, 2, num_features=m, seed=seed).double()
            q, k, v = project_heads(layer, x)
            exact = output(layer, attnkit.attention(q, k, v, backend="reference"))
            err += (layer(x) - exact).abs().mean().item() / 6
        errors.append(err)
    logs = torch.tensor([[math.log(m), 1.0] for m in sizes], dtype=torch.float64)
    slope = torch.linalg.lstsq(logs, torch.tensor(errors, dtype=torch.float64).log()[:, None]).solution[0].item()
    assert -0.75 <= slope <= -0.35, (slope, errors)
    assert errors[-1] < 0.1 * errors[0], errors  # 256 x the features: the rate gives 1/16


def test_a_causal_layer_decodes_from_its_prefix_sums_whatever_the_length():
    from attnkit.costing.analytic import cost

    for length in (7, 70):  # S (d x d) and z (d) per head, in float32 for bfloat16 layers
        lin = cost("linear-attention", batch=2, length=length, dim=12, heads=3, dtype="bfloat16")
        assert (lin.state_fixed, lin.state_per_token) == (3 * 4 * (4 + 1) * 4, 0)
        perf = cost("performer", length=length, dim=12, heads=3, num_features=5, causal=True, dtype="float64")
        assert perf.state_fixed == 3 * 5 * (4 + 1) * 8
    assert cost("linear-attention", causal=False).state_fixed == 0  # nothing to decode from
