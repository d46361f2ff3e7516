"""The recurrent form: one token at a time with a constant-size state (decoding, and the plainest oracle).

Per head, state ``S`` ``(Dk, Dv)``; ``G`` decays per step, 1 (one per head) or ``Dk`` (one per key channel)::

    S <- diag(exp(g_t)) S                                  decay
    d_t = v_t                    (plain)                   what is written
    d_t = beta_t (v_t - S^T p_t) (delta rule, p_t = k_t: the part of v_t the decayed state does not already
                                  predict; Comba reads it at its own p_t)
    S <- S + k_t d_t^T;   o_t = S^T q_t
"""

from __future__ import annotations

import torch

__all__ = ["step", "recurrent"]


def step(state, q, k, v, g, beta, p=None, pre_decay: bool = False):
    """One token: ``state`` ``(..., Dk, Dv)``, ``q, k`` ``(..., Dk)``, ``v`` ``(..., Dv)``, ``g`` ``(..., G)``,
    ``beta`` ``(...)`` or None, ``p`` ``(..., Dk)`` or None (``k``); ``pre_decay``: the correction reads the state
    before the decay -> ``(o (..., Dv), new state)``."""
    before = state
    state = g.exp()[..., None] * state
    read = k if p is None else p
    seen = before if pre_decay else state
    written = v if beta is None else beta[..., None] * (v - (read[..., None, :] @ seen)[..., 0, :])
    state = state + k[..., :, None] * written[..., None, :]
    return (q[..., None, :] @ state)[..., 0, :], state


def recurrent(q, k, v, g, beta, initial, p=None, pre_decay: bool = False):
    """Every token in turn over ``(..., L, D)`` inputs (``g`` ``(..., L, G)``, ``beta`` ``(..., L)``, ``p`` as ``k``
    or None)."""
    state, outs = initial, []
    betas = (None,) * q.shape[-2] if beta is None else beta.unbind(-1)
    reads = (None,) * q.shape[-2] if p is None else p.unbind(-2)
    for qt, kt, vt, gt, bt, pt in zip(q.unbind(-2), k.unbind(-2), v.unbind(-2), g.unbind(-2), betas, reads,
                                      strict=True):
        out, state = step(state, qt, kt, vt, gt, bt, pt, pre_decay)
        outs.append(out)
    return (torch.stack(outs, -2) if outs else v.new_zeros(v.shape)), state
