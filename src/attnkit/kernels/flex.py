"""Path ``flex``: torch's FlexAttention, compiled, for every structured mask and bias on CUDA.

FlexAttention (Dong et al. 2024, arXiv:2412.05496) computes, with a ``BlockMask`` of
tiles that are skipped, full or partial (``mask_mod`` decides each entry)::

    out = softmax(score_mod(q k^T * scale, b, h, q_idx, kv_idx), masked by the block mask) @ v

Inductor turns the two functions into one fused kernel per call signature: empty tiles
are never read, full tiles skip the mask. Here the call's attnkit mask becomes the block
mask (:meth:`~attnkit.masks.Mask.to_block_mask`: its analytic layout and its predicate as
``mask_mod``, built once per mask, lengths and batch/heads and cached on the mask,
bounded), and its bias tensor and modifier the ``score_mod`` (ALiBi, relative positions,
soft-capping, any callable; a bias tensor or a modifier's parameters that require grad
get their gradients through FlexAttention's backward). Grouped K/V heads are read
unexpanded (``enable_gqa``); the lse comes from the kernel, with gradients.

Attention sinks are left to the other paths (its lse's gradient is not checked here on a GPU).
A row no key may attend gets output 0 and lse ``-inf`` from the kernel itself. The inputs
are checked for NaN/inf first (one pass): FlexAttention answers a row whose every score
is ``-inf`` as an empty row, where attnkit's contract propagates the non-finite input.

Eagerly the kernel is ``torch.compile(flex_attention)``, compiled once per process
(recompiling for new shapes, then with dynamic sizes); inside a graph that is being
compiled, the plain ``flex_attention`` (the compiler lowers it). FlexAttention's CPU
forward runs too (compiled or eager: :func:`forward`), which the tests use; its CPU
backward raises, so the table offers this path on CUDA only.

Shapes: q ``(B, H, Lq, D)``, k ``(B, H_kv, Lk, D)``, v ``(B, H_kv, Lk, Dv)``.
"""

from __future__ import annotations

import torch

from ..bias import apply_modifier
from ..functional.validate import Problem
from ..masks import cache
from ..masks.base import gather_at
from . import rules
from .path_cost import PathCost, fused_attention
from .pipeline import KernelOutput

__all__ = ["REFUSALS", "run", "forward", "cost", "describe", "density", "block_mask", "score_mod", "kernel",
           "available", "backward_differentiable", "BLOCK", "DTYPES"]

BLOCK = 128  # FlexAttention's tile (the block mask's BLOCK_SIZE)
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_KERNELS: dict = {}


def available() -> bool:
    """Whether this torch has FlexAttention."""
    try:
        import torch.nn.attention.flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


def kernel(compiled: bool = True):
    """FlexAttention: ``torch.compile(flex_attention)`` made once per process, or the plain function."""
    from torch.nn.attention.flex_attention import flex_attention

    if not compiled or torch.compiler.is_compiling():  # inside a compiled graph the compiler lowers it
        return flex_attention
    if "compiled" not in _KERNELS:
        _KERNELS["compiled"] = torch.compile(flex_attention)
    return _KERNELS["compiled"]


def _has_flex(p: Problem) -> str | None:
    return None if available() else f"torch {torch.__version__} has no FlexAttention"


def _dtype(p: Problem) -> str | None:
    return None if p.q.dtype in DTYPES else f"FlexAttention's kernels take float16, bfloat16, float32; got {p.q.dtype}"


def _backward_here(p: Problem) -> str | None:
    if p.needs_grad and rules.device_type(p) in ("cpu", "mps"):
        return "FlexAttention has no backward on this device"
    return None


REFUSALS = (rules.full_precision_kv,
            _has_flex, rules.softmax_of_dot_products, rules.no_sinks, rules.no_weights, rules.no_dropout,
            rules.not_compiling,
            _dtype, _backward_here, rules.finite_inputs)


def block_mask(p: Problem):
    """The call's mask as a ``BlockMask`` (None: no mask), built once per mask, sizes and device, on the mask."""
    mask = p.mask
    if mask is None or mask.kind == "full":
        return None
    batch, heads, lq, lk, _, _ = p.sizes
    batch, heads = (batch if "b" in mask.uses else 1), (heads if "h" in mask.uses else 1)
    key = (lq, lk, batch, heads, str(p.q.device))
    return cache.on(mask, "flex_block_masks", max_entries=8).get_or_build(key, lambda: mask.to_block_mask(
        lq, lk, batch=batch, heads=heads, block_size=BLOCK, device=p.q.device))


def score_mod(p: Problem):
    """The call's bias tensor and modifier as one ``score_mod(score, b, h, q_idx, kv_idx)``, or None."""
    bias, modifier = p.bias, p.modifier
    if bias is None and modifier is None:
        return None
    _, _, lq, lk, _, _ = p.sizes

    def modified(score, b, h, q_idx, kv_idx):
        if bias is not None:
            score = score + gather_at(bias, b, h, q_idx, kv_idx).to(score.dtype)
        if modifier is not None:
            score = apply_modifier(modifier, score, b, h, q_idx, kv_idx, lq, lk)
        return score
    return modified


def forward(p: Problem, compiled: bool = True) -> KernelOutput:
    """FlexAttention on ``p``: the compiled kernel, or with ``compiled=False`` torch's eager one (CPU forward)."""
    from torch.nn.attention.flex_attention import AuxRequest

    aux = AuxRequest(lse=True) if p.return_lse else None
    result = kernel(compiled)(p.q, p.k, p.v, score_mod=score_mod(p), block_mask=block_mask(p), scale=p.scale,
                              enable_gqa=p.groups > 1, return_aux=aux)
    out, lse = (result[0], result[1].lse) if aux is not None else (result, None)
    return KernelOutput(out, None, lse)


def run(p: Problem) -> KernelOutput:
    return forward(p)


def backward_differentiable(p: Problem) -> bool:
    """FlexAttention's backward has no derivative of its own: a second derivative recomputes on the reference."""
    return False


@rules.reads_data
def density(p: Problem) -> float:
    """The fraction of tiles the kernel reads (partial or full), from the block mask."""
    bm = block_mask(p)
    if bm is None:
        return 1.0
    tiles = bm.kv_num_blocks.sum() + (bm.full_kv_num_blocks.sum() if bm.full_kv_num_blocks is not None else 0)
    rows, cols = bm.kv_indices.shape[-2:]
    return float(tiles) / (bm.kv_num_blocks.shape[0] * bm.kv_num_blocks.shape[1] * rows * cols)


def describe(p: Problem) -> str:
    what = [name for name, on in (("a block mask", p.mask is not None and p.mask.kind != "full"),
                                  ("a score_mod", p.bias is not None or p.modifier is not None),
                                  ("grouped K/V heads", p.groups > 1), ("the lse", p.return_lse)) if on]
    return "torch's FlexAttention, compiled" + (" with " + ", ".join(what) if what else "")


def cost(p: Problem, grad: bool = False) -> PathCost:
    """FlexAttention's fused kernel over the tiles it reads (all of them when the layout is not read yet);
    its backward recomputes the scores from the saved lse. Workspace: the block mask's four int32 tile maps."""
    b, h, lq, lk, d, dv = p.sizes
    share = density(p) if not p.tracing else 1.0
    pairs = int(b * h * lq * lk * share)
    tiles = -(-lq // BLOCK) * -(-lk // BLOCK)
    return PathCost(pairs, 16 * tiles, fused=fused_attention("attention (FlexAttention)", pairs, d, dv),
                    materialized=False)
