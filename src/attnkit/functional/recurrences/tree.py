"""The tree form: a speculative draft tree through a linear recurrence, each node's state its parent's after one step.

Speculative decoding verifies a tree of draft tokens in one call (Miao et al. 2024, SpecInfer,
arXiv:2305.09781). For softmax attention the tree is a mask (:func:`attnkit.masks.tree`); a
recurrence has no mask to change, so the tree is walked: with ``parents[i]`` node ``i``'s parent
(``-1``: a root, whose parent is the committed state ``S_0``) and parents before their nodes::

    S_i = step(S_parents[i], q_i, k_i, v_i, g_i, beta_i)      (S_-1 = S_0)      o_i = S_i^T q_i

with ``step`` the recurrent form's (:mod:`.recurrent`). Node ``i``'s output and state are then those
of the recurrence run over its root-to-node path alone from ``S_0``. Every node's state is kept, so
that committing an accepted path takes its last node's state.

Complexity: O(T Dk Dv) time per head, O(T Dk Dv) memory (every node's state).
"""

from __future__ import annotations

import torch

from .recurrent import step

__all__ = ["tree"]


def tree(q, k, v, g, beta, initial, parents: torch.Tensor):
    """Prepared inputs ``q, k`` ``(B, H, T, Dk)``, ``v`` ``(B, H, T, Dv)``, ``g`` ``(B, H, T, G)``, ``beta``
    ``(B, H, T)`` or None, ``initial`` ``(B, H, Dk, Dv)``, valid ``parents`` ``(B, T)`` -> every node's output
    ``(B, H, T, Dv)`` and state ``(B, H, T, Dk, Dv)``."""
    batch, nodes = parents.shape
    rows = parents.tolist()
    states: list[torch.Tensor] = []
    outs: list[torch.Tensor] = []
    for i in range(nodes):
        before = [initial[b] if rows[b][i] < 0 else states[rows[b][i]][b] for b in range(batch)]
        out, state = step(torch.stack(before), q[:, :, i], k[:, :, i], v[:, :, i], g[:, :, i],
                          None if beta is None else beta[:, :, i])
        states.append(state)
        outs.append(out)
    if not nodes:
        return v.new_zeros(v.shape), initial.new_zeros(*initial.shape[:2], 0, *initial.shape[2:])
    return torch.stack(outs, 2), torch.stack(states, 2)
