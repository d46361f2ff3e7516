"""RoPE scalings: inverse frequencies and attention factors equal transformers' ROPE_INIT_FUNCTIONS.

transformers computes in float32 (relative error ~1e-7); each scaling is built here from a
transformers config with ``scaling_from_transformers`` and by hand, and both must give
transformers' numbers. Reductions: factor 1 (and, for LongRoPE, rescale factors 1) is plain RoPE.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from attnkit.errors import ArgumentError
from attnkit.nn.rope_scaling import (
    DynamicNTKScaling,
    LinearScaling,
    Llama3Scaling,
    LongRopeScaling,
    ProportionalScaling,
    YarnScaling,
    scaling_from_dict,
    scaling_from_transformers,
    yarn_mscale,
)
from attnkit.nn.rotary import RotaryEmbedding

HEAD_DIM = 22  # 11 pairs: no power of two hides a swapped index
BASE = 5000.0


def _config(params: dict, *, max_position=64, fraction=None) -> LlamaConfig:
    rope = {"rope_theta": BASE, **params}
    if fraction is not None:
        rope["partial_rotary_factor"] = fraction
    return LlamaConfig(hidden_size=HEAD_DIM * 2, num_attention_heads=2, max_position_embeddings=max_position,
                       rope_parameters=rope)


def _plain(d: int) -> torch.Tensor:
    """theta_i = base^(-2i / d) in float64, written out."""
    return torch.tensor([BASE ** (-2 * i / d) for i in range(d // 2)], dtype=torch.float64)


CASES = {
    "linear": ({"rope_type": "linear", "factor": 3.0}, LinearScaling(3.0)),
    "dynamic": ({"rope_type": "dynamic", "factor": 2.5}, DynamicNTKScaling(2.5, 64)),
    "yarn": ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
             YarnScaling(4.0, 16)),
    "yarn-deepseek": ({"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 16, "mscale": 0.7,
                       "mscale_all_dim": 1.3, "beta_fast": 24.0, "beta_slow": 2.0},
                      YarnScaling(40.0, 16, 24.0, 2.0, mscale=0.7, mscale_all_dim=1.3)),
    "yarn-untruncated": ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                          "truncate": False}, YarnScaling(4.0, 16, truncate=False)),
    "llama3": ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32}, Llama3Scaling(8.0, 1.0, 4.0, 32)),
    "longrope": ({"rope_type": "longrope", "short_factor": [1.0 + 0.1 * i for i in range(11)],
                  "long_factor": [2.0 + 0.3 * i for i in range(11)], "original_max_position_embeddings": 16},
                 LongRopeScaling(tuple(1.0 + 0.1 * i for i in range(11)), tuple(2.0 + 0.3 * i for i in range(11)),
                                 16, 4.0)),
    "proportional": ({"rope_type": "proportional", "factor": 2.0, "partial_rotary_factor": 0.3},
                     ProportionalScaling(0.3, 2.0)),
    "proportional-whole": ({"rope_type": "proportional", "partial_rotary_factor": 1.0}, ProportionalScaling(1.0)),
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("length", [10, 64, 200])
def test_frequencies_and_attention_factor_equal_transformers(name, length):
    params, ours = CASES[name]
    config = _config(params)
    kind = params["rope_type"]
    want, want_factor = ROPE_INIT_FUNCTIONS[kind](config, torch.device("cpu"), seq_len=length)
    if kind == "dynamic":  # transformers keeps the base below max_position: the formula at max(length, L0)
        want, want_factor = ROPE_INIT_FUNCTIONS[kind](config, torch.device("cpu"), seq_len=max(length, 64))
    for scaling in (ours, scaling_from_transformers(config.rope_parameters, 64)):
        rope = RotaryEmbedding(HEAD_DIM, base=BASE, scaling=scaling)
        theta, factor = rope.frequencies(length)
        torch.testing.assert_close(theta, want.double(), rtol=2e-6, atol=0)
        assert factor == pytest.approx(want_factor, rel=1e-12)


def test_partial_rotation_scales_the_rotated_features_only():
    config = _config({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}, fraction=0.3)
    want, want_factor = ROPE_INIT_FUNCTIONS["yarn"](config, torch.device("cpu"))
    rope = RotaryEmbedding(HEAD_DIM, base=BASE, fraction=0.3, scaling=YarnScaling(4.0, 16))
    theta, factor = rope.frequencies(64)
    assert rope.rotated == 6 and theta.numel() == want.numel() == 3  # int(22 * 0.3) = 6 features rotated
    torch.testing.assert_close(theta, want.double(), rtol=2e-6, atol=0)
    x = torch.randn(2, 3, 5, HEAD_DIM, dtype=torch.float64)
    out = rope.rotate(x, offset=7)
    assert torch.equal(out[..., 6:], x[..., 6:])  # the pass-through part is not multiplied by the factor
    plain = RotaryEmbedding(HEAD_DIM, base=BASE, fraction=0.3, scaling=YarnScaling(4.0, 16, attention_factor=1.0))
    assert factor == want_factor > 1
    torch.testing.assert_close(out[..., :6], plain.rotate(x, offset=7)[..., :6] * factor, rtol=0, atol=1e-12)


@pytest.mark.parametrize("scaling", [LinearScaling(1.0), YarnScaling(1.0, 16), Llama3Scaling(1.0, 1.0, 4.0, 32),
                                     LongRopeScaling((1.0,) * 11, (1.0,) * 11, 16, 1.0),
                                     DynamicNTKScaling(1.0, 64)], ids=lambda s: s.kind)
def test_factor_one_is_plain_rope(scaling):
    plain, scaled = RotaryEmbedding(HEAD_DIM, base=BASE), RotaryEmbedding(HEAD_DIM, base=BASE, scaling=scaling)
    theta, factor = scaled.frequencies(40)
    torch.testing.assert_close(theta, _plain(HEAD_DIM), rtol=1e-15, atol=0)
    assert factor == 1.0
    x = torch.randn(2, 3, 5, HEAD_DIM, dtype=torch.float64)
    torch.testing.assert_close(scaled.rotate(x, offset=30), plain.rotate(x, offset=30), rtol=0, atol=1e-13)


def test_transcriptions_of_the_papers():
    theta = _plain(HEAD_DIM)
    rope = lambda s: RotaryEmbedding(HEAD_DIM, base=BASE, scaling=s).frequencies(100)
    # linear interpolation (Chen et al. 2023, eq. 4): every frequency over s
    torch.testing.assert_close(rope(LinearScaling(3.0))[0], theta / 3, rtol=1e-15, atol=0)
    # dynamic NTK at L = 100 > L0 = 64: base' = base (s L / L0 - s + 1)^(d / (d - 2))
    grown = BASE * (2.5 * 100 / 64 - 1.5) ** (HEAD_DIM / (HEAD_DIM - 2))
    want = torch.tensor([grown ** (-2 * i / HEAD_DIM) for i in range(11)], dtype=torch.float64)
    torch.testing.assert_close(rope(DynamicNTKScaling(2.5, 64))[0], want, rtol=1e-13, atol=0)
    # YaRN: the fastest pairs (many turns in L0) keep theta, the slowest are interpolated, a = 0.1 ln s + 1
    got, a = rope(YarnScaling(4.0, 16))
    assert got[0].item() == theta[0].item() and got[-1].item() == pytest.approx(theta[-1].item() / 4, rel=1e-14)
    assert a == pytest.approx(0.1 * math.log(4.0) + 1)
    assert yarn_mscale(40.0, 0.7) == pytest.approx(0.07 * math.log(40) + 1) and yarn_mscale(0.5) == 1.0
    # Llama 3: wavelength 2 pi / theta above L0 / low kept over s, below L0 / high kept
    got, _ = rope(Llama3Scaling(8.0, 1.0, 4.0, 32))
    for g, t in zip(got.tolist(), theta.tolist(), strict=True):
        wavelength = 2 * math.pi / t
        if wavelength < 32 / 4:
            assert g == t
        elif wavelength > 32:
            assert g == pytest.approx(t / 8, rel=1e-15)
        else:
            smooth = (32 / wavelength - 1) / 3
            assert g == pytest.approx((1 - smooth) * t / 8 + smooth * t, rel=1e-14)
    # LongRoPE: per-pair rescale, short set up to L0 and long set beyond; a = sqrt(1 + ln s / ln L0)
    short, long = tuple(1.0 + i for i in range(11)), tuple(2.0 * (i + 1) for i in range(11))
    scaling = LongRopeScaling(short, long, 16, 4.0)
    theta_short, a = RotaryEmbedding(HEAD_DIM, base=BASE, scaling=scaling).frequencies(16)
    theta_long, _ = RotaryEmbedding(HEAD_DIM, base=BASE, scaling=scaling).frequencies(17)
    torch.testing.assert_close(theta_short, theta / torch.tensor(short, dtype=torch.float64), rtol=1e-15, atol=0)
    torch.testing.assert_close(theta_long, theta / torch.tensor(long, dtype=torch.float64), rtol=1e-15, atol=0)
    assert a == pytest.approx(math.sqrt(1 + math.log(4) / math.log(16)))


def test_length_dependent_scalings_read_the_calls_last_position():
    rope = RotaryEmbedding(HEAD_DIM, base=BASE, scaling=DynamicNTKScaling(2.0, 8))
    q, k = torch.randn(1, 1, 3, HEAD_DIM, dtype=torch.float64), torch.randn(1, 1, 20, HEAD_DIM, dtype=torch.float64)
    q_rot, _ = rope(q, k, q_offset=17)
    theta, _ = rope.frequencies(20)  # max(17 + 3, 0 + 20)
    angle = 18 * theta[0].item()
    want = q[..., 1, 0] * math.cos(angle) - q[..., 1, 1] * math.sin(angle)
    torch.testing.assert_close(q_rot[..., 1, 0], want, rtol=0, atol=1e-12)
    torch.testing.assert_close(rope.rotate(q, offset=17), q_rot, rtol=0, atol=0)  # alone: the same length
    plain = RotaryEmbedding(HEAD_DIM, base=BASE)
    torch.testing.assert_close(rope.rotate(q, offset=5), plain.rotate(q, offset=5), rtol=0, atol=0)  # 8 <= L0
    assert not torch.allclose(q_rot, plain.rotate(q, offset=17))


def test_dict_round_trip_and_errors():
    for _, scaling in CASES.values():
        assert scaling_from_dict(scaling.as_dict()) == scaling
    assert scaling_from_dict(None) is None
    rope = RotaryEmbedding(HEAD_DIM, scaling={"type": "linear", "factor": 2.0})
    assert rope.scaling == LinearScaling(2.0) and "scaling=" in repr(rope)
    with pytest.raises(ArgumentError, match="type"):
        scaling_from_dict({"type": "cubic"})
    with pytest.raises(ArgumentError, match="factor must be a finite number > 0"):
        LinearScaling(0.0)
    with pytest.raises(ArgumentError, match="high_freq_factor must exceed"):
        Llama3Scaling(8.0, 4.0, 1.0, 32)
    with pytest.raises(ArgumentError, match="one value per rotated pair"):
        RotaryEmbedding(8, scaling=LongRopeScaling((1.0,), (1.0,), 16, 2.0)).frequencies(4)
    with pytest.raises(ArgumentError, match="more than 2 rotated features"):
        RotaryEmbedding(2, scaling=DynamicNTKScaling(2.0, 8)).frequencies(4)
    with pytest.raises(ArgumentError, match="rope_type 'cubic'"):
        scaling_from_transformers({"rope_type": "cubic", "rope_theta": 1.0}, 64)
    with pytest.raises(ArgumentError, match=r"fraction must be a number in \[0, 1\]"):
        ProportionalScaling(1.5)
    assert scaling_from_transformers({"rope_type": "default", "rope_theta": 1.0}, 64) is None


def test_proportional_turns_the_first_pairs_at_the_whole_heads_frequencies():
    """Written out: pairs ``i < floor(0.3 * 22 / 2) = 3`` turn at ``base^(-2i / 22) / 2``, the other 8 stay; a
    partial rotation of the same share differs (its 3 pairs take ``base^(-2i / 6)``)."""
    theta, factor = RotaryEmbedding(HEAD_DIM, base=BASE, scaling=ProportionalScaling(0.3, 2.0)).frequencies(40)
    want = torch.tensor([BASE ** (-2 * i / HEAD_DIM) / 2 if i < 3 else 0.0 for i in range(11)], dtype=torch.float64)
    torch.testing.assert_close(theta, want, rtol=1e-15, atol=0)
    assert factor == 1.0
    partial, _ = RotaryEmbedding(HEAD_DIM, base=BASE, fraction=6 / HEAD_DIM).frequencies(40)
    assert partial.numel() == 3 and not torch.allclose(partial, want[:3] * 2)
    rope = RotaryEmbedding(HEAD_DIM, base=BASE, pairing="half", scaling=ProportionalScaling(0.3))
    x = torch.randn(2, 5, HEAD_DIM, dtype=torch.float64)
    out = rope.rotate(x, offset=3)
    still = [i for i in range(HEAD_DIM) if i % 11 >= 3]  # half pairing: pair i is features (i, i + 11)
    assert torch.equal(out[..., still], x[..., still]) and not torch.allclose(out, x)
