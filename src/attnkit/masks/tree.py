"""The mask of a speculative draft tree verified in one call: each node sees the committed keys and its ancestors.

Speculative decoding with a token tree (Miao et al. 2024, SpecInfer, arXiv:2305.09781, Sec. 4;
Cai et al. 2024, Medusa, arXiv:2401.10774, tree attention) appends the ``T`` draft tokens of a tree
after the committed sequence and attends them in one call. ``parents[i]`` is node ``i``'s parent
(``-1``: a root, whose parent is the last committed token), and every parent precedes its node
(``parents[i] < i``), so the nodes are in a topological order. Aligned bottom-right, the last ``T``
of ``Lk`` keys are the nodes and the last ``T`` of ``Lq`` queries are too::

    node query i (row Lq - T + i) sees key j  iff  j < Lk - T  or  j - (Lk - T) is i or an ancestor of i
    earlier query rows r are causal:             j <= r + Lk - Lq

With ``parents = [-1, 0, 1, ..., T - 2]`` (a chain) this is :func:`attnkit.masks.causal`. Node ``i``'s
output then equals attending its root-to-node path alone after the committed keys.
"""

from __future__ import annotations

import torch

from ..errors import ArgumentError, DTypeError, ShapeError
from .base import Mask

__all__ = ["TreeMask", "ancestors", "check_parents"]


def check_parents(who: str, parents) -> torch.Tensor:
    """``parents`` ``(T,)`` or ``(B, T)`` as a CPU long tensor if every ``parents[i]`` is in ``[-1, i)``, else the
    named error (a float or bool dtype, another rank, a parent at or after its node)."""
    t = parents if isinstance(parents, torch.Tensor) else torch.as_tensor(parents if len(parents) else [],
                                                                          dtype=torch.long)
    if t.dtype == torch.bool or t.is_floating_point() or t.is_complex():
        raise DTypeError(f"{who}: parents must hold integer node indices; got dtype {t.dtype}")
    if t.dim() not in (1, 2):
        raise ShapeError(f"{who}: parents must have shape (nodes,) or (batch, nodes); got {tuple(t.shape)}")
    t = t.long().cpu()
    bad = (t < -1) | (t >= torch.arange(t.shape[-1]))
    if bool(bad.any()):
        where = tuple(int(x) for x in torch.nonzero(bad)[0])
        raise ArgumentError(f"{who}: every parent must precede its node (-1 <= parents[i] < i, -1 for a root); got "
                            f"parents[{', '.join(map(str, where))}] = {int(t[where])}")
    return t


def ancestors(parents: torch.Tensor) -> torch.Tensor:
    """``anc[b, i, a]``: node ``a`` is node ``i`` or one of its ancestors, for valid ``parents (B, T)``."""
    batch, t = parents.shape
    anc = torch.eye(t, dtype=torch.bool).repeat(batch, 1, 1)
    for b in range(batch):
        for i, p in enumerate(parents[b].tolist()):  # a parent precedes its node: its row is complete
            if p >= 0:
                anc[b, i] |= anc[b, p]
    return anc


class TreeMask(Mask):
    """:func:`attnkit.masks.tree`: ``parents`` ``(T,)`` or ``(B, T)`` integers, ``parents[i]`` in ``[-1, i)``."""

    kind = "pattern"

    def __init__(self, parents):
        t = check_parents("masks.tree", parents)
        self.parents = t
        self.nodes = t.shape[-1]
        self.batch_size = t.shape[0] if t.dim() == 2 else None
        self.uses = frozenset({"b", "q", "kv"}) if t.dim() == 2 else frozenset({"q", "kv"})
        self._anc = ancestors(t.reshape(-1, self.nodes))  # (B|1, T, T)

    def allows(self, b, h, q_idx, kv_idx, q_len, kv_len):
        t = self.nodes
        anc = self._anc.to(q_idx.device)
        nq = q_idx + (t - q_len)  # the query's node, < 0 for the rows before the tree
        nk = kv_idx - (kv_len - t)  # the key's node, < 0 for committed keys
        causal = kv_idx <= q_idx + (kv_len - q_len)
        if t == 0:
            return causal
        batch = b if anc.shape[0] > 1 else torch.zeros_like(b)
        in_tree = anc[batch, nq.clamp(0, t - 1), nk.clamp(0, t - 1)]
        return torch.where(nk < 0, causal, in_tree & (nq >= 0))

    def depths(self) -> torch.Tensor:
        """Each node's depth ``(B|1, T)`` (a root's is 0): its position after the committed tokens on its path."""
        return self._anc.sum(-1) - 1

    def path(self, node: int, row: int = 0) -> list[int]:
        """The nodes from a root to ``node`` (of batch row ``row`` for per-sequence trees), in order."""
        parents = self.parents if self.parents.dim() == 1 else self.parents[row]
        if isinstance(node, bool) or not isinstance(node, int) or not 0 <= node < self.nodes:
            raise ArgumentError(f"TreeMask.path: node must be an integer in [0, {self.nodes}); got {node!r}")
        out = [node]
        while int(parents[out[-1]]) >= 0:
            out.append(int(parents[out[-1]]))
        return out[::-1]

    def check_path(self, who: str, nodes, row: int = 0) -> list[int]:
        """``nodes`` if they are a root-to-node path of the tree (each the parent of the next), else ArgumentError."""
        nodes = [int(n) for n in nodes]
        if nodes and (not all(0 <= n < self.nodes for n in nodes) or self.path(nodes[-1], row) != nodes):
            want = self.path(nodes[-1], row) if 0 <= nodes[-1] < self.nodes else "a path of nodes in range"
            raise ArgumentError(f"{who}: nodes must be a root-to-node path of the tree (each node's parent before "
                                f"it, starting at a root); got {nodes}, the path to node {nodes[-1]} is {want}")
        return nodes

    def __repr__(self):
        return f"tree({self.parents.tolist()})"
