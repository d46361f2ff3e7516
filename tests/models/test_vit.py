"""VisionTransformer: patch embedding, class token, positions, pre-norm encoder, head."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnkit.errors import ArgumentError, DTypeError, ShapeError
from attnkit.models import VisionTransformer

B, C, DIM, HEADS, CLASSES = 2, 3, 12, 3, 5


def images(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


def randomize(module, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.3 + (1.0 if p.dim() == 1 else 0.0))
    return module


def test_shapes():
    torch.manual_seed(0)
    vit = VisionTransformer((8, 12), (4, 3), in_channels=C, num_classes=CLASSES, dim=DIM, num_heads=HEADS)
    x = images(B, C, 8, 12)
    assert vit(x).shape == (B, CLASSES)
    assert vit.num_patches == 8 and vit.features(x).shape == (B, 9, DIM)


def test_embedding_is_eq1_patches_times_E_plus_positions():
    """depth=0 leaves z_0 and the final LN: check eq. 1 against flattened patches in float64."""
    vit = randomize(VisionTransformer((8, 12), (4, 3), in_channels=C, dim=DIM, depth=0, num_heads=HEADS)).double()
    x = images(B, C, 8, 12, dtype=torch.float64)
    e = vit.patch_embed.weight.reshape(DIM, -1)  # (dim, C P_h P_w): the linear map E of a flattened patch
    rows = [vit.cls_token[0, 0].expand(B, DIM)]
    for i in range(2):  # patches in row-major order
        for j in range(4):
            patch = x[:, :, 4 * i:4 * i + 4, 3 * j:3 * j + 3].reshape(B, -1)
            rows.append(patch @ e.T + vit.patch_embed.bias)
    z0 = torch.stack(rows, 1) + vit.pos_embed
    norm = vit.encoder.norm
    want = nn.functional.layer_norm(z0, (DIM,), norm.weight, norm.bias, norm.eps)
    with torch.no_grad():
        torch.testing.assert_close(vit.features(x), want, atol=1e-10, rtol=1e-10)


def test_encoder_is_eqs_2_to_4_prenorm_gelu():
    """The encoder equals torch's pre-norm GELU TransformerEncoderLayer stack plus the final LN (eq. 4)."""
    torch.manual_seed(0)
    vit = randomize(VisionTransformer(8, 4, in_channels=C, num_classes=CLASSES, dim=DIM, depth=2,
                                      num_heads=HEADS)).eval()
    layer = nn.TransformerEncoderLayer(DIM, HEADS, 4 * DIM, dropout=0.0, activation="gelu", batch_first=True,
                                       norm_first=True)
    ref = nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(DIM), enable_nested_tensor=False).eval()
    ref.load_state_dict(vit.encoder.state_dict())
    x = images(B, C, 8, 8)
    z0 = torch.cat([vit.cls_token.expand(B, -1, -1), vit.patch_embed(x).flatten(2).transpose(1, 2)], 1)
    with torch.no_grad():
        z = ref(z0 + vit.pos_embed)
        torch.testing.assert_close(vit(x), vit.head(z[:, 0]), atol=1e-5, rtol=1e-5)
        vit.pool = "mean"
        torch.testing.assert_close(vit(x), vit.head(z[:, 1:].mean(1)), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("attention", ["performer", "linformer", "bigbird", "longformer"])
def test_other_attention_runs_forward_and_backward(attention):
    torch.manual_seed(0)
    vit = VisionTransformer(8, 2, in_channels=1, num_classes=CLASSES, dim=DIM, num_heads=HEADS, attention=attention)
    out = vit(images(B, 1, 8, 8))
    out.sum().backward()
    assert out.shape == (B, CLASSES) and vit.patch_embed.weight.grad.abs().sum() > 0


def test_overfits_a_batch():
    torch.manual_seed(0)
    vit = VisionTransformer(8, 4, num_classes=4, dim=16, depth=1, num_heads=2)
    x = images(8, 1, 8, 8, seed=1)
    y = torch.arange(8) % 4
    opt = torch.optim.Adam(vit.parameters(), lr=3e-3)
    for _ in range(100):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(vit(x), y)
        loss.backward()
        opt.step()
    assert loss.item() < 0.05 and torch.equal(vit.eval()(x).argmax(-1), y)


@pytest.mark.parametrize(("build", "error", "match"), [
    (lambda: VisionTransformer(10, 4), ArgumentError, "divide"),
    (lambda: VisionTransformer(8, (2, 2, 2)), ArgumentError, "pair"),
    (lambda: VisionTransformer(8, 2, pool="max"), ArgumentError, "pool"),
    (lambda: VisionTransformer(8, 2, dim=12, num_heads=5), ArgumentError, "divisible"),
    (lambda: VisionTransformer(8, 2, attention="nope"), ArgumentError, "unknown attention"),
])
def test_bad_construction_raises(build, error, match):
    with pytest.raises(error, match=match):
        build()


def test_bad_images_raise():
    vit = VisionTransformer(8, 2, in_channels=C, dim=DIM, num_heads=HEADS)
    with pytest.raises(ShapeError, match=r"\(batch, 3, 8, 8\)"):
        vit(images(B, 1, 8, 8))
    with pytest.raises(ShapeError, match="in_channels"):
        vit(images(B, 8, 8, C))
    with pytest.raises(DTypeError, match="floating"):
        vit(torch.zeros(B, C, 8, 8, dtype=torch.long))
