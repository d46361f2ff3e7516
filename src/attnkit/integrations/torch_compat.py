"""``torch.nn.MultiheadAttention`` compatibility for :class:`~attnkit.nn.multihead.MultiHeadAttention`.

Torch's masks have the opposite bool polarity to attnkit (True = *ignore*), so
this is the one place where they are converted, explicitly: a bool
``key_padding_mask`` / ``attn_mask`` becomes an attnkit mask of ``~mask`` (True =
attend), a float one becomes an additive bias. Also here: the checks of torch's
input layouts, the mask that always admits the extra keys of ``add_bias_kv`` /
``add_zero_attn``, the state_dict layout migration and the conversions both ways.
"""

from __future__ import annotations

import functools
import operator
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from .. import masks
from ..core import _autocast_enabled
from ..errors import ArgumentError, DeviceError, DTypeError, ShapeError
from ..masks.base import Mask
from ..nn._inputs import check_floating

__all__ = ["ExtraKeys", "check_inputs", "convert_masks", "with_extra_keys", "merge_projection_keys",
           "from_torch", "to_torch"]


class ExtraKeys(Mask):
    """``inner`` over the first ``kv_len - n`` keys; the last ``n`` keys are always allowed.

    The extra keys are ``bias_k`` and the zero key of ``add_zero_attn``, appended after
    the real keys; torch pads its masks with "attend" for them, and so does this.
    Indices past the ends (padding lanes of block layouts) are clamped before they
    reach ``inner``, so dense tensor masks are never indexed out of range, and the
    block layout is pooled from the dense picture (these masks are dense anyway).
    """

    def __init__(self, inner: Mask, n: int):
        self.inner, self.n = inner, n
        self.uses = inner.uses | {"kv"}
        self.batch_size, self.num_heads = inner.batch_size, inner.num_heads
        self.q_len = inner.q_len  # the data sizes stay checkable against the inputs
        self.kv_len = None if inner.kv_len is None else inner.kv_len + n
        self.kind = "keys" if "q" not in self.uses else "pattern"  # key padding stays on torch's kernel

    def key_padding(self):
        """The inner mask's key padding, over the real keys (the extra keys are never padding)."""
        inner = self.inner.key_padding()
        return None if inner is None else ExtraKeys(inner, self.n)

    def allows(self, b, h, q_idx, kv_idx, q_len, kv_len):
        real = kv_len - self.n
        extra = kv_idx >= real
        if real <= 0 or q_len <= 0:
            return extra
        q_idx, kv_idx = q_idx.clamp(0, q_len - 1), kv_idx.clamp(0, real - 1)
        return self.inner.allows(b, h, q_idx, kv_idx, q_len, real) | extra

    def materialize(self, q_len, kv_len, *, batch=None, heads=None, device=None):
        real = max(kv_len - self.n, 0)
        inner = self.inner.materialize(q_len, real, batch=batch, heads=heads, device=device)
        inner = torch.broadcast_to(inner, (*inner.shape[:2], q_len, real))
        return F.pad(inner, (0, kv_len - real), value=True)  # (B|1, H|1, Lq, Lk)

    def _layout(self, q_len, kv_len, bs, device, sizes=(1, 1)):
        # Pool the dense picture into blocks, keys then queries: a few large ops, padding one axis at a time.
        dense = self.materialize(q_len, kv_len, device=device)
        nq, nk = -(-q_len // bs), -(-kv_len // bs)
        pooled = []
        for fill, reduce in ((False, torch.any), (True, torch.all)):
            t = F.pad(dense, (0, nk * bs - kv_len), value=fill).unflatten(-1, (nk, bs))
            t = reduce(t, dim=-1)  # (B|1, H|1, Lq, nk)
            t = F.pad(t, (0, 0, 0, nq * bs - q_len), value=fill).unflatten(-2, (nq, bs))
            pooled.append(reduce(t, dim=-2))  # (B|1, H|1, nq, nk)
        return pooled[0], pooled[1]

    def __repr__(self):
        return f"ExtraKeys({self.inner!r}, n={self.n})"


def check_inputs(who: str, module, query, key, value) -> bool:
    """Torch's input contract (2-D unbatched or 3-D batched); returns whether the input is batched."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        check_floating(who, name, t)
    want = module.out_proj.weight.dtype
    autocast = _autocast_enabled(query.device.type)  # projections cast the inputs then
    if not (query.dtype == key.dtype == value.dtype and (autocast or query.dtype == want)):
        raise DTypeError(f"{who}: query, key and value must have the parameters' dtype {want}; "
                         f"got {query.dtype}, {key.dtype}, {value.dtype}")
    if query.dim() not in (2, 3) or key.dim() != query.dim() or value.dim() != query.dim():
        raise ShapeError(f"{who}: query, key and value must all be 2-D (L, E) unbatched or all 3-D batched "
                         f"({'(N, L, E)' if module.batch_first else '(L, N, E)'}); got query {tuple(query.shape)}, "
                         f"key {tuple(key.shape)}, value {tuple(value.shape)}")
    for name, t, dim in (("query", query, module.embed_dim), ("key", key, module.kdim), ("value", value, module.vdim)):
        if t.shape[-1] != dim:
            raise ShapeError(f"{who}: {name} must have feature dim {dim}; got shape {tuple(t.shape)}")
    batched = query.dim() == 3
    bdim, sdim = (0, 1) if module.batch_first else (1, 0)
    if batched and not query.shape[bdim] == key.shape[bdim] == value.shape[bdim]:
        raise ShapeError(f"{who}: batch sizes (dim {bdim}, batch_first={module.batch_first}) differ: query "
                         f"{tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}")
    sdim = sdim if batched else 0
    if key.shape[sdim] != value.shape[sdim]:
        raise ShapeError(f"{who}: key and value must have the same length; got key {tuple(key.shape)} "
                         f"and value {tuple(value.shape)}")
    return batched


def _check_mask_tensor(who, name, t, shape, device):
    if not isinstance(t, torch.Tensor) or not (t.dtype == torch.bool or t.is_floating_point()):
        got = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
        raise DTypeError(f"{who}: {name} must be a bool tensor (True = ignore, torch's polarity) or a floating "
                         f"tensor (added to the scores); got {got}")
    if t.device != device:
        raise DeviceError(f"{who}: {name} is on {t.device} but query is on {device}")
    if tuple(t.shape) not in shape:
        want = " or ".join(str(s) for s in shape)
        raise ShapeError(f"{who}: {name} must have shape {want}; got {tuple(t.shape)}")


def _attnkit_mask(who, mask, full):
    """``mask=``: an attnkit Mask, or a bool tensor (True = attend) broadcastable to ``full`` = (B, H, L, S)."""
    if isinstance(mask, Mask):
        return mask
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise DTypeError(f"{who}: mask must be an attnkit.masks.Mask or a bool tensor (True = attend); got {got}")
    dims = tuple(mask.shape)
    if mask.dim() > 4 or dims[-1:] != full[-1:] or any(
            s not in (1, f) for s, f in zip(dims[::-1], full[::-1], strict=False)):
        raise ShapeError(f"{who}: mask must broadcast to (batch, heads, L, S) = {full} (last dim exactly S); "
                         f"got {dims}")
    return masks.TensorMask(mask.reshape((1,) * (4 - mask.dim()) + dims))


def convert_masks(who, *, key_padding_mask, attn_mask, is_causal, mask, full, batched, device):
    """Torch's masks (True = ignore) and attnkit's ``mask`` (True = attend) as ``(Mask | None, bias | None)``.

    ``full`` is ``(B, H, L, S)``. Bool masks are combined with logical AND; float
    masks are added into one bias ``(B|1, H|1, L|1, S)``; a bool mask beside a float one
    (torch's decoder layers pass a float causal mask and a bool padding mask) is the same
    as torch's conversion of the bool one to ``-inf``. A ``key_padding_mask`` and an
    ``attn_mask`` of different dtypes warn, as torch 2.13's module does (it deprecates the
    pair), naming both arguments and their dtypes (RELIABILITY row 10). ``is_causal`` beside ``attn_mask``
    is torch's hint that ``attn_mask`` is causal: AND-ed with it when ``L == S``; when
    ``L != S`` (no alignment is implied) ``attn_mask`` alone applies.
    """
    b, h, lq, s = full
    parts, biases = [], []
    if key_padding_mask is not None and attn_mask is not None and key_padding_mask.dtype != attn_mask.dtype:
        warnings.warn(f"{who}: key_padding_mask ({key_padding_mask.dtype}) and attn_mask ({attn_mask.dtype}) differ in "
                      "type; as torch.nn.MultiheadAttention (torch 2.13 deprecates such pairs), a bool mask is read as "
                      "-inf where True and added to the float one. Give both the same type", UserWarning, stacklevel=3)
    if key_padding_mask is not None:
        _check_mask_tensor(who, "key_padding_mask", key_padding_mask, [(b, s)] if batched else [(s,)], device)
        parts.append(key_padding_mask.reshape(-1, 1, 1, s))  # (B|1, 1, 1, S)
    if attn_mask is not None:
        _check_mask_tensor(who, "attn_mask", attn_mask, [(lq, s), (b * h if batched else h, lq, s)], device)
        parts.append(attn_mask.reshape(-1, h, lq, s) if attn_mask.dim() == 3 else attn_mask[None, None])
    bools = [masks.TensorMask(~t) for t in parts if t.dtype == torch.bool]
    biases = [t for t in parts if t.dtype != torch.bool]
    if is_causal and not (attn_mask is not None and lq != s):
        if lq != s:
            raise ArgumentError(f"{who}: is_causal=True needs as many queries as keys (the alignment is ambiguous "
                                f"otherwise); got L={lq}, S={s}. Pass mask=attnkit.masks.causal(align=...) instead")
        bools.append(masks.causal())
    if mask is not None:
        bools.append(_attnkit_mask(who, mask, full))
    combined = functools.reduce(operator.and_, bools) if bools else None
    return combined, functools.reduce(operator.add, biases) if biases else None


def _holds_tensor(mask) -> bool:
    return isinstance(mask, masks.TensorMask) or any(_holds_tensor(p) for p in getattr(mask, "parts", ()))


def with_extra_keys(mask, bias, n: int):
    """Admit ``n`` extra keys appended after the real ones: wrap the mask, pad the bias with zeros.

    Masks holding dense tensors are wrapped even when ``n == 0``: the core evaluates
    masks on the padding lanes of its block layouts, past the tensors' ends.
    """
    if mask is not None and (n or _holds_tensor(mask)):
        mask = ExtraKeys(mask, n)
    return mask, (F.pad(bias, (0, n)) if bias is not None and n else bias)


_SEPARATE = ("q_proj_weight", "k_proj_weight", "v_proj_weight")


def merge_projection_keys(module, state_dict, prefix) -> None:
    """Load separate q/k/v weights (the fairseq / Hugging Face layout) into a packed module by concatenating them.

    Any other layout mismatch is left to torch, which reports the missing and unexpected
    keys (a RuntimeError under ``strict=True``, as for ``torch.nn.MultiheadAttention``).
    """
    names = [prefix + n for n in _SEPARATE]
    if module._qkv_same_embed_dim and prefix + "in_proj_weight" not in state_dict and all(
            n in state_dict for n in names):
        state_dict[prefix + "in_proj_weight"] = torch.cat([state_dict.pop(n) for n in names])


def from_torch(cls, module: nn.MultiheadAttention, *, mask=None):
    """A ``cls`` with ``module``'s configuration, weights (and which of them are frozen), device, dtype and
    training mode; ``mask``: an extra attnkit mask for every call."""
    if not isinstance(module, nn.MultiheadAttention):
        raise DTypeError(f"{cls.__name__}.from_torch: module must be a torch.nn.MultiheadAttention; "
                         f"got {type(module).__name__}")
    w = module.out_proj.weight
    new = cls(module.embed_dim, module.num_heads, dropout=module.dropout, bias=module.in_proj_bias is not None,
              add_bias_kv=module.bias_k is not None, add_zero_attn=module.add_zero_attn, kdim=module.kdim,
              vdim=module.vdim, batch_first=module.batch_first, device=w.device, dtype=w.dtype, mask=mask)
    new.load_state_dict(module.state_dict())
    frozen = {name for name, p in module.named_parameters() if not p.requires_grad}
    for name, p in new.named_parameters():
        p.requires_grad_(name not in frozen)
    return new.train(module.training)


def to_torch(module) -> nn.MultiheadAttention:
    """The ``torch.nn.MultiheadAttention`` with ``module``'s configuration and weights (not for grouped heads)."""
    if module.num_kv_heads != module.num_heads:
        raise ArgumentError(f"{type(module).__name__}.to_torch: torch has no grouped-query heads; got num_heads="
                            f"{module.num_heads}, num_kv_heads={module.num_kv_heads}")
    if module.extra_mask is not None:
        raise ArgumentError(f"{type(module).__name__}.to_torch: torch's module has no place for the extra mask "
                            f"{module.extra_mask!r}")
    added = [name for name in ("gate", "qk_norm", "rotary", "scale") if getattr(module, name, None) is not None]
    if module.inner_dim != module.embed_dim:
        added.append(f"heads narrower or wider than embed_dim (head_dim={module.head_dim})")
    if (module.in_proj_bias is None) != (module.out_proj.bias is None):
        added.append("out_bias differing from bias")
    if added:
        raise ArgumentError(f"{type(module).__name__}.to_torch: torch's module has no {', '.join(added)}")
    w = module.out_proj.weight
    out = nn.MultiheadAttention(module.embed_dim, module.num_heads, dropout=module.dropout,
                                bias=module.in_proj_bias is not None, add_bias_kv=module.bias_k is not None,
                                add_zero_attn=module.add_zero_attn, kdim=module.kdim, vdim=module.vdim,
                                batch_first=module.batch_first, device=w.device, dtype=w.dtype)
    out.load_state_dict(module.state_dict())
    return out.train(module.training)
