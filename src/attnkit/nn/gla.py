"""Gated linear attention (GLA): a data-dependent forget gate per key channel, a swish output gate."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ShapeError, check_int
from ..functional.recurrences.decay import gated_linear_attention
from ..registry.entry import Entry, register
from ._inputs import merge_heads, split_heads
from ._recurrent import RecurrentLayer, example
from ._recurrent_parts import Mixed
from ._recurrent_spec import recurrent_spec

__all__ = ["GatedLinearAttention"]


class GatedLinearAttention(RecurrentLayer):
    """The GLA layer: linear attention whose state forgets per key channel through a low-rank gate.

    Yang et al. 2023, "Gated Linear Attention Transformers with Hardware-Efficient Training",
    arXiv:2312.06635, Sec. 4::

        S_t = (alpha_t^T 1) * S_{t-1} + k_t^T v_t,   o_t = q_t S_t
        alpha_t = sigmoid(x_t W_a1 W_a2 + b_a)^(1 / tau)     (W_a1: d x 16, tau = 16)
        r_t = swish(x_t W_r + b_r),   y_t = (r_t * LN(o_t)) W_O

    per head, computed by :func:`attnkit.functional.recurrences.gated_linear_attention` in the form asked
    for. Notation: ``W_Q, W_K, W_V`` = ``q_proj, k_proj, v_proj`` (keys ``expand_k`` = 1/2 and values
    ``expand_v`` = 1 times ``dim`` wide, as the paper); ``W_a1, W_a2, b_a`` = ``gate_down``,
    ``gate_up``; ``W_r, b_r`` = ``r_proj``; ``W_O`` = ``out_proj``; the LN = ``norm``.

    Differences from the paper: q is scaled by ``Dk^-1/2`` (as their code); the LayerNorm acts on
    each head's output separately, its parameters shared by the heads. q, k, v projections have
    no bias.

    Shapes: ``x`` ``(B, n, dim)``, ``key_keep_mask`` ``(B, n)`` bool (True = real token) -> ``(B, n, dim)``;
    :meth:`forward_step`: ``(B, dim) -> (B, dim)``.

    Complexity: chunk form O(n c d + n d^2 / H) per layer; O(d^2 / (2 H)) state per token decoded.

    Args:
        dim: model width.
        num_heads: heads (``dim * expand_k`` and ``dim * expand_v`` divisible by them).
        expand_k, expand_v: key and value widths over ``dim``.
        gate_rank: rank of the forget gate's projection (16).
        gate_temperature: tau.
        chunk_size: block length of the chunk form (its memory grows with ``chunk_size * Dk``).

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> layer = GatedLinearAttention(16, 2)
        >>> x = torch.randn(2, 9, 16)
        >>> torch.allclose(layer(x), layer(x, form="parallel"), atol=1e-5)
        True
    """

    per_channel_decay = True

    def __init__(self, dim: int, num_heads: int, *, expand_k: float = 0.5, expand_v: float = 1.0, gate_rank: int = 16,
                 gate_temperature: float = 16.0, chunk_size: int = 16):
        super().__init__()
        who = "GatedLinearAttention"
        key, value = int(check_int(who, "dim", dim, 1) * expand_k), int(dim * expand_v)
        if key < 1 or value < 1 or key % check_int(who, "num_heads", num_heads, 1) or value % num_heads:
            raise ShapeError(f"{who}: dim * expand_k = {key} and dim * expand_v = {value} must be positive multiples "
                             f"of num_heads = {num_heads}")
        self.dim, self.num_heads, self.core_sizes = dim, num_heads, (num_heads, key // num_heads, value // num_heads)
        self.chunk_size, self.temperature = check_int(who, "chunk_size", chunk_size, 1), float(gate_temperature)
        self.expand_k, self.expand_v = expand_k, expand_v
        self.q_proj, self.k_proj = nn.Linear(dim, key, bias=False), nn.Linear(dim, key, bias=False)
        self.v_proj = nn.Linear(dim, value, bias=False)
        self.gate_down = nn.Linear(dim, check_int(who, "gate_rank", gate_rank, 1), bias=False)
        self.gate_up = nn.Linear(gate_rank, key)
        self.r_proj, self.out_proj = nn.Linear(dim, value), nn.Linear(value, dim, bias=False)
        self.norm = nn.LayerNorm(value // num_heads)

    def _mix(self, x, keep, context, offset):
        q, k, v = (split_heads(p(x), self.num_heads) for p in (self.q_proj, self.k_proj, self.v_proj))
        logits = self.gate_up(self.gate_down(x)).to(torch.promote_types(x.dtype, torch.float32))
        g = split_heads(F.logsigmoid(logits) / self.temperature, self.num_heads)  # (B, H, n, Dk): log alpha
        return Mixed(q, k, v, g, None), None

    def family(self, mixed, **options):
        return gated_linear_attention(mixed.q, mixed.k, mixed.v, mixed.g, **options)

    def _finish(self, out, mixed, x):
        return self.out_proj(F.silu(self.r_proj(x)) * merge_heads(self.norm(out)))


register(Entry("gla", GatedLinearAttention, "Yang et al. 2023, arXiv:2312.06635, Sec. 4 (the GLA layer)",
               "O(L c D + L D^2 / H)", "linear attention with a data-dependent forget gate per key channel",
               "linear-recurrent", example(GatedLinearAttention, 4),
               spec=recurrent_spec(GatedLinearAttention,
                                   lambda s: GatedLinearAttention(s["dim"], s["heads"], expand_k=s["expand_k"],
                                                                  expand_v=s["expand_v"], gate_rank=s["gate_rank"],
                                                                  chunk_size=s["chunk_size"]),
                                   {"heads": 4, "expand_k": 0.5, "expand_v": 1.0, "gate_rank": 16, "chunk_size": 16},
                                   lambda m: {"expand_k": m.expand_k, "expand_v": m.expand_v,
                                              "gate_rank": m.gate_down.out_features})))
