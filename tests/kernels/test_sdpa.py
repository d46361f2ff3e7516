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
