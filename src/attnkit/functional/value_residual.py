"""Value residual (ResFormer): every layer's values mixed with the first layer's."""

from __future__ import annotations

import torch

from ..errors import ShapeError

__all__ = ["value_residual"]


def value_residual(v: torch.Tensor, first: torch.Tensor, mix=0.5) -> torch.Tensor:
    """``mix * V_n + (1 - mix) * V_1``: the values a layer attends over, the first layer's mixed in.

    Zhou et al. 2024, "Value Residual Learning For Alleviating Attention Concentration In
    Transformers", arXiv:2410.17897, eq. 6 (ResFormer; x-transformers' ``add_value_residual``)::

        U_n = A_n (lambda_1 V_n + lambda_2 V_1),     here lambda_1 = mix, lambda_2 = 1 - mix

    Give the result to :func:`attnkit.attention` as the values: the attention runs on its fastest
    exact path unchanged. ``mix`` a number (0.5: the paper's equal weights) or a tensor
    broadcasting against ``v`` (a learned gate per token and head, ``(B, H, L, 1)``, as
    x-transformers' ``learned_value_residual_mix``).

    Shapes: ``v``, ``first`` ``(B, Hkv, L, Dv)`` -> the same.

    Example:
        >>> import torch
        >>> v, first = torch.ones(1, 2, 3, 4), torch.zeros(1, 2, 3, 4)
        >>> value_residual(v, first, 0.25)[0, 0, 0].tolist()
        [0.25, 0.25, 0.25, 0.25]
    """
    if not isinstance(v, torch.Tensor) or not isinstance(first, torch.Tensor) or v.shape != first.shape:
        raise ShapeError(f"value_residual: first must have the values' shape "
                         f"{tuple(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__}; got "
                         f"{tuple(first.shape) if isinstance(first, torch.Tensor) else type(first).__name__}")
    return torch.lerp(first, v, mix) if isinstance(mix, torch.Tensor) else mix * v + (1 - mix) * first
