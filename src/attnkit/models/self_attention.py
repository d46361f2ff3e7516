"""The ``attention=`` argument of the models: softmax multi-head attention or any attnkit self-attention module.

:func:`self_attention_maker` turns ``"softmax"``, a registry name or a factory into a
function that builds one self-attention module per layer; :func:`self_attend` calls a
built module with the key padding and KV cache it can use.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .. import masks
from ..core import attention
from ..errors import ArgumentError, DTypeError, ShapeError, UnsupportedFeature
from ..nn._recurrent import RecurrentLayer, tree_parents
from ..nn.bigbird import BigBirdAttention
from ..nn.blocksparse import BlockSparseAttention
from ..nn.kv_cache import CAUSAL, KVCache, check_step, decoding_mask
from ..nn.kv_policies import KVPolicy
from ..nn.lambda_layer import LambdaLayer
from ..nn.linear import LinearAttention, PerformerAttention
from ..nn.linformer import LinformerAttention
from ..nn.local import LocalAttention
from ..nn.longformer import LongformerAttention
from ..nn.multihead import MultiHeadAttention
from ..nn.paged_kv_cache import PagedBatch
from ..nn.reformer import ReformerAttention
from ..nn.rotary import rotary_for
from ..nn.sparse_transformer import SparseTransformerAttention

__all__ = ["SoftmaxSelfAttention", "MECHANISMS", "self_attention_maker", "self_attend"]


class SoftmaxSelfAttention(MultiHeadAttention):
    """Multi-head softmax self-attention with an optional attnkit mask, rotary positions and a KV cache.

    Vaswani et al. 2017, arXiv:1706.03762, Sec. 3.2.2: ``MultiHead(X) = Concat(head_1..h) W^O``,
    ``head_i = softmax(X W_i^Q (X W_i^K)^T / sqrt(d_k)) X W_i^V`` (eq. 1), the keys restricted to
    ``causal & mask & key_keep_mask``. A :class:`MultiHeadAttention` (batch first; state_dict keys
    ``in_proj_weight``, ``in_proj_bias``, ``out_proj.*``, as torch's) whose ``forward`` takes one input.

    Decoding: with a :class:`KVCache` the new positions' keys/values are appended and attended with
    bottom-right causal alignment (as :meth:`MultiHeadAttention.forward_step`), ``mask`` evaluated at
    the absolute positions ``len(cache) ..``, rotary angles at those positions (Su et al. 2021,
    arXiv:2104.09864, eq. 34), so prefill + steps equal one full pass.

    Differences from the paper: none (rotary is the RoFormer extension).

    Shapes: ``x`` ``(B, t, dim)``, ``key_keep_mask`` ``(B, n)`` bool over every key (True = real token;
    ``n = t`` without cache, ``len(cache) + t`` with) -> ``(B, t, dim)``.

    Complexity: ``O(B t n dim + B t dim^2)``.

    Args:
        dim: model width.
        num_heads: heads (``dim % num_heads == 0``).
        dropout: on the weights, training only.
        causal: query ``i`` sees keys ``j <= i``.
        mask: an :mod:`attnkit.masks` mask ANDed in.
        rotary: rotate queries and keys by position (RoPE) before the scores: True, or a dict of
            :class:`~attnkit.nn.rotary.RotaryEmbedding` options (pairing, partial rotation, scaling).
        gate, qk_norm: the output gate and QK-norm of :class:`MultiHeadAttention`.
        head_dim, num_kv_heads: as :class:`MultiHeadAttention` (heads of another width than ``dim / num_heads``;
            grouped-query key/value heads).
        bias: biases on the projections: True (all four), False (none) or "qkv" (``W^Q, W^K, W^V`` only, Qwen2).

    Example:
        >>> import torch
        >>> from attnkit import masks
        >>> _ = torch.manual_seed(0)
        >>> attn = SoftmaxSelfAttention(12, 3, causal=True, mask=masks.sliding_window(2, 0), rotary=True)
        >>> x = torch.randn(2, 5, 12)
        >>> full = attn(x)
        >>> cache = attn.new_cache(2, 5)
        >>> steps = [attn(x[:, :3], cache=cache), attn(x[:, 3:4], cache=cache), attn(x[:, 4:], cache=cache)]
        >>> torch.allclose(torch.cat(steps, 1), full, atol=1e-6)
        True
    """

    # its forward takes one input, so torch's layers never call it: no hook on each call (see MultiHeadAttention)
    _torch_layer_attention = False

    def __init__(self, dim: int, num_heads: int, *, dropout: float = 0.0, causal: bool = False,
                 mask: masks.Mask | None = None, rotary: bool | dict = False, gate: bool = False,
                 qk_norm: bool = False, head_dim: int | None = None, num_kv_heads: int | None = None,
                 bias: bool | str = True):
        if bias not in BIASES:
            raise ArgumentError(f"SoftmaxSelfAttention: bias must be one of {BIASES}; got {bias!r}")
        super().__init__(dim, num_heads, dropout, bias=bool(bias), batch_first=True, gate=gate, qk_norm=qk_norm,
                         rotary=rotary, head_dim=head_dim, num_kv_heads=num_kv_heads, out_bias=bias is True)
        if mask is not None and not isinstance(mask, masks.Mask):
            raise DTypeError(f"SoftmaxSelfAttention: mask must be an attnkit.masks.Mask (a bool tensor: wrap it in "
                             f"masks.TensorMask); got {type(mask).__name__}")
        self.causal, self.pattern = bool(causal), mask

    def forward(self, x: torch.Tensor, *, key_keep_mask: torch.Tensor | None = None,
                cache: KVCache | None = None, tree=None) -> torch.Tensor:
        """``(B, t, dim) -> (B, t, dim)``; ``cache`` continues earlier calls. ``tree`` (:func:`attnkit.masks.tree`
        or its parents): the ``t`` tokens are a speculative draft tree after the cache, each node at the position
        of its depth and attending to the cache and its ancestors (:meth:`KVCache.commit` keeps a path)."""
        if type(cache) is KVCache and key_keep_mask is None and tree is None and cache.kv_format is None:
            return self._decode(x, cache)  # the decoding step: the same result, less Python per token
        who = type(self).__name__
        if cache is not None and type(cache) is not KVCache:  # (a KV cache, the decoding step, asks one test)
            if isinstance(cache, KVPolicy):
                return self._through_policy(x, cache, key_keep_mask, tree)
            if isinstance(cache, PagedBatch):
                return self._through_pages(x, cache, key_keep_mask, tree)
        x, start = check_step(who, self, x, self.embed_dim, key_keep_mask, cache)
        if tree is not None:
            return self._verify(x, start, cache, tree_parents(who, tree, x.shape[0], x.shape[1]), key_keep_mask)
        q, k, v = self._project(x, x, x)  # (B, H, t, d) each
        if self.qk_norm is not None or self.rotary is not None:
            q, k = self._position(q, k, start, start)
        scales = None
        if cache is not None:
            k, v = cache.append(k, v)  # (B, H, n, d); a quantized cache's codes, read with its scales
            if cache.kv_format is not None:
                scales = cache.scales
        mask = decoding_mask(self.causal, self.pattern, q.shape[2], k.shape[2], key_keep_mask)
        return self._attend(q, k, v, mask, None, False, True, True, x, scales)[0]

    def _decode(self, x: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """:meth:`forward` with a full-precision :class:`KVCache`, no ``key_keep_mask`` and no tree: what each layer
        runs per generated token, written out with the checks of the common call reduced to attribute comparisons
        (anything else goes through :func:`check_step`, which names the error) and the attention call of a plain
        layer (no extra keys or mask, no attention option, no weights) made directly (as :meth:`_attend` makes it).
        The operators are :meth:`forward`'s, in the same order."""
        w = self.in_proj_weight  # (H + 2 Hkv) d x dim when the projections are packed, else None
        if not (w is not None and type(x) is torch.Tensor and len(xs := x.shape) == 3 and xs[2] == self.embed_dim
                and x.dtype == w.dtype and x.device == w.device):
            check_step(type(self).__name__, self, x, self.embed_dim, None, cache)  # raises, or passes (autocast)
        if w is None:
            q, k, v = self._project(x, x, x)
        else:  # (B, t, (H + 2 Hkv) d) -> (B, H + 2 Hkv, t, d) -> three views, as _project
            h, hkv = self.num_heads, self.num_kv_heads
            qkv = F.linear(x, w, self.in_proj_bias)
            q, k, v = qkv.view(*qkv.shape[:-1], h + 2 * hkv, self.head_dim).transpose(1, 2).split_with_sizes(
                [h, hkv, hkv], dim=1)
        start = len(cache)
        if self.qk_norm is not None or self.rotary is not None:
            q, k = self._position(q, k, start, start)
        k, v = cache.append(k, v)  # (B, Hkv, n, d)
        mask = decoding_mask(self.causal, self.pattern, q.shape[2], k.shape[2], None)
        if (self.extra_mask is not None or self.bias_k is not None or self.add_zero_attn
                or self.attention_option is not None or (mask is not None and mask is not CAUSAL)):
            return self._attend(q, k, v, mask, None, False, True, True, x, None)[0]
        out = attention(q, k, v, mask=mask, dropout_p=self.dropout if self.training else 0.0, sinks=self.sinks,
                        scale=self.scale).transpose(1, 2).flatten(2)  # (B, H, t, d) -> (B, t, H d)
        return self.out_proj(out if self.gate is None else self.gate(out, x))

    def _through_policy(self, x, policy: KVPolicy, key_keep_mask, tree):
        """:meth:`forward` with a selection or eviction policy as the cache (:mod:`attnkit.nn.kv_policies`): the
        projections, QK-norm and output as always; which keys are read, and at which positions, is the policy's."""
        who = type(self).__name__
        self._plain(who, f"a KV policy ({type(policy).__name__})", **{
            "no other mask": self.pattern is None, "no key_keep_mask": key_keep_mask is None,
            "no draft tree": tree is None})
        x, _ = check_step(who, self, x, self.embed_dim, None, None)
        q, k, v = self._project(x, x, x)
        if self.qk_norm is not None:
            q, k = self.qk_norm(q, k)
        out = policy.step(q, k, v, rotary=self.rotary, scale=self.scale).transpose(1, 2).flatten(2)  # (B, t, H d)
        return self.out_proj(out if self.gate is None else self.gate(out, x))

    def _plain(self, who: str, what: str, **extra: bool) -> None:
        """UnsupportedFeature unless this layer is plain causal attention (what KV policies and pages decode)."""
        plain = {"causal": self.causal, "no learned sinks": self.sinks is None,
                 "no extra keys": not self._n_extra and self.extra_mask is None,
                 "no dropout while training": not (self.training and self.dropout), **extra}
        if not all(plain.values()):
            raise UnsupportedFeature(f"{who}: {what} decodes causal attention; this call lacks "
                                     f"{[k for k, ok in plain.items() if not ok]}")

    def _through_pages(self, x, cache: PagedBatch, key_keep_mask, tree):
        """:meth:`forward` over a :class:`~attnkit.nn.PagedBatch`: the new keys and values go into the sequences'
        pages and the queries read them in place (a draft ``tree`` through its mask, as :meth:`_verify`)."""
        who = type(self).__name__
        self._plain(who, "a paged cache", **{"no key_keep_mask": key_keep_mask is None})
        x, _ = check_step(who, self, x, self.embed_dim, None, None)
        start = len(cache)
        q, k, v = self._project(x, x, x)
        if tree is None:
            q, k = self._position(q, k, start, start)
            mask = decoding_mask(True, self.pattern, q.shape[2], start + q.shape[2], None)
        else:
            if self.pattern is not None:
                raise UnsupportedFeature(f"{who}: a draft tree is verified by causal attention without another mask; "
                                         f"this layer has mask={self.pattern!r}")
            mask = tree_parents(who, tree, x.shape[0], x.shape[1])
            if self.qk_norm is not None:
                q, k = self.qk_norm(q, k)
            if self.rotary is not None:
                at = (start + mask.depths())[:, None, :]  # (B|1, 1, t): a node sits at its depth after the cache
                q, k = self.rotary.rotate_at(q, at), self.rotary.rotate_at(k, at)
        cache.append(k, v)
        out = cache.attend(q, mask=mask, scale=self.scale).transpose(1, 2).flatten(2)  # (B, t, H d)
        return self.out_proj(out if self.gate is None else self.gate(out, x))

    def _verify(self, x, start: int, cache, tree, key_keep_mask):
        """:meth:`forward` over the nodes of a draft tree (see there)."""
        who = type(self).__name__
        if not self.causal or self.pattern is not None or key_keep_mask is not None:
            raise UnsupportedFeature(f"{who}: a draft tree is verified by causal attention without another mask or "
                                     f"key_keep_mask; this layer has causal={self.causal}, mask={self.pattern!r}")
        q, k, v = self._project(x, x, x)
        if self.qk_norm is not None:
            q, k = self.qk_norm(q, k)
        if self.rotary is not None:
            at = (start + tree.depths())[:, None, :]  # (B|1, 1, t): a node sits at its depth after the cache
            q, k = self.rotary.rotate_at(q, at), self.rotary.rotate_at(k, at)
        scales = None
        if cache is not None:
            k, v = cache.append(k, v)
            scales = cache.scales
        return self._attend(q, k, v, tree, None, False, True, True, x, scales)[0]

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, causal={self.causal}, mask={self.pattern!r}"


# name -> (builder(dim, num_heads, causal, max_len), has a causal form). Defaults suit sequences of ~16-512.
MECHANISMS: dict[str, tuple[Callable[..., nn.Module], bool]] = {
    "linear-attention": (lambda d, h, c, n: LinearAttention(d, h, causal=c), True),
    "performer": (lambda d, h, c, n: PerformerAttention(d, h, causal=c), True),
    "local": (lambda d, h, c, n: LocalAttention(d, h, 8, causal=c), True),
    "sparse-transformer": (lambda d, h, c, n: SparseTransformerAttention(d, h, "strided", stride=8, causal=c), True),
    "block-sparse": (lambda d, h, c, n: BlockSparseAttention(
        d, h, masks.fixed(8, 1) & masks.causal() if c else masks.fixed(8, 1)), True),
    "reformer": (lambda d, h, c, n: ReformerAttention(d, h, n_buckets=4, n_hashes=2, chunk_size=16, causal=c), True),
    "longformer": (lambda d, h, c, n: LongformerAttention(d, h, window=16), False),
    "bigbird": (lambda d, h, c, n: BigBirdAttention(d, h, block_size=8, window_blocks=3, global_blocks=1,
                                                    random_blocks=1), False),
    "linformer": (lambda d, h, c, n: LinformerAttention(d, h, max_len=n, k_proj_dim=max(1, n // 4)), False),
    "lambda-layer": (lambda d, h, c, n: LambdaLayer(d, num_heads=h, max_len=n), False),
}
SOFTMAX = ("softmax", "multi-head")
BIASES = (True, False, "qkv")


def _valid_names() -> str:
    return ", ".join(repr(n) for n in (*SOFTMAX, *MECHANISMS))


def self_attention_maker(who: str, attention, dim: int, num_heads: int, *, causal: bool, dropout: float = 0.0,
                         mask: masks.Mask | None = None, rotary: bool | dict = False, max_len: int | None = None,
                         gate: bool = False, qk_norm: bool = False, head_dim: int | None = None,
                         num_kv_heads: int | None = None, attention_bias: bool | str = True) -> Callable[[], nn.Module]:
    """Validate ``attention`` once and return a function building one self-attention module per layer."""
    softmax_only = {"attention_mask": mask is not None, "rotary positions": bool(rotary), "gate": bool(gate),
                    "qk_norm": bool(qk_norm), "head_dim": head_dim is not None,
                    "num_kv_heads": num_kv_heads is not None, "attention_bias": attention_bias is not True}
    if isinstance(attention, str):
        if attention in SOFTMAX:
            layout: dict[str, Any] = {"head_dim": head_dim, "num_kv_heads": num_kv_heads, "bias": attention_bias}
            if attention_bias not in BIASES:
                raise ArgumentError(f"{who}: attention_bias must be one of {BIASES}; got {attention_bias!r}")
            rotary_for(who, rotary, head_dim or dim // num_heads)  # a bad option fails here, before any layer is built
            return lambda: SoftmaxSelfAttention(dim, num_heads, dropout=dropout, causal=causal, mask=mask,
                                                rotary=rotary, gate=gate, qk_norm=qk_norm, **layout)
        if attention not in MECHANISMS:
            raise ArgumentError(f"{who}: unknown attention {attention!r}; expected one of {_valid_names()} "
                                "or a factory (dim, num_heads) -> nn.Module")
        build, has_causal = MECHANISMS[attention]
        if causal and not has_causal:
            causal_names = ", ".join(repr(n) for n, (_, c) in MECHANISMS.items() if c)
            raise ArgumentError(f"{who}: attention {attention!r} has no causal form, so it cannot be used for "
                                f"causal self-attention; causal ones: 'softmax', {causal_names}")
        if attention in ("linformer", "lambda-layer") and max_len is None:
            raise ArgumentError(f"{who}: attention {attention!r} needs max_len (the longest input); got None")
        _check_plain(who, attention, softmax_only)
        return lambda: build(dim, num_heads, causal, max_len)
    if not callable(attention):
        raise DTypeError(f"{who}: attention must be a name ({_valid_names()}) or a factory (dim, num_heads) -> "
                         f"nn.Module; got {type(attention).__name__}")
    _check_plain(who, "a factory", softmax_only)
    return functools.partial(_from_factory, who, attention, dim, num_heads, causal)


def _check_plain(who: str, what: str, softmax_only: dict) -> None:
    for option, given in softmax_only.items():
        if given:
            hint = (" (positional='rotary'; use 'sinusoidal', 'learned' or None)" if option == "rotary positions"
                    else "")
            raise ArgumentError(f"{who}: {option} apply to attention='softmax' only; got it with {what}{hint}")


def _accepts(fn, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _from_factory(who: str, factory, dim: int, num_heads: int, causal: bool) -> nn.Module:
    module = factory(dim, num_heads, causal=True) if causal and _accepts(factory, "causal") else factory(dim, num_heads)
    if not isinstance(module, nn.Module):
        raise DTypeError(f"{who}: the attention factory must return an nn.Module; got {type(module).__name__}")
    return module


def self_attend(module: nn.Module, x: torch.Tensor, key_keep_mask=None, cache=None, tree=None) -> torch.Tensor:
    """``module(x)`` with the key padding, cache (a KV cache, a recurrent layer's state) and draft ``tree`` it can
    take; ``(B, t, dim) -> (B, t, dim)``."""
    name = type(module).__name__
    if isinstance(module, SoftmaxSelfAttention):  # (subclasses that verify no trees take no tree argument)
        extra = {} if tree is None else {"tree": tree}
        return module(x, key_keep_mask=key_keep_mask, cache=cache, **extra)
    if isinstance(module, RecurrentLayer) and (cache is not None or tree is not None):
        keep = None if key_keep_mask is None else key_keep_mask[:, -x.shape[1]:]  # the new positions'
        return module(x, key_keep_mask=keep, cache=cache, parents=tree)
    if tree is not None:
        raise UnsupportedFeature(f"{name}: a draft tree is verified by softmax or linear-recurrent layers; got {name}")
    if cache is not None:
        raise ArgumentError(f"{name}: a KV cache needs attention='softmax'; decode without a cache (use_cache=False)")
    if key_keep_mask is not None and not bool(key_keep_mask.all()):
        if not _accepts(module.forward, "key_keep_mask"):
            raise ArgumentError(f"{name} takes no key_keep_mask, so padded inputs cannot be masked; use an "
                                "attention that does (softmax, linear-attention, performer, linformer, reformer) "
                                "or unpadded batches")
        out = module(x, key_keep_mask=key_keep_mask)
    else:
        out = module(x)
    if not isinstance(out, torch.Tensor) or out.shape != x.shape:
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ShapeError(f"{name}: self-attention must map (batch, n, dim) = {tuple(x.shape)} to the same shape; "
                         f"got {got}")
    return out
