"""Perceiver classifier (Jaegle et al. 2021): latents cross-attend to an input array, self-attend, pool."""

from __future__ import annotations

import math

import torch
from torch import nn

from ..errors import ArgumentError, ShapeError, check_int
from ..nn._inputs import check_floating, check_keep_mask, check_like
from ..nn.perceiver import PerceiverEncoder
from .tokens import check_tokens

__all__ = ["Perceiver", "fourier_features"]

POSITIONS = ("fourier", "learned", None)


def fourier_features(shape: tuple[int, ...], num_bands: int, *, device=None, dtype=torch.float32) -> torch.Tensor:
    """Fourier position features of an index grid ``shape``: ``(prod(shape), len(shape) * (2 num_bands + 1))``.

    Per axis of size ``mu``, positions ``x in [-1, 1]`` (``mu`` points) give ``[x, sin(f_k pi x),
    cos(f_k pi x)]`` with ``f_k`` equally spaced in ``[1, mu / 2]`` (Jaegle et al. 2021, Sec. 3.1).
    """
    axes = []
    for mu in shape:
        pos = torch.linspace(-1.0, 1.0, mu, device=device, dtype=torch.float64)  # (mu,)
        freqs = torch.linspace(1.0, max(mu / 2, 1.0), num_bands, device=device, dtype=torch.float64)
        ang = math.pi * pos[:, None] * freqs  # (mu, num_bands)
        axes.append(torch.cat([pos[:, None], ang.sin(), ang.cos()], dim=-1))  # (mu, 2 num_bands + 1)
    grids = torch.meshgrid(*[torch.arange(mu, device=device) for mu in shape], indexing="ij")
    feats = [a[g.reshape(-1)] for a, g in zip(axes, grids, strict=True)]  # each (M, 2 num_bands + 1)
    return torch.cat(feats, dim=-1).to(dtype)


