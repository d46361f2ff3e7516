"""``attnkit::attention``: the fast paths as one PyTorch custom operator, for torch.compile and torch.export.

Tracing (dynamo, ``torch.export``) runs Python on fake tensors: nothing that reads
data can run there (the finiteness pass, torch's output check, block layouts, the
density that picks a block-sparse path), so a traced call could otherwise only take
the paths written in plain torch operations. Instead, a traced call that
:func:`~.rules.operator_carries` becomes one opaque operator, registered with
:mod:`torch.library`::

    attnkit::attention(q, k, v, bias?, mask: str, softcap: float, scale: float, score: str, normalize: str,
                       path: str) -> (out, saved, ran)
    attnkit::attention_backward(q, k, v, bias?, out, saved, ran, dout, mask, softcap, scale, score, normalize)
        -> (dq, dk, dv, dbias)

- ``mask`` is the mask's text (:attr:`~attnkit.masks.Mask.text`, which
  :func:`attnkit.masks.parse` reads back, so an exported program holds no Python
  object); layouts and block plans are built from it and the sizes inside the
  operator, at run time, and cached (a bounded set of masks, by the bytes their caches hold).
- At run time the operator decides as eager :func:`attnkit.attention` does: a call the
  fast lane takes (:mod:`.lane`) runs there, on attribute checks alone; any other from the
  one table, with the data in hand (:func:`.dispatch.choose`): the same path, checks
  and fallbacks, so a compiled or exported call computes exactly the eager result.
  ``path`` is the decision expected when traced (:func:`.dispatch.choose` with
  ``data=False``), kept for reading the graph and for :func:`attnkit.explain`.
- ``saved`` is what the backward of the path that ran needs (the kernel's lse),
  ``ran`` that path's index in :data:`.paths.PATHS`. The backward runs that row's
  ``op_backward`` (band windows, fused slabs, torch's fused kernel); a call that ran
  another path (non-finite inputs, zeroed padding, an untrusted output, a bias, a
  soft-cap, another score or normaliser) is differentiated by running it again under
  autograd: exact.
- The fake implementations give shapes only, so symbolic sizes trace too.
- A call that records no gradient (a decoding step, a compiled inference graph) goes from the operator's autograd
  kernel straight to the implementation (:func:`_direct_when_no_gradient`), past the wrapper and second dispatch
  of :func:`torch.library.custom_op`'s own kernel, which records the gradient everywhere else.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import torch

from ..bias import Softcap
from ..errors import BackendError
from ..functional.validate import Problem, validate
from ..masks import Mask, parse
from . import lane, rules
from .dispatch import Decision, choose, decide, execute, symbolic_sizes
from .paths import INDEX, PATHS
from .pipeline import KernelOutput, zero_padded_keys
from .sdpa import UntrustedOutput

__all__ = ["mask_text", "run", "expected_path", "compiled_route", "OPERATOR", "MASK_CACHE_BYTES", "RUN_TIME",
           "traced_decision"]

OPERATOR = "attnkit::attention"
_GENERIC = -1  # `ran` for a call served by recomputation
MASK_CACHE_BYTES = 1 << 28  # the masks the operator parsed, kept while their caches hold less than this
# The dispatcher's thread-local key sets of eager code. A compiled backward may call the operator with autograd
# dispatched past (its ADInplaceOrView included); the recomputation restores these to record a graph.
_EAGER_DISPATCH = (torch._C._dispatch_tls_local_include_set(), torch._C._dispatch_tls_local_exclude_set())


def mask_text(mask: Mask | None) -> str | None:
    """The text that rebuilds ``mask`` (``""`` for no mask), or None when no text does (tensors, functions)."""
    return "" if mask is None else mask.text


class _ParsedMasks:
    """One mask object per text, so its cached layouts and plans serve every call; least recently used go first
    once the caches of the masks kept hold more than ``MASK_CACHE_BYTES`` (the newest is always kept)."""

    def __init__(self):
        self._masks: OrderedDict[str, Mask] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, text: str) -> Mask | None:
        if not text:
            return None
        with self._lock:
            mask = self._masks.get(text)
            if mask is None:
                mask = self._masks[text] = parse(text)
            self._masks.move_to_end(text)
            while len(self._masks) > 1 and sum(m.cached_bytes() for m in self._masks.values()) > MASK_CACHE_BYTES:
                self._masks.popitem(last=False)
            return mask

    def __len__(self) -> int:
        return len(self._masks)


_MASKS = _ParsedMasks()


def _problem(q, k, v, bias, mask: str, softcap: float, scale: float, score: str, normalize: str) -> Problem:
    modifier = Softcap(softcap) if softcap else None
    return validate(q, k, v, mask=_MASKS.get(mask), bias=bias if bias is not None else modifier, score=score,
                    scale=scale, normalize=normalize)


def _recomputed(q, k, v, bias, mask: str, cap: float, scale: float, score: str, normalize: str, dout=None):
    """The call through eager attention: its output, or with ``dout`` the gradients of q, k, v and the bias."""
    if dout is None:
        return execute(_problem(q, k, v, bias, mask, cap, scale, score, normalize))[0].out
    with torch.enable_grad(), torch._C._ForceDispatchKeyGuard(*_EAGER_DISPATCH):
        leaves = [t.detach().requires_grad_() for t in (q, k, v, bias) if t is not None]
        p = _problem(*leaves[:3], leaves[3] if bias is not None else None, mask, cap, scale, score, normalize)
        out = execute(p)[0].out
        grads = torch.autograd.grad(out, leaves, dout.to(out.dtype), allow_unused=True)
    grads = [torch.zeros_like(t) if g is None else g for g, t in zip(grads, leaves, strict=True)]
    return (*grads[:3], grads[3] if bias is not None else q.new_empty(0))


def _like_inputs(p: Problem, grads):
    """Gradients in the inputs' dtypes, the repeated key/value heads of grouped queries summed back."""
    out = []
    for g, t in zip(grads, (p.q, p.k, p.v), strict=True):
        if g.shape[1] != t.shape[1]:
            g = g.view(t.shape[0], t.shape[1], -1, *g.shape[2:]).sum(2)
        out.append(g.to(t.dtype))
    return tuple(out)


