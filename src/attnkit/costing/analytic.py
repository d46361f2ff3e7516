"""Analytic cost of every registered mechanism: matmul FLOPs, elementwise FLOPs, bytes and peak memory.

``cost("sliding-window", q_len=4096, window=128)``, ``cost("longformer", q_len=4096)`` or
``cost(module, batch=8, q_len=4096)`` returns a :class:`Cost`. Each mechanism's formula is the
cost spec carried by its registry entry (written beside the mechanism, :mod:`attnkit.costing`);
"dense", "sdpa" and mask expressions for :func:`attnkit.attention` are priced here.

Sizes: the vocabulary every command shares, ``batch, heads, q_len, kv_len, head_dim``, and each
mechanism's own sizes and options (:func:`sizes`; ``length`` and ``dim`` of a self-attention
module are set by ``q_len`` and ``heads x head_dim``). With no size given, the registry example's
small values; once a sequence length is given, every size not given takes a realistic layer's
value (batch 1, 8 heads of 64 features) and every option the paper's setting (Longformer's
window of 512, BigBird's blocks of 64 with 3 window, 2 global and 3 random blocks, Reformer's
chunks of 64 with ``2 n / 64`` buckets; each spec cites its source). Unknown names raise ArgumentError.

What is counted:

- ``flops``: matrix products only, ``2 m k n`` per ``(m, k) @ (k, n)`` (mm, bmm, addmm,
  baddbmm, conv, SDPA), as ``torch.utils.flop_counter.FlopCounterMode`` counts the
  mechanism's forward pass on CPU, *once that counter is given torch's SDPA formulas for the
  fused CPU kernel*: torch 2.13's counter has no entry for
  ``aten._scaled_dot_product_flash_attention_for_cpu`` (nor its backward) and counts 0 for
  every call that runs it. The tests register ``sdpa_flop_count`` / ``sdpa_backward_flop_count``
  for those two ops (``custom_mapping``) and assert equality for every entry. For
  :func:`attnkit.attention` the count follows the kernel the dispatcher picks:
  SDPA's formula, all ``Lq x Lk`` pairs on the reference/chunked kernels, only the
  active key blocks (padding lanes included) on the block-sparse kernel. With
  ``backward=True`` the backward is added: a product costs once more per operand that
  needs a gradient (every input and parameter is taken to need one; buffers, constants
  and sampled one-hot weights do not), checkpointed kernels re-run their forward (a
  chunked slab all of it, a block-sparse slab its score product), and SDPA's fused CPU
  kernel and attnkit's band kernel follow their backward formulas (the scores recomputed).
- ``other_flops``: elementwise work (softmax ~5 operations per score, exp, tanh, masks,
  norms, matrix-vector products such as the additive score's ``v^T tanh(.)``, which the
  counter does not count), an estimate; the backward adds twice the forward's.
- ``bytes_moved``: inputs, outputs and parameters once, intermediates twice (written,
  read), at the dtype's size: an estimate of memory traffic with no cache reuse.
- ``peak_bytes``: the largest set of intermediates alive at once in the forward pass
  (kept activations plus a kernel's workspace as the dispatcher estimates it).
- ``state_fixed``, ``state_per_token`` and ``state_bytes`` (at ``context``, the spec's length):
  what a decoder keeps of the layer for one sequence, a linear-recurrent layer's fixed state
  (and its short convolution's last inputs), linear attention's prefix sums, or softmax
  attention's KV cache, which grows by ``Hkv (D + Dv)`` numbers per token.
- ``forms``: the matmul FLOPs of the same pass in each form of a linear-recurrent layer
  (``"parallel"``, ``"chunk"``, ``"recurrent"``; the ``form`` size picks the one ``flops`` counts).

Counting is arithmetic on the sizes: the dispatcher is asked about each attention call on
stand-in tensors of one element each, so ``cost("dense", q_len=10**9)`` makes no tensor of that
length. A masked call of more than 2^31 q, k, v elements is refused with ArgumentError (its
path would be decided from the mask's blocks and a pass over the data), as is a module whose
count reads its own masks beyond 2^20 positions.
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import nn

from .. import registry
from ..errors import ArgumentError, did_you_mean
from . import core_specs as core
from .spec import Built, Cost, Spec

__all__ = ["Cost", "Built", "cost", "sizes", "build", "spec", "resolve", "specs", "SPECS"]  # noqa: F822 (SPECS: __getattr__)


def specs() -> dict[str, Spec]:
    """Every spec by name: the registry entries' and "dense" and "sdpa"."""
    return {**{e.name: e.spec for e in registry.entries()}, **{s.name: s for s in core.SPECS}}


