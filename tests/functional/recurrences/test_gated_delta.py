"""Gated DeltaNet: no gate is DeltaNet, no write only decays, and it matches transformers' Qwen3-Next fallbacks."""

import pytest
import torch
import torch.nn.functional as F

from attnkit.functional.recurrences import FORMS, delta_rule, gated_delta_rule

pytest.importorskip("transformers")
from transformers.models.qwen3_next import modeling_qwen3_next as qwen

TOL = dict(rtol=0, atol=1e-10)


def _inputs(seed=0, b=2, hk=3, h=3, n=10, dk=5, dv=7, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=dtype)
    return r(b, hk, n, dk), r(b, hk, n, dk), r(b, h, n, dv), F.logsigmoid(r(b, h, n)), torch.sigmoid(r(b, h, n))


@pytest.mark.parametrize("form", FORMS)
def test_no_gate_is_the_delta_rule_and_no_write_only_decays(form):
    q, k, v, g, beta = _inputs()
    s0 = torch.randn(2, 3, 5, 7, dtype=torch.float64)
    got = gated_delta_rule(q, k, v, torch.zeros_like(g), beta, form=form, initial_state=s0, chunk_size=3)
    want = delta_rule(q, k, v, beta, form=form, initial_state=s0, chunk_size=3)
    torch.testing.assert_close(got[0], want[0], **TOL)
    torch.testing.assert_close(got[1], want[1], **TOL)
    _, state = gated_delta_rule(q, k, v, g, torch.zeros_like(beta), form=form, initial_state=s0, chunk_size=3)
    torch.testing.assert_close(state, g.sum(-1).exp()[..., None, None] * s0, **TOL)


def _transformers_layout(*ts):
    return [t.transpose(1, 2).contiguous() for t in ts]


@pytest.mark.parametrize("fallback", ["chunk", "recurrent"])
def test_matches_transformers_torch_gated_delta_rule(fallback):
    q, k, v, g, beta = _inputs(1, hk=2, h=4, n=37, dk=8, dv=6, dtype=torch.float32)  # grouped values, as Qwen3-Next
    s0 = torch.randn(2, 4, 8, 6)
    fn = qwen.torch_chunk_gated_delta_rule if fallback == "chunk" else qwen.torch_recurrent_gated_delta_rule
    extra = {"chunk_size": 16} if fallback == "chunk" else {}
    out_t, state_t = fn(*_transformers_layout(q, k, v), g=g.transpose(1, 2), beta=beta.transpose(1, 2),
                        initial_state=s0, output_final_state=True, use_qk_l2norm_in_kernel=True, **extra)
    out, state = gated_delta_rule(q, k, v, g, beta, normalize_qk=True, initial_state=s0, form=fallback)
    torch.testing.assert_close(out.transpose(1, 2), out_t, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state, state_t, rtol=1e-5, atol=1e-5)
