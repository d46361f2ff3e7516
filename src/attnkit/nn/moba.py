"""MoBA, Mixture of Block Attention: each query attends the top-k key blocks by mean key, and its own block."""

from __future__ import annotations

import torch

from .. import masks
from ..core import attention
from ..costing.attend import attend, projections
from ..costing.tally import dropout_of, dtype_of
from ..errors import check_int
from ..registry.entry import Entry, register
from ._projections import ProjectedAttention, projected_spec, sequence_input

__all__ = ["MoBA", "moba_blocks"]

_INF = float("inf")


def moba_blocks(q: torch.Tensor, k: torch.Tensor, block_size: int, top_k: int) -> torch.Tensor:
    """The key blocks each query selects, ``(B, H, n, min(top_k, n_blocks))`` (``-1``: fewer blocks to choose).

    Lu et al. 2025, arXiv:2502.13189, eq. 5-6: ``s_i = <q, mean_pool(K[I_i])>`` over the keys of block
    ``i``; the top-k blocks by ``s_i``, among the blocks that start at or before the query (later
    ones ``-inf``), the query's own block always among them (``+inf``). No gradient.
    """
    with torch.no_grad():
        batch, heads, n, d = q.shape
        blocks = -(-k.shape[2] // block_size)
        padded = torch.nn.functional.pad(k, (0, 0, 0, blocks * block_size - k.shape[2]))
        counts = torch.full((blocks,), block_size, dtype=k.dtype, device=k.device)
        if blocks:  # the last block may be partial; an empty sequence has none
            counts[-1] = k.shape[2] - (blocks - 1) * block_size
        means = padded.view(batch, heads, blocks, block_size, d).sum(3) / counts[:, None]  # (B, H, nb, D)
        gate = q @ means.transpose(-1, -2)  # (B, H, n, nb)
        own = torch.arange(n, device=q.device)[:, None] // block_size
        column = torch.arange(blocks, device=q.device)
        gate = gate.masked_fill(column > own, -_INF).masked_fill(column == own, _INF)
        values, idx = gate.topk(min(top_k, blocks), dim=-1)
        return idx.masked_fill(values == -_INF, -1)


class MoBA(ProjectedAttention):
    """Causal self-attention over a few key blocks per query, chosen by a parameter-free gate (MoBA).

    Lu et al. 2025, arXiv:2502.13189, Sec. 2.2, eq. 2-6: the keys are cut into blocks of
    ``block_size``; query ``q`` scores block ``i`` by ``s_i = <q, mean_pool(K[I_i])>`` and attends
    the union of its top-``k`` blocks, ``Attn(q, K[I], V[I])`` with ``I = U_{g_i = 1} I_i``;
    blocks after the query are never chosen and its own block always is, with a causal mask
    inside it. Each head chooses its own blocks.

    Differences from the paper: none in the function computed. As in the paper's kernel, the own
    block (causal) and the other selected blocks are attended separately and merged by lse
    (attnkit's selected-blocks path: the own blocks in place, the past blocks in tiles of queries
    sharing a block).

    Shapes:
        ``x`` ``(B, n, dim)`` -> ``(B, n, dim)``.

    Complexity:
        ``O(B H n k bs D)`` for attention, ``O(B H n (n / bs) D)`` for the gate.

    Args:
        dim: model width.
        num_heads: heads (``dim % num_heads == 0``).
        block_size: keys per block.
        top_k: blocks each query attends, its own included.
        dropout: on the weights, training only.
        bias: projections with bias.

    Example:
        >>> _ = torch.manual_seed(0)
        >>> layer = MoBA(16, 2, block_size=4, top_k=2)
        >>> layer(torch.randn(2, 11, 16)).shape
        torch.Size([2, 11, 16])
    """

    def __init__(self, dim: int, num_heads: int, *, block_size: int = 512, top_k: int = 3, dropout: float = 0.0,
                 bias: bool = True):
        super().__init__(dim, num_heads, dropout=dropout, bias=bias)
        self.block_size = check_int(type(self).__name__, "block_size", block_size, 1)
        self.top_k = check_int(type(self).__name__, "top_k", top_k, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        q, k, v = self.project(x)  # (B, H, n, D) each
        chosen = moba_blocks(q, k, self.block_size, self.top_k)
        mask = masks.selected_blocks(chosen, self.block_size) & masks.causal()
        return self.merge_heads(attention(q, k, v, mask=mask, dropout_p=self.dropout_p))

    def extra_repr(self) -> str:
        return f"dim={self.dim}, num_heads={self.num_heads}, block_size={self.block_size}, top_k={self.top_k}"


def _example():
    g = torch.Generator().manual_seed(0)
    return MoBA(16, 2, block_size=4, top_k=2), (torch.randn(2, 19, 16, generator=g),)


def _make(s):
    with torch.random.fork_rng(devices=[]):  # seeded: the count reads the blocks this module chooses
        torch.manual_seed(0)
        return MoBA(s["dim"], s["heads"], block_size=s["block_size"], top_k=s["top_k"]).to(dtype_of(s))


def _count(t, s, module):
    """The blocks the module chooses on the spec's inputs decide the gathered path's work (their unions)."""
    b, n, h, dim, bs = s["batch"], s["length"], s["heads"], s["dim"], s["block_size"]
    d, blocks = dim // h, -(-s["length"] // s["block_size"])
    projections(t, s)
    t.ew("block means of the keys", b * h * blocks * bs * d)
    t.mm("gate q . mean_k", b * h, n, d, blocks, grads=0)
    with torch.no_grad():
        q, k, _ = module.project(sequence_input(s, module)[1][0])
        chosen = masks.selected_blocks(moba_blocks(q, k, bs, s["top_k"]), bs)
    attend(t, "", b, h, n, n, d, d, dtype=dtype_of(s), mask=chosen & masks.causal(), dropout_p=dropout_of(module))


register(Entry("moba", MoBA, "Lu et al. 2025, arXiv:2502.13189, eq. 5-6 (Mixture of Block Attention)",
               "O(L k bs D) + gate O(L^2 D / bs)", "each query attends its top-k key blocks by mean key, and its own",
               "long-sequence", _example,
               spec=projected_spec(MoBA, _count, "gate 2 B H n (n / bs) D; attention over k blocks of bs keys",
                                   sizes={"length": 19, "block_size": 4, "top_k": 2},
                                   options=("block_size", "top_k"), make=_make,
                                   at_scale={"block_size": 512, "top_k": 3},
                                   source="Lu et al. 2025, arXiv:2502.13189, Sec. 3.1: block size 512, top-k 3")))
