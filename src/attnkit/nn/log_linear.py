"""Log-linear Mamba-2 and log-linear Gated DeltaNet: the layers with O(log L) Fenwick bucket states."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import DTypeError, UnsupportedFeature, check_int
from ..functional.recurrences.log_linear import levels_for, log_linear_attention
from ..registry.entry import Entry, register
from ._inputs import check_keep_mask, check_sequence
from ._recurrent import RecurrentCache, RecurrentLayer, example
from ._recurrent_spec import LOG_LINEAR_FORMULA, recurrent_spec
from .gated_deltanet import GatedDeltaNet
from .mamba2 import _OPTIONS as _MAMBA2_OPTIONS
from .mamba2 import Mamba2Mixer

__all__ = ["LogLinearCache", "LogLinearMamba2", "LogLinearGatedDeltaNet"]


class LogLinearCache(RecurrentCache):
    """The decoding state of a log-linear layer: :class:`RecurrentCache` whose ``state`` holds the bucket states
    ``(B, H, G, Dk, Dv)`` (levels ``1 .. G``), and ``positions`` ``(B,)``: the real tokens each row has seen (padded
    tokens take no position in the Fenwick partition)."""

    def __init__(self):
        super().__init__()
        self.positions: torch.Tensor | None = None

    def reset(self) -> None:
        super().reset()
        self.positions = None


class _LogLinear(RecurrentLayer):
    """What the log-linear layers add to their base layer: the level weights, the cache and the forward pass."""

    num_levels: int
    level_proj: nn.Linear
    num_heads: int
    dim: int
    chunk_size: int

    def _levels(self, who: str, heads: int, dim: int, max_length: int) -> None:
        """``level_proj`` ``dim -> heads G``: ``lambda = softplus(x W_l + b_l)``, W zero and ``softplus(b) = 1`` at
        first, so a new layer is its base layer."""
        self.num_levels = levels_for(check_int(who, "max_length", max_length, 1))
        self.max_length = max_length
        self.level_proj = nn.Linear(dim, heads * self.num_levels)
        with torch.no_grad():
            self.level_proj.weight.zero_()
            self.level_proj.bias.fill_(math.log(math.e - 1))

    def new_cache(self) -> LogLinearCache:
        """An empty :class:`LogLinearCache`."""
        return LogLinearCache()

    def check_one_step_a_token(self, what: str) -> None:
        raise UnsupportedFeature(f"{what} does not take {type(self).__name__}: its buckets follow the tokens' "
                                 "positions in one sequence")

    def level_weights(self, x: torch.Tensor) -> torch.Tensor:
        """``lambda`` ``(B, H, n, G)`` of ``x`` ``(B, n, dim)``, in float32 or better."""
        acc = torch.promote_types(x.dtype, torch.float32)
        lam = F.softplus(self.level_proj(x).to(acc))
        return lam.unflatten(-1, (self.num_heads, self.num_levels)).transpose(1, 2)

    def forward(self, x: torch.Tensor, *, key_keep_mask: torch.Tensor | None = None,
                cache: RecurrentCache | None = None, form: str = "chunk", parents=None) -> torch.Tensor:
        """``(B, n, dim) -> (B, n, dim)``, causal; ``cache`` continues an earlier call and is updated."""
        who = type(self).__name__
        check_sequence(who, "x", x, self.dim, like=self)
        keep = check_keep_mask(who, "key_keep_mask", key_keep_mask, x.shape[0], x.shape[1])
        if cache is not None and not isinstance(cache, LogLinearCache):
            raise DTypeError(f"{who}: cache must be a LogLinearCache (new_cache()); got {type(cache).__name__}")
        if parents is not None:
            raise UnsupportedFeature(f"{who}: a draft tree (parents) is not supported: its buckets follow the "
                                     "tokens' positions in one sequence")
        if keep is not None:  # by select, so NaN or inf there reaches nothing
            x = x.masked_fill(~keep[..., None], 0.0)
        start = None if cache is None else cache.positions
        start = torch.zeros(x.shape[0], dtype=torch.long, device=x.device) if start is None else start
        mixed, tail = self._mix(x, keep, None if cache is None else cache.conv, 0)  # type: ignore[operator]
        out, state = log_linear_attention(mixed.q, mixed.k, mixed.v, mixed.g[..., 0], self.level_weights(x),
                                          mixed.beta, scale=self.scale, normalize_qk=self.normalize_qk, form=form,
                                          chunk_size=self.chunk_size, initial_state=None if cache is None else
                                          cache.state, offset=start, key_keep_mask=keep)
        if cache is not None:
            cache.conv, cache.state, cache.length = tail, state, cache.length + x.shape[1]
            cache.positions = start + (x.shape[1] if keep is None else keep.sum(1))
        return self._finish(out, mixed, x)  # type: ignore[operator]


class LogLinearMamba2(_LogLinear, Mamba2Mixer):
    """Log-linear Mamba-2: the Mamba-2 mixer whose SSD is read through Fenwick buckets, weighted per token and level.

    Guo et al. 2025, "Log-Linear Attention", arXiv:2506.04761, Sec. 3.2 (Log-Linear Mamba-2)::

        O = (Q K^T * M^S * M^H) V,     M^H_ts = lambda_t^{bit_length(t XOR s)}
        lambda_t = softplus(x_t W_l + b_l)             ((H, G): one weight per head and level)

    around :class:`~attnkit.nn.Mamba2Mixer`'s block (its projections, convolution, ``D`` skip and gated
    norm), by :func:`attnkit.functional.recurrences.log_linear_attention`. The decoding cache
    (:class:`LogLinearCache`) holds ``G`` bucket states per head, ``G = bit_length(max_length - 1) + 1``.
    ``W_l`` = ``level_proj``.

    Differences from the paper: ``lambda`` is a softplus of a linear map of ``x`` (the paper's level
    weights are data-dependent and positive; the reference parametrises them in its own way), with
    ``W_l = 0`` and ``softplus(b_l) = 1`` at initialisation, so a new layer equals a Mamba-2 mixer.

    Shapes: ``x`` ``(B, n, dim)``, ``key_keep_mask`` ``(B, n)`` bool (padded tokens take no position)
    -> ``(B, n, dim)``; :meth:`forward_step`: ``(B, dim) -> (B, dim)``.

    Complexity: chunk form O(n c (N + P) H + n G N P H), ``G = O(log max_length)``; state ``G H N P``
    numbers plus the convolution's.

    Args:
        max_length: the longest sequence (prefill and decoding together) the levels reach.
        options: ``dim``, ``num_heads`` and every keyword of :class:`~attnkit.nn.Mamba2Mixer`.

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> layer = LogLinearMamba2(16, head_dim=8, state_dim=4, max_length=32)
        >>> x = torch.randn(2, 9, 16)
        >>> cache = layer.new_cache()
        >>> steps = torch.stack([layer.forward_step(x[:, t], cache) for t in range(9)], 1)
        >>> torch.allclose(steps, layer(x), atol=1e-5)
        True
    """

    def __init__(self, dim: int, num_heads: int | None = None, *, max_length: int = 65536, **options):
        super().__init__(dim, num_heads, **options)
        self._levels("LogLinearMamba2", self.num_heads, dim, max_length)
        self.state_levels = self.num_levels  # bucket states per head (cost spec)


class LogLinearGatedDeltaNet(_LogLinear, GatedDeltaNet):
    """Log-linear Gated DeltaNet: Gated DeltaNet's attention matrix read through Fenwick buckets.

    Guo et al. 2025, "Log-Linear Attention", arXiv:2506.04761, Sec. 3.2 (Log-Linear Gated DeltaNet)::

        O = (((Q K^T * L) (I + K K^T * (L - I))^-1) * M^H) V       (beta folded into K and V)
        lambda_t = softplus(x_t W_l + b_l)

    around :class:`~attnkit.nn.GatedDeltaNet`'s block, by
    :func:`attnkit.functional.recurrences.log_linear_attention`: every bucket state follows the
    gated delta rule's transition. ``W_l`` = ``level_proj``.

    Differences from the paper: as :class:`LogLinearMamba2` (``lambda`` a softplus, 1 at initialisation).

    Shapes, complexity: as :class:`~attnkit.nn.GatedDeltaNet` with ``G`` bucket states per head.

    Args:
        max_length: the longest sequence (prefill and decoding together) the levels reach.
        options: ``dim``, ``num_heads`` and every keyword of :class:`~attnkit.nn.GatedDeltaNet`.

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> layer = LogLinearGatedDeltaNet(16, 4, max_length=32)
        >>> x = torch.randn(2, 9, 16)
        >>> cache = layer.new_cache()
        >>> steps = torch.stack([layer.forward_step(x[:, t], cache) for t in range(9)], 1)
        >>> torch.allclose(steps, layer(x), atol=1e-5)
        True
    """

    def __init__(self, dim: int, num_heads: int, *, max_length: int = 65536, **options):
        super().__init__(dim, num_heads, **options)
        self._levels("LogLinearGatedDeltaNet", num_heads, dim, max_length)
        self.state_levels = self.num_levels


register(Entry("log-linear-mamba2", LogLinearMamba2, "Guo et al. 2025, arXiv:2506.04761, Sec. 3.2 (Log-Linear "
               "Mamba-2)", "O(L c (N + P) H + L log(L) N P H)", "Mamba-2's SSD read through O(log L) Fenwick-tree "
               "bucket states, each weighted per token (a hierarchical mask on the SSD matrix)", "linear-recurrent",
               example(LogLinearMamba2, head_dim=16, state_dim=16, max_length=64),
               spec=recurrent_spec(LogLinearMamba2,
                                   lambda s: LogLinearMamba2(s["dim"], max_length=s["max_length"],
                                                             **{k: s[k] for k in _MAMBA2_OPTIONS}),
                                   {"head_dim": 16, "state_dim": 16, "expand": 2, "num_groups": 1, "conv_size": 4,
                                    "chunk_size": 64, "max_length": 64},
                                   lambda m: {"head_dim": m.core_sizes[2], "state_dim": m.core_sizes[1],
                                              "expand": m.sizes[0] // m.dim, "num_groups": m.sizes[2],
                                              "max_length": m.max_length}, LOG_LINEAR_FORMULA)))
register(Entry("log-linear-gated-deltanet", LogLinearGatedDeltaNet, "Guo et al. 2025, arXiv:2506.04761, Sec. 3.2 "
               "(Log-Linear Gated DeltaNet)", "O(L c D + L log(L) D^2 / H)", "Gated DeltaNet's attention matrix "
               "read through O(log L) Fenwick-tree bucket states, each weighted per token", "linear-recurrent",
               example(LogLinearGatedDeltaNet, 4, max_length=64),
               spec=recurrent_spec(LogLinearGatedDeltaNet,
                                   lambda s: LogLinearGatedDeltaNet(s["dim"], s["heads"], num_key_heads=s["key_heads"],
                                                                    key_head_dim=s["key_head_dim"],
                                                                    value_head_dim=s["value_head_dim"],
                                                                    conv_size=s["conv_size"],
                                                                    chunk_size=s["chunk_size"],
                                                                    max_length=s["max_length"]),
                                   {"heads": 4, "key_heads": None, "key_head_dim": None, "value_head_dim": None,
                                    "conv_size": 4, "chunk_size": 64, "max_length": 64},
                                   lambda m: {"key_heads": m.num_key_heads, "key_head_dim": m.core_sizes[1],
                                              "value_head_dim": m.core_sizes[2], "max_length": m.max_length},
                                   LOG_LINEAR_FORMULA)))
