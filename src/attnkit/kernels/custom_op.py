"""``attnkit::attention``: the fast paths as one PyTorch custom operator, for torch.compile and torch.export.

Tracing (dynamo, ``torch.export``) runs Python on fake tensors: nothing that reads
data can run there (the finiteness pass, torch's output check, block layouts, the
density that picks a block-sparse path), so on its own the dispatcher could only
trace the dense reference. Instead, a traced call that the fused paths can serve
becomes one opaque operator, registered with :mod:`torch.library`::

    attnkit::attention(q, k, v, bias?, mask: str, softcap: float, scale: float, path: str) -> (out, saved, ran)
    attnkit::attention_backward(q, k, v, bias?, out, saved, ran, dout, mask, softcap, scale) -> (dq, dk, dv, dbias)

- ``mask`` is the mask's text (its ``repr``, which :func:`attnkit.masks.parse` reads
  back, so an exported program holds no Python object); layouts and block plans are
  built from it and the sizes inside the operator, at run time, and cached.
- At run time the operator decides as eager :func:`attnkit.attention` does, with
  the data in hand (:func:`.dispatch.choose`): the same path, checks and fallbacks,
  so a compiled or exported call computes exactly the eager result. ``path`` is the
  path chosen when traced, kept for reading the graph (``band-windows``,
  ``torch-sdpa``, or ``blocksparse`` where the block density needs the layout).
- ``saved`` is what the backward of the path that ran needs (the kernel's lse),
  ``ran`` that path's index in :data:`.paths.PATHS`. The backward operator runs that
  path's own backward (band windows, fused slabs, torch's fused kernel); a call that
  ran another path (non-finite inputs, zeroed padding, an untrusted output) is
  differentiated by running it again under autograd: exact, and rare.
- An additive bias tensor (``bias-slabs``) and a soft-cap (``softcap``, 0 for none:
  ``softcap-loop``) ride along; their paths are differentiated by recomputation.
- The fake implementations give shapes only, so symbolic sizes trace too.

Calls with other score modifiers, scores or normalisers, dropout, weights or an lse,
masks without a text (tensors, functions), and exports to ONNX (whose runtimes know
only standard operators) are traced as plain torch operations on the dense reference
path instead (:func:`accepts` says which).
"""

from __future__ import annotations

import functools

import torch

from ..bias import Softcap
from ..functional.validate import Problem
from ..masks import parse
from . import band, blocksparse_fused, rules, sdpa
from .paths import BY_NAME, PATHS
from .pipeline import KernelOutput, zero_padded_keys

__all__ = ["accepts", "mask_text", "run", "planned_path", "OPERATOR"]

OPERATOR = "attnkit::attention"
_GENERIC = -1  # `ran` for a call served by another path: differentiated by recomputation
# The dispatcher's thread-local key sets of eager code. A compiled backward may call the operator with autograd
# dispatched past (its ADInplaceOrView included); the recomputation restores these to record a graph.
_EAGER_DISPATCH = (torch._C._dispatch_tls_local_include_set(), torch._C._dispatch_tls_local_exclude_set())


def mask_text(mask) -> str | None:
    """The text that rebuilds ``mask`` (``""`` for no mask), or None when no text does (tensors, functions)."""
    if mask is None:
        return ""
    return repr(mask) if mask.textual else None


@functools.lru_cache(maxsize=256)
def _mask(text: str):
    """One mask object per text, so its cached layouts and plans serve every call."""
    return parse(text) if text else None


def accepts(p: Problem, backend: str) -> bool:
    """Whether a traced call runs as the operator: softmax of dot products with a mask that has a text.

    Not in an export to ONNX, whose runtimes know only standard operators.
    """
    return (backend == "auto" and not p.q.is_meta and not torch.onnx.is_in_onnx_export()
            and rules.softmax_of_dot_products(p) is None and (p.modifier is None or type(p.modifier) is Softcap)
            and rules.no_dropout(p) is None and not p.return_weights
            and not p.return_lse and mask_text(p.mask) is not None)


