"""The affine map of a run of blocks: what sequence parallelism sends instead of the states.

A block entered with state ``S`` leaves with ``diag(Gamma) S + K~^T (U - W S)`` (see :mod:`.local`),
an affine map of ``S``. The chunk form applies those maps one block after the other
(:func:`.forms.pass_states`). :func:`span_map` folds a run of blocks into one map
``S -> M S + N``: the scan itself, run on the augmented state ``[I | 0]`` (``Dk x (Dk + Dv)``), which
the maps carry to ``[M | N]`` because they are affine. Sequence parallelism sends those maps, whose
size does not depend on the length (:mod:`attnkit.distributed.recurrences`).
"""

from __future__ import annotations

import torch

from .forms import pass_states
from .local import Local

__all__ = ["span_map", "apply_map"]


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
