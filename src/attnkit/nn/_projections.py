"""Shared pieces of the sparse-pattern modules: q/k/v/out projections, input checks and cost.

:class:`ProjectedAttention` owns the four ``dim -> dim`` linear maps of multi-head
self-attention (state-dict keys ``q_proj``, ``k_proj``, ``v_proj``, ``out_proj``)
and the head split/merge; a mechanism subclasses it and only says which keys each
query may see. The cost specs of those modules share :data:`PROJECTED_SIZES`,
:func:`projected_spec` and :func:`count_self_attention`.
"""

from __future__ import annotations

import torch
from torch import nn

from ..costing.attend import attend
from ..costing.spec import Spec
from ..costing.tally import dtype_of, randn
from ..errors import ArgumentError, ShapeError, check_int
from ._inputs import check_sequence

__all__ = ["ProjectedAttention", "check_int", "count_self_attention", "sequence_input", "projected_spec",
           "PROJECTED_SIZES", "PROJECTED_FORMULA"]

PROJECTED_SIZES = {"batch": 2, "length": 12, "dim": 16, "heads": 2, "dtype": "float32"}
PROJECTED_FORMULA = "projections 2 B n dim^2 each (q, k, v, out); "


class ProjectedAttention(nn.Module):
    """Base of the sparse-pattern modules: multi-head q/k/v/out projections of ``(batch, n, dim)`` inputs.

    Args:
        dim: model width; must be a multiple of ``num_heads``.
        num_heads: number of heads; each has width ``dim // num_heads``.
        dropout: dropout on the attention weights, applied only in training.
        bias: whether the projections have a bias.
    """

    def __init__(self, dim: int, num_heads: int, *, dropout: float = 0.0, bias: bool = True):
        super().__init__()
        who = type(self).__name__
        check_int(who, "dim", dim, 1)
        check_int(who, "num_heads", num_heads, 1)
        if dim % num_heads:
            raise ShapeError(f"{who}: dim must be a multiple of num_heads; got dim={dim}, num_heads={num_heads}")
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
            raise ArgumentError(f"{who}: dropout must be a float in [0, 1); got {dropout!r}")
        self.dim, self.num_heads, self.head_dim = dim, num_heads, dim // num_heads
        self.dropout = float(dropout)
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(dim, dim, bias=bias) for _ in range(4))

    @property
    def dropout_p(self) -> float:
        """The dropout probability to pass to :func:`attnkit.attention` (0 in eval mode)."""
        return self.dropout if self.training else 0.0

    def check_input(self, x) -> None:
        """Raise unless ``x`` is a floating ``(batch, n, dim)`` tensor of the parameters' dtype and device."""
        check_sequence(type(self).__name__, "x", x, self.dim, named=True, like=self)

    def split_heads(self, t: torch.Tensor) -> torch.Tensor:
        """``(B, n, dim) -> (B, H, n, dim / H)``."""
        return t.unflatten(-1, (self.num_heads, self.head_dim)).transpose(1, 2)

    def merge_heads(self, t: torch.Tensor) -> torch.Tensor:
        """``(B, H, n, dim / H) -> (B, n, dim)`` followed by the output projection."""
        return self.out_proj(t.transpose(1, 2).flatten(2))

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per-head ``q, k, v``, each ``(B, H, n, dim / H)``."""
        return tuple(self.split_heads(proj(x)) for proj in (self.q_proj, self.k_proj, self.v_proj))


def count_self_attention(t, label: str, s, module: ProjectedAttention, mask, **kwargs) -> None:
    """One ``attention(q, k, v, mask=mask)`` of the module's heads over its ``length`` positions."""
    b, n, h = s["batch"], s["length"], s["heads"]
    attend(t, label, b, h, n, n, s["dim"] // h, s["dim"] // h, dtype=dtype_of(s), mask=mask,
           dropout_p=module.dropout_p, **kwargs)


def sequence_input(s, module):
    """``(module, (x,))`` with ``x`` ``(batch, length, dim)`` at the sizes ``s``."""
    return module, (randn(s["batch"], s["length"], s["dim"], dtype=dtype_of(s)),)


def projected_spec(module_type: type, count, formula: str, *, sizes, options: tuple[str, ...] = (),
                   make=None, inputs=sequence_input, **kwargs) -> Spec:
    """The cost spec of ``module_type(dim, heads, **options)``, a :class:`ProjectedAttention`.

    ``sizes``: the example's values beyond :data:`PROJECTED_SIZES` (``options`` among them, read back from a
    module); ``count`` reads the module's own masks (``reads_module``); ``formula`` follows the projections'.
    """
    def build(s):
        return module_type(s["dim"], s["heads"], **{k: s[k] for k in options}).to(dtype_of(s))

    return Spec({**PROJECTED_SIZES, **sizes}, count, inputs, PROJECTED_FORMULA + formula, make=make or build,
                reads_module=True, module_type=module_type,
                config=lambda m: {"dim": m.dim, "heads": m.num_heads, **{k: getattr(m, k) for k in options}}, **kwargs)
