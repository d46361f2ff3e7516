"""PerceiverAttention and PerceiverEncoder against float64 references written from the paper's description."""

import pytest
import torch
import torch.nn.functional as F

import attnkit
from attnkit.errors import DTypeError, ShapeError
from attnkit.nn.perceiver import PerceiverAttention, PerceiverEncoder
from tests.nn.projected_reference import merge_heads, project_heads, split_heads

B, NL, M, QD, CD, H, DH = 2, 5, 11, 12, 7, 3, 4  # latents N=5, input length M=11


def _t(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _softmax_attention(layer, latents, context, keep=None):
    """softmax(Q K^T / sqrt(d)) V written out, padded keys removed from the sum."""
    (q,) = project_heads(layer, latents, ("q_proj",))
    k, v = project_heads(layer, context, ("k_proj", "v_proj"))
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if keep is not None:
        scores = scores.masked_fill(~keep[:, None, None, :], float("-inf"))
        v = v.masked_fill(~keep[:, None, :, None], 0.0)
    weights = torch.nan_to_num(torch.softmax(scores, -1))  # an all-padded sample: weights 0
    return layer.out_proj(merge_heads(weights @ v))


def test_cross_attention_equals_core_attention_on_projected_inputs():
    layer = PerceiverAttention(QD, CD, num_heads=H, head_dim=DH).double()
    z, x = _t(B, NL, QD), _t(B, M, CD, seed=1)
    got = layer(z, x)
    q, k, v = split_heads(layer.q_proj(z), H), split_heads(layer.k_proj(x), H), split_heads(layer.v_proj(x), H)
    core = attnkit.attention(q, k, v, backend="reference")
    torch.testing.assert_close(got, layer.out_proj(merge_heads(core)), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got, _softmax_attention(layer, z, x), rtol=1e-10, atol=1e-12)


def test_self_attention_when_context_is_omitted():
    layer = PerceiverAttention(QD, num_heads=H, head_dim=DH).double()
    z = _t(B, NL, QD)
    torch.testing.assert_close(layer(z), _softmax_attention(layer, z, z), rtol=1e-10, atol=1e-12)


def test_padded_inputs_cannot_leak_and_empty_samples_give_zero_attention():
    layer = PerceiverAttention(QD, CD, num_heads=H, head_dim=DH).double()
    z, x = _t(B, NL, QD), _t(B, M, CD, seed=1)
    keep = torch.ones(B, M, dtype=torch.bool)
    keep[1, 6:] = False
    bad = x.clone()
    bad[1, 6:] = float("nan")
    got = layer(z, bad, context_keep_mask=keep)
    torch.testing.assert_close(got, _softmax_attention(layer, z, x, keep), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(got[1:], layer(z[1:], x[1:, :6]), rtol=1e-10, atol=1e-12)
    keep[0] = False
    empty = layer(z, bad, context_keep_mask=keep)
    torch.testing.assert_close(empty[0], layer.out_proj.bias.expand(NL, QD), rtol=0, atol=0)
    torch.testing.assert_close(empty[1], got[1], rtol=0, atol=0)


def _encoder_reference(enc, x, keep=None):
    """Sec. 2 / Fig. 1 written out: pre-norm residual cross-attend + MLP, then latent blocks, final LN."""
    def ln(mod, t):
        return F.layer_norm(t, t.shape[-1:], mod.weight, mod.bias, mod.eps)

    def mlp(seq, t):
        norm, fc1, _, _, fc2 = seq
        return fc2(F.gelu(fc1(ln(norm, t))))
    z = enc.latents.expand(x.shape[0], -1, -1)
    z = z + _softmax_attention(enc.cross_attn, ln(enc.norm_latents, z), ln(enc.norm_input, x), keep)
    z = z + mlp(enc.cross_ff, z)
    for block in enc.blocks:
        h = ln(block["norm"], z)
        z = z + _softmax_attention(block["attn"], h, h)
        z = z + mlp(block["ff"], z)
    return ln(enc.norm_out, z)


def _encoder():
    return PerceiverEncoder(CD, num_latents=NL, latent_dim=QD, depth=2, cross_heads=2, latent_heads=H,
                            head_dim=DH).double()


def test_encoder_matches_written_out_forward():
    enc, x = _encoder(), _t(B, M, CD, seed=1)
    keep = torch.ones(B, M, dtype=torch.bool)
    keep[0, 3:] = False
    torch.testing.assert_close(enc(x, input_keep_mask=keep), _encoder_reference(enc, x, keep),
                               rtol=1e-10, atol=1e-12)


def test_encoder_padded_sample_equals_sample_alone():
    enc, x = _encoder(), _t(B, M, CD, seed=1)
    keep = torch.ones(B, M, dtype=torch.bool)
    keep[0, 8:] = False
    bad = x.clone()
    bad[0, 8:] = float("nan")
    got = enc(bad, input_keep_mask=keep)
    torch.testing.assert_close(got[:1], enc(x[:1, :8]), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(got[1:], enc(x[1:]), rtol=1e-10, atol=1e-12)


def test_encoder_is_invariant_to_input_order_without_positions():
    enc, x = _encoder(), _t(B, M, CD, seed=1)
    perm = torch.randperm(M, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(enc(x[:, perm]), enc(x), rtol=1e-10, atol=1e-12)


def test_bad_inputs_raise():
    layer = PerceiverAttention(QD, CD, num_heads=H, head_dim=DH)
    with pytest.raises(ShapeError, match="context must have shape"):
        layer(torch.randn(B, NL, QD), torch.randn(B, M, CD + 1))
    with pytest.raises(ShapeError, match="latents must have shape"):
        layer(torch.randn(B, NL, QD + 1), torch.randn(B, M, CD))
    with pytest.raises(DTypeError, match="context_keep_mask"):
        layer(torch.randn(B, NL, QD), torch.randn(B, M, CD), context_keep_mask=torch.ones(B, M))


def test_dropout_only_in_training():
    enc = PerceiverEncoder(CD, num_latents=NL, latent_dim=QD, depth=1, latent_heads=H, head_dim=DH, dropout=0.5)
    x = _t(B, M, CD).float()
    enc.eval()
    assert torch.equal(enc(x), enc(x))
    enc.train()
    torch.manual_seed(0)
    assert not torch.allclose(enc(x), enc.eval()(x))


def test_gradcheck():
    layer = PerceiverAttention(4, 3, num_heads=2, head_dim=2).double()
    z, x = _t(1, 2, 4).requires_grad_(), _t(1, 5, 3, seed=1).requires_grad_()
    keep = torch.tensor([[True, False, True, True, False]])
    assert torch.autograd.gradcheck(lambda a, c: layer(a, c, context_keep_mask=keep), (z, x))
    enc = PerceiverEncoder(3, num_latents=2, latent_dim=4, depth=1, latent_heads=2, head_dim=2).double()
    assert torch.autograd.gradcheck(lambda c: enc(c, input_keep_mask=keep), (x,))


def test_state_dict_round_trip():
    a, b = _encoder(), _encoder()
    b.load_state_dict(a.state_dict())
    x = _t(B, M, CD)
    assert torch.equal(a(x), b(x))


@pytest.mark.parametrize("name", ["perceiver-attention", "perceiver-encoder"])
def test_registry_entry_runs_and_cost_is_linear_in_input_length(name):
    entry = attnkit.registry.get(name)
    fn, inputs = entry.example()
    out = fn(*inputs)
    assert out.shape[0] == inputs[0].shape[0] and out.dim() == 3
    costs = [entry.cost(length=n) for n in (1024, 2048, 4096)]  # the one cost model
    for key in ("flops", "bytes_moved"):
        small, mid, big = (getattr(c, key) for c in costs)
        assert big - mid == pytest.approx(2 * (mid - small), rel=1e-9) and mid > small > 0


@pytest.mark.parametrize("m", [0, 1])
def test_empty_and_length_one_inputs(m):
    enc = _encoder()
    x = _t(B, m, CD).requires_grad_()
    out = enc(x)
    assert out.shape == (B, NL, QD) and torch.isfinite(out).all()
    out.sum().backward()
