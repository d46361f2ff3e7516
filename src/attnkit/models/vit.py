"""Vision Transformer (Dosovitskiy et al. 2021): an image as a sequence of patches through a Transformer encoder."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ArgumentError, check_int
from ..nn._inputs import check_floating, check_like, check_shape
from .blocks import check_dropout
from .stacks import TransformerEncoder

__all__ = ["VisionTransformer"]


def _pair(who: str, name: str, value) -> tuple[int, int]:
    pair = (value, value) if isinstance(value, int) and not isinstance(value, bool) else tuple(value)
    if len(pair) != 2:
        raise ArgumentError(f"{who}: {name} must be an int or a pair (height, width); got {value!r}")
    return check_int(who, name, pair[0], 1), check_int(who, name, pair[1], 1)


class VisionTransformer(nn.Module):
    """Vision Transformer (ViT): patches + class token + learned positions, a pre-norm encoder, a linear head.

    Dosovitskiy et al. 2021, "An Image is Worth 16x16 Words", arXiv:2010.11929, eqs. 1-4::

        z_0 = [x_class; x_p^1 E; ...; x_p^N E] + E_pos          (1)   N = HW / P^2 patches
        z'_l = MSA(LN(z_{l-1})) + z_{l-1}                        (2)
        z_l = MLP(LN(z'_l)) + z'_l                               (3)   MLP: two layers, GELU
        y = LN(z_L^0);  logits = y W_head                        (4)

    Notation: ``E`` = ``patch_embed`` (a convolution with kernel = stride = P, i.e. the linear map
    of each flattened patch), ``x_class`` = ``cls_token``, ``E_pos`` = ``pos_embed`` ``(N + 1, dim)``,
    ``P`` = ``patch_size``; ``MSA`` is any attnkit self-attention (``attention``, as in
    :class:`TransformerEncoder`).

    Differences from the paper: small defaults for 16x16 grayscale images; ``pool="mean"`` (mean of
    the patch tokens instead of the class token) is an option; the head is one linear layer (the
    paper's fine-tuning head). Positions and the class token start as N(0, 0.02^2).

    Shapes: ``images`` ``(B, in_channels, H, W)`` with ``(H, W)`` = ``image_size`` -> logits
    ``(B, num_classes)``; :meth:`features` gives the encoder output ``(B, N + 1, dim)``.

    Complexity: ``O(L B N^2 dim + L B N dim ff_dim)`` for softmax attention, ``L = depth``.

    Args:
        image_size: int or (H, W).
        patch_size: int or (P_h, P_w), dividing ``image_size``.
        in_channels: image channels.
        num_classes: classes.
        dim, depth, num_heads: encoder width, layers, heads (MLP width ``4 dim``).
        dropout: after the embeddings and in every layer, training only.
        attention: self-attention (name or factory, see :class:`TransformerEncoder`).
        pool: "cls" or "mean".

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> vit = VisionTransformer(8, 2, num_classes=3, dim=16, depth=1, num_heads=2)
        >>> vit(torch.randn(5, 1, 8, 8)).shape
        torch.Size([5, 3])
        >>> vit.features(torch.randn(5, 1, 8, 8)).shape  # 16 patches + the class token
        torch.Size([5, 17, 16])
    """

    def __init__(self, image_size=16, patch_size=4, *, in_channels: int = 1, num_classes: int = 10,
                 dim: int = 64, depth: int = 2, num_heads: int = 4, dropout: float = 0.0, attention="softmax",
                 pool: str = "cls"):
        super().__init__()
        who = "VisionTransformer"
        self.image_size, self.patch_size = _pair(who, "image_size", image_size), _pair(who, "patch_size", patch_size)
        grid = tuple(s // p for s, p in zip(self.image_size, self.patch_size, strict=True))
        if any(s % p for s, p in zip(self.image_size, self.patch_size, strict=True)):
            raise ArgumentError(f"{who}: patch_size {self.patch_size} must divide image_size {self.image_size}")
        if pool not in ("cls", "mean"):
            raise ArgumentError(f"{who}: pool must be 'cls' or 'mean'; got {pool!r}")
        self.in_channels = check_int(who, "in_channels", in_channels, 1)
        self.num_classes, self.pool = check_int(who, "num_classes", num_classes, 1), pool
        self.dropout, self.num_patches = check_dropout(who, dropout), grid[0] * grid[1]
        self.patch_embed = nn.Conv2d(in_channels, dim, self.patch_size, stride=self.patch_size)
        self.cls_token = nn.Parameter(nn.init.trunc_normal_(torch.empty(1, 1, dim), std=0.02))
        self.pos_embed = nn.Parameter(nn.init.trunc_normal_(torch.empty(1, self.num_patches + 1, dim), std=0.02))
        self.encoder = TransformerEncoder(dim, num_heads, depth, dropout=dropout, activation="gelu",
                                          norm_first=True, attention=attention, max_len=self.num_patches + 1)
        self.head = nn.Linear(dim, num_classes)

    def _check(self, images) -> None:
        who = "VisionTransformer"
        check_floating(who, "images", images)
        check_like(who, "images", images, self)
        want = (self.in_channels, *self.image_size)
        check_shape(who, "images", images, lambda t: t.dim() == 4 and tuple(t.shape[1:]) == want,
                    f"have shape (batch, in_channels, H, W) = (batch, {want[0]}, {want[1]}, {want[2]})")

    def features(self, images: torch.Tensor) -> torch.Tensor:
        """The encoder output ``z_L`` ``(B, N + 1, dim)``, class token first (after the final LN)."""
        self._check(images)
        patches = self.patch_embed(images).flatten(2).transpose(1, 2)  # (B, dim, H/P, W/P) -> (B, N, dim)
        cls = self.cls_token.to(patches.dtype).expand(patches.shape[0], -1, -1)
        z = torch.cat([cls, patches], dim=1) + self.pos_embed.to(patches.dtype)  # (B, N + 1, dim)
        z = F.dropout(z, self.dropout, training=self.training) if self.dropout else z
        return self.encoder(z)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        z = self.features(images)
        return self.head(z[:, 0] if self.pool == "cls" else z[:, 1:].mean(1))  # (B, num_classes)
