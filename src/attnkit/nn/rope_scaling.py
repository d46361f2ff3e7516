"""Context-extension scalings of rotary embeddings: new rotation frequencies and an attention factor.

A rotary embedding rotates feature pair ``i`` of position ``m`` by ``m * theta_i`` with
``theta_i = base^(-2i / d)``. A scaling, chosen for a model trained on ``L0`` positions and run
on more, replaces ``theta_i`` by ``theta'_i`` and multiplies the rotated features by an
attention factor ``a`` (so the scores of the rotated part by ``a^2``):

- :class:`LinearScaling` (Chen et al. 2023, "Extending Context Window of Large Language Models
  via Positional Interpolation", arXiv:2306.15595, eq. 4): ``theta'_i = theta_i / s``.
- :class:`DynamicNTKScaling` (Peng et al. 2023, YaRN, arXiv:2309.00071, Sec. 3.1 and 3.3, "NTK-aware"
  with dynamic scaling): a larger base once the sequence passes ``L0``,
  ``base' = base * (s L / L0 - (s - 1))^(d / (d - 2))`` at length ``L > L0``.
- :class:`YarnScaling` (Peng et al. 2023, arXiv:2309.00071, eqs. 17-23): "NTK-by-parts": pairs that
  turn many times within ``L0`` keep ``theta_i``, pairs that turn less than once are interpolated
  (``theta_i / s``), a linear ramp in between; ``a = 0.1 ln s + 1``.
- :class:`Llama3Scaling` (Llama Team 2024, "The Llama 3 Herd of Models", arXiv:2407.21783, Sec. 3.3
  and its released code): by wavelength ``2 pi / theta_i``: short ones kept, long ones divided by
  ``s``, a smooth blend between ``L0 / high_freq_factor`` and ``L0 / low_freq_factor``.
- :class:`LongRopeScaling` (Ding et al. 2024, "LongRoPE", arXiv:2402.13753, eq. 3): a searched
  rescale factor per pair, ``theta'_i = theta_i / lambda_i`` (the short set up to ``L0``, the long
  set beyond), ``a = sqrt(1 + ln s / ln L0)``.
- :class:`ProportionalScaling` (transformers' "proportional" type): the first ``r = floor(p d / 2)``
  pairs keep the frequencies of the whole head, ``theta'_i = theta_i / s = base^(-2i / d) / s``
  (``d`` the full head width, not the ``2r`` turning features), the other pairs do not turn
  (``theta'_i = 0``); ``a = 1``. Unlike a partial rotation (``RotaryEmbedding(fraction=p)``, whose
  ``r`` pairs take ``base^(-2i / 2r)`` over the first ``2r`` features), the encoding spans the head.

Each gives the same inverse frequencies and attention factor as transformers'
``ROPE_INIT_FUNCTIONS`` of the same name (``from_transformers`` reads its ``rope_parameters``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from ..errors import ArgumentError

__all__ = ["RopeScaling", "LinearScaling", "DynamicNTKScaling", "YarnScaling", "Llama3Scaling", "LongRopeScaling",
           "ProportionalScaling", "yarn_mscale", "scaling_from_dict", "scaling_from_transformers"]


def _positive(who: str, name: str, value, *, at_least: float = 0.0, integer: bool = False):
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not math.isfinite(value) or value <= at_least:
        kind = "an int" if integer else "a finite number"
        raise ArgumentError(f"{who}: {name} must be {kind} > {at_least:g}; got {value!r}")
    return value


def _ramp(low: float, high: float, n: int) -> torch.Tensor:
    """``clamp((i - low) / (high - low), 0, 1)`` for ``i = 0 .. n - 1``; a zero-width ramp is widened to 0.001."""
    if low == high:
        high += 0.001
    return ((torch.arange(n, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)


@dataclass(frozen=True)
class RopeScaling:
    """Base of the scalings: :meth:`frequencies` maps the plain ``theta`` to the scaled one."""

    kind = ""

    def frequencies(self, theta: torch.Tensor, base: float, length: int) -> tuple[torch.Tensor, float]:
        """``(theta' (pairs,), attention factor)`` for a sequence of ``length`` positions (float64 ``theta``)."""
        raise NotImplementedError

    def as_dict(self) -> dict:
        """``{"type": kind, **fields}``: what :func:`scaling_from_dict` rebuilds it from (JSON-ready)."""
        return {"type": self.kind, **{k: list(v) if isinstance(v, tuple) else v
                                      for k, v in dataclasses.asdict(self).items()}}


@dataclass(frozen=True)
class LinearScaling(RopeScaling):
    """Position interpolation: every frequency divided by ``factor`` (positions squeezed into ``[0, L0)``)."""

    factor: float
    kind = "linear"

    def __post_init__(self):
        _positive("LinearScaling", "factor", self.factor)

    def frequencies(self, theta, base, length):
        return theta / self.factor, 1.0


@dataclass(frozen=True)
class DynamicNTKScaling(RopeScaling):
    """Plain RoPE up to ``max_position``; beyond, the base grows with the length (NTK-aware, dynamic)."""

    factor: float
    max_position: int
    kind = "dynamic"

    def __post_init__(self):
        _positive("DynamicNTKScaling", "factor", self.factor)
        _positive("DynamicNTKScaling", "max_position", self.max_position, integer=True)

    def frequencies(self, theta, base, length):
        d = 2 * theta.numel()
        if d <= 2:
            raise ArgumentError(f"DynamicNTKScaling: needs more than 2 rotated features (d / (d - 2)); got d={d}")
        length = max(length, self.max_position)
        s = self.factor
        grown = base * (s * length / self.max_position - (s - 1)) ** (d / (d - 2))
        return grown ** (-2.0 * torch.arange(d // 2, dtype=torch.float64) / d), 1.0


@dataclass(frozen=True)
class YarnScaling(RopeScaling):
    """YaRN: NTK-by-parts interpolation and the attention temperature ``a = 0.1 ln s + 1``.

    ``beta_fast`` / ``beta_slow`` (the paper's ``beta`` and ``alpha``): pairs turning more than
    ``beta_fast`` times within ``original_max_position`` keep their frequency, fewer than
    ``beta_slow`` times are interpolated by ``factor``; the ramp between is linear in the pair
    index, its ends rounded outwards when ``truncate``. ``mscale`` and ``mscale_all_dim``
    (DeepSeek-V2) give ``a = m(s, mscale) / m(s, mscale_all_dim)`` with ``m(s, c) = 0.1 c ln s + 1``;
    ``attention_factor`` overrides ``a``.
    """

    factor: float
    original_max_position: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None
    truncate: bool = True
    kind = "yarn"

    def __post_init__(self):
        _positive("YarnScaling", "factor", self.factor)
        _positive("YarnScaling", "original_max_position", self.original_max_position, integer=True)
        _positive("YarnScaling", "beta_fast", self.beta_fast)
        _positive("YarnScaling", "beta_slow", self.beta_slow)

    def temperature(self) -> float:
        """The attention factor ``a`` (the paper's ``sqrt(1 / t)``)."""
        if self.attention_factor is not None:
            return float(self.attention_factor)
        if self.mscale and self.mscale_all_dim:
            return yarn_mscale(self.factor, self.mscale) / yarn_mscale(self.factor, self.mscale_all_dim)
        return yarn_mscale(self.factor)

    def frequencies(self, theta, base, length):
        d = 2 * theta.numel()

        def pair_turning(turns: float) -> float:  # the (fractional) pair index turning `turns` times in L0
            return d * math.log(self.original_max_position / (turns * 2 * math.pi)) / (2 * math.log(base))

        low, high = pair_turning(self.beta_fast), pair_turning(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        keep = 1 - _ramp(max(low, 0), min(high, d - 1), d // 2)  # 1: the pair's own frequency
        return theta / self.factor * (1 - keep) + theta * keep, self.temperature()


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """``0.1 mscale ln s + 1`` for ``s > 1``, else 1 (YaRN eq. 22, DeepSeek-V2's ``mscale``)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


@dataclass(frozen=True)
class Llama3Scaling(RopeScaling):
    """Llama 3.1: wavelengths above ``L0 / low_freq_factor`` divided by ``factor``, below ``L0 / high_freq_factor``
    kept, and in between ``(1 - g) theta / s + g theta`` with ``g = (L0 / wavelength - low) / (high - low)``."""

    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192
    kind = "llama3"

    def __post_init__(self):
        who = "Llama3Scaling"
        for name in ("factor", "low_freq_factor", "high_freq_factor"):
            _positive(who, name, getattr(self, name))
        _positive(who, "original_max_position", self.original_max_position, integer=True)
        if self.high_freq_factor <= self.low_freq_factor:
            raise ArgumentError(f"{who}: high_freq_factor must exceed low_freq_factor; got "
                                f"{self.high_freq_factor} and {self.low_freq_factor}")

    def frequencies(self, theta, base, length):
        l0, s = self.original_max_position, self.factor
        wavelength = 2 * math.pi / theta
        g = (l0 / wavelength - self.low_freq_factor) / (self.high_freq_factor - self.low_freq_factor)
        blended = (1 - g) * theta / s + g * theta
        out = torch.where(wavelength > l0 / self.low_freq_factor, theta / s, theta)
        middle = (wavelength >= l0 / self.high_freq_factor) & (wavelength <= l0 / self.low_freq_factor)
        return torch.where(middle, blended, out), 1.0


@dataclass(frozen=True)
class LongRopeScaling(RopeScaling):
    """LongRoPE: ``theta_i / lambda_i`` with ``lambda = short_factor`` up to ``original_max_position`` positions
    and ``long_factor`` beyond; ``factor`` is the extension ratio ``s`` (attention factor
    ``sqrt(1 + ln s / ln L0)`` for ``s > 1`` unless ``attention_factor`` is given)."""

    short_factor: tuple[float, ...]
    long_factor: tuple[float, ...]
    original_max_position: int
    factor: float
    attention_factor: float | None = None
    kind = "longrope"

    def __post_init__(self):
        who = "LongRopeScaling"
        for name in ("short_factor", "long_factor"):
            values = tuple(getattr(self, name))
            for v in values:
                _positive(who, name, v)
            object.__setattr__(self, name, values)
        _positive(who, "original_max_position", self.original_max_position, integer=True)
        _positive(who, "factor", self.factor)

    def frequencies(self, theta, base, length):
        rescale = self.long_factor if length > self.original_max_position else self.short_factor
        if len(rescale) != theta.numel():
            raise ArgumentError(f"LongRopeScaling: short_factor and long_factor need one value per rotated pair "
                                f"({theta.numel()}); got {len(rescale)}")
        if self.attention_factor is not None:
            a = float(self.attention_factor)
        else:
            s = self.factor
            a = 1.0 if s <= 1 else math.sqrt(1 + math.log(s) / math.log(self.original_max_position))
        return theta / torch.tensor(rescale, dtype=torch.float64), a


@dataclass(frozen=True)
class ProportionalScaling(RopeScaling):
    """The first ``floor(fraction * d / 2)`` pairs turn at the whole head's frequencies over ``factor``; the rest
    do not turn (``d`` = twice the pairs: use it with ``RotaryEmbedding(fraction=1)``, the encoding spans the head).

    ``theta'_i = base^(-2i / d) / factor`` for ``i < floor(fraction d / 2)``, else 0; attention factor 1.
    """

    fraction: float = 1.0
    factor: float = 1.0
    kind = "proportional"

    def __post_init__(self):
        who = "ProportionalScaling"
        if isinstance(self.fraction, bool) or not isinstance(self.fraction, (int, float)) or not (
                0 <= self.fraction <= 1):
            raise ArgumentError(f"{who}: fraction must be a number in [0, 1] (the share of pairs that turn); got "
                                f"{self.fraction!r}")
        _positive(who, "factor", self.factor)

    def frequencies(self, theta, base, length):
        pairs = theta.numel()
        turning = int(self.fraction * (2 * pairs) // 2)  # floor(p d / 2), d = 2 pairs
        return torch.cat([theta[:turning], theta.new_zeros(pairs - turning)]) / self.factor, 1.0


_KINDS = {cls.kind: cls for cls in (LinearScaling, DynamicNTKScaling, YarnScaling, Llama3Scaling, LongRopeScaling,
                                    ProportionalScaling)}


def scaling_from_dict(config: dict | None) -> RopeScaling | None:
    """The scaling :meth:`RopeScaling.as_dict` wrote (None stays None)."""
    if config is None:
        return None
    if not isinstance(config, dict) or config.get("type") not in _KINDS:
        raise ArgumentError(f"RotaryEmbedding: scaling must be a RopeScaling, None or a dict with 'type' in "
                            f"{sorted(_KINDS)}; got {config!r}")
    fields = {k: v for k, v in config.items() if k != "type"}
    try:
        return _KINDS[config["type"]](**fields)
    except TypeError as err:
        raise ArgumentError(f"RotaryEmbedding: scaling {config!r}: {err}") from None


def scaling_from_transformers(rope_parameters: dict, max_position_embeddings: int) -> RopeScaling | None:
    """The scaling of a transformers config's ``rope_parameters`` (``rope_type`` "default": None)."""
    p, kind = dict(rope_parameters), rope_parameters.get("rope_type", "default")
    original = p.get("original_max_position_embeddings") or max_position_embeddings
    ratio = p.get("factor") or max_position_embeddings / original
    if kind == "default":
        return None
    if kind == "linear":
        return LinearScaling(p["factor"])
    if kind == "dynamic":
        return DynamicNTKScaling(p["factor"], max_position_embeddings)
    if kind == "yarn":
        return YarnScaling(ratio, original, p.get("beta_fast") or 32.0, p.get("beta_slow") or 1.0,
                           p.get("mscale"), p.get("mscale_all_dim"), p.get("attention_factor"),
                           p.get("truncate", True))
    if kind == "llama3":
        return Llama3Scaling(p["factor"], p["low_freq_factor"], p["high_freq_factor"], original)
    if kind == "longrope":
        return LongRopeScaling(p["short_factor"], p["long_factor"], original, ratio, p.get("attention_factor"))
    if kind == "proportional":
        fraction = p.get("partial_rotary_factor")
        return ProportionalScaling(1.0 if fraction is None else float(fraction), float(p.get("factor") or 1.0))
    raise ArgumentError(f"RotaryEmbedding: rope_type {kind!r} has no attnkit scaling; known: default, "
                        f"{', '.join(_KINDS)}")
