"""RWKV-7's time mixing: token shift, low-rank gates, the generalized delta rule, a group norm and a bonus term."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ShapeError, check_int
from ..functional.recurrences import generalized_delta_rule
from ..registry.entry import Entry, register
from ._inputs import merge_heads, split_heads
from ._recurrent import RecurrentLayer, example
from ._recurrent_parts import Mixed
from ._recurrent_spec import recurrent_spec

__all__ = ["RWKV7TimeMixing"]

_DECAY_FLOOR = -math.exp(-0.5)  # the log decay's range: w = exp(-e^-0.5 sigmoid(.)) in (0.545, 1)


class LowRank(nn.Module):
    """``act(x W_down) W_up (+ b)``: RWKV's low-rank projections (``down`` ``dim -> rank`` without bias)."""

    def __init__(self, dim: int, out: int, rank: int, activation=None, bias: bool = True):
        super().__init__()
        self.down, self.up = nn.Linear(dim, rank, bias=False), nn.Linear(rank, out, bias=bias)
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.down(x)
        return self.up(h if self.activation is None else self.activation(h))


def _rank(dim: int, scale: float) -> int:
    """The reference's low-rank widths: ``scale sqrt(dim)`` rounded to a multiple of 32, at least 32."""
    return max(32, int(round(scale * dim ** 0.5 / 32) * 32))