def _own_forward(p: Problem):
    """``(out, saved, row index)`` when the path eager attention takes differentiates itself here; else None."""
    if zero_padded_keys(p) is not None:  # non-finite padding: the exact recomputation handles it
        return None
    row = choose(p).path
    forward = getattr(row.module, "op_forward", None)
    if forward is None:
        return None
    try:
        done = forward(p)
    except UntrustedOutput:
        return None
    return None if done is None else (*done, INDEX[row.name])


def _through_lane(q, k, v, bias, mask: str, softcap: float, scale: float, score: str, normalize: str):
    """``(out, lse, row index)`` of the call eager :func:`attnkit.attention` serves on the fast lane (:mod:`.lane`:
    attribute checks, torch's CPU kernel, its lse checked), the lse kept for the torch-sdpa row's backward; None
    where the lane would not answer (then the operator validates and decides as the full route does)."""
    if bias is not None or softcap:
        return None
    m = _MASKS.get(mask)
    fast = lane.route(q, k, v, m, None, score, scale, normalize, 0.0, False, False, "auto")
    if fast is None or not fast[3] or rules.FLASH is None:  # the CPU kernel alone gives the lse
        return None
    is_causal, float_mask, scale, _ = fast
    out, lse = rules.FLASH(q, k, v, 0.0, is_causal, attn_mask=float_mask, scale=scale)
    if not lane.trusted(out, lse):
        return None
    return out.contiguous(), lse.contiguous(), torch.scalar_tensor(INDEX["torch-sdpa"], dtype=torch.int64)


