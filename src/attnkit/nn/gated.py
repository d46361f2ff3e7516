"""The standard block's two modern additions: a sigmoid output gate and RMS normalisation of queries and keys.

Both are options of :class:`attnkit.nn.MultiHeadAttention` (``gate=True``, ``qk_norm=True``);
their registry entries ("gated-attention", "qk-norm") and cost specs sit beside the multi-head
one in :mod:`attnkit.nn.multihead`.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["OutputGate", "QKNorm"]


class OutputGate(nn.Module):
    """A sigmoid gate on the attention output, computed from the query's input: ``Y' = Y * sigmoid(X W_theta)``.

    Qiu et al. 2025, "Gated Attention for Large Language Models: Non-linearity, Sparsity, and
    Attention-Sink-Free", arXiv:2505.06708: the gate ``Y' = Y * sigmoid(X W_theta)`` at position G1
    (after scaled dot-product attention, before the output projection; elementwise, head-specific,
    multiplicative), the gate of Qwen3-Next's full-attention layers::

        MultiHead(X) = (Concat(head_1, ..., head_h) * sigmoid(X W_theta + b_theta)) W^O

    The gate adds a data-dependent non-linearity between ``W^V`` and ``W^O`` and lets a query
    output (close to) nothing, so no key has to absorb unwanted attention: the paper reports far
    less attention on the first token ("attention sink") and more stable training.

    Notation: ``X`` = the query's input ``x``, ``Y`` = ``out`` (the heads concatenated),
    ``W_theta, b_theta`` = ``proj.weight, proj.bias``.

    Differences from the paper: none (Qwen3-Next stores ``W_theta`` inside its query projection,
    interleaved per head; :meth:`attnkit.nn.MultiHeadAttention.from_transformers` splits it out).

    Shapes: ``out`` ``(B, L, out_dim)``, ``x`` ``(B, L, in_dim)`` -> ``(B, L, out_dim)``.

    Complexity: ``O(B L in_dim out_dim)`` for the projection, ``O(B L out_dim)`` for the product.

    Args:
        in_dim: features of ``x``.
        out_dim: features of ``out``.
        bias: learn ``b_theta``.
        device, dtype: of the parameters.

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> gate = OutputGate(6, 4)
        >>> gate(torch.ones(2, 3, 4), torch.randn(2, 3, 6)).shape
        torch.Size([2, 3, 4])
    """

    def __init__(self, in_dim: int, out_dim: int, *, bias: bool = True, device=None, dtype=None):
        super().__init__()
        self.proj = nn.Linear(in_dim, out_dim, bias=bias, device=device, dtype=dtype)

    def forward(self, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return out * torch.sigmoid(self.proj(x))


class QKNorm(nn.Module):
    """RMS normalisation of each head's queries and keys before their dot product (and before RoPE).

    Dehghani et al. 2023, "Scaling Vision Transformers to 22 Billion Parameters", arXiv:2302.05442,
    Sec. 2 ("QK normalization"), with Zhang & Sennrich's RMSNorm (2019, arXiv:1910.07467, eq. 4)::

        q' = g_q * q / sqrt(mean(q^2) + eps),   k' = g_k * k / sqrt(mean(k^2) + eps)   (per head, over d)

    Bounding ``|q|`` and ``|k|`` keeps the logits from growing without limit, the instability
    (one-hot attention) that stopped large models' training.

    Notation: ``g_q, g_k`` = ``q_norm.weight, k_norm.weight`` (``d`` each, shared by the heads).

    Differences from the paper: RMSNorm in place of LayerNorm (no centring, no bias), as in
    Qwen3 and OLMo 2.

    Shapes: ``q`` ``(B, H, Lq, d)``, ``k`` ``(B, Hkv, Lk, d)`` -> the same shapes.

    Complexity: ``O((H Lq + Hkv Lk) d)`` per batch.

    Args:
        head_dim: ``d``.
        eps: added to the mean square.
        device, dtype: of the parameters.

    Example:
        >>> import torch
        >>> q, k = QKNorm(4)(3 * torch.ones(2, 3, 5, 4), torch.ones(2, 1, 7, 4))
        >>> [round(v, 4) for v in q[0, 0, 0].tolist()]
        [1.0, 1.0, 1.0, 1.0]
    """

    def __init__(self, head_dim: int, *, eps: float = 1e-6, device=None, dtype=None):
        super().__init__()
        self.q_norm = nn.RMSNorm(head_dim, eps=eps, device=device, dtype=dtype)
        self.k_norm = nn.RMSNorm(head_dim, eps=eps, device=device, dtype=dtype)

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.q_norm(q), self.k_norm(k)
