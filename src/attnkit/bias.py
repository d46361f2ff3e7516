"""Score modifiers: ``modifier(scores, b, h, q_idx, kv_idx) -> scores``.

A modifier is applied after the score stage and before masking. It must be
elementwise in its index arguments (integer tensors broadcasting against
``scores``; kernels pass index tensors of various ranks), so kernels can apply it
to any block. Any callable with that signature works; subclasses of
:class:`ScoreModifier` also receive the sequence lengths, which is what lets
ALiBi follow the same bottom-right alignment as :func:`attnkit.masks.causal`.
A modifier with per-head parameters says how many heads it holds in ``num_heads``
(:func:`attnkit.attention` checks it against the query heads).
Subclasses of :class:`AdditiveModifier` (ALiBi, RelativePositionBias) add a term
that does not depend on the scores; kernels may then hand that term to a fused
kernel as a float bias instead of calling :meth:`~ScoreModifier.modify`.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .errors import ArgumentError, DTypeError, check_int

__all__ = ["ScoreModifier", "AdditiveModifier", "ALiBi", "Softcap", "RelativePositionBias", "apply_modifier",
           "alibi", "softcap", "t5_buckets", "check_t5_buckets"]


class ScoreModifier:
    """Base for modifiers that need the lengths; implement :meth:`modify`."""

    def modify(self, scores, b, h, q_idx, kv_idx, q_len: int, kv_len: int):
        raise NotImplementedError

    def __call__(self, scores, b, h, q_idx, kv_idx):
        # Lengths unknown here: assume queries and keys are aligned (q_len == kv_len).
        return self.modify(scores, b, h, q_idx, kv_idx, 0, 0)


class AdditiveModifier(ScoreModifier):
    """A modifier that adds a term independent of the scores: ``scores + term(b, h, q_idx, kv_idx)``.

    Implement :meth:`term` (or, with ``relative = True``, :meth:`relative_term` of
    ``h`` and ``kv_idx - q_idx``) and :meth:`term_is_finite`; :meth:`modify` follows.
    Kernels may then pass the term to a fused kernel as a float bias (``kernels/bias_slabs.py``);
    a relative term is read from one vector per head, never an ``Lq x Lk`` tensor.

    Example:
        >>> import torch, attnkit
        >>> class Recency(attnkit.bias.AdditiveModifier):
        ...     relative = True
        ...     def relative_term(self, h, rel, q_len, kv_len):
        ...         return 0.1 * rel.float()  # later keys score higher
        ...     def term_is_finite(self):
        ...         return True
        >>> q = k = v = torch.randn(1, 2, 300, 8, generator=torch.Generator().manual_seed(0))
        >>> attnkit.explain(q, k, v, bias=Recency()).backend
        'chunked'
    """

    relative = False  # True: the term depends on h and kv_idx - q_idx only

    def term(self, b, h, q_idx, kv_idx, q_len: int, kv_len: int) -> torch.Tensor:
        """The float term added to the scores, broadcast over the index tensors."""
        if self.relative:
            return self.relative_term(h, kv_idx - q_idx, q_len, kv_len)
        raise NotImplementedError

    def relative_term(self, h, rel, q_len: int, kv_len: int) -> torch.Tensor:
        """The term for relative positions ``rel = kv_idx - q_idx`` (when ``relative`` is True)."""
        raise NotImplementedError

    def term_is_finite(self) -> bool:
        """True when every value :meth:`term` can return is finite (a cheap check of the parameters)."""
        return False

    def parameters_needing_grad(self) -> list[torch.Tensor]:
        """Tensors :meth:`term` reads that autograd must reach (learned tables)."""
        return []

    def modify(self, scores, b, h, q_idx, kv_idx, q_len, kv_len):
        return scores + self.term(b, h, q_idx, kv_idx, q_len, kv_len).to(scores.dtype)


def apply_modifier(modifier, scores, b, h, q_idx, kv_idx, q_len, kv_len):
    """Call a modifier the way its type asks for (kernels use this one entry)."""
    if isinstance(modifier, ScoreModifier):
        return modifier.modify(scores, b, h, q_idx, kv_idx, q_len, kv_len)
    return modifier(scores, b, h, q_idx, kv_idx)


def _alibi_slopes(num_heads: int) -> torch.Tensor:
    """Press et al. 2022 slopes: geometric sequence ``2^(-8/n * i)``, interleaved for non-powers of 2."""
    def powers(n):
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]
    if math.log2(num_heads).is_integer():
        return torch.tensor(powers(num_heads))
    closest = 2 ** math.floor(math.log2(num_heads))
    extra = powers(2 * closest)[0::2][: num_heads - closest]
    return torch.tensor(powers(closest) + extra)


class ALiBi(AdditiveModifier):
    """Attention with Linear Biases (Press et al. 2022, arXiv:2108.12409, Sec. 3).

    ``scores[b, h, i, j] - m_h * |i' - j|`` with ``i' = i + Lk - Lq`` (bottom_right)
    or ``i' = i`` (top_left), and per-head slopes ``m_h``. With a causal mask this is
    the paper's ``-m_h (i - j)``.
    """

    def __init__(self, num_heads: int | None = None, *, slopes: torch.Tensor | None = None,
                 align: str = "bottom_right"):
        if (num_heads is None) == (slopes is None):
            raise ValueError("give exactly one of num_heads or slopes")
        if slopes is None:
            if not isinstance(num_heads, int) or num_heads < 1:
                raise ValueError(f"num_heads must be an int >= 1; got {num_heads!r}")
            slopes = _alibi_slopes(num_heads)
        self.slopes = torch.as_tensor(slopes, dtype=torch.float32).flatten()
        if align not in ("bottom_right", "top_left"):
            raise ValueError(f"align must be 'bottom_right' or 'top_left'; got {align!r}")
        self.align = align

    relative = True

    def relative_term(self, h, rel, q_len, kv_len):
        # In float64: the caller rounds once to its compute dtype (a float32 product would round float64 runs)
        offset = kv_len - q_len if self.align == "bottom_right" else 0
        slope = self.slopes.to(rel.device, torch.float64)[h]
        return slope * -(offset - rel).abs().to(torch.float64)

    def modify(self, scores, b, h, q_idx, kv_idx, q_len, kv_len):
        offset = kv_len - q_len if self.align == "bottom_right" else 0
        slope = self.slopes.to(scores.device, scores.dtype)[h]
        return scores - slope * (q_idx + offset - kv_idx).abs().to(scores.dtype)

    def term_is_finite(self) -> bool:
        return bool(torch.isfinite(self.slopes).all())

    @property
    def num_heads(self) -> int:
        """One slope per query head: attention checks that the call has exactly this many."""
        return self.slopes.numel()

    def __repr__(self):
        return f"ALiBi(heads={self.slopes.numel()}, align={self.align!r})"


class Softcap(ScoreModifier):
    """Soft-capping ``cap * tanh(scores / cap)`` (Gemma 2, arXiv:2408.00118)."""

    def __init__(self, cap: float):
        if not (isinstance(cap, (int, float)) and math.isfinite(cap) and cap > 0):
            raise ValueError(f"cap must be a finite number > 0; got {cap!r}")
        self.cap = float(cap)

    def modify(self, scores, b, h, q_idx, kv_idx, q_len, kv_len):
        return self.cap * torch.tanh(scores / self.cap)

    def __repr__(self):
        return f"Softcap({self.cap})"


def check_t5_buckets(who: str, num_buckets, max_distance, bidirectional) -> None:
    """Raise unless the T5 bucketing is well defined: at least one exact bucket per direction, and
    ``max_distance`` beyond the exact ones (where the logarithmic buckets start).

    With ``n = num_buckets // 2`` per direction (bidirectional) or ``n = num_buckets``, the
    distances ``0 .. n // 2 - 1`` get one bucket each and the rest ``log(d / (n // 2)) /
    log(max_distance / (n // 2))`` of the remaining ones: ``max_distance <= n // 2`` would divide
    by ``log(1) = 0`` or turn the logarithm negative and read the exact buckets of short distances.
    """
    if not isinstance(bidirectional, bool):
        raise DTypeError(f"{who}: bidirectional must be a bool; got {type(bidirectional).__name__}")
    check_int(who, "num_buckets", num_buckets, 4 if bidirectional else 2,
              f" (at least one exact bucket per direction with bidirectional={bidirectional})")
    exact = (num_buckets // 2 if bidirectional else num_buckets) // 2
    check_int(who, "max_distance", max_distance, exact + 1,
              f" (beyond the {exact} exact buckets of num_buckets={num_buckets}, bidirectional={bidirectional}, "
              "where the logarithmic buckets start)")


def t5_buckets(relative: torch.Tensor, *, num_buckets: int = 32, max_distance: int = 128,
               bidirectional: bool = True) -> torch.Tensor:
    """T5 relative-position buckets (Raffel et al. 2020, arXiv:1910.10683, Sec. 2.1).

    ``relative = j - i``. Half the buckets are exact small distances, the rest
    grow logarithmically up to ``max_distance``; bidirectional splits by sign.
    The arguments are checked by :func:`check_t5_buckets`.
    """
    check_t5_buckets("t5_buckets", num_buckets, max_distance, bidirectional)
    buckets = torch.zeros_like(relative)
    n = num_buckets
    if bidirectional:
        n //= 2
        buckets = buckets + (relative > 0).long() * n
        distance = relative.abs()
    else:
        distance = (-relative).clamp(min=0)
    exact = n // 2
    log_ratio = torch.log(distance.float().clamp(min=1) / exact) / math.log(max_distance / exact)
    large = (exact + (log_ratio * (n - exact)).long()).clamp(max=n - 1)
    return buckets + torch.where(distance < exact, distance, large)


class RelativePositionBias(nn.Module, AdditiveModifier):
    """Learned per-head bias on relative position: T5 buckets or Shaw et al. clipping.

    Shaw et al. 2018 (arXiv:1803.02155, eq. 3-4) clip ``j - i`` to ``[-max_distance,
    max_distance]``; T5 maps it to ``num_buckets`` log buckets. The bias
    ``table[h, bucket(j - i')]`` is added to the scores.

    Differences from the paper: Shaw et al. add a learned vector to keys
    (``q . a_ij``); here, as in T5, the relative term is a scalar per head.

    Every argument is checked here, with an error naming it: in T5 mode, ``num_buckets`` must
    leave an exact bucket per direction and ``max_distance`` must lie beyond the exact buckets
    (:func:`check_t5_buckets`); in clip mode ``max_distance >= 1`` (``num_buckets`` and
    ``bidirectional`` are then unused).

    Args:
        num_heads: one table row per query head.
        mode: ``"t5"`` (log buckets) or ``"clip"`` (Shaw et al.).
        num_buckets: T5 buckets in all (half per direction when bidirectional).
        max_distance: T5: where the last bucket starts; clip: the largest distinguished ``|j - i|``.
        bidirectional: T5: separate buckets for keys after the query.
        align: ``"bottom_right"`` (query ``i`` sits at ``i + Lk - Lq``) or ``"top_left"``.
    """

    def __init__(self, num_heads: int, *, mode: str = "t5", num_buckets: int = 32,
                 max_distance: int = 128, bidirectional: bool = True, align: str = "bottom_right"):
        super().__init__()
        who = "RelativePositionBias"
        check_int(who, "num_heads", num_heads, 1)
        if mode not in ("t5", "clip"):
            raise ArgumentError(f"{who}: mode must be 't5' or 'clip'; got {mode!r}")
        if align not in ("bottom_right", "top_left"):
            raise ArgumentError(f"{who}: align must be 'bottom_right' or 'top_left'; got {align!r}")
        if mode == "t5":
            check_t5_buckets(who, num_buckets, max_distance, bidirectional)
        else:
            check_int(who, "max_distance", max_distance, 1, " (clip mode: the largest distinguished |j - i|)")
        size = num_buckets if mode == "t5" else 2 * max_distance + 1
        self.mode, self.num_buckets, self.max_distance = mode, num_buckets, max_distance
        self.bidirectional, self.align = bidirectional, align
        self.table = nn.Parameter(torch.zeros(num_heads, size))

    def bucket(self, relative: torch.Tensor) -> torch.Tensor:
        if self.mode == "clip":
            return relative.clamp(-self.max_distance, self.max_distance) + self.max_distance
        return t5_buckets(relative, num_buckets=self.num_buckets, max_distance=self.max_distance,
                          bidirectional=self.bidirectional)

    relative = True

    def relative_term(self, h, rel, q_len, kv_len):
        offset = kv_len - q_len if self.align == "bottom_right" else 0
        return self.table[h, self.bucket(rel - offset)]

    def modify(self, scores, b, h, q_idx, kv_idx, q_len, kv_len):
        return scores + self.term(b, h, q_idx, kv_idx, q_len, kv_len).to(scores.dtype)

    def term_is_finite(self) -> bool:
        return bool(torch.isfinite(self.table.detach()).all())

    @property
    def num_heads(self) -> int:
        """One table row per query head: attention checks that the call has exactly this many."""
        return self.table.shape[0]

    def parameters_needing_grad(self) -> list[torch.Tensor]:
        return [self.table] if self.table.requires_grad and torch.is_grad_enabled() else []

    def forward(self, scores, b, h, q_idx, kv_idx):
        return self.modify(scores, b, h, q_idx, kv_idx, 0, 0)

    __call__ = nn.Module.__call__


def alibi(num_heads: int, *, align: str = "bottom_right") -> ALiBi:
    """ALiBi modifier for ``num_heads`` heads with the paper's slopes."""
    return ALiBi(num_heads, align=align)


def softcap(cap: float) -> Softcap:
    """Soft-capping modifier ``cap * tanh(scores / cap)``."""
    return Softcap(cap)