def _attention_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, mask: str,
                    softcap: float, scale: float, score: str, normalize: str,
                    path: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    fast = _through_lane(q, k, v, bias, mask, softcap, scale, score, normalize)
    if fast is not None:  # a decoding step, a small call: at the eager lane's cost
        return fast
    p = _problem(q, k, v, bias, mask, softcap, scale, score, normalize)
    batch, heads, lq, _, _, _ = p.sizes
    empty_saved = q.new_zeros(batch, heads, lq, dtype=p.compute_dtype)
    own = _own_forward(p)
    if own is not None:
        out, saved, index = own
        saved = empty_saved if saved is None else saved.contiguous()  # the fake gives contiguous strides
        return out.contiguous(), saved, torch.tensor(index)
    out = _recomputed(q, k, v, bias, mask, softcap, scale, score, normalize)
    return out.contiguous(), empty_saved, torch.tensor(_GENERIC)


_attention = torch.library.custom_op(OPERATOR, mutates_args=())(_attention_impl)


@_attention.register_fake
def _(q, k, v, bias, mask, softcap, scale, score, normalize, path):
    dt = torch.float64 if q.dtype == torch.float64 else torch.float32
    batch, heads, lq, _ = q.shape
    return (q.new_empty(batch, heads, lq, v.shape[3], dtype=dt), q.new_empty(batch, heads, lq, dtype=dt),
            q.new_empty((), dtype=torch.int64, device="cpu"))


@torch.library.custom_op(OPERATOR + "_backward", mutates_args=())
def _attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None,
                        out: torch.Tensor, saved: torch.Tensor, ran: torch.Tensor, dout: torch.Tensor, mask: str,
                        softcap: float, scale: float, score: str,
                        normalize: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    index = int(ran)
    if index == _GENERIC:
        return tuple(g.contiguous() for g in _recomputed(q, k, v, bias, mask, softcap, scale, score, normalize,
                                                         dout))
    p = _problem(q, k, v, bias, mask, softcap, scale, score, normalize)
    grads = PATHS[index].module.op_backward(p, out, saved, dout)
    return (*(g.contiguous() for g in _like_inputs(p, grads)), q.new_empty(0))


@_attention_backward.register_fake
def _(q, k, v, bias, out, saved, ran, dout, mask, softcap, scale, score, normalize):
    dbias = bias.new_empty(bias.shape) if bias is not None else q.new_empty(0)  # contiguous, as the kernels give
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dbias


def _setup_context(ctx, inputs, output):
    q, k, v, bias, mask, softcap, scale, score, normalize, _ = inputs
    out, saved, ran = output
    ctx.save_for_backward(q, k, v, bias, out, saved, ran)
    ctx.options = (mask, softcap, scale, score, normalize)
    ctx.mark_non_differentiable(saved, ran)


def _backward(ctx, dout, _dsaved, _dran):
    q, k, v, bias, out, saved, ran = ctx.saved_tensors
    dq, dk, dv, dbias = torch.ops.attnkit.attention_backward(q, k, v, bias, out, saved, ran, dout.contiguous(),
                                                             *ctx.options)
    return dq, dk, dv, (dbias if bias is not None else None), None, None, None, None, None, None


_attention.register_autograd(_backward, setup_context=_setup_context)


