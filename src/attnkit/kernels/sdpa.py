"""The sdpa kernel: hands exact cases to ``torch.nn.functional.scaled_dot_product_attention``.

PyTorch's fused CPU kernel is the fastest dense path here, but on torch 2.13 it
turns a NaN query row into zeros and lets NaN in a masked key leak
(RELIABILITY rows 21-22), and it has no lse, weights, bias modifiers or other
scores. So it is used only when it computes exactly attnkit's function:
softmax of (scaled) dot products, finite inputs, and a mask it can represent
(none, top-left causal via ``is_causal``, or a dense bool mask).
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F

from ..functional.masks import TensorMask, _Causal, _Full
from ..functional.validate import Problem
from ..runtime import low_precision_math
from .common import KernelOutput

NAME = "sdpa"

# Key-only masks (padding) as the (B, 1, 1, Lk) bool tensors SDPA takes, per mask object and sizes.
# Masks are immutable, and one padding mask usually serves every layer of a model: build it once.
_KEY_MASKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _causal_flag(p: Problem) -> bool:
    """True when the mask is causal with an alignment SDPA's ``is_causal`` (top-left) matches."""
    _, _, lq, lk, _, _ = p.sizes
    return isinstance(p.mask, _Causal) and (p.mask.align == "top_left" or lq == lk)


def refusal(p: Problem) -> str | None:
    if p.normalize != "softmax":
        return f"softmax only; got normalize={p.normalize!r}"
    if p.score not in ("dot", "scaled_dot"):
        return f"dot-product scores only; got score={p.score!r}"
    if p.bias is not None or p.modifier is not None:
        return "no bias or score modifier"
    if p.return_weights or p.return_lse:
        return "returns neither weights nor lse"
    if torch.compiler.is_compiling():
        return "under torch.compile: its exactness needs a data-dependent finiteness check"
    if not p.inputs_finite():
        return "non-finite inputs: torch's CPU kernel zeroes NaN rows and leaks NaN from masked keys"
    return None


def sdpa_mask(p: Problem):
    """``(attn_mask, is_causal)`` for SDPA: None, the causal flag, or a dense bool tensor."""
    if p.mask is None or isinstance(p.mask, _Full):
        return None, False
    if _causal_flag(p):
        return None, True
    if isinstance(p.mask, TensorMask):
        return p.mask.tensor, False
    batch, heads, lq, lk, _, _ = p.sizes
    if "q" not in p.mask.uses:  # key-only (padding): a (B, 1, 1, Lk) mask is enough
        return _key_mask(p.mask, lk, batch, heads, p.q.device), False
    return p.mask.materialize(lq, lk, batch=batch, heads=heads, device=p.q.device), False


def _key_mask(mask, lk: int, batch: int, heads: int, device) -> torch.Tensor:
    """``mask.materialize(1, lk)`` for a mask that reads no query index, cached on the mask (a few bytes per row)."""
    if torch.compiler.is_compiling():
        return mask.materialize(1, lk, batch=batch, heads=heads, device=device)
    cache = _KEY_MASKS.setdefault(mask, {})
    key = (lk, batch, heads, str(device))
    if key not in cache:
        if len(cache) >= 8:  # many lengths (decoding): keep the cache small
            cache.clear()
        cache[key] = mask.materialize(1, lk, batch=batch, heads=heads, device=device)
    return cache[key]


def run(p: Problem) -> KernelOutput:
    """bfloat16/float16 inputs run in float32 where the CPU has no matmul units for them (attnkit.runtime)."""
    attn_mask, is_causal = sdpa_mask(p)
    dtype = low_precision_math(p.q.dtype, p.q.device)
    q, k, v = (t if t.dtype == dtype else t.to(dtype) for t in (p.q, p.k, p.v))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=p.dropout_p,
                                         is_causal=is_causal, scale=p.scale, enable_gqa=p.groups > 1)
    return KernelOutput(out, None, None)
