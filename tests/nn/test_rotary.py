"""RotaryEmbedding's pairings and partial rotation against float64 rotation matrices and transformers' layers.

The interleaved pairing's transcription is in test_positional.py (RoFormer eq. 15); here the
half-split pairing (GPT-NeoX / Llama: feature ``i`` with ``i + d/2``) and the partial rotation
(the first ``d`` features) are written as block rotations with loops, and checked against
transformers' own ``apply_rotary_pos_emb`` (Llama: half pairing; Qwen3-Next: partial).
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as llama_rope
from transformers.models.qwen3_next.modeling_qwen3_next import apply_rotary_pos_emb as partial_rope

from attnkit.errors import ArgumentError
from attnkit.nn.rotary import RotaryEmbedding


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def ref_rotate(x, offset, *, rotated, half, base=10000.0):
    """Rotate pairs (i, i + d/2) (half) or (2i, 2i + 1) of the first ``rotated`` features by m * base^(-2i/d)."""
    out = x.clone()
    d = rotated
    for t in range(x.shape[-2]):
        m = offset + t
        for i in range(d // 2):
            a, b = (i, i + d // 2) if half else (2 * i, 2 * i + 1)
            c, s = math.cos(m * base ** (-2 * i / d)), math.sin(m * base ** (-2 * i / d))
            out[..., t, a] = x[..., t, a] * c - x[..., t, b] * s
            out[..., t, b] = x[..., t, b] * c + x[..., t, a] * s
    return out


@pytest.mark.parametrize(("dim", "fraction", "rotated"), [(10, 1.0, 10), (11, 1.0, 10), (12, 0.5, 6), (12, 0.25, 2),
                                                          (14, 0.3, 4)])
@pytest.mark.parametrize("pairing", ["interleaved", "half"])
def test_pairings_and_partial_rotation_equal_block_rotations(dim, fraction, rotated, pairing):
    rope = RotaryEmbedding(dim, base=300.0, pairing=pairing, fraction=fraction)
    assert rope.rotated == rotated
    q, k = _randn(2, 3, 5, dim), _randn(2, 1, 7, dim, seed=1)
    q_rot, k_rot = rope(q, k, q_offset=4, k_offset=2)
    half = pairing == "half"
    torch.testing.assert_close(q_rot, ref_rotate(q, 4, rotated=rotated, half=half, base=300.0), rtol=0, atol=1e-12)
    torch.testing.assert_close(k_rot, ref_rotate(k, 2, rotated=rotated, half=half, base=300.0), rtol=0, atol=1e-12)


def test_the_two_pairings_differ_by_a_fixed_permutation_and_give_the_same_scores():
    d = 12
    perm = torch.tensor([j for i in range(d // 2) for j in (i, i + d // 2)])  # half layout -> interleaved layout
    q, k = _randn(2, 3, 5, d), _randn(2, 3, 7, d, seed=1)
    inter, half = RotaryEmbedding(d), RotaryEmbedding(d, pairing="half")
    torch.testing.assert_close(half.rotate(q, offset=3)[..., perm], inter.rotate(q[..., perm], offset=3),
                               rtol=0, atol=1e-12)
    qi, ki = inter(q[..., perm], k[..., perm])
    qh, kh = half(q, k)
    torch.testing.assert_close(qh @ kh.transpose(-1, -2), qi @ ki.transpose(-1, -2), rtol=0, atol=1e-12)
    assert not torch.allclose(half.rotate(q, offset=3), inter.rotate(q, offset=3))  # yet not the same map


def test_half_pairing_equals_llama_and_partial_equals_qwen3_next():
    config = LlamaConfig(hidden_size=48, num_attention_heads=3, rope_parameters={"rope_type": "default",
                                                                                 "rope_theta": 500.0})
    positions = torch.arange(3, 9)[None]
    q, k = _randn(1, 3, 6, 16).float(), _randn(1, 3, 6, 16, seed=1).float()
    cos, sin = LlamaRotaryEmbedding(config)(q, positions)
    want_q, want_k = llama_rope(q, k, cos, sin)
    got_q, got_k = RotaryEmbedding(16, base=500.0, pairing="half")(q, k, q_offset=3, k_offset=3)
    torch.testing.assert_close(got_q, want_q, rtol=0, atol=1e-5)
    torch.testing.assert_close(got_k, want_k, rtol=0, atol=1e-5)
    angles = _angles(positions, 4, 500.0)  # Qwen3-Next's table for 4 rotated features: theta over d = 4
    cos4, sin4 = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    want_q, want_k = partial_rope(q, k, cos4.float(), sin4.float())
    got_q, got_k = RotaryEmbedding(16, base=500.0, pairing="half", fraction=0.25)(q, k, q_offset=3, k_offset=3)
    torch.testing.assert_close(got_q, want_q, rtol=0, atol=1e-5)
    torch.testing.assert_close(got_k, want_k, rtol=0, atol=1e-5)


def _angles(positions, d, base):
    theta = torch.tensor([base ** (-2 * i / d) for i in range(d // 2)], dtype=torch.float64)
    return positions[..., None].double() * theta  # (1, L, d/2)


def test_errors_and_repr():
    with pytest.raises(ArgumentError, match="pairing must be one of"):
        RotaryEmbedding(8, pairing="adjacent")
    for bad in (0.0, 1.5, True):
        with pytest.raises(ArgumentError, match=r"fraction must be a number in \(0, 1\]"):
            RotaryEmbedding(8, fraction=bad)
    assert repr(RotaryEmbedding(8, pairing="half", fraction=0.5)) == (
        "RotaryEmbedding(dim=8, base=10000, pairing='half', fraction=0.5)")
    assert repr(RotaryEmbedding(8)) == "RotaryEmbedding(dim=8, base=10000)"
    assert torch.equal(RotaryEmbedding(8, fraction=0.2).rotate(_randn(2, 5, 8)), _randn(2, 5, 8))  # nothing rotated