def _direct_when_no_gradient(op, impl):
    """Register, for CPU and CUDA tensors, an autograd kernel of ``op`` that calls ``impl`` directly on a call that
    traces no gradient: plain tensors, none requiring one (or grad mode off), no dispatch mode (fake tensors,
    ``make_fx``, a user's mode), no forward-mode level. That is a decoding step, a compiled inference graph, and a
    compiled training graph's forward (AOTAutograd runs it with grad off). Every other call (fake and functional
    tensors while tracing, a gradient to record) goes to the kernel :func:`torch.library.custom_op` registered,
    which records the op's autograd node and then runs ``impl`` through a second dispatch. That kernel's Python
    (the ``autograd.Function``-style wrapper, the redispatch below autograd, the check that no output aliases an
    input) costs about 25 us a call, the order of a decoding step's kernel; ``impl`` is the same function here, so
    the outputs are the same. ``impl`` runs with dynamo off, as in the kernel torch registers (an eager call after
    a graph break must not be traced): directly where dynamo's frame callback is unset, else through
    :func:`torch.compiler.disable`.
    """
    generated = getattr(getattr(torch._library, "autograd", None), "make_autograd_impl", None)
    if generated is None:  # (a torch without it: the registered kernel alone)
        return
    generated = generated(op._opoverload, op)
    disabled = []  # impl with dynamo disabled, built on the first call that needs it (importing dynamo is slow)
    python, forward_ad = torch._C.DispatchKey.Python, torch.autograd.forward_ad
    # dynamo's frame callback: None when no torch.compile'd code is running Python here (an eager call, a compiled
    # graph, which dynamo runs with it off); where it cannot be read, impl always runs with dynamo off
    callback = getattr(getattr(torch._C, "_dynamo", None), "eval_frame", None)
    callback = getattr(callback, "get_eval_frame_callback", lambda: True)

    def kernel(keyset, q, k, v, bias, *options):
        if (type(q) is torch.Tensor and type(k) is torch.Tensor and type(v) is torch.Tensor
                and (bias is None or type(bias) is torch.Tensor) and not keyset.has(python)  # a dispatch mode
                and forward_ad._current_level < 0
                and not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad
                                                      or (bias is not None and bias.requires_grad)))):
            if callback() is None:
                return impl(q, k, v, bias, *options)
            if not disabled:
                disabled.append(torch.compiler.disable(impl))
            return disabled[0](q, k, v, bias, *options)
        return generated(keyset, q, k, v, bias, *options)

    for key in ("AutogradCPU", "AutogradCUDA"):  # (more specific than the Autograd alias custom_op registered)
        op._lib.impl(op._name, kernel, key, with_keyset=True)


_direct_when_no_gradient(_attention, _attention_impl)


RUN_TIME = "decided at run time"  # the expected path with symbolic sizes: every rule reads a size


def expected_path(p: Problem) -> str:
    """The path a traced call is expected to take: the eager decision without the rules that read data."""
    if symbolic_sizes(p):
        return RUN_TIME
    return choose(p.with_inputs(tracing=False), data=False).path.name


def run(p: Problem) -> KernelOutput:
    """A traced call the operator carries (:func:`~.rules.operator_carries`), as one operator node."""
    cap = p.modifier.cap if p.modifier is not None else 0.0
    out, _, _ = torch.ops.attnkit.attention(p.q, p.k, p.v, p.bias, mask_text(p.mask), cap, float(p.scale),
                                            p.score, p.normalize, expected_path(p))
    return KernelOutput(out, None, None)


def compiled_route(p: Problem, backend: str) -> str:
    """How the call runs under ``torch.compile`` / ``torch.export`` (what :func:`attnkit.explain` shows)."""
    if rules.operator_carries(p, backend):
        return (f"one {OPERATOR} node, expected path {expected_path(p.with_inputs(tracing=True))}: it decides "
                "at run time, with the data, as eager attention does (kernels/custom_op.py)")
    try:
        traced = choose(p.with_inputs(tracing=True), backend).path.name
    except BackendError as err:
        return f"cannot be traced as asked: {err}"
    return f"plain torch operations on {traced} (the operator does not carry this call)"


def traced_decision(p: Problem, backend: str) -> Decision:
    """:func:`attnkit.explain` of a call being traced that the operator carries: the choice it will make at run
    time, as far as it can be read without the data (none at all with symbolic sizes)."""
    compiled = compiled_route(p, backend)
    if symbolic_sizes(p):
        return Decision(backend, RUN_TIME, {path.name: f"{RUN_TIME}: sizes symbolic" for path in PATHS},
                        flops=float("nan"), peak_bytes=float("nan"), cost=None, compiled=compiled)
    return decide(p.with_inputs(tracing=False), backend, data=False, compiled=compiled)