def __getattr__(name: str):
    if name == "SPECS":  # read from the registry when asked for, so importing this module loads no mechanism
        return specs()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def spec(name_or_module) -> Spec:
    """The cost spec of a registry name, "dense", "sdpa", a mask expression, or a module instance."""
    if isinstance(name_or_module, nn.Module):
        found = [e.spec for e in registry.entries() if e.spec.module_type is type(name_or_module)
                 and (e.spec.matches is None or e.spec.matches(name_or_module))]
        if not found:
            raise ArgumentError(f"cost: no cost formula for a {type(name_or_module).__name__} module; "
                                f"pass a registry name instead")
        return found[0]
    if not isinstance(name_or_module, str):
        raise ArgumentError(f"cost: expected a registry name or a module; got {type(name_or_module).__name__}")
    known = specs()
    if name_or_module in known:
        return known[name_or_module]
    if "(" in name_or_module:  # a mask expression such as "sliding_window(128, 128)"
        return core.mask_spec(name_or_module)
    raise ArgumentError(f"unknown mechanism {name_or_module!r}; {did_you_mean(name_or_module, known)}"
                        f"known: {', '.join(sorted(known))} "
                        "or a mask expression such as 'sliding_window(128, 128)'")


def sizes(name_or_module) -> dict:
    """The sizes and options a mechanism accepts, with the registry example's values (None: derived)."""
    return dict(spec(name_or_module).defaults)


def resolve(sp: Spec, given: Mapping[str, object], module: nn.Module | None = None) -> dict:
    """Every size of ``sp`` for the ``given`` ones (:meth:`attnkit.costing.spec.Spec.resolve`)."""
    return sp.resolve(given, module)


def cost(name_or_module, *, backward: bool = False, **size_kwargs) -> Cost:
    """The analytic cost of a mechanism at given sizes (see the module docstring for what is counted).

    Args:
        name_or_module: a registry name (``attnkit list``), "dense", "sdpa", a mask expression
            for :func:`attnkit.attention` such as ``"causal() & sliding_window(64, 0)"``, or a
            module instance (its configuration is read from it; give only batch and lengths).
        backward: include the backward pass (FLOPs only; bytes and peak stay forward).
        size_kwargs: the vocabulary (``batch, heads, q_len, kv_len, head_dim``) and the
            mechanism's own sizes and options, see :func:`sizes`; unknown names raise ArgumentError.

    Example:
        >>> from attnkit.costing.analytic import cost
        >>> c = cost("scaled-dot-product", batch=1, heads=2, q_len=64, head_dim=16)
        >>> c.flops == 2 * 1 * 2 * 64 * 64 * (16 + 16)
        True
        >>> cb = cost("scaled-dot-product", batch=1, heads=2, q_len=64, head_dim=16, backward=True)
        >>> cb.flops / c.flops  # torch's fused CPU SDPA backward recomputes the scores: 2.5x the forward
        3.5
        >>> cost("longformer", q_len=4096).sizes["window"]  # a length given: the paper's window
        512
    """
    module = name_or_module if isinstance(name_or_module, nn.Module) else None
    return spec(name_or_module).cost(size_kwargs, backward=backward, module=module)


def build(name_or_module, **size_kwargs) -> Built:
    """The mechanism at the given sizes (as :func:`cost` counts it), with seeded Gaussian inputs.

    Integer inputs (segment ids) are built too; modules are in eval mode where that matters.
    """
    module = name_or_module if isinstance(name_or_module, nn.Module) else None
    return spec(name_or_module).build(size_kwargs, module)
