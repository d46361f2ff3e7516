"""nn/padding.py: padded positions are inert in every attention module given a padding mask.

NaN or inf at a padded input position must reach no output at a real position and no gradient
(parameters or real inputs); the modules clear it by select before projecting. Each module runs
twice: with NaN/inf at its padded positions and with zeros there; a loss over the real positions
must give the same outputs and the same gradients, all finite.
"""

from __future__ import annotations

import pytest
import torch

import attnkit.nn as N
from attnkit import masks
from attnkit.models.self_attention import SoftmaxSelfAttention
from attnkit.nn.padding import clear_key_padding, clear_padding

B, L, E = 2, 7, 8
KEEP = torch.tensor([[True] * 7, [True] * 4 + [False] * 3])  # sample 1: the last three positions are padding


def _mha(x):
    m = N.MultiHeadAttention(E, 2, batch_first=True, dtype=torch.float64)
    return m, lambda: m(x, x, x, key_padding_mask=~KEEP, need_weights=False)[0]


def _mha_float_padding(x):
    m = N.MultiHeadAttention(E, 2, batch_first=True, dtype=torch.float64)
    pad = torch.zeros(B, L, dtype=torch.float64).masked_fill(~KEEP, float("-inf"))
    return m, lambda: m(x, x, x, key_padding_mask=pad, need_weights=False)[0]


def _additive(x):
    m = N.AdditiveAttention(E, E, 16).double()
    return m, lambda: m(x, x, mask=masks.keys(KEEP))[0]


def _perceiver_self(x):
    m = N.PerceiverAttention(E, num_heads=2, head_dim=4).double()
    return m, lambda: m(x, context_keep_mask=KEEP)


def _perceiver_encoder(x):
    m = N.PerceiverEncoder(E, num_latents=3, latent_dim=8, depth=1, latent_heads=2, head_dim=4).double()
    return m, lambda: m(x, input_keep_mask=KEEP)


def _mha_causal_padding(x):
    m = N.MultiHeadAttention(E, 2, batch_first=True, dtype=torch.float64)
    return m, lambda: m(x, x, x, key_padding_mask=~KEEP, need_weights=False, is_causal=True,
                        attn_mask=torch.ones(L, L, dtype=torch.bool).triu(1))[0]


def _keyed(cls, **kwargs):
    def build(x):
        m = cls(E, 2, **kwargs).double()
        return m, lambda: m(x, key_keep_mask=KEEP)
    return build


MODULES = {
    "MultiHeadAttention": _mha,
    "MultiHeadAttention, float padding mask": _mha_float_padding,
    "MultiHeadAttention, causal and padding": _mha_causal_padding,
    "SoftmaxSelfAttention": _keyed(SoftmaxSelfAttention),
    "SoftmaxSelfAttention, causal": _keyed(SoftmaxSelfAttention, causal=True),
    "AdditiveAttention": _additive,
    "PerceiverAttention": _perceiver_self,
    "PerceiverEncoder": _perceiver_encoder,
    "LinearAttention": _keyed(N.LinearAttention),
    "LinearAttention, causal": _keyed(N.LinearAttention, causal=True, chunk_size=3),
    "PerformerAttention": _keyed(N.PerformerAttention, num_features=8),
    "PerformerAttention, causal": _keyed(N.PerformerAttention, num_features=8, causal=True, chunk_size=3),
    "ReformerAttention": _keyed(N.ReformerAttention, n_buckets=2, n_hashes=2, chunk_size=3),
    "LinformerAttention": _keyed(N.LinformerAttention, max_len=L, k_proj_dim=4),
}


def _run(name, fill):
    """Outputs, parameter gradients and input gradient of a loss over the real positions only."""
    torch.manual_seed(0)
    x = torch.randn(B, L, E, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    x[~KEEP] = fill
    x.requires_grad_(True)
    module, call = MODULES[name](x)
    out = call()
    real = out[KEEP] if out.shape[1] == L else out  # the Perceiver encoder returns latents
    (real * torch.linspace(-1, 1, real.shape[-1], dtype=torch.float64)).sum().backward()
    grads = {n: p.grad for n, p in module.named_parameters() if p.grad is not None}
    return real.detach(), grads, x.grad


@pytest.mark.parametrize("fill", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("name", list(MODULES))
def test_non_finite_padding_reaches_no_output_and_no_gradient(name, fill):
    out, grads, x_grad = _run(name, fill)
    ref_out, ref_grads, ref_x_grad = _run(name, 0.0)
    torch.testing.assert_close(out, ref_out, rtol=0, atol=0)
    assert grads.keys() == ref_grads.keys() and grads
    for n, g in grads.items():
        assert torch.isfinite(g).all(), f"{name}: gradient of {n} is not finite"
        torch.testing.assert_close(g, ref_grads[n], rtol=0, atol=0, msg=f"{name}: gradient of {n}")
    assert torch.isfinite(x_grad).all()
    torch.testing.assert_close(x_grad[KEEP], ref_x_grad[KEEP], rtol=0, atol=0)
    assert (x_grad[~KEEP] == 0).all()  # the loss reads no padded output: nothing flows back to padding


def test_clear_padding_selects_only_non_finite_padded_entries():
    x = torch.tensor([[[1.0, float("nan")], [float("inf"), 2.0], [3.0, -float("inf")]]])
    keep = torch.tensor([[True, False, False]])
    got = clear_padding(x, keep)
    assert torch.isnan(got[0, 0, 1])  # a real position keeps its NaN: NaN in real inputs propagates
    assert got[0, 1].tolist() == [0.0, 2.0] and got[0, 2].tolist() == [3.0, 0.0]  # finite padding is kept
    assert clear_padding(x, None) is x


def test_clear_key_padding_clears_queries_only_in_self_attention():
    x = torch.full((1, 3, 2), float("nan"))
    pad = torch.tensor([[False, True, True]])
    q, k, v = clear_key_padding(x, x, x, pad, self_attention=False)
    assert q is x and torch.isnan(k[0, 0]).all() and (k[0, 1:] == 0).all() and (v[0, 1:] == 0).all()
    q, _, _ = clear_key_padding(x, x, x, pad, self_attention=True)
    assert (q[0, 1:] == 0).all() and torch.isnan(q[0, 0]).all()
