"""The state-passing scan: carry the state from block to block, and the affine map of a run of blocks.

A block entered with state ``S`` leaves with ``diag(Gamma) S + K~^T (U - W S)`` (see :mod:`.local`),
an affine map of ``S``. :func:`pass_states` applies those maps one block after the other (a loop
over the ``C = L / c`` blocks, each step ``O(c Dk Dv)``), returning the state each block was entered
with, the values it wrote and the last state. :func:`span_map` folds a run of blocks into one map
``S -> M S + N``: the scan itself, run on the augmented state ``[I | 0]`` (``Dk x (Dk + Dv)``), which
the maps carry to ``[M | N]`` because they are affine. Sequence parallelism sends those maps, whose
size does not depend on the length (:mod:`attnkit.distributed.recurrences`).
"""

from __future__ import annotations

import torch

from .local import Local

__all__ = ["pass_states", "span_map", "apply_map"]


def pass_states(initial: torch.Tensor, blocks: Local):
    """States entering each block ``(..., C, Dk, Dv)``, written values ``(..., C, c, Dv)``, last state.

    ``blocks`` holds :class:`Local` terms with a block axis before the token axis (``(..., C, c, D)``);
    ``initial`` is ``(..., Dk, Dv)``.
    """
    state, entering = initial, []
    if blocks.w is None:  # nothing written depends on the state: every block's update at once
        updates = blocks.k_to_end.transpose(-1, -2) @ blocks.u  # (..., C, Dk, Dv)
        for decay, update in zip(blocks.decay.unbind(-3), updates.unbind(-3), strict=True):
            entering.append(state)
            state = decay * state + update
        return _stack(entering, initial), blocks.u, state
    written = []  # unbind, not indexing in the loop: a slice's backward would write a full-size gradient
    for decay, k_end, u, w in zip(blocks.decay.unbind(-3), blocks.k_to_end.unbind(-3), blocks.u.unbind(-3),
                                  blocks.w.unbind(-3), strict=True):
        entering.append(state)
        written.append(u - w @ state)  # (..., c, Dv)
        state = decay * state + k_end.transpose(-1, -2) @ written[-1]
    return _stack(entering, initial), torch.stack(written, -3) if written else blocks.u, state


def _stack(states: list[torch.Tensor], initial: torch.Tensor) -> torch.Tensor:
    return torch.stack(states, -3) if states else initial.new_zeros(*initial.shape[:-2], 0, *initial.shape[-2:])


def span_map(blocks: Local) -> tuple[torch.Tensor, torch.Tensor]:
    """``(M, N)`` with ``M`` ``(..., Dk, Dk)`` and ``N`` ``(..., Dk, Dv)``: the run of blocks maps ``S`` to
    ``M S + N``."""
    dk, dv = blocks.k_to_end.shape[-1], blocks.u.shape[-1]
    lead = blocks.u.shape[:-3]
    eye = torch.eye(dk, dtype=blocks.u.dtype, device=blocks.u.device).expand(*lead, dk, dk)
    start = torch.cat([eye, blocks.u.new_zeros(*lead, dk, dv)], -1)  # [I | 0]
    augmented = blocks._replace(u=torch.cat([blocks.u.new_zeros(*blocks.u.shape[:-1], dk), blocks.u], -1))  # [0 | U]
    _, _, last = pass_states(start, augmented)
    return last.split([dk, dv], -1)


def apply_map(m: torch.Tensor, n: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """``M S + N``."""
    return m @ state + n
