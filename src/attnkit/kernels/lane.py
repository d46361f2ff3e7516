"""The fast lane: the calls generation makes, on torch's fused kernel, at torch's speed.

A decoding step (one query over a KV cache), chunked prefill, and small training calls
spend most of their time around the kernel, not in it: validation, the decision and
the output check cost more than the arithmetic at short lengths. For the calls whose
result cannot differ from the ``torch-sdpa`` path (and whose mask leaves no row
empty), :func:`route` decides with attribute checks only (types, ranks, sizes,
dtypes, devices, strides; no torch operator) and :func:`run` calls torch's CPU kernel
directly, as its own entry point would (grouped-query heads with no mask as rows of one product per
key/value head, :func:`.sdpa.flash`, as the ``torch-sdpa`` path runs them). :func:`route` checks its scope:

- ``backend="auto"``, no bias, sinks, dropout, weights or lse, no recorder listening, no mask
  tensor (validation converts it);
- plain 4-D tensors on the CPU (float32/float64) or on one CUDA device (float16, bfloat16,
  float32, float64, where torch's public ``F.scaled_dot_product_attention`` runs: flash,
  memory-efficient or cuDNN, as torch picks), valid sizes (grouped-query heads allowed),
  a finite scale, not traced, no autocast;

and then the table's own rules on the call (:data:`.sdpa.LANE`, read without data): the
rules of ``torch-sdpa`` that read no data (softmax of dot products, ...) and the lane's
(:func:`.rules.output_checked`, :func:`.rules.equal_head_dims`, :func:`.rules.read_in_place`,
:func:`.rules.mask_keeps_every_row`), so what torch's kernel answers exactly is stated once,
in :mod:`.rules`. The rules read no data, so their answer is kept per call signature
(:func:`_signature`: dtype, device, the mask's kind, score, normaliser, the scale's sign,
the sizes as a class, layout, autograd): a repeated call, or a decoding step whose cache
has grown, pays a dict lookup instead of the walk. The mask is read as the path reads it
(:func:`.sdpa.kernel_mask`): none; ``is_causal``; no mask for one bottom-right causal query
(decoding); a cached float mask for several (chunked prefill).

Every contract holds: the output and the kernel's log-sum-exp are checked after every
call (:func:`trusted`: NaN or inf in the output, an lse of NaN, inf or exactly 0: an
overflow, a masked NaN key torch leaked, a NaN query row it zeroed; a small lse is read
as Python floats and the output summed once, since each operator right after the kernel
costs microseconds; on CUDA, whose public kernel returns no lse, NaN or inf in the output
or in q: :func:`.sdpa.sums_finite`, no second pass over the KV cache), and then the call
is handed to the full route (validation, :func:`~.dispatch.choose`), which raises
attnkit's errors and runs an exact path. Anything the lane does not take goes there too.
The check stays after the kernel even with no masked key: torch's kernel answers a head
whose every score is -inf with 0 and lets values near the largest float overflow, over a
cache of any length (and zeroes NaN queries and all-NaN keys below 16 keys); only a pass
over the cache before the kernel could tell those calls apart.
"""

from __future__ import annotations

import math
from itertools import chain

import torch
import torch.nn.functional as F

from .. import recording
from ..functional.validate import default_scale, validate
from . import reference, sdpa
from .pipeline import twice_differentiable, twice_differentiable_node
from .sdpa import sums_finite

__all__ = ["route", "run", "trusted", "describe", "LISTED_ROWS"]

_DTYPES = (torch.float32, torch.float64)
# one C call when no autocast is on anywhere (the common case), before asking for the call's device
_any_autocast = getattr(torch._C, "_is_any_autocast_enabled", lambda: True)
_CUDA_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class _Call:
    """The lane's call as the table's rules read it: the fields of a :class:`~attnkit.functional.validate.Problem`
    they use, from the arguments as given (no validation: :func:`route` has already checked what it would). The
    options outside the lane's scope keep their defaults, which :func:`route` has checked the call has."""

    __slots__ = ("k", "mask", "memo", "needs_grad", "normalize", "q", "scale", "score", "sizes", "v")
    bias = modifier = sinks = quant = None
    dropout_p = 0.0
    return_weights = return_lse = tracing = False

    def __init__(self, q, k, v, mask, score, scale, normalize, sizes, needs_grad, device_type):
        self.q, self.k, self.v, self.mask, self.score, self.scale = q, k, v, mask, score, scale
        self.normalize, self.sizes, self.needs_grad = normalize, sizes, needs_grad
        self.memo = {"device_type": device_type}  # rules.device_type, known from the route's checks


def _passes_the_whole_scope(rule) -> bool:
    """Whether ``rule`` passes every call the lane's scope admits: it says None reading only the options the scope
    pins (a call with no other field set raises AttributeError on any other). Such rules are not asked again."""
    try:
        return rule(_Call.__new__(_Call)) is None
    except AttributeError:
        return False


