"""RWKV-7's generalized delta rule: a per-channel decay plus a rank-one transition with free vectors a and b."""

from __future__ import annotations

import torch

from ...errors import ShapeError
from .forms import check_lengths, check_qkv, check_tensor, linear_recurrence

__all__ = ["generalized_delta_rule"]


def generalized_delta_rule(q, k, v, g, a, b, *, scale=None, form: str = "chunk", chunk_size: int = 32,
                           initial_state=None, cu_seqlens=None):
    """``S_t = (diag(exp(g_t)) + b_t a_t^T) S_{t-1} + k_t v_t^T``, ``o_t = S_t^T q_t``: RWKV-7's state update.

    Peng et al. 2025, "RWKV-7 "Goose" with Expressive Dynamic State Evolution", arXiv:2503.14456,
    eq. 14 (in the paper's ``(Dv, Dk)`` layout ``S_t = S_{t-1} (diag(w_t) + a_t^T b_t) + v_t^T k_t``;
    here the state is ``(Dk, Dv)``, its transpose). RWKV-7 sets ``a = -kappa^``, ``b = kappa^ * a_t``
    (the normalised removal key and the in-context learning rate) and ``w = exp(g)`` per channel;
    the function takes any ``a, b``. The transition is diagonal plus rank one, not necessarily
    symmetric: flash-linear-attention's ``dplr`` recurrence.

    Computed as two steps per token of the delta rule's machinery (:func:`.forms.linear_recurrence`):
    the first decays by ``g_t`` and writes ``b_t (S_{t-1}^T a_t)^T`` (key ``b_t``, a correction read at
    ``a_t`` from the state before the decay, ``beta = -1``, value 0), the second writes ``k_t v_t^T``;
    the query reads after the second. So every form of the delta rule runs it.

    Differences from the paper: none in the function (the output gate, group norm and the bonus
    term ``(r (k u)^T) v`` of RWKV-7's block belong to a layer); q is scaled by ``scale`` (default 1,
    as RWKV-7: its receptance is not scaled).

    Shapes: ``q, k, a, b`` ``(B, H, L, Dk)``, ``v`` ``(B, H, L, Dv)``, ``g`` ``(B, H, L, Dk)`` log decays
    -> ``(out (B, H, L, Dv), final state (N, H, Dk, Dv))``; ``form``, ``chunk_size`` (in steps, 2 per
    token), ``initial_state``, ``cu_seqlens`` (in tokens) as :func:`attnkit.functional.recurrences.delta_rule`.

    Complexity: that of Kimi Delta Attention over ``2 L`` steps.

    Example:
        >>> import torch
        >>> import torch.nn.functional as F
        >>> _ = torch.manual_seed(0)
        >>> q, k, v, kappa = torch.randn(4, 1, 2, 6, 4).unbind(0)
        >>> kappa = F.normalize(kappa, dim=-1)
        >>> g = -0.6 * torch.sigmoid(torch.randn(1, 2, 6, 4))
        >>> a, b = -kappa, kappa * torch.rand(1, 2, 6, 4)
        >>> out, _ = generalized_delta_rule(q, k, v, g, a, b, chunk_size=4)
        >>> torch.allclose(out, generalized_delta_rule(q, k, v, g, a, b, form="recurrent")[0], atol=1e-5)
        True
    """
    who = "generalized_delta_rule"
    nb, h, n, dk, dv = check_qkv(who, q, k, v)
    if q.shape[1] != h:
        raise ShapeError(f"{who}: q, k and v must have the same heads; got {q.shape[1]} and {h}")
    for name, t in (("g", g), ("a", a), ("b", b)):
        check_tensor(who, name, t, (nb, h, n, dk), "(B, H, L, Dk)", q.device)
    lengths = check_lengths(who, cu_seqlens, nb, n)

    def steps(first, second):  # (B, H, L, D) twice -> (B, H, 2 L, D), token t's steps at 2 t, 2 t + 1
        return torch.stack([first, second], 3).flatten(2, 3)

    zero_k, zero_v = q.new_zeros(nb, h, n, dk), v.new_zeros(nb, h, n, dv)
    beta = torch.stack([torch.full_like(g[..., 0], -1.0), torch.ones_like(g[..., 0])], 3).flatten(2, 3)
    out, final = linear_recurrence(who, steps(zero_k, q), steps(b, k), steps(zero_v, v), steps(g, torch.zeros_like(g)),
                                   beta, scale=1.0 if scale is None else scale, normalize_qk=False, form=form,
                                   chunk_size=chunk_size, initial_state=initial_state,
                                   cu_seqlens=None if lengths is None else cu_seqlens * 2,
                                   p=steps(a, zero_k), pre_decay=True)
    return out[:, :, 1::2], final
