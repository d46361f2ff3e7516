"""MiniMax's lightning attention: linear attention with a fixed decay per head, SiLU features and a sigmoid gate."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ArgumentError, ShapeError, check_int
from ..functional.recurrences.decay import retention
from ..registry.entry import Entry, register
from ._inputs import merge_heads
from ._recurrent import RecurrentLayer, copy_weights, example
from ._recurrent_parts import GatedRMSNorm, Mixed
from ._recurrent_spec import recurrent_spec

__all__ = ["LightningAttention", "lightning_slopes"]


def lightning_slopes(num_heads: int, layer_index: int = 0, num_layers: int = 1) -> torch.Tensor:
    """The decay rates ``s_h`` ``(H,)`` (float64) of a layer: ALiBi's geometric slopes ``(2^(-8/H))^(h+1)``, scaled
    down with the depth by ``1 - l / (num_layers - 1 + 1e-5) + 1e-5`` (MiniMax-01's schedule: the last layer
    barely decays)."""
    rates = (2.0 ** (-8.0 / num_heads)) ** torch.arange(1, num_heads + 1, dtype=torch.float64)
    return rates * (1 - layer_index / (num_layers - 1 + 1e-5) + 1e-5)


class LightningAttention(RecurrentLayer):
    """Lightning attention: linear attention whose state decays by a fixed ``exp(-s_h)`` per head and step.

    MiniMax 2025, "MiniMax-01: Scaling Foundation Models with Lightning Attention", arXiv:2501.08313,
    Sec. 2.2 (its linear layers; the blockwise algorithm is Qin et al. 2024, Lightning Attention-2,
    arXiv:2401.04658)::

        [q, k, v] = silu(x W_qkv)                    (per head: q, k, v of ``head_dim`` each, in that order)
        S_t = exp(-s_h) S_{t-1} + k_t^T v_t,   o_t = q_t S_t      (no 1/sqrt(d) scale)
        y = (RMSNorm(o) * sigmoid(x W_g)) W_o        (the norm over all heads' features at once)

    i.e. ``o_t = sum_{j <= t} exp(-s_h (t - j)) (q_t . k_j) v_j`` (:func:`attnkit.functional.recurrences.
    retention` with ``g = -s_h``), in the form asked for. Notation: ``W_qkv`` = ``qkv_proj``,
    ``W_g`` = ``output_gate``, ``W_o`` = ``out_proj``, ``norm``; ``s`` = ``-log_decay``, by default
    :func:`lightning_slopes` of the layer's depth.

    The computation is that of transformers' ``MiniMaxLightningAttention`` (:meth:`from_transformers`), which
    runs the blockwise algorithm in prefill and the recurrence in decoding. Projections have no bias.

    Shapes: ``x`` ``(B, n, dim)``, ``key_keep_mask`` ``(B, n)`` bool (True = real token) -> ``(B, n, dim)``;
    :meth:`forward_step`: ``(B, dim) -> (B, dim)``.

    Complexity: chunk form O(n c H d + n H d^2) plus the projections; state ``H d^2`` numbers.

    Args:
        dim: model width.
        num_heads: H.
        head_dim: d (default ``dim / num_heads``).
        layer_index, num_layers: the layer's depth, for the default decays.
        chunk_size: block length of the chunk form.
        eps: the norm's epsilon.

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> layer = LightningAttention(16, 2)
        >>> x = torch.randn(2, 7, 16)
        >>> cache = layer.new_cache()
        >>> steps = torch.stack([layer.forward_step(x[:, t], cache) for t in range(7)], 1)
        >>> torch.allclose(steps, layer(x), atol=1e-5)
        True
    """

    scale = 1.0
    log_decay: torch.Tensor  # a buffer: log s_h per head

    def __init__(self, dim: int, num_heads: int, *, head_dim: int | None = None, layer_index: int = 0,
                 num_layers: int = 1, chunk_size: int = 64, eps: float = 1e-6):
        super().__init__()
        who = "LightningAttention"
        check_int(who, "num_heads", num_heads, 1)
        if head_dim is None and check_int(who, "dim", dim, 1) % num_heads:
            raise ShapeError(f"{who}: dim must be a multiple of num_heads when head_dim is not given; got dim={dim}, "
                             f"num_heads={num_heads}")
        head_dim = dim // num_heads if head_dim is None else check_int(who, "head_dim", head_dim, 1)
        if not 0 <= check_int(who, "layer_index", layer_index, 0) < check_int(who, "num_layers", num_layers, 1):
            raise ArgumentError(f"{who}: layer_index must be in [0, num_layers = {num_layers}); got {layer_index}")
        self.dim, self.num_heads, self.chunk_size = dim, num_heads, check_int(who, "chunk_size", chunk_size, 1)
        self.core_sizes = (num_heads, head_dim, head_dim)
        self.layer_index, self.num_layers = layer_index, num_layers
        inner = num_heads * head_dim
        self.qkv_proj = nn.Linear(dim, 3 * inner, bias=False)
        self.output_gate = nn.Linear(dim, inner, bias=False)
        self.out_proj = nn.Linear(inner, dim, bias=False)
        self.norm = GatedRMSNorm(inner, eps=eps, activation="sigmoid")
        self.learned_decay = False  # s_h is fixed per head
        self.register_buffer("log_decay", -lightning_slopes(num_heads, layer_index, num_layers))

    def _mix(self, x, keep, context, offset):
        batch, n, _ = x.shape
        qkv = F.silu(self.qkv_proj(x)).view(batch, n, self.num_heads, 3, self.core_sizes[1]).transpose(1, 2)
        q, k, v = qkv.unbind(3)
        g = self.log_decay.to(torch.promote_types(x.dtype, torch.float32))[:, None, None].expand(
            batch, self.num_heads, n, 1)
        return Mixed(q, k, v, g, None), None

    def family(self, mixed, **options):
        """:func:`~attnkit.functional.recurrences.retention` with the log decays per token (0 at padded tokens)."""
        return retention(mixed.q, mixed.k, mixed.v, g=mixed.g[..., 0], **options)

    def _finish(self, out, mixed, x):
        return self.out_proj(self.norm(merge_heads(out).to(x.dtype), self.output_gate(x)))

    @classmethod
    def from_transformers(cls, layer) -> LightningAttention:
        """The same layer from transformers' ``MiniMaxLightningAttention`` (its weights and decays copied).

        ``forward`` then equals ``layer(x)`` and decoding with :meth:`forward_step` equals ``layer`` with
        transformers' cache.

        Raises:
            attnkit.errors.DTypeError: ``layer`` is not a ``MiniMaxLightningAttention``.
            attnkit.errors.UnsupportedFeature: its feature map is not SiLU.
        """
        from ..errors import DTypeError, UnsupportedFeature

        if type(layer).__name__ != "MiniMaxLightningAttention":
            raise DTypeError(f"LightningAttention.from_transformers takes a MiniMaxLightningAttention; got "
                             f"{type(layer).__name__}")
        probe = torch.linspace(-4, 4, 9)
        if not torch.allclose(layer.act_fn(probe), F.silu(probe)):  # transformers' activations are its own classes
            raise UnsupportedFeature(f"LightningAttention.from_transformers: the feature map must be silu; got "
                                     f"{layer.act_fn!r}")
        new = cls(layer.qkv_proj.in_features, layer.num_attention_heads, head_dim=layer.head_dim,
                  layer_index=layer.layer_idx, num_layers=layer.num_hidden_layers, chunk_size=layer.block_size,
                  eps=layer.norm.variance_epsilon).to(layer.out_proj.weight)
        copy_weights([(new.qkv_proj.weight, layer.qkv_proj.weight), (new.output_gate.weight, layer.output_gate.weight),
                      (new.out_proj.weight, layer.out_proj.weight), (new.norm.weight, layer.norm.weight)])
        with torch.no_grad():
            new.log_decay.copy_(-layer.slope_rate.reshape(-1).to(new.log_decay))
        return new


register(Entry("lightning-attention", LightningAttention,
               "MiniMax 2025, arXiv:2501.08313, Sec. 2.2 (lightning attention, MiniMax-01's linear layers)",
               "O(L c D + L D^2 / H)", "linear attention with a fixed decay per head (ALiBi's slopes over the "
               "depth), SiLU features, an RMS norm and a sigmoid gate", "linear-recurrent",
               example(LightningAttention, 4),
               spec=recurrent_spec(LightningAttention,
                                   lambda s: LightningAttention(s["dim"], s["heads"], head_dim=s["head_dim"],
                                                                chunk_size=s["chunk_size"]),
                                   {"heads": 4, "head_dim": None, "chunk_size": 64},
                                   lambda m: {"head_dim": m.core_sizes[1]})))
