"""The error contract, in one place: check every argument once, before dispatch.

:func:`validate` turns the user's arguments into a :class:`Problem` whose
tensors are 4-D ``(B, H, L, D)``; every backend sees only a valid problem.
Each error names the argument and shows expected vs actual (RELIABILITY.md).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..errors import ArgumentError, DeviceError, DTypeError, ShapeError
from ..masks.base import Mask
from ..masks.indexed import TensorMask
from ..masks.selected import Pages, check_pages
from .normalize import NORMALIZERS
from .quantize import CODE_DTYPES, Quantized, check_scale, format_of_codes
from .scores import SCORES

__all__ = ["Problem", "validate", "default_scale", "check_sinks"]
_WHO = "attnkit.attention"


@dataclass(frozen=True, eq=False)
class Problem:
    """A validated attention call: 4-D tensors, resolved options, and the facts every rule reads.

    Immutable: a changed call is a new problem (:meth:`with_inputs`). The facts that
    depend only on the arguments (sizes, grouped heads, compute dtype, whether autograd
    records the call) are computed once, when the problem is built; the mask's band,
    facts that read the data (whether q, k, v are finite) and facts a kernel derives
    (torch's kernel checks its own output) at most once, on first use, into :attr:`memo`.
    """

    q: torch.Tensor  # (B, Hq, Lq, D)
    k: torch.Tensor  # (B, Hkv, Lk, D)
    v: torch.Tensor  # (B, Hkv, Lk, Dv)
    mask: Mask | None
    bias: torch.Tensor | None  # (B|1, H|1, Lq|1, Lk), floating
    modifier: Callable | None
    score: str | Callable
    scale: float
    normalize: str | Callable
    dropout_p: float
    return_weights: bool
    return_lse: bool
    user_rank: int
    tracing: bool = False  # traced by torch.compile / export: nothing may read the data
    sinks: torch.Tensor | None = None  # (B|1, H|1, Lq|1): a logit in each row's softmax denominator
    quant: Quantized | None = None  # k and v hold codes (k_scale=, v_scale=): dequantized one key block at a time
    sizes: tuple[int, int, int, int, int, int] = field(init=False)  # (B, Hq, Lq, Lk, D, Dv)
    groups: int = field(init=False)  # query heads per key/value head (1 unless grouped-query attention)
    compute_dtype: torch.dtype = field(init=False)  # float64 stays float64; everything else runs in float32
    learned: tuple[torch.Tensor, ...] = field(init=False)  # bias tensors autograd asks gradients of
    needs_grad: bool = field(init=False)  # autograd records this call
    memo: dict = field(init=False, repr=False)  # facts computed on first use (see rules.fact)

    def __post_init__(self):
        b, h, lq, d = self.q.shape
        hkv, lk = self.k.shape[1], self.k.shape[2]
        learned = _learned(self.bias, self.modifier)
        grad = torch.is_grad_enabled() and (
            bool(learned) or self.q.requires_grad or self.k.requires_grad or self.v.requires_grad
            or (self.sinks is not None and self.sinks.requires_grad))
        dv = self.v.shape[3] * (2 if self.quant is not None and self.quant.kind == "int4" else 1)
        for name, value in (("sizes", (b, h, lq, lk, d, dv)), ("groups", h // hkv if hkv else 1),
                            ("compute_dtype", torch.float64 if self.q.dtype == torch.float64 else torch.float32),
                            ("learned", learned), ("needs_grad", grad), ("memo", {})):
            object.__setattr__(self, name, value)

    @property
    def band(self) -> tuple[int, int] | None:
        """``(lo, hi)`` when the mask allows exactly the keys ``lo <= j - i <= hi``, both sides bounded; else None.

        Arithmetic on the mask's band terms, done once per problem (on first use: with
        symbolic sizes, comparing the terms would pin the sizes, so nothing asks then).
        """
        memo = self.memo
        if "band" not in memo:
            mask = self.mask  # no band terms: no band (Mask.band reads only them), so the mask is not asked
            band = None if mask is None or mask.band_terms is None else mask.band(self.sizes[2], self.sizes[3])
            memo["band"] = None if band is None or None in band else band
        return memo["band"]

    def with_inputs(self, **changes) -> Problem:
        """This call with some arguments replaced (e.g. ``k=..., v=...``): a new problem, its facts anew."""
        return dataclasses.replace(self, **changes)

    def inputs_finite(self) -> bool:
        """Whether q, k and v hold no NaN/inf (one summed pass, computed once per problem).

        NaN or inf anywhere makes a tensor's sum NaN or inf; the three sums are added
        as Python floats (float64, so that addition cannot overflow), one reduction
        per distinct tensor and no other tensor op. A huge finite input can overflow
        a float32 sum: that only makes the answer a cautious False (an exact kernel
        then runs), never a wrong result. Meta tensors hold no values: True, unread.
        """
        finite = self.memo.get("inputs_finite")
        if finite is None:
            distinct = {id(t): t for t in (self.q, self.k, self.v)}.values()  # q is k is v: sum once
            finite = self.q.is_meta or math.isfinite(sum(t.sum(dtype=self.compute_dtype).item() for t in distinct))
            self.memo["inputs_finite"] = finite
        return finite

    @property
    def finiteness_known(self) -> bool:
        return "inputs_finite" in self.memo


def _learned(bias, modifier) -> tuple[torch.Tensor, ...]:
    """The bias tensors whose gradients autograd asks for (a tensor bias, an additive modifier's parameters)."""
    if not torch.is_grad_enabled():
        return ()
    if bias is not None:
        return (bias,) if bias.requires_grad else ()
    grads = getattr(modifier, "parameters_needing_grad", None)  # additive modifiers (ALiBi, relative positions)
    return tuple(grads()) if grads is not None else ()


def _shape(t) -> tuple:
    return tuple(t.shape)


def _check_qkv(q, k, v, kind: str | None = None):
    """q, k, v; with ``kind`` (quantized keys and values, :func:`_check_codes`) k and v hold its codes."""
    for name, t in (("query", q), ("key", k), ("value", v)):
        if not isinstance(t, torch.Tensor):
            raise DTypeError(f"{_WHO}: {name} must be a torch.Tensor; got {type(t).__name__}")
        if not t.is_floating_point() and (kind is None or name == "query"):
            raise DTypeError(f"{_WHO}: {name} must be a floating tensor; got dtype {t.dtype}")
    if kind is None and not (q.dtype == k.dtype == v.dtype):
        raise DTypeError(f"{_WHO}: query, key and value must share a dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise DeviceError(f"{_WHO}: query, key and value must share a device; got {q.device}, {k.device}, {v.device}")
    qs, ks, vs = q.shape, k.shape, v.shape  # read once: each read builds a torch.Size
    packed = 2 if kind == "int4" else 1  # int4: two features per stored byte
    rank = len(qs)
    if not (rank == len(ks) == len(vs)) or not 2 <= rank <= 4:
        raise ShapeError(f"{_WHO}: query, key and value must all be 2-D (L, D), 3-D (B, L, D) or "
                         f"4-D (B, H, L, D); got shapes {_shape(q)}, {_shape(k)}, {_shape(v)}")
    if qs[-1] != ks[-1] * packed:
        packing = ", int4 codes packed two per byte" if packed > 1 else ""
        raise ShapeError(f"{_WHO}: query and key must share the feature dim; got query {_shape(q)} (D={qs[-1]}) "
                         f"and key {_shape(k)} (D={ks[-1] * packed}{packing})")
    if ks[-2] != vs[-2]:
        raise ShapeError(f"{_WHO}: key and value must have the same length; got key {_shape(k)} "
                         f"(Lk={ks[-2]}) and value {_shape(v)} (Lv={vs[-2]})")
    if rank >= 3 and not (qs[0] == ks[0] == vs[0]):
        raise ShapeError(f"{_WHO}: batch dims differ: query {_shape(q)}, key {_shape(k)}, value {_shape(v)}")
    if rank == 4:
        hq, hk, hv = qs[1], ks[1], vs[1]
        if hk != hv:
            raise ShapeError(f"{_WHO}: key and value must have the same number of heads; got {hk} and {hv}")
        if (hk == 0 and hq != 0) or (hk and hq % hk):
            raise ShapeError(f"{_WHO}: query heads must be a multiple of key/value heads (grouped-query "
                             f"attention); got {hq} query heads and {hk} key/value heads")


def _as_4d(t: torch.Tensor) -> torch.Tensor:
    return t.reshape((1,) * (4 - t.dim()) + tuple(t.shape)) if t.dim() == 2 else (
        t.unsqueeze(1) if t.dim() == 3 else t)


def _check_broadcast(name, t, q, k, user_rank):
    """A mask/bias tensor must broadcast to the scores ``(..., Lq, Lk)`` in the documented dims only."""
    full = tuple(q.shape[:-1]) + (k.shape[-2],)
    ok = t.dim() <= user_rank and t.shape[-1] == full[-1]
    ok = ok and all(s in (1, f) for s, f in zip(reversed(t.shape[:-1]), reversed(full[:-1]), strict=False))
    if not ok:
        raise ShapeError(f"{_WHO}: {name} must broadcast to the scores {full} (last dim exactly kv_len="
                         f"{full[-1]}, other dims equal or 1); got {_shape(t)}")
    t = t.reshape((1,) * (user_rank - t.dim()) + tuple(t.shape))
    return _as_4d(t)


def _non_bool_mask_hint(mask: torch.Tensor, tracing: bool) -> str:
    """What to pass instead of a non-bool mask: a tensor of only 0 and 1 (read eagerly, on the error path only) is a
    keep-or-drop mask of either polarity; other float tensors are additive biases."""
    binary = False
    if not tracing and not torch.compiler.is_compiling() and mask.device.type != "meta":
        binary = bool(((mask == 0) | (mask == 1)).all())
    if binary:
        return (" (it holds only 0 and 1: mask=m.bool() if 1 marks the keys to attend, mask=(m == 0) if 1 marks those"
                " to drop" + ("; float tensors of 0 and -inf are additive biases: pass them as bias=)"
                              if mask.is_floating_point() else ")"))
    return " (float tensors are additive biases: pass them as bias=)" if mask.is_floating_point() else ""


def _check_mask(mask, q4, user_q, user_k, tracing=False):
    if mask is None:
        return None
    if isinstance(mask, Mask):
        b, h = q4.shape[:2]
        if mask.batch_size is not None and mask.batch_size != b:
            raise ShapeError(f"{_WHO}: mask {mask!r} holds data for batch size {mask.batch_size}; got batch {b}")
        if mask.num_heads is not None and mask.num_heads != h:
            raise ShapeError(f"{_WHO}: mask {mask!r} holds data for {mask.num_heads} heads; got {h} heads")
        for name, want, got in (("q_len", mask.q_len, user_q.shape[-2]), ("kv_len", mask.kv_len, user_k.shape[-2])):
            if want is not None and want != got:
                raise ShapeError(f"{_WHO}: mask {mask!r} holds data for {name}={want}; got {name}={got}")
        if mask.kind == "selected" and not tracing:
            mask.selection.check_keys(user_k.shape[-2], f"{_WHO}: mask")
        return mask
    if not isinstance(mask, torch.Tensor):
        hint = " (a mask expression is built with attnkit.masks.parse(text))" if isinstance(mask, str) else ""
        raise DTypeError(f"{_WHO}: mask must be an attnkit.masks.Mask or a bool tensor; got {type(mask).__name__}"
                         f"{hint}")
    if mask.dtype != torch.bool:
        raise DTypeError(f"{_WHO}: mask must be a bool tensor (True = attend); got dtype {mask.dtype}"
                         f"{_non_bool_mask_hint(mask, tracing)}")
    if mask.device != q4.device:
        raise DeviceError(f"{_WHO}: mask is on {mask.device} but query is on {q4.device}")
    return TensorMask(_check_broadcast("mask", mask, user_q, user_k, user_q.dim()))


def _check_bias(bias, q4, user_q, user_k):
    if bias is None:
        return None, None
    if isinstance(bias, torch.Tensor):
        if not bias.is_floating_point():
            hint = " (bool tensors are masks: pass them as mask=)" if bias.dtype == torch.bool else ""
            raise DTypeError(f"{_WHO}: bias must be a floating tensor; got dtype {bias.dtype}{hint}")
        if bias.device != q4.device:
            raise DeviceError(f"{_WHO}: bias is on {bias.device} but query is on {q4.device}")
        return _check_broadcast("bias", bias, user_q, user_k, user_q.dim()), None
    if callable(bias):
        heads = getattr(bias, "num_heads", None)  # a modifier with per-head parameters (ALiBi, relative positions)
        if isinstance(heads, int) and heads != q4.shape[1]:
            raise ShapeError(f"{_WHO}: bias {bias!r} holds parameters for {heads} heads; got {q4.shape[1]} "
                             f"query heads (shape {_shape(user_q)})")
        return None, bias
    raise DTypeError(f"{_WHO}: bias must be a float tensor or a modifier (scores, b, h, q_idx, kv_idx) -> scores; "
                     f"got {type(bias).__name__}")


def check_sinks(sinks, q4, user_q, normalize="softmax", who=_WHO, values=True):
    """Sinks ``(H_q,)``, ``(B, H_q)`` or ``(B, H_q, L_q)`` (any of them 1 to broadcast), as ``(B|1, H|1, Lq|1)``;
    softmax only.

    A sink of ``+inf`` would take every row's whole weight (output 0 whatever q, k and v) and has no
    gradient but NaN: it is refused (``values``: read the sinks; off while tracing). ``-inf`` is plain
    softmax; NaN propagates, as NaN in q, k, v does.
    """
    if sinks is None:
        return None
    if not isinstance(sinks, torch.Tensor) or not sinks.is_floating_point():
        got = f"dtype {sinks.dtype}" if isinstance(sinks, torch.Tensor) else type(sinks).__name__
        raise DTypeError(f"{who}: sinks must be a floating tensor (a logit per query head); got {got}")
    if sinks.device != q4.device:
        raise DeviceError(f"{who}: sinks is on {sinks.device} but query is on {q4.device}")
    if normalize != "softmax":
        raise ArgumentError(f"{who}: sinks join a softmax's denominator: normalize must be 'softmax'; "
                            f"got normalize={normalize!r}")
    batch, heads, length = q4.shape[:3]
    full = {0: (), 1: (heads,), 2: (batch, heads), 3: (batch, heads, length)}.get(sinks.dim())  # () every head
    if full is None or any(s not in (1, f) for s, f in zip(sinks.shape, full, strict=True)):
        raise ShapeError(f"{who}: sinks must have shape (H_q,) = ({heads},), or broadcast to (batch, H_q) = "
                         f"({batch}, {heads}) or to (batch, H_q, L_q) = ({batch}, {heads}, {length}) for query "
                         f"{_shape(user_q)}; got {_shape(sinks)}")
    if values and not sinks.is_meta and sinks.numel():
        plus = torch.isposinf(sinks.detach())
        if plus.any():
            where = tuple(int(i) for i in plus.nonzero()[0])
            raise ArgumentError(f"{who}: sinks must be finite or -inf (plain softmax); got +inf at "
                                f"{'head ' + str(where[0]) if sinks.dim() == 1 else 'index ' + str(where)} of "
                                f"sinks {_shape(sinks)}")
    shape = tuple(sinks.shape)
    return sinks.reshape({0: (1, 1, 1), 1: (1, *shape, 1), 2: (*shape, 1), 3: shape}[sinks.dim()])


def _check_choice(name, value, table):
    if callable(value):
        return value
    if not isinstance(value, str) or value not in table:
        raise ArgumentError(f"{_WHO}: {name} must be one of {sorted(table)} or a callable; got {value!r}")
    return value


def default_scale(score, head_dim: int) -> float:
    """``1/sqrt(D)`` for "scaled_dot" (Vaswani et al. 2017, eq. 1); 1 for every other score."""
    return 1.0 / math.sqrt(head_dim) if score == "scaled_dot" and head_dim > 0 else 1.0


def _check_scale(scale, score, head_dim):
    if scale is None:
        return default_scale(score, head_dim)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ArgumentError(f"{_WHO}: scale must be a finite real number or None; got {scale!r}")
    return float(scale)


def _check_dropout(p):
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not (p == 0 or 1e-300 < p < 1):
        raise ArgumentError(f"{_WHO}: dropout_p must be 0 or a normal float in (0, 1); got {p!r}")
    return float(p)


def _paged_inputs(q, k, v, mask, bias, block_table, seqused_k, tracing, kind=None):
    """A paged call as an ordinary one: the pool of pages as one key axis ``(B, Hkv, P * page_size, D)`` (a view of
    a contiguous pool, expanded over the batch) and a :class:`~.selected_masks.Pages` mask holding the caller's."""
    if not isinstance(q, torch.Tensor) or q.dim() != 4:
        raise ShapeError(f"{_WHO}: with block_table or seqused_k, query must be 4-D (B, H, Lq, D); got "
                         f"{_shape(q) if isinstance(q, torch.Tensor) else type(q).__name__}")
    if seqused_k is None:
        raise ArgumentError(f"{_WHO}: block_table needs seqused_k (the number of keys each sequence holds); got None")
    if bias is not None:
        raise ArgumentError(f"{_WHO}: bias is not supported with block_table or seqused_k (keys are read by their "
                            f"position in each sequence); got {type(bias).__name__}")
    if mask is not None and not isinstance(mask, Mask):
        raise DTypeError(f"{_WHO}: with block_table or seqused_k, mask must be an attnkit mask evaluated at each "
                         f"sequence's own positions (causal, windows); got {type(mask).__name__}")
    batch = q.shape[0]
    if block_table is None:  # a contiguous cache (B, Hkv, Lk, D): one page per sequence, the whole row
        _check_qkv(q, k, v, kind)
        pages, page_size, table = batch, max(k.shape[2], 1), torch.zeros(batch, 1, dtype=torch.long, device=q.device)
    else:
        for name, t in (("key", k), ("value", v)):
            if not isinstance(t, torch.Tensor) or t.dim() != 4:
                got = _shape(t) if isinstance(t, torch.Tensor) else type(t).__name__
                raise ShapeError(f"{_WHO}: with block_table, {name} must be a pool of pages (num_pages, page_size, "
                                 f"kv_heads, dim); got {got}")
        if k.shape[:3] != v.shape[:3]:
            raise ShapeError(f"{_WHO}: key and value pools must share (num_pages, page_size, kv_heads); got "
                             f"{_shape(k)} and {_shape(v)}")
        if k.shape[1] == 0:
            raise ShapeError(f"{_WHO}: with block_table, a page must hold at least one position; got pools "
                             f"{_shape(k)} (page_size 0)")
        pages, page_size, table = k.shape[0], k.shape[1], block_table
        k, v = (t.reshape(-1, *t.shape[2:]).transpose(0, 1).unsqueeze(0).expand(batch, -1, -1, -1) for t in (k, v))
        _check_qkv(q, k, v, kind)
    table, lengths = check_pages(_WHO, table, seqused_k, pages, page_size, batch, q.device, values=not tracing)
    if block_table is None and not tracing and batch and int(lengths.max()) > k.shape[2]:
        raise ArgumentError(f"{_WHO}: seqused_k must be at most the key length {k.shape[2]}; got {int(lengths.max())}")
    return k, v, Pages(table, page_size, lengths, mask, pooled=block_table is not None)


def _check_codes(k, v, k_scale, v_scale) -> str | None:
    """The kind of quantized keys and values (:mod:`.quantize`), or None for full-precision ones."""
    if k_scale is None and v_scale is None:
        codes = [name for name, t in (("key", k), ("value", v)) if getattr(t, "dtype", None) in CODE_DTYPES]
        if codes:
            t = k if codes[0] == "key" else v
            raise DTypeError(f"{_WHO}: {codes[0]} has dtype {t.dtype}, the codes of a quantized cache: pass "
                             f"{'k_scale' if codes[0] == 'key' else 'v_scale'} (and the other scale) to dequantize "
                             f"them, or full-precision tensors")
        return None
    for name, given in (("k_scale", k_scale), ("v_scale", v_scale)):
        if given is None:
            raise ArgumentError(f"{_WHO}: quantized keys and values need both k_scale and v_scale; got {name}=None")
    for name, t in (("key", k), ("value", v)):
        if not isinstance(t, torch.Tensor) or t.dtype not in CODE_DTYPES:
            got = f"dtype {t.dtype}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise DTypeError(f"{_WHO}: with k_scale and v_scale, {name} must hold codes (float8_e4m3fn, float8_e5m2, "
                             f"int8, or uint8: int4 packed two per byte); got {got}")
    if k.dtype != v.dtype:
        raise DTypeError(f"{_WHO}: key and value codes must share a dtype; got {k.dtype} and {v.dtype}")
    return format_of_codes(k.dtype)


def _scales(k, v, k_scale, v_scale, kind, pooled: bool, batch: int) -> Quantized:
    """The scales checked against the codes (``()`` or one per stored row) and laid out as the 4-D keys:
    ``()`` or ``(B, H_kv, Lk)`` (a pool's ``(P, page_size, H_kv)`` seen as one key axis, as its keys are)."""
    out = []
    for name, scale, t in (("k_scale", k_scale, k), ("v_scale", v_scale, v)):
        check_scale(_WHO, name, scale, t, tuple(t.shape[:-1]))
        if scale.dim() == 0:
            pass
        elif pooled:
            scale = scale.reshape(-1, scale.shape[-1]).transpose(0, 1).unsqueeze(0).expand(batch, -1, -1)
        else:
            scale = scale.reshape((1,) * (3 - scale.dim()) + tuple(scale.shape)) if scale.dim() == 1 else (
                scale.unsqueeze(1) if scale.dim() == 2 else scale)
        out.append(scale)
    if (k_scale.dim() == 0) != (v_scale.dim() == 0):
        raise ShapeError(f"{_WHO}: k_scale and v_scale must both be per tensor () or both per token and head; got "
                         f"{_shape(k_scale)} and {_shape(v_scale)}")
    return Quantized(kind, *out)


def validate(q, k, v, *, mask=None, bias=None, score="scaled_dot", scale=None, normalize="softmax",
             dropout_p=0.0, return_weights=False, return_lse=False, tracing=False, sinks=None, block_table=None,
             seqused_k=None, k_scale=None, v_scale=None) -> Problem:
    """Check every argument of :func:`attnkit.attention` and build the :class:`Problem`."""
    kind = _check_codes(k, v, k_scale, v_scale)
    quant = None
    if kind is not None:
        if isinstance(q, torch.Tensor) and q.dtype in CODE_DTYPES:
            raise DTypeError(f"{_WHO}: query must be a full-precision floating tensor; got dtype {q.dtype}")
        pooled = block_table is not None and isinstance(q, torch.Tensor)
        quant = _scales(k, v, k_scale, v_scale, kind, pooled, q.shape[0] if pooled else 0)
    if block_table is not None or seqused_k is not None:
        k, v, mask = _paged_inputs(q, k, v, mask, bias, block_table, seqused_k, tracing, kind)
    _check_qkv(q, k, v, kind)
    q4, k4, v4 = _as_4d(q), _as_4d(k), _as_4d(v)
    score = _check_choice("score", score, SCORES)
    normalize = _check_choice("normalize", normalize, NORMALIZERS)
    if return_lse and normalize != "softmax":
        raise ArgumentError(f"{_WHO}: return_lse is defined for normalize='softmax' only; got normalize={normalize!r}")
    bias_tensor, modifier = _check_bias(bias, q4, q, k)
    return Problem(
        q=q4, k=k4, v=v4,
        mask=_check_mask(mask, q4, q, k, tracing),
        bias=bias_tensor, modifier=modifier,
        score=score, scale=_check_scale(scale, score, q.shape[-1]), normalize=normalize,
        dropout_p=_check_dropout(dropout_p),
        return_weights=bool(return_weights), return_lse=bool(return_lse), user_rank=q.dim(), tracing=tracing,
        sinks=check_sinks(sinks, q4, q, normalize, values=not tracing), quant=quant,
    )
