"""RetNet's multi-scale retention: linear attention with a fixed decay per head, rotary positions and a swish gate."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ShapeError, check_int
from ..functional.recurrences.decay import retention
from ..registry.entry import Entry, register
from ._inputs import merge_heads, split_heads
from ._recurrent import RecurrentLayer, example
from ._recurrent_parts import Mixed
from ._recurrent_spec import recurrent_spec
from .rotary import RotaryEmbedding

__all__ = ["RetNetRetention"]


class RetNetRetention(RecurrentLayer):
    """Multi-scale retention (MSR): one retention per head, each with its own fixed decay ``gamma_h``.

    Sun et al. 2023, "Retentive Network: A Successor to Transformer for Large Language Models",
    arXiv:2307.08621, eq. 5-8::

        Q = (X W_Q) * Theta,  K = (X W_K) * conj(Theta),  V = X W_V        (Theta: rotation by position)
        Retention(X) = (Q K^T * D) V,   D_nm = gamma^(n - m) (n >= m), 0 otherwise
        gamma_h = 1 - 2^(-5 - h);   Y = GroupNorm_h(Concat(head_1 .. head_H))
        MSR(X) = (swish(X W_G) * Y) W_O

    computed by :func:`attnkit.functional.recurrences.retention`'s recurrence in the form asked for
    (``forward(x, form=...)``: "chunk", "parallel" or "recurrent"). Notation: ``W_Q, W_K, W_V, W_G,
    W_O`` = ``q_proj, k_proj, v_proj, g_proj, out_proj``; ``Theta`` = :class:`RotaryEmbedding` (pairs
    of adjacent features); ``gamma`` = ``exp(log_decay)``; the GroupNorm = ``norm``.

    Differences from the paper: the retention scores are scaled by ``d^-1/2`` (as their code);
    the further normalisations of Sec. 2.2 (per-row factors that the group norm cancels up to its
    eps) are left out. Value heads are ``value_factor`` times wider than key heads (2, as the paper).
    Projections have no bias.

    Shapes: ``x`` ``(B, n, dim)``, ``key_keep_mask`` ``(B, n)`` bool (True = real token) -> ``(B, n, dim)``;
    :meth:`forward_step`: ``(B, dim) -> (B, dim)``.

    Complexity: chunk form O(n c d + n d^2 / H) per layer (c = ``chunk_size``), O(d^2 / H) state per
    token decoded; parallel O(n^2 d).

    Args:
        dim: model width.
        num_heads: heads (``dim % num_heads == 0``; key head width ``dim / num_heads``).
        value_factor: value width over key width.
        chunk_size: block length of the chunk form.
        eps: the group norm's epsilon.

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> layer = RetNetRetention(16, 2)
        >>> x = torch.randn(2, 7, 16)
        >>> cache = layer.new_cache()
        >>> steps = torch.stack([layer.forward_step(x[:, t], cache) for t in range(7)], 1)
        >>> torch.allclose(steps, layer(x), atol=1e-5)
        True
    """

    def __init__(self, dim: int, num_heads: int, *, value_factor: int = 2, chunk_size: int = 64, eps: float = 1e-6):
        super().__init__()
        check_int("RetNetRetention", "num_heads", num_heads, 1)
        check_int("RetNetRetention", "value_factor", value_factor, 1)
        if check_int("RetNetRetention", "dim", dim, 1) % num_heads:
            raise ShapeError(f"RetNetRetention: dim must be a multiple of num_heads; got dim={dim}, "
                             f"num_heads={num_heads}")
        self.dim, self.num_heads, self.chunk_size = dim, num_heads, check_int("RetNetRetention", "chunk_size",
                                                                             chunk_size, 1)
        wide, self.value_factor = value_factor * dim, value_factor
        self.core_sizes = (num_heads, dim // num_heads, wide // num_heads)
        self.q_proj, self.k_proj = nn.Linear(dim, dim, bias=False), nn.Linear(dim, dim, bias=False)
        self.v_proj, self.g_proj = nn.Linear(dim, wide, bias=False), nn.Linear(dim, wide, bias=False)
        self.out_proj = nn.Linear(wide, dim, bias=False)
        self.norm = nn.GroupNorm(num_heads, wide, eps=eps)
        self.rotary = RotaryEmbedding(dim // num_heads)
        self.learned_decay = False  # gamma is fixed per head
        self.register_buffer("log_decay", torch.log1p(-(2.0 ** (-5.0 - torch.arange(num_heads, dtype=torch.float64)))))

    def _mix(self, x, keep, context, offset):
        q, k = (split_heads(p(x), self.num_heads) for p in (self.q_proj, self.k_proj))  # (B, H, n, d)
        q, k = self.rotary(q, k, q_offset=offset, k_offset=offset)
        v = split_heads(self.v_proj(x), self.num_heads)  # (B, H, n, value_factor d)
        g = self.log_decay.to(torch.promote_types(x.dtype, torch.float32))[:, None, None].expand(
            x.shape[0], self.num_heads, x.shape[1], 1)
        return Mixed(q, k, v, g, None), None

    def family(self, mixed, **options):
        """:func:`~attnkit.functional.recurrences.retention` with the log decays per token (0 at padded tokens)."""
        return retention(mixed.q, mixed.k, mixed.v, g=mixed.g[..., 0], **options)

    def _finish(self, out, mixed, x):
        y = self.norm(merge_heads(out).flatten(0, 1)).unflatten(0, x.shape[:2])  # per head, per token
        return self.out_proj(F.silu(self.g_proj(x)) * y)


register(Entry("retnet", RetNetRetention, "Sun et al. 2023, arXiv:2307.08621, eq. 5-8 (multi-scale retention)",
               "O(L c D + L D^2 / H)", "linear attention with a fixed decay gamma per head, rotary positions, "
               "group norm and a swish gate", "linear-recurrent", example(RetNetRetention, 4),
               spec=recurrent_spec(RetNetRetention,
                                   lambda s: RetNetRetention(s["dim"], s["heads"], value_factor=s["value_factor"],
                                                             chunk_size=s["chunk_size"]),
                                   {"heads": 4, "value_factor": 2, "chunk_size": 64},
                                   lambda m: {"value_factor": m.value_factor})))