def planned_path(p: Problem, static_sizes: bool) -> str:
    """The path the traced call is expected to take, named in the graph; decided again at run time."""
    if p.bias is not None or p.modifier is not None:
        return "bias-slabs" if p.bias is not None else "softcap-loop"
    if sdpa.simple_mask(p):
        return "torch-sdpa"
    band_rules = tuple(rule for rule in band.REFUSALS if rule is not rules.not_compiling)  # it runs in the operator
    if static_sizes and rules.first_refusal(p, band_rules) is None:
        return "band-windows" if band.density(p) < BY_NAME["band-windows"].sparse_below else "torch-sdpa"
    return "blocksparse"


def _problem(q, k, v, bias, mask: str, cap: float, scale: float) -> Problem:
    modifier = Softcap(cap) if cap else None
    return Problem(q, k, v, _mask(mask), bias, modifier, "scaled_dot", scale, "softmax", 0.0, False, False, 4)


def _contiguous(p: Problem):
    dt = p.compute_dtype
    return tuple(t.to(dt).contiguous() for t in (p.q, p.k, p.v))


# Each path the operator differentiates itself: forward (out, saved) and backward (dq, dk, dv), in the
# compute dtype; dk and dv may come with the key/value heads repeated for grouped queries.
def _band_forward(p: Problem):
    out, _ = band.forward(*_contiguous(p), band.plan(p), p.scale, False)
    return out, None


def _band_backward(p: Problem, out, saved, dout):
    return band.backward(*_contiguous(p), out, dout, None, band.plan(p), p.scale, p.inputs_finite())


def _sdpa_forward(p: Problem):
    q, k, v = _contiguous(p)
    km = sdpa.kernel_mask(p, q.dtype)
    out, lse = rules.FLASH.default(q, k, v, 0.0, km.is_causal, attn_mask=km.float_mask, scale=p.scale)
    if not sdpa.trustworthy(out, lse, km.empty_rows):
        raise sdpa.UntrustedOutput
    return out, lse


def _sdpa_backward(p: Problem, out, lse, dout):
    q, k, v = _contiguous(p)
    km = sdpa.kernel_mask(p, q.dtype)
    return rules.FLASH_BACKWARD(dout.to(q.dtype).contiguous(), q, k, v, out, lse, 0.0, km.is_causal,
                                attn_mask=km.float_mask, scale=p.scale)[:3]


def _sdpa_direct(p: Problem) -> bool:
    return sdpa.checks_output(p)  # torch's CPU kernel called directly: its lse is there for the backward


_OWN = {  # path name -> (applies, forward, backward)
    "band-windows": (lambda p: True, _band_forward, _band_backward),
    "blocksparse-fused": (lambda p: True, blocksparse_fused.forward, blocksparse_fused.backward),
    "torch-sdpa": (_sdpa_direct, _sdpa_forward, _sdpa_backward),
}
_INDEX = {path.name: i for i, path in enumerate(PATHS)}


def _own(p: Problem):
    """The path eager attention would take, when the operator differentiates it itself; else None."""
    from .dispatch import choose  # the dispatcher imports this module

    name = choose(p).path.name
    entry = _OWN.get(name)
    return (name, entry) if entry is not None and entry[0](p) else None


def _recomputed(q, k, v, bias, mask: str, cap: float, scale: float, dout=None):
    """The call through eager attention: its output, or with ``dout`` the gradients of q, k, v and the bias."""
    from .dispatch import execute

    if dout is None:
        return execute(_problem(q, k, v, bias, mask, cap, scale))[0].out
    with torch.enable_grad(), torch._C._ForceDispatchKeyGuard(*_EAGER_DISPATCH):
        leaves = [t.detach().requires_grad_() for t in (q, k, v, bias) if t is not None]
        out = execute(_problem(*leaves[:3], leaves[3] if bias is not None else None, mask, cap, scale))[0].out
        grads = torch.autograd.grad(out, leaves, dout.to(out.dtype), allow_unused=True)
    grads = [torch.zeros_like(t) if g is None else g for g, t in zip(grads, leaves, strict=True)]
    return (*grads[:3], grads[3] if bias is not None else q.new_empty(0))


