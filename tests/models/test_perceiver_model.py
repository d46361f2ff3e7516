"""Perceiver classifier: Fourier features, latent encoder, pooled head."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from attnkit.errors import ArgumentError, DTypeError, ShapeError
from attnkit.models import Perceiver
from attnkit.models.perceiver import fourier_features

B, M, C, CLASSES = 2, 7, 3, 5


def data(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def small(**kwargs):
    torch.manual_seed(0)
    args = {"num_latents": 4, "latent_dim": 12, "depth": 1, "latent_heads": 3}
    return Perceiver(C, CLASSES, **(args | kwargs)).eval()


def test_fourier_features_follow_sec_3_1():
    shape, bands = (3, 5), 2
    got = fourier_features(shape, bands, dtype=torch.float64)
    assert got.shape == (15, 2 * (2 * bands + 1))
    for i in range(3):
        for j in range(5):
            row = []
            for pos, mu in ((i, 3), (j, 5)):
                x = -1 + 2 * pos / (mu - 1)
                freqs = [1 + k * (mu / 2 - 1) / (bands - 1) for k in range(bands)]
                row += [x] + [math.sin(f * math.pi * x) for f in freqs] + [math.cos(f * math.pi * x) for f in freqs]
            torch.testing.assert_close(got[i * 5 + j], torch.tensor(row, dtype=torch.float64))


def test_shapes_for_sequences_images_and_tokens():
    assert small()(data(B, M, C)).shape == (B, CLASSES)
    assert small(index_dims=2)(data(B, 4, 6, C)).shape == (B, CLASSES)
    tokens = torch.randint(0, 9, (B, M))
    assert small(vocab_size=9)(tokens).shape == (B, CLASSES)


def test_logits_are_the_linear_map_of_the_mean_latent():
    model = small(index_dims=2)
    x = data(B, 4, 6, C)
    feats = fourier_features((4, 6), 4)
    with torch.no_grad():
        z = model.encoder(torch.cat([x.reshape(B, 24, C), feats.expand(B, -1, -1)], -1))
        torch.testing.assert_close(model(x), model.head(z.mean(1)), atol=1e-6, rtol=1e-6)


def test_without_positions_it_ignores_the_input_order_and_with_them_it_does_not():
    x, perm = data(B, M, C), torch.randperm(M, generator=torch.Generator().manual_seed(1))
    plain, fourier = small(positions=None), small()
    with torch.no_grad():
        torch.testing.assert_close(plain(x), plain(x[:, perm]), atol=1e-5, rtol=1e-5)
        assert (fourier(x) - fourier(x[:, perm])).abs().max() > 1e-4


def test_padded_sample_equals_sample_alone():
    model = small(vocab_size=9, positions="learned", max_len=M)
    tokens = torch.randint(0, 9, (B, M), generator=torch.Generator().manual_seed(2))
    keep = torch.tensor([[True] * M, [True] * 4 + [False] * (M - 4)])
    with torch.no_grad():
        torch.testing.assert_close(model(tokens, input_keep_mask=keep)[1], model(tokens[1:, :4])[0],
                                   atol=1e-5, rtol=1e-5)


def test_overfits_a_batch():
    torch.manual_seed(0)
    model = Perceiver(1, 4, index_dims=2, num_latents=8, latent_dim=32, depth=1, latent_heads=2)
    x, y = data(8, 6, 6, 1, seed=3), torch.arange(8) % 4
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(150):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    assert loss.item() < 0.05 and torch.equal(model.eval()(x).argmax(-1), y)


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"positions": "sinusoidal"}, ArgumentError, "positions"),
    ({"positions": "learned"}, ArgumentError, "max_len"),
    ({"latent_dim": 10}, ArgumentError, "divisible"),
    ({"num_bands": 0}, ArgumentError, "num_bands"),
])
def test_bad_construction_raises(kwargs, error, match):
    with pytest.raises(error, match=match):
        small(**kwargs)


def test_bad_inputs_raise():
    with pytest.raises(ShapeError, match="input_dim=3"):
        small()(data(B, M, C + 1))
    with pytest.raises(ShapeError, match="1 index dims"):
        small()(data(B, 2, M, C))
    with pytest.raises(DTypeError, match="floating"):
        small()(torch.zeros(B, M, C, dtype=torch.long))
    with pytest.raises(ArgumentError, match=r"\[0, 9\)"):
        small(vocab_size=9)(torch.full((B, M), 9))
    with pytest.raises(ShapeError, match="max_len=4"):
        small(positions="learned", max_len=4)(data(B, M, C))
    with pytest.raises(ShapeError, match="input_keep_mask"):
        small()(data(B, M, C), input_keep_mask=torch.ones(B, M + 1, dtype=torch.bool))
