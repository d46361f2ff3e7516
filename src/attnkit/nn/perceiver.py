"""Perceiver: a small latent array cross-attends to a long input, then self-attends (Jaegle et al. 2021)."""

from __future__ import annotations

import torch
from torch import nn

from .. import masks
from ..core import attention
from ..costing.attend import ATTENTION_FORMULA, attend
from ..costing.spec import Spec
from ..costing.tally import dropout_of, dtype_of, randn
from ..errors import ArgumentError
from ..registry.entry import Entry, register
from ._inputs import check_keep_mask, check_sequence, merge_heads, split_heads
from .padding import clear_padding

__all__ = ["PerceiverAttention", "PerceiverEncoder"]


class PerceiverAttention(nn.Module):
    """Multi-head attention from a latent array to a context (Jaegle et al. 2021, arXiv:2103.03206, Sec. 2.1).

    ``out = W_o softmax(Q K^T / sqrt(d)) V`` with ``Q = latents W_q`` (N x D) and ``K, V = context W_k,
    context W_v`` (M x C): the cost is O(M N), linear in the input length M, not O(M^2). With
    ``context=None`` it is the latent self-attention of the latent Transformer. Notation: latent array
    = ``latents``, byte array = ``context``.

    Differences from the paper: none in the attention itself; layer norms and residuals live in
    :class:`PerceiverEncoder`.

    Shapes: ``latents`` ``(b, N, query_dim)``, ``context`` ``(b, M, context_dim)``, ``context_keep_mask``
    ``(b, M)`` bool (True = real input position) -> ``(b, N, query_dim)``. A sample whose context is
    all padding gets zero attention (the output is then ``out_proj``'s bias).

    Complexity: O(N M d) time, O(N M) memory per head (less on the chunked/SDPA backends).

    Args:
        query_dim: width of the latents.
        context_dim: width of the context (default ``query_dim``).
        num_heads: number of heads.
        head_dim: width per head.
        dropout: on the weights while training.

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> cross = PerceiverAttention(16, 8, num_heads=2, head_dim=4)
        >>> cross(torch.randn(2, 3, 16), torch.randn(2, 50, 8)).shape
        torch.Size([2, 3, 16])
    """

    def __init__(self, query_dim: int, context_dim: int | None = None, *, num_heads: int = 1, head_dim: int = 64,
                 dropout: float = 0.0):
        super().__init__()
        context_dim = context_dim or query_dim
        if min(query_dim, context_dim, num_heads, head_dim) < 1:
            raise ArgumentError(f"dims and num_heads must be >= 1; got {(query_dim, context_dim, num_heads, head_dim)}")
        if not 0 <= dropout < 1:
            raise ArgumentError(f"dropout must be in [0, 1); got {dropout!r}")
        self.query_dim, self.context_dim, self.num_heads, self.dropout = query_dim, context_dim, num_heads, dropout
        inner = num_heads * head_dim
        self.q_proj = nn.Linear(query_dim, inner)
        self.k_proj = nn.Linear(context_dim, inner)
        self.v_proj = nn.Linear(context_dim, inner)
        self.out_proj = nn.Linear(inner, query_dim)

    def forward(self, latents: torch.Tensor, context: torch.Tensor | None = None, *,
                context_keep_mask: torch.Tensor | None = None) -> torch.Tensor:
        self_attention = context is None
        context = latents if context is None else context
        who = type(self).__name__
        check_sequence(who, "latents", latents, self.query_dim, like=self)
        check_sequence(who, "context", context, self.context_dim, like=self)
        keep = check_keep_mask(type(self).__name__, "context_keep_mask", context_keep_mask,
                               context.shape[0], context.shape[1])
        context = clear_padding(context, keep)
        latents = context if self_attention else latents
        q = split_heads(self.q_proj(latents), self.num_heads)  # (b, h, N, d)
        k, v = split_heads(self.k_proj(context), self.num_heads), split_heads(self.v_proj(context), self.num_heads)
        out = attention(q, k, v, mask=None if keep is None else masks.keys(keep),
                        dropout_p=self.dropout if self.training else 0.0)
        return self.out_proj(merge_heads(out))


class _FeedForward(nn.Sequential):
    def __init__(self, dim: int, dropout: float):
        super().__init__(nn.LayerNorm(dim), nn.Linear(dim, 4 * dim), nn.GELU(), nn.Dropout(dropout),
                         nn.Linear(4 * dim, dim))