class Perceiver(nn.Module):
    """Perceiver classifier: a latent array cross-attends to the input, a latent Transformer, mean pool, linear.

    Jaegle et al. 2021, "Perceiver: General Perception with Iterative Attention", arXiv:2103.03206,
    Sec. 2 and Fig. 1: with the byte array ``x`` (M x C, plus position features) and learned latents
    ``z`` (N x D), ``z = z + CrossAttn(LN(z), LN(x)); z = z + MLP(LN(z))``, then ``depth`` latent
    self-attention blocks (:class:`attnkit.nn.PerceiverEncoder`), and ``logits = mean_N(z) W``
    (Sec. 3.1: "average over the index dimension of the latent, then linear"). Position features
    (Sec. 3.1): per index axis of size ``mu``, ``[x, sin(f_k pi x), cos(f_k pi x)]``, ``x in [-1, 1]``,
    ``f_k`` equally spaced in ``[1, mu / 2]``, concatenated to the input channels.

    Notation: M = input positions (the product of the index dims), C = ``input_dim``, N =
    ``num_latents``, D = ``latent_dim``, ``k = 1..num_bands``.

    Differences from the paper: one cross-attend (no repeated, weight-shared cross-attends); the
    Fourier maximum frequency ``mu`` is each axis's size at run time; ``positions="learned"`` adds a
    learned vector per flattened position instead; ``vocab_size`` embeds token ids into C channels.

    Shapes: ``x`` ``(B, *index, input_dim)`` with ``len(index) = index_dims`` (e.g. ``(B, H, W, C)``
    images, channels last), or int tokens ``(B, *index)`` when ``vocab_size`` is set;
    ``input_keep_mask`` ``(B, M)`` bool (True = real position) -> logits ``(B, num_classes)``.

    Complexity: ``O(B M N D)`` for the cross-attention (linear in M) plus ``O(depth B N^2 D)``.

    Args:
        input_dim: channels C.
        num_classes: classes.
        vocab_size: token vocabulary (None: float input).
        index_dims: number of index axes (1: sequence, 2: image).
        positions: "fourier", "learned" (needs ``max_len``) or None.
        num_bands: Fourier bands per axis.
        max_len: most positions M.
        num_latents, latent_dim, depth, latent_heads: the latent array and Transformer.
        dropout: training only.

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> model = Perceiver(1, 4, index_dims=2, num_latents=6, latent_dim=16, depth=1, latent_heads=2)
        >>> model(torch.randn(3, 8, 8, 1)).shape  # 64 pixels, each with 2 x 9 position features
        torch.Size([3, 4])
        >>> Perceiver(8, 4, vocab_size=20, num_latents=6, latent_dim=16)(torch.randint(0, 20, (3, 30))).shape
        torch.Size([3, 4])
    """

    def __init__(self, input_dim: int, num_classes: int, *, vocab_size: int | None = None, index_dims: int = 1,
                 positions: str | None = "fourier", num_bands: int = 4, max_len: int | None = None,
                 num_latents: int = 16, latent_dim: int = 64, depth: int = 2, latent_heads: int = 4,
                 dropout: float = 0.0):
        super().__init__()
        who = "Perceiver"
        for name, value in (("input_dim", input_dim), ("num_classes", num_classes), ("index_dims", index_dims),
                            ("num_bands", num_bands), ("latent_heads", latent_heads)):
            check_int(who, name, value, 1)
        if positions not in POSITIONS:
            raise ArgumentError(f"{who}: positions must be one of {POSITIONS}; got {positions!r}")
        if positions == "learned" and max_len is None:
            raise ArgumentError(f"{who}: positions='learned' needs max_len; got None")
        if latent_dim % latent_heads:
            raise ArgumentError(f"{who}: latent_dim must be divisible by latent_heads; got {latent_dim}, "
                                f"{latent_heads}")
        self.input_dim, self.index_dims, self.positions, self.num_bands = input_dim, index_dims, positions, num_bands
        self.max_len = None if max_len is None else check_int(who, "max_len", max_len, 1)
        self.vocab_size = None if vocab_size is None else check_int(who, "vocab_size", vocab_size, 1)
        self.embed = None if vocab_size is None else nn.Embedding(vocab_size, input_dim)
        self.pos = None if positions != "learned" else nn.Parameter(torch.randn(max_len, input_dim) * 0.02)
        width = input_dim + (index_dims * (2 * num_bands + 1) if positions == "fourier" else 0)
        self.encoder = PerceiverEncoder(width, num_latents=num_latents, latent_dim=latent_dim, depth=depth,
                                        cross_heads=1, latent_heads=latent_heads,
                                        head_dim=latent_dim // latent_heads, dropout=dropout)
        self.head = nn.Linear(latent_dim, num_classes)

    def _inputs(self, x) -> torch.Tensor:
        """``x`` as the byte array ``(B, M, C')`` with position features."""
        who = "Perceiver"
        if self.embed is not None:
            if isinstance(x, torch.Tensor) and x.dim() != 1 + self.index_dims:
                raise ShapeError(f"{who}: tokens must have shape (batch, *index) with {self.index_dims} index "
                                 f"dims; got {tuple(x.shape)}")
            check_tokens(who, "tokens", x.flatten(1) if isinstance(x, torch.Tensor) else x, self.vocab_size)
            x = self.embed(x)  # (B, *index) -> (B, *index, C)
        else:
            check_floating(who, "x (or token ids with vocab_size)", x)
            check_like(who, "x", x, self)
        if x.dim() != 2 + self.index_dims or x.shape[-1] != self.input_dim:
            raise ShapeError(f"{who}: x must have shape (batch, *index, input_dim={self.input_dim}) with "
                             f"{self.index_dims} index dims; got {tuple(x.shape)}")
        index = tuple(x.shape[1:-1])
        x = x.flatten(1, -2)  # (B, *index, C) -> (B, M, C), also for B = 0
        if self.positions == "learned":
            if x.shape[1] > self.max_len:
                raise ShapeError(f"{who}: {x.shape[1]} input positions exceed max_len={self.max_len}")
            x = x + self.pos[: x.shape[1]].to(x.dtype)
        elif self.positions == "fourier":
            feats = fourier_features(index, self.num_bands, device=x.device, dtype=x.dtype)  # (M, F)
            x = torch.cat([x, feats.expand(x.shape[0], -1, -1)], dim=-1)  # (B, M, C + F)
        return x

    def forward(self, x: torch.Tensor, *, input_keep_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = self._inputs(x)
        keep = check_keep_mask("Perceiver", "input_keep_mask", input_keep_mask, *x.shape[:2])
        z = self.encoder(x, input_keep_mask=keep)  # (B, N, D)
        return self.head(z.mean(1))