# sdpa.LANE less the rules the scope already decides (no bias, weights, lse, sinks, quantization, tracing)
_ASKED = tuple(rule for rule in sdpa.LANE if not _passes_the_whole_scope(rule))


# The rules' answer per call signature (:func:`_signature`): what they read of a call, its sizes as a class (a
# decoding step's cache grows by one key a step and keeps its signature). The rules read no data, so a repeated
# call pays a dict lookup instead of the walk; a test holds every cached answer to the walk's on the same call.
_DECIDED: dict = {}
_MOST_DECIDED = 1024  # distinct signatures kept (strings users pass for score/normalize are in them); then cleared
_REFUSED, _PER_CALL = "refused", "the mask depends on the lengths"


def _signature(q, k, v, mask, score, scale, normalize, sizes, grad, cpu):
    """What the lane's rules (:data:`_ASKED`) and :func:`.sdpa.kernel_mask` read of a call, as a hashable key; None
    where it would not be one (a callable score or normaliser, sizes that are traced tensors under
    ``torch.jit.trace``: the walk runs uncached).

    The sizes enter as a class (equal head dims; one query; ``Lq`` against ``Lk``; the head dim for the default
    scale); the layout as contiguous, innermost stride 1, or neither; the mask as its kind and alignment; the
    scale as its sign (the default scale: None, computed from the head dim).
    """
    _, _, lq, lk, d, dv = sizes
    if type(score) is not str or type(normalize) is not str or type(lq) is not int or type(lk) is not int:
        return None
    if q.is_contiguous() and k.is_contiguous() and v.is_contiguous():
        layout = 2
    else:
        layout = int(q.stride(3) == 1 and k.stride(3) == 1 and v.stride(3) == 1)
    return (None if mask is None else (mask.kind, getattr(mask, "align", None)), score, normalize,
            None if scale is None else scale > 0, q.dtype, cpu, d, d == dv, lq == 1, (lq > lk) - (lq < lk), layout,
            grad)


def _decide(q, k, v, mask, score, scale, normalize, sizes, grad, cpu):
    """The walk: the dtypes the lane serves, then the table's rules (:data:`.sdpa.LANE`) on the call; ``(kernel
    mask, scale)``, where the kernel mask is :data:`_PER_CALL` when it depends on the lengths (a cached float mask
    for several bottom-right causal queries), or :data:`_REFUSED`."""
    if q.dtype not in (_DTYPES if cpu else _CUDA_DTYPES):
        return _REFUSED
    if scale is None:
        scale = default_scale(score, sizes[4])
    # the fields of a Problem that the rules read (a test holds the two to the same answers)
    call = _Call(q, k, v, mask, score, scale, normalize, sizes, grad, "cpu" if cpu else "cuda")
    for rule in _ASKED:
        if rule(call) is not None:
            return _REFUSED
    km = sdpa.kernel_mask(call, q.dtype)
    return (_PER_CALL if km.float_mask is not None else km), scale


def route(q, k, v, mask, bias, score, scale, normalize, dropout_p, return_weights, return_lse,
          backend, sinks=None) -> tuple | None:
    """``(is_causal, float_mask, scale, on_cpu)`` for a call the lane takes, else None; reads attributes only.

    The lane's scope first (the options it leaves to the full route, plain valid 4-D tensors), then the table's
    rules (:data:`.sdpa.LANE`) on the call, asked once per call signature (:func:`_signature`): what torch's
    kernel answers exactly is stated there, once.
    """
    if (backend != "auto" or bias is not None or sinks is not None or dropout_p or return_weights or return_lse
            or recording.listening or (mask is not None and getattr(mask, "kind", None) is None)):  # a tensor mask
        return None
    if type(q) is not torch.Tensor or type(k) is not torch.Tensor or type(v) is not torch.Tensor:
        return None
    qs, ks, vs = q.shape, k.shape, v.shape
    if len(qs) != 4 or len(ks) != 4 or len(vs) != 4:
        return None
    cpu = q.is_cpu and k.is_cpu and v.is_cpu
    if not cpu and not (q.is_cuda and k.device == q.device and v.device == q.device):
        return None
    dtype = q.dtype
    if k.dtype is not dtype or v.dtype is not dtype:
        return None
    batch, heads, lq, d = qs
    bk, hkv, lk, dk = ks
    bv, hv, lv, dv = vs
    if (bk != batch or bv != batch or hv != hkv or lv != lk or dk != d or not hkv or heads % hkv
            or not (batch and lq and lk and d)):
        return None
    if scale is not None and (type(scale) not in (float, int) or not math.isfinite(scale)):
        return None
    if torch.compiler.is_compiling() or (_any_autocast() and torch.is_autocast_enabled("cpu" if cpu else "cuda")):
        return None
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    sizes = (batch, heads, lq, lk, d, dv)
    key = _signature(q, k, v, mask, score, scale, normalize, sizes, grad, cpu)
    decision = _DECIDED.get(key) if key is not None else None
    if decision is None:
        decision = _decide(q, k, v, mask, score, scale, normalize, sizes, grad, cpu)
        if key is not None:
            if len(_DECIDED) >= _MOST_DECIDED:
                _DECIDED.clear()
            _DECIDED[key] = decision
    if decision is _REFUSED:
        return None
    km, default = decision
    if scale is None:
        scale = default
    if km is _PER_CALL:
        km = sdpa.kernel_mask(_Call(q, k, v, mask, score, scale, normalize, sizes, grad,  # type: ignore[arg-type]
                                    "cpu" if cpu else "cuda"), dtype)
    return km.is_causal, km.float_mask, scale, cpu


