"""Rotary position embedding (RoPE): rotate pairs of query/key features by position-dependent angles."""

from __future__ import annotations

import math

import torch
from torch import nn

from ..errors import ArgumentError, check_int
from ._inputs import check_floating, check_shape

__all__ = ["RotaryEmbedding"]


def check_offset(who: str, name: str, offset) -> int:
    """``offset`` must be a non-negative int (the absolute position of the first token)."""
    return check_int(who, name, offset, 0, " (absolute position of the first token)")


def check_base(who: str, base) -> float:
    if isinstance(base, bool) or not isinstance(base, (int, float)) or not math.isfinite(base) or base <= 1:
        raise ArgumentError(f"{who}: base must be a finite number > 1; got {base!r}")
    return float(base)


def check_dim(who: str, name: str, value) -> int:
    return check_int(who, name, value, 1)


def angle_dtype(device: torch.device) -> torch.dtype:
    """Angles ``position * frequency`` in float64 where the device has it: large positions keep their phase."""
    return torch.float32 if device.type == "mps" else torch.float64


class RotaryEmbedding(nn.Module):
    """Rotary position embedding: queries and keys rotated so that ``q . k`` sees only ``m - n``.

    Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding",
    arXiv:2104.09864, eq. 34 (the efficient form of eq. 15). Features are taken in
    adjacent pairs ``(x_{2i}, x_{2i+1})``, and the pair ``i`` of a token at absolute
    position ``m`` is rotated by the angle ``m * theta_i``::

        R_m x = x * [cos m t_0, cos m t_0, cos m t_1, ...] + [-x_1, x_0, -x_3, x_2, ...] * [sin m t_0, sin m t_0, ...]
        theta_i = base^(-2i / d),  i = 0 .. d/2 - 1

    so that ``(R_m q) . (R_n k) = q^T R_{n-m} k`` depends on the positions only through
    ``n - m`` (eq. 16).

    Notation: paper ``d`` = ``dim`` (rounded down to even, see below), ``10000`` = ``base``,
    ``m`` = ``q_offset + i`` for query row ``i``, ``n`` = ``k_offset + j`` for key row ``j``.

    Decoding: positions are absolute, so a query at position ``p`` must be given
    ``q_offset=p``. With one new query against ``L`` cached keys (rotated when they
    were appended, or passed whole with ``k_offset=0``), ``q_offset = L - 1``: the
    bottom-right alignment of :func:`attnkit.masks.causal`::

        keys     0 1 2 3 4
        query            4   (q_offset = 4, k_offset = 0)

    Differences from the paper: the paper assumes an even ``d``; for odd ``dim`` the
    last feature is left unrotated, i.e. ``RotaryEmbedding(2r + 1)`` equals
    ``RotaryEmbedding(2r)`` on the first ``2r`` features with the last one passed
    through. Angles are computed in float64 and the rotation in float32 or better,
    then cast back to the input dtype.

    Shapes:
        q: ``(B, H, Lq, dim)`` (any ``(..., Lq, dim)``); k: ``(B, H_kv, Lk, dim)``.
        Returns rotated ``q`` and ``k`` with the same shapes and dtypes.

    Complexity:
        ``O((Lq + Lk) * dim)`` time per batch and head; no parameters, no buffers.

    Args:
        dim: features per head (the last dim of q and k).
        base: the frequency base (10000 in the paper); > 1.

    Example:
        >>> import torch
        >>> from attnkit.nn.rotary import RotaryEmbedding
        >>> _ = torch.manual_seed(0)
        >>> rope = RotaryEmbedding(8)
        >>> q, k = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 7, 8)
        >>> q_rot, k_rot = rope(q, k, q_offset=2)
        >>> q_rot.shape, k_rot.shape
        (torch.Size([2, 3, 5, 8]), torch.Size([2, 3, 7, 8]))
        >>> bool(torch.allclose(q_rot.norm(dim=-1), q.norm(dim=-1)))  # a rotation keeps lengths
        True
    """

    def __init__(self, dim: int, *, base: float = 10000.0):
        super().__init__()
        self.dim = check_dim("RotaryEmbedding", "dim", dim)
        self.base = check_base("RotaryEmbedding", base)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, base={self.base:g}"

    def angles(self, length: int, *, offset: int = 0, device=None) -> torch.Tensor:
        """Angles ``m * theta_i`` for positions ``offset .. offset + length - 1``: ``(length, dim // 2)``."""
        device = torch.device("cpu") if device is None else torch.device(device)
        dt = angle_dtype(device)
        pairs = self.dim // 2
        theta = self.base ** (-2.0 * torch.arange(pairs, device=device, dtype=dt) / (2 * pairs))
        pos = torch.arange(offset, offset + length, device=device, dtype=dt)
        return pos[:, None] * theta  # (length, pairs)

    def rotate(self, x: torch.Tensor, *, offset: int = 0) -> torch.Tensor:
        """Rotate ``x`` of shape ``(..., L, dim)`` whose row ``i`` sits at absolute position ``offset + i``."""
        return self._rotate(x, offset, "x", "offset")

    def forward(self, q: torch.Tensor, k: torch.Tensor, *, q_offset: int = 0, k_offset: int = 0):
        """Rotated ``(q, k)``; query row ``i`` at position ``q_offset + i``, key row ``j`` at ``k_offset + j``."""
        return self._rotate(q, q_offset, "q", "q_offset"), self._rotate(k, k_offset, "k", "k_offset")

    def _rotate(self, x, offset, name: str, offset_name: str) -> torch.Tensor:
        self._check(x, name)
        offset = check_offset("RotaryEmbedding", offset_name, offset)
        compute = torch.float64 if x.dtype == torch.float64 else torch.float32
        ang = self.angles(x.shape[-2], offset=offset, device=x.device)
        cos, sin = ang.cos().to(compute), ang.sin().to(compute)  # (L, pairs)
        rot = 2 * (self.dim // 2)
        pairs = x[..., :rot].to(compute).unflatten(-1, (-1, 2))  # (..., L, pairs, 2)
        even, odd = pairs[..., 0], pairs[..., 1]
        out = torch.stack((even * cos - odd * sin, odd * cos + even * sin), dim=-1).flatten(-2)  # (..., L, rot)
        if rot < self.dim:
            out = torch.cat((out, x[..., rot:].to(compute)), dim=-1)
        return out.to(x.dtype)

    def _check(self, t, name: str) -> None:
        check_floating("RotaryEmbedding", name, t)
        check_shape("RotaryEmbedding", name, t, lambda t: t.dim() >= 2 and t.shape[-1] == self.dim,
                    f"have shape (..., L, dim={self.dim}), usually (B, H, L, {self.dim})")