def _like_inputs(p: Problem, grads):
    """Gradients in the inputs' dtypes, the repeated key/value heads of grouped queries summed back."""
    q, k, v = p.q, p.k, p.v
    out = []
    for g, t in zip(grads, (q, k, v), strict=True):
        if g.shape[1] != t.shape[1]:
            g = g.view(t.shape[0], t.shape[1], -1, *g.shape[2:]).sum(2)
        out.append(g.to(t.dtype))
    return tuple(out)


@torch.library.custom_op(OPERATOR, mutates_args=())
def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, mask: str,
               softcap: float, scale: float, path: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    p = _problem(q, k, v, bias, mask, softcap, scale)
    batch, heads, lq, _, _, _ = p.sizes
    empty_saved = q.new_zeros(batch, heads, lq, dtype=p.compute_dtype)
    own = None if zero_padded_keys(p) else _own(p)
    if own is not None:
        name, (_, forward, _) = own
        try:
            out, saved = forward(p)
            saved = empty_saved if saved is None else saved.contiguous()  # the fake gives contiguous strides
            return out.contiguous(), saved, torch.tensor(_INDEX[name])
        except sdpa.UntrustedOutput:
            pass
    out = _recomputed(q, k, v, bias, mask, softcap, scale)
    return out.contiguous(), empty_saved, torch.tensor(_GENERIC)


@_attention.register_fake
def _(q, k, v, bias, mask, softcap, scale, path):
    dt = torch.float64 if q.dtype == torch.float64 else torch.float32
    batch, heads, lq, _ = q.shape
    return (q.new_empty(batch, heads, lq, v.shape[3], dtype=dt), q.new_empty(batch, heads, lq, dtype=dt),
            q.new_empty((), dtype=torch.int64, device="cpu"))


@torch.library.custom_op(OPERATOR + "_backward", mutates_args=())
def _attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None,
                        out: torch.Tensor, saved: torch.Tensor, ran: torch.Tensor, dout: torch.Tensor, mask: str,
                        softcap: float, scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    index = int(ran)
    if index == _GENERIC:
        return tuple(g.contiguous() for g in _recomputed(q, k, v, bias, mask, softcap, scale, dout))
    p = _problem(q, k, v, bias, mask, softcap, scale)
    backward = _OWN[PATHS[index].name][2]
    return (*(g.contiguous() for g in _like_inputs(p, backward(p, out, saved, dout))), q.new_empty(0))


@_attention_backward.register_fake
def _(q, k, v, bias, out, saved, ran, dout, mask, softcap, scale):
    dbias = bias.new_empty(bias.shape) if bias is not None else q.new_empty(0)  # contiguous, as the kernels give
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dbias


def _setup_context(ctx, inputs, output):
    q, k, v, bias, mask, softcap, scale, _ = inputs
    out, saved, ran = output
    ctx.save_for_backward(q, k, v, bias, out, saved, ran)
    ctx.mask, ctx.softcap, ctx.scale = mask, softcap, scale
    ctx.mark_non_differentiable(saved, ran)


def _backward(ctx, dout, _dsaved, _dran):
    q, k, v, bias, out, saved, ran = ctx.saved_tensors
    dq, dk, dv, dbias = torch.ops.attnkit.attention_backward(q, k, v, bias, out, saved, ran, dout.contiguous(),
                                                             ctx.mask, ctx.softcap, ctx.scale)
    return dq, dk, dv, (dbias if bias is not None else None), None, None, None, None


_attention.register_autograd(_backward, setup_context=_setup_context)


def run(p: Problem, path: str) -> KernelOutput:
    """The traced call as one operator node (``path``: the path expected, see :func:`planned_path`)."""
    cap = p.modifier.cap if p.modifier is not None else 0.0
    out, _, _ = torch.ops.attnkit.attention(p.q, p.k, p.v, p.bias, mask_text(p.mask), cap, float(p.scale), path)
    return KernelOutput(out, None, None)
