"""The Forgetting Transformer's attention: softmax attention with a data-dependent forget-gate bias.

Lin et al. 2025, "Forgetting Transformer: Softmax Attention with a Forget Gate", ICLR 2025,
arXiv:2503.02130, eq. 3-5. Each token has a forget gate ``f_t = sigmoid(w_f^T x_t + b_f)`` per head
in ``(0, 1)``; with ``F_i = sum_{l <= i} log f_l`` the decay between key ``j`` and query ``i >= j`` is
``prod_{l = j+1}^{i} f_l = exp(F_i - F_j)``, and::

    o_i = sum_{j <= i} exp(q_i^T k_j / sqrt(d) + F_i - F_j) v_j / sum_{j <= i} exp(q_i^T k_j / sqrt(d) + F_i - F_j)

The bias ``D_ij = F_i - F_j`` is a difference of one number per query and one per key, so it is
never stored: :class:`ForgetGateBias` is an additive modifier that each path of
:func:`attnkit.attention` builds one block (or slab of rows) at a time from the ``(B, H, L)``
cumulative sums, with the causal mask. That puts FoX on the O(L)-memory paths, forward and
backward; the gradient reaches the log forget gates through the bias's rows and columns.
"""

from __future__ import annotations

import torch

from ..bias import AdditiveModifier
from ..errors import DeviceError, DTypeError, ShapeError

__all__ = ["ForgetGateBias", "forgetting_attention"]


class ForgetGateBias(AdditiveModifier):
    """The additive bias ``F_i - F_j`` of FoX from cumulative log forget gates ``F`` ``(B, H, Lk)``.

    ``F`` runs over the keys' positions; the ``Lq`` queries are the last ``Lq`` of them (a query
    block, or decoding with a cache, aligned bottom-right as :func:`attnkit.masks.causal`). Use it
    with a causal mask: ``F_i - F_j`` is ``<= 0`` only for ``j <= i`` (it grows past the diagonal).

    Args:
        cumulative: ``F`` ``(B, H, Lk)``, the running sums of the log forget gates over the keys.
    """

    def __init__(self, cumulative: torch.Tensor):
        self.cumulative = cumulative

    def term(self, b, h, q_idx, kv_idx, q_len: int, kv_len: int) -> torch.Tensor:
        f = self.cumulative
        offset = f.shape[-1] - q_len if q_len else 0
        return f[b, h, q_idx + offset] - f[b, h, kv_idx]

    def term_is_finite(self) -> bool:
        return bool(torch.isfinite(self.cumulative.detach()).all())

    def parameters_needing_grad(self) -> list[torch.Tensor]:
        return [self.cumulative] if self.cumulative.requires_grad and torch.is_grad_enabled() else []

    @property
    def num_heads(self) -> int:
        """One row of gates per query head: attention checks that the call has exactly this many."""
        return self.cumulative.shape[1]

    def __repr__(self):
        b, h, n = self.cumulative.shape
        return f"ForgetGateBias(B={b}, H={h}, L={n})"


def _check_gates(who: str, log_fgate, q, k) -> torch.Tensor:
    if not isinstance(log_fgate, torch.Tensor) or not log_fgate.is_floating_point():
        got = log_fgate.dtype if isinstance(log_fgate, torch.Tensor) else type(log_fgate).__name__
        raise DTypeError(f"{who}: log_fgate must be a floating tensor; got {got}")
    want = (q.shape[0], q.shape[1], k.shape[2])
    if q.dim() != 4 or tuple(log_fgate.shape) != want:
        raise ShapeError(f"{who}: log_fgate must have shape (B, H, Lk) = {want} (one gate per query head and "
                         f"key position); got {tuple(log_fgate.shape)}")
    if log_fgate.device != q.device:
        raise DeviceError(f"{who}: log_fgate must be on q's device {q.device}; got {log_fgate.device}")
    return log_fgate


def forgetting_attention(q, k, v, log_fgate, *, scale=None, backend: str = "auto", sinks=None):
    """FoX attention: causal softmax attention with the forget-gate decay ``exp(F_i - F_j)`` (module docstring).

    Shapes: ``q`` ``(B, H, Lq, D)``, ``k`` ``(B, Hkv, Lk, D)``, ``v`` ``(B, Hkv, Lk, Dv)`` (``Lq <= Lk``,
    the queries the last ``Lq`` positions), ``log_fgate`` ``(B, H, Lk)`` = ``log f`` (``<= 0``) per query
    head and key position -> ``(B, H, Lq, Dv)``. Computed by :func:`attnkit.attention` with
    :class:`ForgetGateBias` and a causal mask: O(Lq Lk D) time, O(Lq + Lk) memory beyond q, k, v on
    the chunked paths, forward and backward (``scale``, ``backend``, ``sinks`` as there).

    Example:
        >>> import torch
        >>> import torch.nn.functional as F
        >>> _ = torch.manual_seed(0)
        >>> q, k, v = torch.randn(3, 1, 2, 6, 4).unbind(0)
        >>> out = forgetting_attention(q, k, v, torch.zeros(1, 2, 6))  # f = 1: plain causal softmax attention
        >>> torch.allclose(out, F.scaled_dot_product_attention(q, k, v, is_causal=True), atol=1e-6)
        True
    """
    from ..core import attention
    from ..masks import causal

    gates = _check_gates("forgetting_attention", log_fgate, q, k)
    cumulative = gates.to(torch.promote_types(gates.dtype, torch.float32)).cumsum(-1)
    return attention(q, k, v, mask=causal(), bias=ForgetGateBias(cumulative), scale=scale, backend=backend,
                     sinks=sinks)