class RWKV7TimeMixing(RecurrentLayer):
    """RWKV-7 "Goose"'s time mixing: a per-channel decay plus a rank-one removal along a normalised key.

    Peng et al. 2025, "RWKV-7 "Goose" with Expressive Dynamic State Evolution", arXiv:2503.14456,
    Sec. 4 (eq. 14-20; the block of flash-linear-attention's ``RWKV7Attention``)::

        x^s_t = lerp(x_t, x_{t-1}, mu_s)                   (token shift, s in r, w, k, v, a, g)
        r = x^r W_r,  k = x^k W_k,  v = x^v W_v
        w = exp(-e^-0.5 sigmoid(lora_w(x^w)))              (per channel; lora_w = tanh(x A) B + b)
        a = sigmoid(lora_a(x^a)),  g = sigmoid(x^g G_1) G_2 (in-context learning rate, output gate)
        kappa^ = (k * k_k) / |k * k_k|  (per head),   k~ = k * (1 + (a - 1) * k_a)
        S_t = (diag(w_t) - (a_t * kappa^_t) kappa^_t^T) S_{t-1} + k~_t v_t^T,   o_t = S_t^T r_t
        y = ((GroupNorm(o) + ((r * k~ * r_k) . 1) v) * g) W_o           (per head)

    the recurrence :func:`attnkit.functional.recurrences.generalized_delta_rule` with ``a = -kappa^``,
    ``b = kappa^ * a``, in the form asked for. Notation: ``W_r, W_k, W_v, W_o`` = ``r_proj, k_proj,
    v_proj, o_proj``; ``mu_s`` = ``x_r, x_w, x_k, x_v, x_a, x_g``; ``lora_w, lora_a, G`` = ``w_lora,
    a_lora, g_lora``; the group norm (one group per head, eps ``head_dim * eps``) = ``g_norm``. The
    decoding cache holds the last input (the token shift) and the state.

    Differences from the paper: this is the first layer's form: layers after the first mix their
    values with the first layer's (the value residual, ``v_lora``), which a single layer cannot see.
    Initialisation follows the reference's first layer loosely (token-shift ratios, decay and
    learning-rate biases, ``k_k``, ``k_a``, ``r_k``); ``o_proj`` is not zeroed.

    Shapes: ``x`` ``(B, n, dim)``, ``key_keep_mask`` ``(B, n)`` bool (True = real token) -> ``(B, n, dim)``;
    :meth:`forward_step`: ``(B, dim) -> (B, dim)``.

    Complexity: that of Kimi Delta Attention over ``2 n`` steps: chunk form O(n c H D + n H D^2) plus the
    projections; state ``H D^2`` numbers plus the last input's ``dim``.

    Args:
        dim: model width.
        num_heads: heads H (``dim % H == 0``; ``D = dim / H``).
        decay_rank, a_rank, gate_rank: the low-rank widths of ``w_lora, a_lora, g_lora`` (default the
            reference's, from ``dim`` and ``D``).
        chunk_size: block length of the chunk form, in steps (two a token).
        eps: the group norm's epsilon per feature.

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> layer = RWKV7TimeMixing(16, 2)
        >>> x = torch.randn(2, 9, 16)
        >>> cache = layer.new_cache()
        >>> steps = torch.stack([layer.forward_step(x[:, t], cache) for t in range(9)], 1)
        >>> torch.allclose(steps, layer(x), atol=1e-5)
        True
    """

    per_channel_decay = True

    scale = 1.0
    steps_per_token = 2  # the generalized delta rule runs as two delta-rule steps a token (cost spec)
    delta_rule = True
    reads_before_decay = True  # the removal reads S_{t-1} before the decay (cost spec)
    own_recurrence = "its generalized delta rule reads the state before the decay"

    def __init__(self, dim: int, num_heads: int, *, decay_rank: int | None = None, a_rank: int | None = None,
                 gate_rank: int | None = None, chunk_size: int = 64, eps: float = 1e-5):
        super().__init__()
        who = "RWKV7TimeMixing"
        heads = check_int(who, "num_heads", num_heads, 1)
        if check_int(who, "dim", dim, 1) % heads:
            raise ShapeError(f"{who}: dim must be a multiple of num_heads; got dim={dim}, num_heads={heads}")
        d = dim // heads
        factor = d / 64
        ranks = [check_int(who, name, r, 1) if r is not None else _rank(dim, s) for name, r, s in
                 (("decay_rank", decay_rank, 2.5 * factor), ("a_rank", a_rank, 2.5 * factor),
                  ("gate_rank", gate_rank, 5.0))]
        self.dim, self.num_heads, self.core_sizes = dim, heads, (heads, d, d)
        self.chunk_size = check_int(who, "chunk_size", chunk_size, 1)
        self.token_shift = dim  # the decoding cache keeps the last input (cost spec)
        place = torch.arange(dim) / dim
        for name, power in (("x_r", 0.2), ("x_w", 0.9), ("x_k", 0.7), ("x_v", 0.7), ("x_a", 0.9), ("x_g", 0.2)):
            setattr(self, name, nn.Parameter(1.0 - place ** power))
        self.k_k = nn.Parameter(torch.full((dim,), 0.85))
        self.k_a = nn.Parameter(torch.full((dim,), 1.02))
        self.r_k = nn.Parameter(torch.full((heads, d), -0.04))
        self.r_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(dim, dim, bias=False) for _ in range(4))
        self.w_lora = LowRank(dim, dim, ranks[0], torch.tanh)
        self.a_lora = LowRank(dim, dim, ranks[1])
        self.g_lora = LowRank(dim, dim, ranks[2], torch.sigmoid, bias=False)
        with torch.no_grad():
            self.w_lora.up.bias.copy_(-6 + 6 * (torch.arange(dim) / max(dim - 1, 1)) ** 1.5 + 0.5)
            self.a_lora.up.bias.fill_(-0.19)
        self.g_norm = nn.GroupNorm(heads, dim, eps=d * eps)

    def _mix(self, x, keep, context, offset):
        previous = x.new_zeros(x.shape[0], 1, self.dim) if context is None else context.transpose(1, 2).to(x.dtype)
        if x.shape[1] == 0:  # nothing read, the cache's last input kept
            return self._mixed(x, x), context
        return self._mixed(x, torch.cat([previous, x[:, :-1]], 1)), x[:, -1:].transpose(1, 2)  # tail (B, dim, 1)

    def _mixed(self, x, shifted) -> Mixed:
        xr, xw, xk, xv, xa, xg = (torch.lerp(x, shifted, getattr(self, f"x_{s}").to(x.dtype)) for s in "rwkvag")
        acc = torch.promote_types(x.dtype, torch.float32)
        h = self.num_heads
        r, k, v = (split_heads(p(t).to(acc), h) for p, t in ((self.r_proj, xr), (self.k_proj, xk), (self.v_proj, xv)))
        w = _DECAY_FLOOR * torch.sigmoid(split_heads(self.w_lora(xw).to(acc), h))  # log decays (B, H, n, D)
        a = torch.sigmoid(split_heads(self.a_lora(xa).to(acc), h))
        kappa = F.normalize(k * split_heads(self.k_k.to(acc).expand(1, 1, -1), h), dim=-1)
        k = k * (1 + (a - 1) * split_heads(self.k_a.to(acc).expand(1, 1, -1), h))
        return Mixed(r, k, v, w, None, (-kappa, kappa * a, self.g_lora(xg)))

    def recurrence(self, mixed: Mixed, keep, form: str, initial_state):
        """:func:`~attnkit.functional.recurrences.generalized_delta_rule` of ``mixed``; a padded token neither
        writes (zero key), removes (zero ``b``) nor decays."""
        removal, rate, _ = mixed.rest
        k, g = mixed.k, mixed.g
        if keep is not None:
            pad = ~keep[:, None, :, None]
            k, g, rate = (t.masked_fill(pad, 0.0) for t in (k, g, rate))
        return generalized_delta_rule(mixed.q, k, mixed.v, g, removal, rate, scale=self.scale, form=form,
                                      chunk_size=self.chunk_size, initial_state=initial_state)

    def _finish(self, out, mixed, x):
        gate = mixed.rest[2]
        b, _, n, _ = out.shape
        normed = self.g_norm(merge_heads(out).reshape(b * n, self.dim).to(self.g_norm.weight.dtype))
        bonus = (mixed.q * mixed.k * self.r_k.to(out.dtype)[:, None]).sum(-1, keepdim=True) * mixed.v
        y = normed.reshape(b, n, self.dim).to(out.dtype) + merge_heads(bonus)
        return self.o_proj((y * gate.to(out.dtype)).to(x.dtype))


register(Entry("rwkv7", RWKV7TimeMixing, "Peng et al. 2025, arXiv:2503.14456, Sec. 4 (RWKV-7's time mixing)",
               "O(L c D + L D^2 / H)", "token shift and low-rank gates, then the generalized delta rule: a "
               "per-channel decay with a rank-one removal along a normalised key, scaled by an in-context "
               "learning rate", "linear-recurrent", example(RWKV7TimeMixing, 4),
               spec=recurrent_spec(RWKV7TimeMixing,
                                   lambda s: RWKV7TimeMixing(s["dim"], s["heads"], decay_rank=s["decay_rank"],
                                                             a_rank=s["a_rank"], gate_rank=s["gate_rank"],
                                                             chunk_size=s["chunk_size"]),
                                   {"heads": 4, "decay_rank": None, "a_rank": None, "gate_rank": None,
                                    "chunk_size": 64},
                                   lambda m: {"decay_rank": m.w_lora.down.out_features,
                                              "a_rank": m.a_lora.down.out_features,
                                              "gate_rank": m.g_lora.down.out_features})))