class PerceiverEncoder(nn.Module):
    """Perceiver encoder: cross-attend from learned latents to the input, then a latent Transformer.

    Jaegle et al. 2021, arXiv:2103.03206, Sec. 2 and Fig. 1: with a learned latent array ``z`` (N x D),
    ``z = z + CrossAttn(LN(z), LN(x)); z = z + MLP(LN(z))``, then ``depth`` blocks of
    ``z = z + SelfAttn(LN(z)); z = z + MLP(LN(z))`` (pre-norm, MLP width 4 D, GELU), and a final LN.

    Differences from the paper: one cross-attend followed by one latent stack (the paper interleaves
    further cross-attends, optionally weight-shared); positional/Fourier features of the input are the
    caller's. Latents start as a truncated normal (std 0.02) as in the paper.

    Shapes: ``x`` ``(b, M, input_dim)``, ``input_keep_mask`` ``(b, M)`` bool (True = real position)
    -> ``(b, num_latents, latent_dim)``. A padded sample gives the same latents as the sample alone.

    Complexity: O(M N D) for the cross-attend plus O(depth N^2 D) for the latent blocks: linear in M.

    Args:
        input_dim: width C of the input.
        num_latents: N.
        latent_dim: D.
        depth: latent self-attention blocks.
        cross_heads, latent_heads: heads of the two attentions.
        head_dim: width per head.
        dropout: on the attention weights and inside the MLPs while training.

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> enc = PerceiverEncoder(8, num_latents=4, latent_dim=16, depth=1, latent_heads=2, head_dim=8)
        >>> enc(torch.randn(2, 100, 8)).shape
        torch.Size([2, 4, 16])
    """

    def __init__(self, input_dim: int, *, num_latents: int = 64, latent_dim: int = 256, depth: int = 4,
                 cross_heads: int = 1, latent_heads: int = 8, head_dim: int = 64, dropout: float = 0.0):
        super().__init__()
        self.input_dim = input_dim
        self.latents = nn.Parameter(nn.init.trunc_normal_(torch.empty(num_latents, latent_dim), std=0.02))
        self.norm_latents, self.norm_input = nn.LayerNorm(latent_dim), nn.LayerNorm(input_dim)
        self.cross_attn = PerceiverAttention(latent_dim, input_dim, num_heads=cross_heads, head_dim=head_dim,
                                             dropout=dropout)
        self.cross_ff = _FeedForward(latent_dim, dropout)
        self.blocks = nn.ModuleList(nn.ModuleDict({
            "norm": nn.LayerNorm(latent_dim),
            "attn": PerceiverAttention(latent_dim, num_heads=latent_heads, head_dim=head_dim, dropout=dropout),
            "ff": _FeedForward(latent_dim, dropout)}) for _ in range(depth))
        self.norm_out = nn.LayerNorm(latent_dim)

    def forward(self, x: torch.Tensor, *, input_keep_mask: torch.Tensor | None = None) -> torch.Tensor:
        check_sequence(type(self).__name__, "x", x, self.input_dim, like=self)
        x = clear_padding(x, check_keep_mask(type(self).__name__, "input_keep_mask", input_keep_mask, *x.shape[:2]))
        z = self.latents.to(x.dtype).expand(x.shape[0], -1, -1)  # (b, N, D)
        z = z + self.cross_attn(self.norm_latents(z), self.norm_input(x), context_keep_mask=input_keep_mask)
        z = z + self.cross_ff(z)
        for block in self.blocks:
            h = block["norm"](z)
            z = z + block["attn"](h)
            z = z + block["ff"](z)
        return self.norm_out(z)


def _example_attention():
    g = torch.Generator().manual_seed(0)
    return (PerceiverAttention(16, 8, num_heads=2, head_dim=8),
            (torch.randn(2, 4, 16, generator=g), torch.randn(2, 32, 8, generator=g)))


def _example_encoder():
    g = torch.Generator().manual_seed(0)
    enc = PerceiverEncoder(8, num_latents=4, latent_dim=16, depth=1, latent_heads=2, head_dim=8)
    return enc, (torch.randn(2, 32, 8, generator=g),)


