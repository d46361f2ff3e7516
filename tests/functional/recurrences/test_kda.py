"""Kimi Delta Attention: equal channel gates are Gated DeltaNet, and it matches transformers' Kimi Linear fallbacks."""

import pytest
import torch
import torch.nn.functional as F

from attnkit.functional.recurrences import FORMS, gated_delta_rule, kimi_delta_attention

pytest.importorskip("transformers")
from transformers.models.kimi_linear import modeling_kimi_linear as kimi

TOL = dict(rtol=0, atol=1e-10)


def _inputs(seed=0, b=2, h=3, n=10, dk=5, dv=7, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=dtype)
    return r(b, h, n, dk), r(b, h, n, dk), r(b, h, n, dv), F.logsigmoid(r(b, h, n, dk)), torch.sigmoid(r(b, h, n))


@pytest.mark.parametrize("form", FORMS)
def test_equal_channel_gates_are_gated_deltanet_and_no_write_only_decays(form):
    q, k, v, g, beta = _inputs()
    s0 = torch.randn(2, 3, 5, 7, dtype=torch.float64)
    head_gate = g[..., 0]
    got = kimi_delta_attention(q, k, v, head_gate[..., None].expand_as(g), beta, form=form, initial_state=s0)
    want = gated_delta_rule(q, k, v, head_gate, beta, form=form, initial_state=s0)
    torch.testing.assert_close(got[0], want[0], **TOL)
    torch.testing.assert_close(got[1], want[1], **TOL)
    _, state = kimi_delta_attention(q, k, v, g, torch.zeros_like(beta), form=form, initial_state=s0, chunk_size=4)
    torch.testing.assert_close(state, g.sum(2).exp()[..., None] * s0, **TOL)


@pytest.mark.parametrize("fallback", ["chunk", "recurrent"])
def test_matches_transformers_kimi_delta_attention(fallback):
    q, k, v, g, beta = _inputs(1, h=4, n=37, dk=8, dv=8, dtype=torch.float32)  # Kimi Linear: dv = dk
    s0 = torch.randn(2, 4, 8, 8)
    t = lambda x: x.transpose(1, 2).contiguous()
    if fallback == "chunk":
        out_t, state_t = kimi.chunk_kimi_delta_attention(t(q), t(k), t(v), g=t(g), beta=t(beta), chunk_size=16,
                                                         initial_state=s0, output_final_state=True,
                                                         use_qk_l2norm_in_kernel=True)
    else:
        out_t, state_t = kimi.recurrent_kimi_delta_attention(t(q), t(k), t(v), g=t(g), beta=t(beta), initial_state=s0,
                                                             output_final_state=True, use_qk_l2norm_in_kernel=True)
    out, state = kimi_delta_attention(q, k, v, g, beta, normalize_qk=True, initial_state=s0, form=fallback)
    torch.testing.assert_close(out.transpose(1, 2), out_t, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state, state_t, rtol=1e-5, atol=1e-5)
