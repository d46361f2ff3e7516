"""DeepSeek Sparse Attention (DSA): a lightning indexer scores every past token, attention reads the top k."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .. import masks
from ..core import attention
from ..costing.attend import attend, projections
from ..costing.tally import dropout_of, dtype_of
from ..errors import check_int
from ..registry.entry import Entry, register
from ._projections import ProjectedAttention, projected_spec

__all__ = ["DSAIndexer", "DSASparseAttention", "indexer_kl"]

_ROWS = 1 << 22  # index scores computed at once (query rows x keys): the top-k runs per chunk of queries
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
    Hadamard rotation, an orthogonal map that leaves the dot products as they are); no rotary
    embedding in the indexer (the model's own positions are the caller's).

    Shapes:
        ``x`` ``(B, n, dim)`` -> indices ``(B, n, k)`` int64 (``-1`` where a token has fewer than
        ``k`` earlier tokens); :meth:`scores` ``(B, n, n)``.

    Complexity:
        ``O(B n^2 H_I d_I)`` (cheap heads) and ``O(B n k)`` for the selection; scores computed
        ``_ROWS`` at a time.

    Args:
        dim: model width.
        index_heads: indexer heads ``H_I``.
        index_dim: indexer head width ``d_I``.
        top_k: keys each query keeps.

    Example:
        >>> _ = torch.manual_seed(0)
        >>> indexer = DSAIndexer(16, index_heads=2, index_dim=4, top_k=3)
        >>> indexer(torch.randn(2, 5, 16)).shape
        torch.Size([2, 5, 3])
    """

    def __init__(self, dim: int, *, index_heads: int = 4, index_dim: int = 32, top_k: int = 2048):
        super().__init__()
        who = type(self).__name__
        self.dim = check_int(who, "dim", dim, 1)
        self.index_heads = check_int(who, "index_heads", index_heads, 1)
        self.index_dim = check_int(who, "index_dim", index_dim, 1)
        self.top_k = check_int(who, "top_k", top_k, 1)
        self.q_proj = nn.Linear(dim, index_heads * index_dim, bias=False)
        self.k_proj = nn.Linear(dim, index_dim, bias=False)
        self.w_proj = nn.Linear(dim, index_heads, bias=False)

    def scores(self, x: torch.Tensor, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """Index scores ``I[t, s]`` of queries ``t`` in ``[start, stop)`` against every key (``-inf``: ``s > t``)."""
        batch, n, _ = x.shape
        stop = n if stop is None else stop
        rows = stop - start
        q = self.q_proj(x[:, start:stop]).view(batch, rows * self.index_heads, self.index_dim)
        k = self.k_proj(x)  # (B, n, d_I)
        s = F.relu(q @ k.transpose(1, 2) * self.index_dim ** -0.5)  # (B, rows * H_I, n)
        w = self.w_proj(x[:, start:stop]) * self.index_heads ** -0.5  # (B, rows, H_I)
        index = (w.unsqueeze(-2) @ s.view(batch, rows, self.index_heads, n)).squeeze(-2)  # (B, rows, n)
        t = torch.arange(start, stop, device=x.device).view(-1, 1)
        return index.masked_fill(torch.arange(n, device=x.device) > t, _NEG_INF)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The top-k keys of every query, ``(B, n, min(k, n))``; the selection carries no gradient."""
        batch, n, _ = x.shape
        k = min(self.top_k, n)
        rows = max(1, _ROWS // max(1, n))
        out = []
        with torch.no_grad():
            for start in range(0, n, rows):
                values, idx = self.scores(x.detach(), start, min(n, start + rows)).topk(k, dim=-1)
                out.append(idx.masked_fill(values == _NEG_INF, -1))  # fewer than k earlier tokens
        return torch.cat(out, 1) if out else x.new_zeros(batch, 0, k, dtype=torch.long)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, index_heads={self.index_heads}, index_dim={self.index_dim}, top_k={self.top_k}"


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
        mask = masks.selected_keys(self.indexer(x)) & masks.causal()
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


def _example():
    g = torch.Generator().manual_seed(0)
    return DSASparseAttention(16, 2, top_k=4, index_heads=2, index_dim=4), (torch.randn(2, 9, 16, generator=g),)


def _count(t, s, module):
    b, n, h, dim = s["batch"], s["length"], s["heads"], s["dim"]
    hi, di, k = s["index_heads"], s["index_dim"], min(s["top_k"], s["length"])
    projections(t, s)
    rows = max(1, _ROWS // max(1, n))
    for start in range(0, n, rows):  # the indexer, chunk by chunk, without autograd
        r = min(n, start + rows) - start
        t.mm("indexer projections (q, w)", 1, b * r, dim, hi * (di + 1), grads=0)
        t.mm("indexer projection k", 1, b * n, dim, di, grads=0)
        t.mm("index scores q_I k_I^T", b, r * hi, di, n, grads=0)
        t.mm("weighted sum over indexer heads", b * r, 1, hi, n, grads=0)
    t.ew("index scores: ReLU, scale, top-k", b * n * n * hi, 3)
    stand_in = masks.selected_keys(torch.zeros(b, n, k, dtype=torch.long)) & masks.causal()
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
