"""DeltaProduct: several delta-rule steps per token, so each token's transition is a product of Householder-like
matrices (a richer, possibly rotating, state update than the delta rule's one reflection)."""

from __future__ import annotations

import torch

from ...errors import ShapeError, check_int
from .forms import check_lengths, check_qkv, check_tensor, linear_recurrence, required_beta

__all__ = ["delta_product"]


def delta_product(q, k, v, beta, *, num_householder: int, g=None, scale=None, normalize_qk: bool = False,
                  form: str = "chunk", chunk_size: int = 64, initial_state=None, cu_seqlens=None):
    """``n_h`` delta-rule steps per token (Gated DeltaProduct with ``g``), read once after the last step.

    Siems et al. 2025, "DeltaProduct: Improving State-Tracking in Linear RNNs via Householder
    Products", arXiv:2502.10297, eq. 3 (with the gate of Gated DeltaNet)::

        S_{t,0} = alpha_t S_{t-1}
        S_{t,i} = (I - beta_{t,i} k_{t,i} k_{t,i}^T) S_{t,i-1} + beta_{t,i} k_{t,i} v_{t,i}^T    i = 1 .. n_h
        S_t = S_{t,n_h},   o_t = S_t^T q_t

    so the transition of token ``t`` is ``alpha_t prod_i (I - beta_{t,i} k_{t,i} k_{t,i}^T)``: with
    ``beta`` in ``[0, 2]`` and unit keys, a product of ``n_h`` reflections can rotate the state.

    Computed as the (gated) delta rule over the ``L n_h`` steps in sequence: each token's queries are
    read only at its last step (the others read a zero query) and its decay is applied at its first
    step. ``form`` (``"parallel" | "chunk" | "recurrent"``), ``chunk_size`` (counted in steps, ``L n_h``
    of them), ``initial_state``, ``cu_seqlens`` (in tokens), ``scale`` and ``normalize_qk`` as
    :func:`attnkit.functional.recurrences.delta_rule`.

    Shapes: ``q`` ``(B, Hk, L, Dk)``; ``k`` ``(B, Hk, L n_h, Dk)``, ``v`` ``(B, H, L n_h, Dv)`` and ``beta``
    ``(B, H, L n_h)`` with token ``t``'s steps at ``t n_h .. t n_h + n_h - 1`` (flash-linear-attention's
    layout); ``g`` ``(B, H, L)`` log decays or None -> ``(out (B, H, L, Dv), final state (N, H, Dk, Dv))``.

    Complexity: that of the delta rule over ``L n_h`` steps.

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> q, k, v = torch.randn(1, 2, 5, 4), torch.randn(1, 2, 10, 4), torch.randn(1, 2, 10, 3)
        >>> beta = 2 * torch.rand(1, 2, 10)  # two reflections per token
        >>> out, state = delta_product(q, k, v, beta, num_householder=2, normalize_qk=True, chunk_size=4)
        >>> again, _ = delta_product(q, k, v, beta, num_householder=2, normalize_qk=True, form="recurrent")
        >>> out.shape, torch.allclose(out, again, atol=1e-5)
        (torch.Size([1, 2, 5, 3]), True)
    """
    who = "delta_product"
    n_h = check_int(who, "num_householder", num_householder, 1)
    if not isinstance(q, torch.Tensor) or q.dim() != 4:
        raise ShapeError(f"{who}: q must have shape (B, Hk, L, Dk); got "
                         f"{tuple(q.shape) if isinstance(q, torch.Tensor) else type(q).__name__}")
    b, hk, n, dk = q.shape
    reads = q.new_zeros(b, hk, n, n_h, dk)
    reads[:, :, :, -1] = q  # the query reads after the token's last step
    h = check_qkv(who, reads.flatten(2, 3), k, v, names=("q (its L n_h steps)", "k", "v"))[1]
    check_tensor(who, "beta", required_beta(who, beta), (b, h, n * n_h), "(B, H, L n_h)", q.device)
    decay = v.new_zeros(b, h, n, n_h)
    if g is not None:
        decay[:, :, :, 0] = check_tensor(who, "g", g, (b, h, n), "(B, H, L)", q.device)  # at the token's first step
    lengths = check_lengths(who, cu_seqlens, b, n)
    steps = None if lengths is None else cu_seqlens * n_h
    out, final = linear_recurrence(who, reads.flatten(2, 3), k, v, decay.flatten(2, 3)[..., None], beta, scale=scale,
                                   normalize_qk=normalize_qk, form=form, chunk_size=chunk_size,
                                   initial_state=initial_state, cu_seqlens=steps)
    return out[:, :, n_h - 1::n_h], final