def run(q, k, v, mask, lane: tuple) -> torch.Tensor | None:
    """torch's kernel on the lane's call; None when its output or log-sum-exp shows a row it answered differently.

    Under autograd the output is made twice differentiable (torch's kernel has no second derivative): on the CPU a
    hook on the kernel's own node (:func:`.pipeline.twice_differentiable_node`), on CUDA a wrapper (the public
    entry point's output may be a view after the kernel).
    """
    is_causal, float_mask, scale, cpu = lane
    if not cpu:  # torch's public kernel, which returns no lse: the sums of the output and the queries stand for it
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=float_mask, is_causal=is_causal, scale=scale,
                                             enable_gqa=q.shape[1] != k.shape[1])
        # Not k and v: a decoding step is bound by reading the cache, and a second pass over it would double it.
        # NaN or inf in an attended key or value reaches the output (checked); a NaN query row, which a kernel
        # may answer 0 like a row with no key, is seen in q.
        if not sums_finite(out, (q,)):
            return None
        if out.requires_grad:
            inputs = [t for t in (q, k, v) if t.requires_grad]
            out, _ = twice_differentiable(out, None, inputs, lambda *ts: reference.recomputed(
                validate(q, k, v, mask=mask, scale=scale), inputs, ts))
        return out
    # (grouped heads as rows where it can; their lse, only checked, in the kernel's rows: no copy)
    out, lse = sdpa.flash(q, k, v, is_causal, float_mask, scale, lse_per_head=False)
    if not trusted(out, lse):
        return None
    if out.requires_grad:  # out.grad_fn is the kernel's own node, on (q, k, v)
        twice_differentiable_node(out, (q, k, v), lambda *ts: reference.recomputed(
            validate(q, k, v, mask=mask, scale=scale), (q, k, v), ts))
    return out


# An lse of at most this many rows is read as Python floats (a decoding step's B x H, a short chunk's): one copy and
# no operator, where the operators of the tensor check cost microseconds each right after the kernel.
LISTED_ROWS = 256


def trusted(out: torch.Tensor, lse: torch.Tensor) -> bool:
    """Whether the CPU kernel's answer is attnkit's: no NaN or inf in the output (an overflow, a leak) and an lse
    neither NaN, +-inf nor exactly 0 (a row torch zeroed: no row is empty on the lane).

    A small lse is read as Python floats and the output summed once (one reduction, one sync); a larger one is
    checked with the output in one expression, each row's output sum plus ``lse / lse``. ``lse`` holds the rows
    of ``out`` in any 3-D shape (a grouped call's ``(B, H_kv, (H / H_kv) Lq)``, :func:`.sdpa.flash`).
    """
    if out.requires_grad:  # (torch's lse takes no gradient)
        out = out.detach()
    if lse.numel() <= LISTED_ROWS:
        rows = list(chain.from_iterable(chain.from_iterable(lse.tolist())))  # 3-D nested lists, flattened in C
        return 0.0 not in rows and math.isfinite(sum(rows)) and math.isfinite(out.sum().item())
    sums = out.sum(-1)
    if sums.shape != lse.shape:  # a grouped call's rows
        sums = sums.reshape(lse.shape)
    return math.isfinite(torch.addcdiv(sums, lse, lse).sum().item())


def describe(lane: tuple) -> str:
    is_causal, float_mask, _, cpu = lane
    mask = "is_causal" if is_causal else "no mask" if float_mask is None else "a cached causal float mask"
    if not cpu:
        return (f"fast lane: torch's public SDPA on CUDA ({mask}), attribute checks before it, the sums of its "
                "output and inputs checked after (kernels/lane.py)")
    return (f"fast lane: torch's fused CPU kernel called directly ({mask}), attribute checks before it, its "
            "log-sum-exp checked after (kernels/lane.py)")