def _cross(t, label, b, lq, lk, q_dim, kv_dim, heads, hd, dt, module):
    """:class:`PerceiverAttention`: projections, attention, output projection."""
    inner = heads * hd
    t.mm(f"{label}projections (q, out)", 2, b * lq, q_dim, inner)
    t.mm(f"{label}projections (k, v)", 2, b * lk, kv_dim, inner)
    t.inter(2 * b * lq * inner, 2 * b * lk * inner)
    attend(t, label, b, heads, lq, lk, hd, hd, dtype=dt, dropout_p=dropout_of(module))


def _attention_count(t, s, module=None):
    _cross(t, "", s["batch"], s["latents"], s["length"], s["query_dim"], s["context_dim"], s["heads"],
           s["head_dim"], dtype_of(s), module)


def _encoder_count(t, s, module=None):
    b, lat, dim, dt = s["batch"], s["latents"], s["latent_dim"], dtype_of(s)
    parts = [None] * (s["depth"] + 1) if module is None else [module.cross_attn, *(k["attn"] for k in module.blocks)]
    for i, part in enumerate(parts):
        label = "cross-attend: " if i == 0 else "latent blocks: "
        if i:
            _cross(t, label, b, lat, lat, dim, dim, s["latent_heads"], s["head_dim"], dt, part)
        else:
            _cross(t, label, b, lat, s["length"], dim, s["input_dim"], s["cross_heads"], s["head_dim"], dt, part)
        t.mm(f"{label}MLP (D -> 4D -> D)", 2, b * lat, dim, 4 * dim)
        t.ew(f"{label}layer norms, GELU, residuals", b * lat * dim, 16)


def _encoder_config(m):
    cross, blocks = m.cross_attn, m.blocks
    return {"input_dim": m.input_dim, "latents": m.latents.shape[0], "latent_dim": m.latents.shape[1],
            "depth": len(blocks), "cross_heads": cross.num_heads,
            "head_dim": cross.q_proj.out_features // cross.num_heads,
            "latent_heads": blocks[0]["attn"].num_heads if len(blocks) else 1}


_ATTENTION_SPEC = Spec(
    {"batch": 2, "latents": 4, "length": 32, "query_dim": 16, "context_dim": 8, "heads": 2, "head_dim": 8,
     "dtype": "float32"}, _attention_count,
    lambda s, m: (m, (randn(s["batch"], s["latents"], s["query_dim"], dtype=dtype_of(s)),
                      randn(s["batch"], s["length"], s["context_dim"], seed=1, dtype=dtype_of(s)))),
    "projections 2 B (2 N Dq + 2 L Dc) H d; " + ATTENTION_FORMULA + " with Lq = N latents",
    make=lambda s: PerceiverAttention(s["query_dim"], s["context_dim"], num_heads=s["heads"],
                                      head_dim=s["head_dim"]).to(dtype_of(s)),
    module_type=PerceiverAttention,
    config=lambda m: {"query_dim": m.query_dim, "context_dim": m.context_dim, "heads": m.num_heads,
                      "head_dim": m.q_proj.out_features // m.num_heads})
_ENCODER_SPEC = Spec(
    {"batch": 2, "length": 32, "input_dim": 8, "latents": 4, "latent_dim": 16, "depth": 1, "cross_heads": 1,
     "latent_heads": 2, "head_dim": 8, "dtype": "float32"}, _encoder_count,
    lambda s, m: (m, (randn(s["batch"], s["length"], s["input_dim"], dtype=dtype_of(s)),)),
    "cross-attend (as perceiver-attention) + MLP 16 B N D^2; depth x (latent self-attention + MLP)",
    make=lambda s: PerceiverEncoder(s["input_dim"], num_latents=s["latents"], latent_dim=s["latent_dim"],
                                    depth=s["depth"], cross_heads=s["cross_heads"], latent_heads=s["latent_heads"],
                                    head_dim=s["head_dim"]).to(dtype_of(s)),
    module_type=PerceiverEncoder, config=_encoder_config)
_PAPER = "Jaegle et al. 2021, arXiv:2103.03206, Sec. 2.1"
register(Entry("perceiver-attention", PerceiverAttention, _PAPER, "O(L N D)",
               "N latent queries cross-attend to a length-L input", "long-sequence", _example_attention,
               spec=_ATTENTION_SPEC))
register(Entry("perceiver-encoder", PerceiverEncoder, _PAPER, "O(L N D + N^2 D)",
               "latent cross-attention then a latent Transformer", "long-sequence", _example_encoder,
               spec=_ENCODER_SPEC))
