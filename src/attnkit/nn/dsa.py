"""DeepSeek Sparse Attention (DSA): a lightning indexer scores every past token, attention reads the top k."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .. import masks
from ..core import attention
from ..costing.attend import attend, projections
from ..costing.tally import dropout_of, dtype_of
from ..errors import ArgumentError, check_int
from ..masks.selected import SelectedKeys
from ..registry.entry import Entry, register
from ._projections import ProjectedAttention, projected_spec
from .latent import MultiHeadLatentAttention
from .rotary import RotaryEmbedding, rotary_for

__all__ = ["DSAIndexer", "DSASparseAttention", "DSALatentAttention", "indexer_kl"]

_ROWS = 1 << 20  # index scores computed at once (query rows x keys): the top-k runs per chunk of queries
_NEG_INF = float("-inf")


class DSAIndexer(nn.Module):
    """The lightning indexer of DeepSeek Sparse Attention: index scores and the top-k keys of each query.

    DeepSeek-AI 2025, "DeepSeek-V3.2" (arXiv:2512.02556), eq. 1-2::

        I[t, s] = sum_j w[t, j] * ReLU(q[t, j] . k[s])        (j over H_I indexer heads)
        S_t     = top-k_s I[t, s]                              (s <= t: earlier tokens and t itself)

    ``q[t, j] = W_q x_t`` (``H_I`` heads of ``d_I``), ``k[s] = W_k x_s`` (one head, shared) and
    ``w[t] = W_w x_t``; as in the reference code, ``q . k`` is scaled by ``d_I^-1/2`` and ``w``
    by ``H_I^-1/2`` (constant factors: the top-k is unchanged, the warm-up loss's softmax is not).

    Differences from the paper: scores in the input's dtype (the paper's are FP8 with a
    Hadamard rotation, an orthogonal map that leaves the dot products as they are). The options of
    DeepSeek-V3.2's released indexer: ``q`` read from another input (``query_dim``: its query latent
    ``c^Q_t``), ``k`` LayerNorm-ed (``key_norm``), and the first ``rotary.dim`` features of both
    rotated by position (``rotary``); without them, no positions in the indexer (the model's own
    positions are the caller's).

    Shapes:
        ``x`` ``(B, n, dim)`` (``query`` ``(B, n, query_dim)``) -> indices ``(B, n, k)`` int64 (``-1``
        where a token has fewer than ``k`` earlier tokens); :meth:`scores` ``(B, n, n)``.

    Complexity:
        ``O(B n^2 H_I d_I)`` (cheap heads) and ``O(B n k)`` for the selection; scores computed
        ``_ROWS`` at a time.

    Args:
        dim: model width.
        index_heads: indexer heads ``H_I``.
        index_dim: indexer head width ``d_I``.
        top_k: keys each query keeps.
        query_dim: the width of the input ``q`` is projected from (default ``dim``: from ``x``).
        key_norm: LayerNorm (epsilon 1e-6) on ``k``, as DeepSeek-V3.2.
        rotary: a :class:`~attnkit.nn.RotaryEmbedding` rotating the first ``rotary.dim`` features of ``q``
            and ``k`` (positions ``0 ..``), as DeepSeek-V3.2; None: none.

    Example:
        >>> _ = torch.manual_seed(0)
        >>> indexer = DSAIndexer(16, index_heads=2, index_dim=4, top_k=3)
        >>> indexer(torch.randn(2, 5, 16)).shape
        torch.Size([2, 5, 3])
    """

    def __init__(self, dim: int, *, index_heads: int = 4, index_dim: int = 32, top_k: int = 2048,
                 query_dim: int | None = None, key_norm: bool = False, rotary: RotaryEmbedding | None = None):
        super().__init__()
        who = type(self).__name__
        self.dim = check_int(who, "dim", dim, 1)
        self.index_heads = check_int(who, "index_heads", index_heads, 1)
        self.index_dim = check_int(who, "index_dim", index_dim, 1)
        self.top_k = check_int(who, "top_k", top_k, 1)
        self.query_dim = dim if query_dim is None else check_int(who, "query_dim", query_dim, 1)
        if rotary is not None and (not isinstance(rotary, RotaryEmbedding) or rotary.dim > index_dim):
            raise ArgumentError(f"{who}: rotary must be None or a RotaryEmbedding of at most index_dim={index_dim} "
                                f"features; got {rotary!r}")
        self.q_proj = nn.Linear(self.query_dim, index_heads * index_dim, bias=False)
        self.k_proj = nn.Linear(dim, index_dim, bias=False)
        self.w_proj = nn.Linear(dim, index_heads, bias=False)
        self.k_norm = nn.LayerNorm(index_dim, eps=1e-6) if key_norm else None
        self.rotary = rotary

    def _rotate(self, t: torch.Tensor, offset: int) -> torch.Tensor:
        """``t`` ``(..., L, d_I)`` with its first ``rotary.dim`` features rotated (row ``i`` at ``offset + i``)."""
        if self.rotary is None:
            return t
        r = self.rotary.dim
        return torch.cat([self.rotary.rotate(t[..., :r], offset=offset), t[..., r:]], dim=-1)

    def scores(self, x: torch.Tensor, start: int = 0, stop: int | None = None, *,
               query: torch.Tensor | None = None, key_keep_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Index scores ``I[t, s]`` of queries ``t`` in ``[start, stop)`` against every key (``-inf``: ``s > t``,
        or ``key_keep_mask[:, s]`` False); ``q`` projected from ``query`` (default ``x``)."""
        batch, n, _ = x.shape
        stop = n if stop is None else stop
        rows = stop - start
        query = x if query is None else query
        q = self.q_proj(query[:, start:stop]).view(batch, rows, self.index_heads, self.index_dim)
        k = self.k_proj(x)  # (B, n, d_I)
        if self.k_norm is not None:
            k = self.k_norm(k)
        q = self._rotate(q.transpose(1, 2), start).transpose(1, 2).reshape(batch, rows * self.index_heads, -1)
        k = self._rotate(k, 0)
        s = F.relu(q @ k.transpose(1, 2) * self.index_dim ** -0.5)  # (B, rows * H_I, n)
        w = self.w_proj(x[:, start:stop]) * self.index_heads ** -0.5  # (B, rows, H_I)
        index = (w.unsqueeze(-2) @ s.view(batch, rows, self.index_heads, n)).squeeze(-2)  # (B, rows, n)
        t = torch.arange(start, stop, device=x.device).view(-1, 1)
        hidden = torch.arange(n, device=x.device) > t
        if key_keep_mask is not None:
            hidden = hidden | ~key_keep_mask[:, None, :]
        return index.masked_fill(hidden, _NEG_INF)

    def forward(self, x: torch.Tensor, *, query: torch.Tensor | None = None,
                key_keep_mask: torch.Tensor | None = None) -> torch.Tensor:
        """The top-k keys of every query, ``(B, n, min(k, n))`` in no particular order; the selection carries no
        gradient.

        ``_ROWS`` index scores at a time, each chunk of queries against the keys up to its last query only; the
        scales are folded into ``w`` (``ReLU(c x) = c ReLU(x)`` for ``c > 0``), so the scores are eq. 1's up to
        rounding."""
        batch, n, _ = x.shape
        k = min(self.top_k, n)
        rows = max(1, _ROWS // max(1, n))
        with torch.no_grad():
            x = x.detach()
            query = x if query is None else query.detach()
            keys = self.k_proj(x)  # (B, n, d_I)
            if self.k_norm is not None:
                keys = self.k_norm(keys)
            keys = self._rotate(keys, 0).transpose(1, 2)  # (B, d_I, n)
            out = torch.empty(batch, n, k, dtype=torch.long, device=x.device)
            for start in range(0, n, rows):
                stop = min(n, start + rows)
                out[:, start:stop] = self._top_k(x, query, keys, start, stop, k, key_keep_mask)
        return out

    def _top_k(self, x, query, keys, start: int, stop: int, k: int, key_keep_mask) -> torch.Tensor:
        """The top-k of queries ``[start, stop)`` over keys ``[0, stop)``: ``(B, stop - start, k)``, -1 past the
        keys a query sees."""
        batch, rows = x.shape[0], stop - start
        q = self.q_proj(query[:, start:stop]).view(batch, rows, self.index_heads, self.index_dim)
        q = self._rotate(q.transpose(1, 2), start).transpose(1, 2).reshape(batch, rows * self.index_heads, -1)
        s = torch.relu_(q @ keys[..., :stop])  # (B, rows * H_I, stop)
        w = self.w_proj(x[:, start:stop]) * (self.index_heads * self.index_dim) ** -0.5  # (B, rows, H_I)
        index = (w.unsqueeze(-2) @ s.view(batch, rows, self.index_heads, stop)).squeeze(-2)  # (B, rows, stop)
        later = torch.arange(start, stop, device=x.device).view(-1, 1) < torch.arange(start, stop, device=x.device)
        index[..., start:].masked_fill_(later, _NEG_INF)
        if key_keep_mask is not None:
            index.masked_fill_(~key_keep_mask[:, None, :stop], _NEG_INF)
        values, idx = index.topk(min(k, stop), dim=-1, sorted=False)
        idx = idx.masked_fill_(values == _NEG_INF, -1)  # fewer than k earlier tokens
        return F.pad(idx, (0, k - idx.shape[-1]), value=-1)

    def extra_repr(self) -> str:
        more = "" if self.query_dim == self.dim else f", query_dim={self.query_dim}"
        more += "" if self.k_norm is None else ", key_norm=True"
        return (f"dim={self.dim}, index_heads={self.index_heads}, index_dim={self.index_dim}, "
                f"top_k={self.top_k}{more}")


def indexer_kl(index_scores: torch.Tensor, weights: torch.Tensor, selected: torch.Tensor | None = None):
    """The indexer's training loss, ``sum_t KL(p_t || softmax(I_t))`` (arXiv:2512.02556, eq. 3 and 4).

    ``weights`` ``(B, H, n, n)``: the main attention's weights; their sum over heads, L1-normalised
    per query, is the target ``p_t`` (no gradient). ``index_scores`` ``(B, n, n)`` with ``-inf``
    on keys a query cannot see. With ``selected`` (bool ``(B, n, n)``, the top-k keys: the sparse
    stage) both distributions are restricted to the selected keys (eq. 4); without, every key
    the query sees (the dense warm-up, eq. 3).
    """
    target = weights.detach().sum(1)
    scores = index_scores if selected is None else index_scores.masked_fill(~selected, _NEG_INF)
    if selected is not None:
        target = target * selected
    target = target / target.sum(-1, keepdim=True).clamp_min(torch.finfo(target.dtype).tiny)
    log_q = torch.log_softmax(scores.to(torch.promote_types(scores.dtype, torch.float32)), -1)
    terms = torch.where(target > 0, target * (torch.log(target.clamp_min(torch.finfo(target.dtype).tiny)) - log_q),
                        0.0)
    return terms.sum()


class DSASparseAttention(ProjectedAttention):
    """Causal self-attention over the top-k keys a :class:`DSAIndexer` picks for each query (DSA).

    DeepSeek-AI 2025, arXiv:2512.02556, eq. 2: ``u_t = Attn(h_t, {c_s : I[t, s] in Top-k(I[t, :])})``,
    every head reading the same selected keys (the paper's MQA mode). The indexer reads the
    input detached (it learns only from :meth:`indexer_loss`, as in the paper's sparse stage).

    Differences from the paper: multi-head attention with its own projections instead of MLA.

    Shapes:
        ``x`` ``(B, n, dim)`` -> ``(B, n, dim)``.

    Complexity:
        ``O(B H n k D)`` for attention (the gathered keys), plus the indexer.

    Args:
        dim: model width.
        num_heads: attention heads (``dim % num_heads == 0``).
        top_k: keys each query reads.
        index_heads: indexer heads.
        index_dim: indexer head width.
        dropout: on the weights, training only.
        bias: projections with bias.

    Example:
        >>> _ = torch.manual_seed(0)
        >>> layer = DSASparseAttention(16, 2, top_k=3, index_heads=2, index_dim=4)
        >>> layer(torch.randn(2, 7, 16)).shape
        torch.Size([2, 7, 16])
    """

    def __init__(self, dim: int, num_heads: int, *, top_k: int = 2048, index_heads: int = 4, index_dim: int = 32,
                 dropout: float = 0.0, bias: bool = True):
        super().__init__(dim, num_heads, dropout=dropout, bias=bias)
        self.indexer = DSAIndexer(dim, index_heads=index_heads, index_dim=index_dim, top_k=top_k)

    @property
    def top_k(self) -> int:
        return self.indexer.top_k

    @property
    def index_heads(self) -> int:
        return self.indexer.index_heads

    @property
    def index_dim(self) -> int:
        return self.indexer.index_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        q, k, v = self.project(x)  # (B, H, n, D) each
        mask = SelectedKeys(self.indexer(x), distinct=True) & masks.causal()  # a top-k: distinct keys
        return self.merge_heads(attention(q, k, v, mask=mask, dropout_p=self.dropout_p))

    def indexer_loss(self, x: torch.Tensor, *, sparse: bool = False) -> torch.Tensor:
        """The indexer's KL loss against this layer's dense attention weights (:func:`indexer_kl`).

        ``sparse=False``: the dense warm-up (every earlier key); ``True``: over the selected keys.
        """
        self.check_input(x)
        with torch.no_grad():
            q, k, v = self.project(x)
            weights = attention(q, k, v, mask=masks.causal(), return_weights=True).weights
        n = x.shape[1]
        scores = self.indexer.scores(x.detach())
        selected = None
        if sparse:
            idx = self.indexer(x)
            selected = torch.zeros(x.shape[0], n, n + 1, dtype=torch.bool, device=x.device)
            selected = selected.scatter_(2, torch.where(idx >= 0, idx, n), True)[..., :n]
        return indexer_kl(scores, weights, selected)


class DSALatentAttention(MultiHeadLatentAttention):
    """Multi-head latent attention over the top-k keys of a lightning indexer: DeepSeek-V3.2's attention layer.

    DeepSeek-AI 2025, "DeepSeek-V3.2", arXiv:2512.02556, Sec. 2.1, eq. 1-2, on the MLA of DeepSeek-V3
    (:class:`MultiHeadLatentAttention`)::

        I[t, s] = sum_j w[t, j] ReLU(q^I[t, j] . k^I[s])      q^I[t, j] = RoPE(W^IQ_j c^Q_t)   (the query latent)
        S_t = top-k_s I[t, s]  (s <= t)                       k^I[s] = RoPE(LayerNorm(W^IK h_s)),  w[t] = W^w h_t
        u_t = MLA(h_t, {c^KV_s, k^R_s : s in S_t})

    The indexer (:class:`DSAIndexer` with ``query_dim=q_lora_rank``, ``key_norm=True`` and a rotation of
    its first ``qk_rope_head_dim`` features) picks each query's keys; every head attends to the same
    ones (the paper's MQA mode of MLA), in either of MLA's forms.

    Notation: as :class:`MultiHeadLatentAttention`; ``W^IQ, W^IK, W^w`` = ``indexer.q_proj, k_proj, w_proj``.

    Differences from the paper: the indexer's scores in the input's dtype (FP8 in the paper); no
    decoding cache (the indexer's keys would need one beside the latent): a full pass over the
    sequence (prefill), ``cache=`` raises.

    Shapes: ``x`` ``(B, n, dim)``, ``key_keep_mask`` ``(B, n)`` -> ``(B, n, dim)``.

    Complexity: MLA's over the ``k`` selected keys (``O(B n k h (d_h + d_h^R + d_v))`` in the naive
    form's attention) plus the indexer's ``O(B n^2 H_I d_I)``.

    Args:
        dim, num_heads, kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim: as
            :class:`MultiHeadLatentAttention`.
        q_lora_rank, causal, rotary, bias: as :class:`MultiHeadLatentAttention` (``q_lora_rank`` required:
            the indexer reads ``c^Q``).
        top_k, index_heads, index_dim: the indexer's ``k``, ``H_I``, ``d_I``.
        index_rotary: the rotation of the indexer's first ``qk_rope_head_dim`` features: options as
            ``rotary`` (default half-split pairs, DeepSeek-V3.2; GLM-MoE-DSA's are interleaved).

    Example:
        >>> _ = torch.manual_seed(0)
        >>> dsa = DSALatentAttention(24, 3, kv_lora_rank=8, q_lora_rank=12, qk_nope_head_dim=6, qk_rope_head_dim=4,
        ...                          v_head_dim=5, top_k=3, index_heads=2, index_dim=8).eval()
        >>> dsa(torch.randn(2, 7, 24)).shape
        torch.Size([2, 7, 24])
    """

    def __init__(self, dim: int, num_heads: int, *, kv_lora_rank: int, qk_rope_head_dim: int,
                 qk_nope_head_dim: int, q_lora_rank: int, v_head_dim: int | None = None, causal: bool = True,
                 rotary: bool | dict | RotaryEmbedding | None = True, bias: bool = False, top_k: int = 2048,
                 index_heads: int = 64, index_dim: int = 128,
                 index_rotary: bool | dict | RotaryEmbedding | None = True):
        who = type(self).__name__
        if q_lora_rank is None:
            raise ArgumentError(f"{who}: the indexer reads the query latent; q_lora_rank must be an int, got None")
        super().__init__(dim, num_heads, kv_lora_rank=kv_lora_rank, qk_rope_head_dim=qk_rope_head_dim,
                         qk_nope_head_dim=qk_nope_head_dim, v_head_dim=v_head_dim, q_lora_rank=q_lora_rank,
                         causal=causal, rotary=rotary, bias=bias)
        check_int(who, "index_dim", index_dim, 1)
        if index_dim < qk_rope_head_dim:
            raise ArgumentError(f"{who}: index_dim must be >= qk_rope_head_dim={qk_rope_head_dim} (the indexer rotates "
                                f"that many features); got {index_dim}")
        default = {"pairing": "half"} if index_rotary is True else index_rotary
        self.indexer = DSAIndexer(dim, index_heads=index_heads, index_dim=index_dim, top_k=top_k,
                                  query_dim=q_lora_rank, key_norm=True,
                                  rotary=rotary_for(who, default, qk_rope_head_dim))

    @property
    def top_k(self) -> int:
        return self.indexer.top_k

    def forward(self, x: torch.Tensor, *, key_keep_mask: torch.Tensor | None = None, cache=None,
                form: str = "naive") -> torch.Tensor:
        if cache is not None:
            raise ArgumentError(f"{type(self).__name__}: no decoding cache (the indexer's keys are not cached); got "
                                f"cache={type(cache).__name__}: call it on the whole sequence")
        return super().forward(x, key_keep_mask=key_keep_mask, form=form)

    def _selected(self, x, q_input, key_keep_mask):
        return SelectedKeys(self.indexer(x, query=q_input, key_keep_mask=key_keep_mask), distinct=True)

    @classmethod
    def from_transformers(cls, layer) -> DSALatentAttention:
        """The equivalent module of a transformers DeepSeek-V3.2 or GLM-MoE-DSA attention layer, indexer included.

        ``module(x)`` then equals the layer on ``x`` at positions ``0 ..`` with a causal mask. A layer
        without its own indexer (GLM's "shared" layers reuse an earlier layer's top-k) raises ArgumentError.
        """
        from ..integrations.transformers_layers import dsa_latent_from_transformers

        return dsa_latent_from_transformers(cls, layer)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, top_k={self.top_k}"


def _example():
    g = torch.Generator().manual_seed(0)
    return DSASparseAttention(16, 2, top_k=4, index_heads=2, index_dim=4), (torch.randn(2, 9, 16, generator=g),)


def _stand_in(n: int, k: int) -> torch.Tensor:
    """Indices shaped as the indexer's: query ``t`` reads ``min(k, t + 1)`` distinct earlier keys, then -1."""
    return (torch.arange(n).view(-1, 1) - torch.arange(k)).clamp(min=-1)


def _count(t, s, module):
    b, n, h, dim = s["batch"], s["length"], s["heads"], s["dim"]
    hi, di, k = s["index_heads"], s["index_dim"], min(s["top_k"], s["length"])
    projections(t, s)
    rows = max(1, _ROWS // max(1, n))
    t.mm("indexer projection k", 1, b * n, dim, di, grads=0)
    for start in range(0, n, rows):  # the indexer, chunk by chunk, without autograd, over the keys up to its end
        stop = min(n, start + rows)
        r = stop - start
        t.mm("indexer projections (q, w)", 1, b * r, dim, hi * (di + 1), grads=0)
        t.mm("index scores q_I k_I^T", b, r * hi, di, stop, grads=0)
        t.mm("weighted sum over indexer heads", b * r, 1, hi, stop, grads=0)
    t.ew("index scores: ReLU, scale, top-k", b * n * (n + 1) // 2 * hi, 3)
    stand_in = masks.selected_keys(_stand_in(n, k).expand(b, n, k)) & masks.causal()
    attend(t, "", b, h, n, n, dim // h, dim // h, dtype=dtype_of(s), mask=stand_in, dropout_p=dropout_of(module))


register(Entry("dsa", DSASparseAttention, "DeepSeek-AI 2025, arXiv:2512.02556, eq. 1-2 (DeepSeek Sparse Attention)",
               "O(L k D) + indexer O(L^2 H_I d_I)",
               "a lightning indexer scores every past token; each query attends its top-k", "long-sequence", _example,
               spec=projected_spec(DSASparseAttention, _count,
                                   "indexer 2 B n dim H_I (d_I + 1) + 2 B n^2 H_I (d_I + 1); attention over k keys",
                                   sizes={"length": 9, "top_k": 4, "index_heads": 2, "index_dim": 4},
                                   options=("top_k", "index_heads", "index_dim"),
                                   at_scale={"top_k": 2048, "index_heads": 64, "index_dim": 128},
                                   source="DeepSeek-AI et al. 2025, arXiv:2512.02556, Sec. 2.1: k = 2048 selected "
                                          "tokens; H_I = 64, d_I = 128")))
