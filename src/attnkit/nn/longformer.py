"""Longformer attention (Beltagy et al. 2020): (dilated) sliding window plus global tokens."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .. import masks
from ..core import attention
from ..costing.attend import attend, projections
from ..costing.tally import dtype_of
from ..errors import ArgumentError, DTypeError, ShapeError, check_int
from ..masks.base import Mask
from ..registry.entry import Entry, register
from ._projections import ProjectedAttention, count_self_attention, projected_spec, sequence_input

__all__ = ["LongformerAttention", "GlobalKeys"]


class GlobalKeys(Mask):
    """Every query may attend the keys flagged in ``flags`` (bool ``(n,)`` or ``(B, n)``, True = global).

    Reads only the key index (and the batch index for per-sample flags), with an exact
    analytic block layout, so OR-ing it with a window keeps the block-sparse kernel sparse.
    """

    def __init__(self, flags: torch.Tensor):
        self.flags = flags.reshape((1,) * (2 - flags.dim()) + tuple(flags.shape))  # (B|1, n)
        self.batch_size = self.flags.shape[0] if self.flags.shape[0] > 1 else None
        self.uses = frozenset({"b", "kv"}) if self.batch_size else frozenset({"kv"})

    def allows(self, b, h, q_idx, kv_idx, q_len, kv_len):
        flags = self.flags.to(kv_idx.device)
        b = b if flags.shape[0] > 1 else torch.zeros_like(b)
        return (kv_idx < flags.shape[1]) & flags[b, kv_idx.clamp(max=flags.shape[1] - 1)]

    def _layout(self, q_len, kv_len, bs, device, sizes=(1, 1)):
        nk, nq = -(-kv_len // bs), -(-q_len // bs)
        flags = F.pad(self.flags[:, :kv_len].to(device), (0, nk * bs - kv_len))  # (B|1, nk * bs)
        real = torch.arange(nk * bs, device=device) < kv_len
        active = flags.view(-1, nk, bs).any(2)
        full = (flags | ~real).view(-1, nk, bs).all(2)
        return active[:, None, None, :].expand(-1, 1, nq, -1), full[:, None, None, :].expand(-1, 1, nq, -1)

    def __repr__(self):
        return f"GlobalKeys(shape={tuple(self.flags.shape)})"


class LongformerAttention(ProjectedAttention):
    """Multi-head self-attention with Longformer's (dilated) sliding window and global tokens.

    Beltagy, Peters & Cohan 2020, arXiv:2004.05150, Sec. 3.1 with eq. 1,
    ``softmax(Q K^T / sqrt(d_k)) V``, over the pattern: query ``i`` sees keys ``i + t d``
    for ``|t| <= w / 2`` (window ``w``, dilation ``d``) and every global token; a global token
    sees every key. Window rows use the projections ``Q_s, K_s, V_s``; global tokens' rows use
    separate ``Q_g, K_g, V_g`` (initialised equal to ``Q_s, K_s, V_s``, as in the paper)::

        w=2, d=1, global={0}
        x x x x x      <- global row: every key, with Q_g, K_g, V_g
        x x x . .
        x x x x .
        x . x x x
        x . . x x

    Notation: ``w`` = ``window``, ``d`` = ``dilation``, ``d_k`` = head width.

    Differences from the paper: one window and dilation for all heads (the paper varies them
    per layer and per head). No autoregressive variant (use :class:`BlockSparseAttention` with
    ``masks.dilated(...) & masks.causal()``). Global rows are computed by dense attention of the
    gathered global queries, window rows on the block-sparse kernel, instead of a banded CUDA kernel.

    Shapes:
        ``x`` ``(B, n, dim)``; ``global_tokens`` positions ``(g,)`` (shared by the batch) or a bool
        ``(B, n)`` tensor (True = global) -> ``(B, n, dim)``.

    Complexity:
        ``O(B H n (w + 2g) d_k)`` time and ``O(B H n (w + g))`` memory for ``g`` global tokens,
        plus ``O(B n dim^2)`` for the seven projections.

    Args:
        dim: model width.
        num_heads: number of heads (``dim % num_heads == 0``).
        window: ``w``, an even number of keys (``w / 2`` on each side; ``0`` = itself only).
        dilation: ``d >= 1``.
        dropout: on the weights, training only.
        bias: projections with bias.

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> layer = LongformerAttention(16, 2, window=4)
        >>> layer(torch.randn(2, 10, 16), global_tokens=[0]).shape
        torch.Size([2, 10, 16])
    """

    def __init__(self, dim: int, num_heads: int, *, window: int, dilation: int = 1, dropout: float = 0.0,
                 bias: bool = True):
        super().__init__(dim, num_heads, dropout=dropout, bias=bias)
        check_int("LongformerAttention", "window", window, 0)
        if window % 2:
            raise ArgumentError(f"LongformerAttention: window must be even (w/2 keys on each side); got {window}")
        self.window, self.dilation = window, check_int("LongformerAttention", "dilation", dilation, 1)
        self.q_global, self.k_global, self.v_global = (nn.Linear(dim, dim, bias=bias) for _ in range(3))
        with torch.no_grad():
            for g, s in ((self.q_global, self.q_proj), (self.k_global, self.k_proj), (self.v_global, self.v_proj)):
                g.load_state_dict(s.state_dict())
        # Independent of n: built once so its block layouts are cached.
        self._window = (masks.sliding_window(window // 2, window // 2) if dilation == 1
                        else masks.dilated(window // 2, dilation))

    def global_flags(self, global_tokens, batch: int, n: int, device) -> torch.Tensor | None:
        """``global_tokens`` as a bool ``(B|1, n)`` tensor (True = global), or None when there are none."""
        if global_tokens is None:
            return None
        try:
            g = torch.as_tensor(global_tokens, device=device)
        except (TypeError, ValueError, RuntimeError) as err:
            raise DTypeError("LongformerAttention: global_tokens must be positions (a list or 1-D/2-D int tensor) "
                             f"or a bool (batch, n) tensor; got {global_tokens!r}") from err
        if g.numel() == 0 and g.dim() == 1:  # no global tokens, e.g. []
            return None
        if g.dtype == torch.bool:
            if tuple(g.shape) != (batch, n):
                raise ShapeError(f"LongformerAttention: a bool global_tokens must have shape (batch, n) = "
                                 f"{(batch, n)}; got {tuple(g.shape)}")
            flags = g
        elif g.is_floating_point() or g.is_complex() or g.dim() > 1:
            raise DTypeError(f"LongformerAttention: global_tokens must be integer positions (g,) or a bool (batch, n) "
                             f"tensor; got dtype {g.dtype}, shape {tuple(g.shape)}")
        else:
            if g.numel() and (int(g.min()) < 0 or int(g.max()) >= n):
                raise ArgumentError(f"LongformerAttention: global_tokens positions must be in [0, {n}); "
                                    f"got {g.tolist()}")
            flags = torch.zeros(1, n, dtype=torch.bool, device=device)
            flags[0, g.long()] = True
        return flags if bool(flags.any()) else None

    def forward(self, x: torch.Tensor, global_tokens=None) -> torch.Tensor:
        self.check_input(x)
        batch, n, _ = x.shape
        flags = self.global_flags(global_tokens, batch, n, x.device)
        q, k, v = self.project(x)  # (B, H, n, D) each
        mask = self._window if flags is None else self._window | GlobalKeys(flags)
        out = attention(q, k, v, mask=mask, dropout_p=self.dropout_p)  # window rows (global rows replaced below)
        if flags is not None and batch:
            out = self._global_rows(x, out, flags.expand(batch, n))
        return self.merge_heads(out)

    def _global_rows(self, x, out, flags):
        """Replace the rows of global tokens by their attention over every key, with Q_g, K_g, V_g."""
        n = x.shape[1]
        count = int(flags.sum(1).max())
        order = torch.sort((~flags).to(torch.uint8), dim=1, stable=True).indices[:, :count]  # global positions first
        real = flags.gather(1, order)  # (B, G): False in the padding slots of samples with fewer tokens
        x_g = x.gather(1, order[..., None].expand(-1, -1, x.shape[2]))  # (B, G, dim)
        q_g = self.split_heads(self.q_global(x_g))  # (B, H, G, D)
        k_g, v_g = self.split_heads(self.k_global(x)), self.split_heads(self.v_global(x))  # (B, H, n, D)
        rows = attention(q_g, k_g, v_g, dropout_p=self.dropout_p)  # (B, H, G, D)
        slots = torch.where(real, order, torch.full_like(order, n))  # padding slots write to a spare row n
        slots = slots[:, None, :, None].expand(-1, out.shape[1], -1, out.shape[3])
        return F.pad(out, (0, 0, 0, 1)).scatter(2, slots, rows.to(out.dtype))[:, :, :n]

    def extra_repr(self) -> str:
        return f"dim={self.dim}, num_heads={self.num_heads}, window={self.window}, dilation={self.dilation}"


def _example():
    g = torch.Generator().manual_seed(0)
    layer = LongformerAttention(16, 2, window=4, dilation=2)
    return lambda x: layer(x, global_tokens=[0, 5]), (torch.randn(2, 14, 16, generator=g),)


def _count(t, s, module):
    b, n, h, dim = s["batch"], s["length"], s["heads"], s["dim"]
    projections(t, s)
    flags = module.global_flags(list(s["global_tokens"]), b, n, None)
    count_self_attention(t, "window rows: ", s, module,
                         module._window if flags is None else module._window | GlobalKeys(flags))
    if flags is not None and b:
        g = int(flags.expand(b, n).sum(1).max())
        t.mm("global projections (Q_g, K_g, V_g)", 1, b * g, dim, dim)
        t.mm("global projections (Q_g, K_g, V_g)", 2, b * n, dim, dim)
        t.inter(b * g * dim, 2 * b * n * dim)
        attend(t, "global rows: ", b, h, g, n, dim // h, dim // h, dtype=dtype_of(s), dropout_p=module.dropout_p)


def _inputs(s, module):
    return (lambda x: module(x, global_tokens=list(s["global_tokens"]))), sequence_input(s, module)[1]


register(Entry("longformer", LongformerAttention, "Beltagy et al. 2020, arXiv:2004.05150, Sec. 3.1",
               "O(L (w + g) D)", "dilated sliding window plus global tokens with their own projections",
               "long-sequence", _example,
               spec=projected_spec(
                   LongformerAttention, _count, "global projections 2 B (g + 2 n) dim^2; window rows as the mask's "
                   "blocks; global rows 2 B H g n 2D", inputs=_inputs, options=("window", "dilation"),
                   sizes={"length": 14, "window": 4, "dilation": 2, "global_tokens": (0, 5)},
                   at_scale={"window": 512, "dilation": 1, "global_tokens": (0,)},
                   source="Beltagy et al. 2020, arXiv:2004.05150, Sec. 5: window 512 in every layer, no dilation (the "
                          "pretrained model); Sec. 3.1: global attention on the [CLS] token")))
