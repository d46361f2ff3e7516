"""Rotary position embedding (RoPE): rotate pairs of query/key features by position-dependent angles."""

from __future__ import annotations

import math

import torch
from torch import nn

from ..errors import ArgumentError, DTypeError, check_int
from ._inputs import check_floating, check_shape
from .rope_scaling import RopeScaling, scaling_from_dict

__all__ = ["RotaryEmbedding", "PAIRINGS", "rotary_for"]

PAIRINGS = ("interleaved", "half")


def check_offset(who: str, name: str, offset) -> int:
    """``offset`` must be a non-negative int (the absolute position of the first token)."""
    if type(offset) is int and offset >= 0:  # the common case, without the shared check's call
        return offset
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
    arXiv:2104.09864, eq. 34 (the efficient form of eq. 15). Feature pair ``i`` of a token at
    absolute position ``m`` is rotated by the angle ``m * theta_i``; with ``pairing="interleaved"``
    (the paper's) the pairs are adjacent features ``(x_{2i}, x_{2i+1})``::

        R_m x = x * [cos m t_0, cos m t_0, cos m t_1, ...] + [-x_1, x_0, -x_3, x_2, ...] * [sin m t_0, sin m t_0, ...]
        theta_i = base^(-2i / d),  i = 0 .. d/2 - 1

    so that ``(R_m q) . (R_n k) = q^T R_{n-m} k`` depends on the positions only through
    ``n - m`` (eq. 16). ``pairing="half"`` pairs feature ``i`` with ``i + d/2`` (GPT-NeoX, Llama and
    their checkpoints): ``[x1, x2] -> [x1 cos - x2 sin, x2 cos + x1 sin]``, the same rotation up to a
    fixed permutation of the features. ``fraction < 1`` rotates only the first ``d`` features
    (partial RoPE, GPT-NeoX's ``rotary_pct``); the rest pass through. ``scaling``
    (:mod:`attnkit.nn.rope_scaling`: linear, dynamic NTK, YaRN, Llama 3, LongRoPE) replaces the
    ``theta_i`` for long contexts and may multiply the rotated features by an attention factor.

    Notation: paper ``d`` = the rotated features, ``2 * floor(dim * fraction / 2)``; ``10000`` =
    ``base``; ``m`` = ``q_offset + i`` for query row ``i``, ``n`` = ``k_offset + j`` for key row ``j``.

    Decoding: positions are absolute, so a query at position ``p`` must be given
    ``q_offset=p``. With one new query against ``L`` cached keys (rotated when they
    were appended, or passed whole with ``k_offset=0``), ``q_offset = L - 1``: the
    bottom-right alignment of :func:`attnkit.masks.causal`::

        keys     0 1 2 3 4
        query            4   (q_offset = 4, k_offset = 0)

    A scaling that depends on the length (dynamic NTK, LongRoPE) reads the length as the last
    position of the call plus one, ``max(q_offset + Lq, k_offset + Lk)``, as transformers does.

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
        pairing: "interleaved" (adjacent features) or "half" (feature ``i`` with ``i + d/2``).
        fraction: the share of ``dim`` rotated, in ``(0, 1]`` (the first features).
        scaling: a :class:`~attnkit.nn.rope_scaling.RopeScaling`, its ``as_dict()``, or None.

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
        >>> half = RotaryEmbedding(8, pairing="half", fraction=0.5)  # rotates features 0-3: pairs (0, 2), (1, 3)
        >>> bool(torch.equal(half.rotate(q, offset=3)[..., 4:], q[..., 4:]))
        True
    """

    def __init__(self, dim: int, *, base: float = 10000.0, pairing: str = "interleaved", fraction: float = 1.0,
                 scaling: RopeScaling | dict | None = None):
        super().__init__()
        who = "RotaryEmbedding"
        self.dim = check_dim(who, "dim", dim)
        self.base = check_base(who, base)
        if pairing not in PAIRINGS:
            raise ArgumentError(f"{who}: pairing must be one of {PAIRINGS}; got {pairing!r}")
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
            raise ArgumentError(f"{who}: fraction must be a number in (0, 1] (the share of dim rotated); "
                                f"got {fraction!r}")
        if scaling is not None and not isinstance(scaling, RopeScaling):
            scaling = scaling_from_dict(scaling)
        self.pairing, self.fraction, self.scaling = pairing, float(fraction), scaling
        self.rotated = 2 * (int(self.dim * self.fraction) // 2)

    def extra_repr(self) -> str:
        more = "" if self.pairing == "interleaved" else f", pairing={self.pairing!r}"
        more += "" if self.fraction == 1 else f", fraction={self.fraction:g}"
        more += "" if self.scaling is None else f", scaling={self.scaling}"
        return f"dim={self.dim}, base={self.base:g}{more}"

    def frequencies(self, length: int, *, device=None) -> tuple[torch.Tensor, float]:
        """``(theta (d/2,), attention factor)`` for a sequence of ``length`` positions (scaled if asked)."""
        device = torch.device("cpu") if device is None else torch.device(device)
        pairs = self.rotated // 2
        theta = self.base ** (-2.0 * torch.arange(pairs, dtype=torch.float64) / max(2 * pairs, 1))
        factor = 1.0
        if self.scaling is not None and pairs:
            theta, factor = self.scaling.frequencies(theta, self.base, length)
        return theta.to(device=device, dtype=angle_dtype(device)), factor

    def angles(self, length: int, *, offset: int = 0, device=None) -> torch.Tensor:
        """Angles ``m * theta_i`` for positions ``offset .. offset + length - 1``: ``(length, d / 2)``."""
        theta, _ = self.frequencies(offset + length, device=device)
        pos = torch.arange(offset, offset + length, device=theta.device, dtype=theta.dtype)
        return pos[:, None] * theta  # (length, pairs)

    def rotate(self, x: torch.Tensor, *, offset: int = 0) -> torch.Tensor:
        """Rotate ``x`` of shape ``(..., L, dim)`` whose row ``i`` sits at absolute position ``offset + i``."""
        self._check(x, "x")
        offset = check_offset("RotaryEmbedding", "offset", offset)
        return self._rotate(x, offset, offset + x.shape[-2])

    def forward(self, q: torch.Tensor, k: torch.Tensor, *, q_offset: int = 0, k_offset: int = 0):
        """Rotated ``(q, k)``; query row ``i`` at position ``q_offset + i``, key row ``j`` at ``k_offset + j``."""
        self._check(q, "q")
        self._check(k, "k")
        q_offset = check_offset("RotaryEmbedding", "q_offset", q_offset)
        k_offset = check_offset("RotaryEmbedding", "k_offset", k_offset)
        length = max(q_offset + q.shape[-2], k_offset + k.shape[-2])
        return self._rotate(q, q_offset, length), self._rotate(k, k_offset, length)

    def rotate_at(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotate ``x`` ``(..., L, dim)`` whose rows sit at the absolute ``positions`` (non-negative integers
        broadcasting to ``x.shape[:-1]``, e.g. ``(B, 1, L)``): the nodes of a draft tree sit at their depths."""
        self._check(x, "x")
        return self._rotate(x, 0, int(positions.max()) + 1 if positions.numel() else 0, positions)

    def _rotate(self, x, offset: int, length: int, positions: torch.Tensor | None = None) -> torch.Tensor:
        compute = torch.float64 if x.dtype == torch.float64 else torch.float32
        theta, factor = self.frequencies(length, device=x.device)
        pos = (torch.arange(offset, offset + x.shape[-2], device=x.device, dtype=theta.dtype) if positions is None
               else positions.to(x.device, theta.dtype))
        ang = pos[..., None] * theta  # (..., L, pairs)
        cos, sin = ang.cos().to(compute), ang.sin().to(compute)
        r = self.rotated
        part = x[..., :r].to(compute)
        if self.pairing == "interleaved":
            pairs = part.unflatten(-1, (-1, 2))  # (..., L, pairs, 2)
            a, b = pairs[..., 0], pairs[..., 1]
            out = torch.stack((a * cos - b * sin, b * cos + a * sin), dim=-1).flatten(-2)  # (..., L, r)
        else:
            a, b = part[..., : r // 2], part[..., r // 2:]
            out = torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)  # (..., L, r)
        if factor != 1:
            out = out * factor
        if r < self.dim:
            out = torch.cat((out, x[..., r:].to(compute)), dim=-1)
        return out.to(x.dtype)

    def _check(self, t, name: str) -> None:
        check_floating("RotaryEmbedding", name, t)
        if t.dim() < 2 or t.shape[-1] != self.dim:  # decided here, so check_shape calls nothing back in this file
            check_shape("RotaryEmbedding", name, t, lambda _: False,
                        f"have shape (..., L, dim={self.dim}), usually (B, H, L, {self.dim})")


def rotary_for(who: str, option, head_dim: int) -> RotaryEmbedding | None:
    """A module's ``rotary=`` option as a :class:`RotaryEmbedding` of ``head_dim``: None/False (none), True
    (plain), a dict of the constructor's keywords (``pairing``, ``fraction``, ``base``, ``scaling``) or one."""
    if option is None or option is False:
        return None
    if option is True:
        return RotaryEmbedding(head_dim)
    if isinstance(option, dict):
        unknown = sorted(set(option) - {"base", "pairing", "fraction", "scaling"})
        if unknown:
            raise ArgumentError(f"{who}: rotary options are base, pairing, fraction and scaling; got "
                                f"{', '.join(unknown)}")
        return RotaryEmbedding(head_dim, **option)
    if not isinstance(option, RotaryEmbedding):
        raise DTypeError(f"{who}: rotary must be None, a bool, a dict of RotaryEmbedding options or a "
                         f"RotaryEmbedding; got {type(option).__name__}")
    if option.dim != head_dim:
        raise ArgumentError(f"{who}: rotary must rotate the head's {head_dim} features; got "
                            f"RotaryEmbedding(dim={option.dim})")
    return option
