"""The eligibility rules of the execution paths, each written once.

A rule takes a :class:`~attnkit.functional.validate.Problem` and returns why a path
cannot compute it exactly (a short reason that :func:`attnkit.explain` shows), or
None when it can. A path's eligibility is a tuple of rules checked in order by
:func:`first_refusal`, cheap ones first, so the data-dependent ones (the finiteness
pass over q, k, v) run only when everything else already holds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ..bias import AdditiveModifier
from ..functional.validate import Problem

__all__ = ["Rule", "first_refusal", "FLASH", "FLASH_BACKWARD", "needs_grad", "learned", "softmax_of_dot_products",
           "no_bias", "no_dropout", "no_weights", "no_lse", "not_compiling", "finite_inputs",
           "not_known_non_finite", "fused_cpu_kernel", "equal_head_dims", "lse_without_grad", "softmax_only"]

Rule = Callable[[Problem], "str | None"]

# torch's fused CPU attention kernel (flash-style tiles), forward and backward, called directly where a
# path needs its log-sum-exp or a float mask per slab; None on builds without it.
FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
FLASH_BACKWARD = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)


def first_refusal(p: Problem, rules: Sequence[Rule]) -> str | None:
    """The first reason among ``rules`` why ``p`` cannot run, or None."""
    for rule in rules:
        why = rule(p)
        if why is not None:
            return why
    return None


def learned(p: Problem) -> list[torch.Tensor]:
    """The bias tensors whose gradients autograd asks for (a tensor bias, an additive modifier's table)."""
    if not torch.is_grad_enabled():
        return []
    if p.bias is not None:
        return [p.bias] if p.bias.requires_grad else []
    return list(p.modifier.parameters_needing_grad()) if isinstance(p.modifier, AdditiveModifier) else []


def needs_grad(p: Problem) -> bool:
    """Whether autograd records this call (q, k, v or a learned bias need a gradient)."""
    return torch.is_grad_enabled() and (any(t.requires_grad for t in (p.q, p.k, p.v)) or bool(learned(p)))


def softmax_only(p: Problem) -> str | None:
    if p.normalize != "softmax":
        return f"softmax only; normalize={p.normalize!r} needs each whole row at once"
    return None


def softmax_of_dot_products(p: Problem) -> str | None:
    if p.normalize != "softmax" or p.score not in ("dot", "scaled_dot"):
        return f"softmax of dot products only; got normalize={p.normalize!r}, score={p.score!r}"
    return None


def no_bias(p: Problem) -> str | None:
    return "no bias or score modifier" if p.bias is not None or p.modifier is not None else None


def no_dropout(p: Problem) -> str | None:
    return "no dropout" if p.dropout_p > 0 else None


def no_weights(p: Problem) -> str | None:
    return "never builds the dense (Lq, Lk) weights that return_weights asks for" if p.return_weights else None


def no_lse(p: Problem) -> str | None:
    return "returns no lse" if p.return_lse else None


def not_compiling(p: Problem) -> str | None:
    if torch.compiler.is_compiling():
        return "under torch.compile: its exactness or plan needs data-dependent checks"
    return None


_NON_FINITE = "non-finite inputs: torch's fused kernel can zero a NaN row and leaks NaN from masked keys"


def finite_inputs(p: Problem) -> str | None:
    """One summed pass over each distinct q, k, v (cached on the problem)."""
    return None if p.inputs_finite() else _NON_FINITE


def not_known_non_finite(p: Problem) -> str | None:
    """Refuses only inputs already known to be non-finite (a path that checks its own output instead)."""
    return _NON_FINITE if p.finiteness_known and not p.inputs_finite() else None


def fused_cpu_kernel(p: Problem) -> str | None:
    return "needs torch's fused CPU flash kernel" if FLASH is None or p.q.device.type != "cpu" else None


def equal_head_dims(p: Problem) -> str | None:
    return "the fused kernel needs Dv == D" if p.sizes[4] != p.sizes[5] else None


def lse_without_grad(p: Problem) -> str | None:
    return "the fused backward takes no lse gradient" if p.return_lse and needs_grad(p) else None
