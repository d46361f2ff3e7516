"""The eligibility rules of the execution paths, each written once, and the facts they share.

A rule takes a :class:`~attnkit.functional.validate.Problem` and returns why a path
cannot compute it exactly (a short reason that :func:`attnkit.explain` shows), or
None when it can. A path's eligibility is the tuple of rules in its row of
:data:`attnkit.kernels.paths.PATHS`, checked in order by :func:`first_refusal`,
cheap ones first, so the rules that read the data run only when everything else
already holds. Those are marked with :func:`reads_data`: a traced call (compile,
export) cannot read data, so the decision it expects skips them and the operator
that carries it decides them at run time (:func:`attnkit.kernels.dispatch.choose`).

Rules read the problem's facts (``p.sizes``, ``p.band``, ``p.needs_grad``, the mask's
``kind``, :func:`device_type`), each computed once per call; facts a kernel derives are
memoised on the problem with :func:`fact`. The device a path serves is a column of the
table (``Path.devices``), checked by :func:`serves` before the path's own rules.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

from ..bias import Softcap
from ..functional.blockwise import BLOCKWISE
from ..functional.validate import Problem

__all__ = ["Rule", "reads_data", "fact", "first_refusal", "FLASH", "FLASH_BACKWARD", "softmax_of_dot_products",
           "no_bias", "no_sinks", "no_dropout", "no_weights", "no_lse", "not_compiling", "finite_inputs",
           "not_known_non_finite",
           "fused_cpu_kernel", "equal_head_dims", "lse_without_grad", "over_key_blocks", "cpu_flash", "simple_mask",
           "operator_carries", "device_type", "serves", "device_text", "layout_mask", "selected_keys", "paged_cache",
           "checks_output", "output_checked_or_finite", "sinks_on_cpu_kernel", "lse_from_cpu_kernel", "bounded_band",
           "fused_cpu_backward", "causal_flag", "output_checked", "read_in_place", "mask_keeps_every_row",
           "fixed_pattern", "fixed_terms", "FIXED_MIN_BLOCK", "plain_causal"]

Rule = Callable[[Problem], "str | None"]

# torch's fused CPU attention kernel (flash-style tiles), forward and backward, called directly where a
# path needs its log-sum-exp or a float mask per slab; None on builds without it. torch's own binding
# (torch._...) when it has one: its call costs less than torch.ops.aten's Python overload (a few µs, which a
# decoding step over a short cache notices).
FLASH = getattr(torch, "_scaled_dot_product_flash_attention_for_cpu", None) or getattr(
    torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
FLASH_BACKWARD = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)


def reads_data(rule: Rule) -> Rule:
    """Mark ``rule`` as one that reads the values of the inputs (or runs only eagerly): traced calls skip it."""
    rule.reads_data = True
    return rule


T = TypeVar("T")


def fact(compute: Callable[[Problem], T]) -> Callable[[Problem], T]:
    """``compute(p)`` evaluated at most once per problem (kept in ``p.memo`` under the function's name)."""
    name = compute.__name__

    def once(p: Problem) -> T:
        memo = p.memo
        if name not in memo:
            memo[name] = compute(p)
        return memo[name]

    once.__name__, once.__doc__ = name, compute.__doc__
    return once


def first_refusal(p: Problem, rules: Sequence[Rule], data: bool = True, device: Rule | None = None) -> str | None:
    """The first reason among ``rules`` why ``p`` cannot run, or None; ``data=False`` skips :func:`reads_data` rules.

    ``device``: the row's device rule (:func:`serves`), asked first."""
    if device is not None:
        why = device(p)
        if why is not None:
            return why
    for rule in rules:
        if not data and getattr(rule, "reads_data", False):
            continue
        why = rule(p)
        if why is not None:
            return why
    return None


@fact
def device_type(p: Problem) -> str:
    """The type of the device the tensors live on (``"cpu"``, ``"cuda"``, ``"mps"``, ...): every device decision
    reads this one fact, so a test can decide a problem for a device it does not have."""
    return p.q.device.type


def device_text(devices: tuple[str, ...]) -> str:
    """How a row's devices read in a reason: ``"CPU only"``, ``"CUDA only"``, ``"CPU and MPS only"``."""
    return " and ".join(d.upper() for d in devices) + " only"


def serves(devices: tuple[str, ...] | None) -> Rule | None:
    """The device rule of a row of the table serving ``devices``: the row's reason when ``p`` lives elsewhere.

    None for a row serving every device (no rule to check). The reason is written once, here.
    """
    if devices is None:
        return None
    reason = device_text(devices)

    def device(p: Problem) -> str | None:
        return None if device_type(p) in devices else reason
    return device


@fact
def cpu_flash(p: Problem) -> bool:
    """torch's fused CPU kernel can be called directly: it exists, the tensors are on the CPU, ``Dv == D``."""
    return FLASH is not None and device_type(p) == "cpu" and p.sizes[4] == p.sizes[5]


def simple_mask(p: Problem) -> bool:
    """Masks torch's kernel takes without evaluating the mask per call (no mask, causal, key-only, a tensor)."""
    return p.mask is None or p.mask.kind in ("full", "causal", "keys", "tensor")


def selected_keys(p: Problem) -> bool:
    """The mask names each query's keys by index tensors (kind ``"selected"``): gathered per query, not per block."""
    return p.mask is not None and p.mask.kind == "selected"


def layout_mask(p: Problem) -> str | None:
    """Paths that plan from one block layout shared by every batch element and head."""
    if selected_keys(p):
        return "keys selected per query (index tensors): one shared block layout would hold their union"
    return None


def paged_cache(p: Problem) -> str | None:
    """Only calls with ``block_table=``/``seqused_k=``: their keys are a pool of pages (a rule of its own file
    would be entered by every masked call's decision)."""
    mask = p.mask
    if mask is None or mask.kind != "selected" or mask.selection.lengths is None:
        return "reads a paged KV cache: calls with block_table= or seqused_k= only"
    return None


def full_precision_kv(p: Problem) -> str | None:
    """Quantized keys and values (``k_scale=``, ``v_scale=``) are read only by the paths that dequantize one key
    block at a time (online softmax, paged split-KV): the others would need a full-precision copy of the cache."""
    if p.quant is not None:
        return (f"reads full-precision keys and values; these are {p.quant.format} codes, dequantized one key block "
                "at a time by online-softmax and paged-split-kv only")
    return None


def over_key_blocks(p: Problem) -> str | None:
    """Softmax, or a normaliser written over key blocks (:mod:`attnkit.functional.blockwise`)."""
    if p.normalize != "softmax" and not (isinstance(p.normalize, str) and p.normalize in BLOCKWISE):
        return (f"softmax or a normaliser over key blocks ({', '.join(BLOCKWISE)}) only; normalize={p.normalize!r} "
                "needs each whole row at once")
    return None


def softmax_of_dot_products(p: Problem) -> str | None:
    if p.normalize != "softmax" or p.score not in ("dot", "scaled_dot"):
        return f"softmax of dot products only; got normalize={p.normalize!r}, score={p.score!r}"
    return None


def no_bias(p: Problem) -> str | None:
    return "no bias or score modifier" if p.bias is not None or p.modifier is not None else None


def no_sinks(p: Problem) -> str | None:
    return "no attention sinks" if p.sinks is not None else None


def no_dropout(p: Problem) -> str | None:
    return "no dropout" if p.dropout_p > 0 else None


def no_weights(p: Problem) -> str | None:
    return "never builds the dense (Lq, Lk) weights that return_weights asks for" if p.return_weights else None


def no_lse(p: Problem) -> str | None:
    return "returns no lse" if p.return_lse else None


def not_compiling(p: Problem) -> str | None:
    """Paths whose plan or exactness needs the data: traced as plain ops they cannot run (the operator can)."""
    if p.tracing:
        return "traced (torch.compile, export): its exactness or plan needs data-dependent checks"
    return None


_NON_FINITE = "non-finite inputs: torch's fused kernel can zero a NaN row and leaks NaN from masked keys"


@reads_data
def finite_inputs(p: Problem) -> str | None:
    """One summed pass over each distinct q, k, v (computed once per problem)."""
    return None if p.inputs_finite() else _NON_FINITE


@reads_data
def not_known_non_finite(p: Problem) -> str | None:
    """Refuses only inputs already known to be non-finite (a path that checks its own output instead)."""
    return _NON_FINITE if p.finiteness_known and not p.inputs_finite() else None


def fused_cpu_kernel(p: Problem) -> str | None:
    """This torch build has the fused CPU kernel (the device itself is the row's column, :func:`serves`)."""
    return "needs torch's fused CPU flash kernel" if FLASH is None else None


def equal_head_dims(p: Problem) -> str | None:
    return "the fused kernel needs Dv == D" if p.sizes[4] != p.sizes[5] else None


def lse_without_grad(p: Problem) -> str | None:
    return "the fused backward takes no lse gradient" if p.return_lse and p.needs_grad else None


_CARRIED_SCORES = ("scaled_dot", "dot", "cosine")
# deterministic: a recomputation repeats them
_CARRIED_NORMALIZERS = ("softmax", "sparsemax", "hard", *BLOCKWISE)


def operator_carries(p: Problem, backend: str) -> bool:
    """Whether a traced call becomes one ``attnkit::attention`` operator node (:mod:`.custom_op`).

    A mask that has a text (or none), a score and a normaliser named by a string (the
    stochastic Gumbel softmax aside: the backward recomputes the call), optionally an
    additive bias tensor or a soft-cap; no sinks, dropout, weights or lse; ``backend="auto"``;
    not in an export to ONNX, whose runtimes know only standard operators.
    """
    modifier = p.modifier
    return (backend == "auto" and not p.q.is_meta and p.sinks is None and p.quant is None
            and not torch.onnx.is_in_onnx_export()
            and p.score in _CARRIED_SCORES and p.normalize in _CARRIED_NORMALIZERS
            and (modifier is None or type(modifier) is Softcap)
            and p.dropout_p == 0 and not p.return_weights and not p.return_lse
            and (p.mask is None or p.mask.text is not None))


# ------------------------------------------------------------------ rules of one path each
# Written here rather than in their path's file, so that a decision enters this file and no kernel's: the paths'
# files are entered only to run (a rule in a path's file, which reads facts from here, would be a call back up).

@fact
def checks_output(p: Problem) -> bool:
    """Whether torch-sdpa checks the kernel's output instead of checking the inputs first: torch's CPU kernel
    called directly (its lse), or torch's public kernel on another device (the sums); not with dropout."""
    return p.dropout_p == 0 and (cpu_flash(p) or device_type(p) != "cpu")


@reads_data
def output_checked_or_finite(p: Problem) -> str | None:
    """torch-sdpa: inputs known finite, or the kernel's output is checked after (:func:`checks_output`)."""
    return not_known_non_finite(p) if checks_output(p) else finite_inputs(p)


def sinks_on_cpu_kernel(p: Problem) -> str | None:
    """torch-sdpa joins sinks from the CPU kernel's own lse."""
    if p.sinks is not None and not checks_output(p):
        return "sinks need the CPU kernel's lse (CPU tensors, Dv == D, no dropout)"
    return None


def lse_from_cpu_kernel(p: Problem) -> str | None:
    """The lse is the CPU kernel's own (called directly), without sinks, and needs no gradient: torch's
    kernel gives its lse no derivative."""
    if not p.return_lse:
        return None
    if not (checks_output(p) and cpu_flash(p)) or p.sinks is not None:
        return "returns an lse only from torch's CPU kernel called directly, without sinks"
    if p.needs_grad:
        return "torch's kernel gives its lse no gradient"
    return None


def causal_flag(p: Problem) -> bool:
    """torch-sdpa computes a causal mask with ``is_causal``: top-left alignment (or ``Lq == Lk``) and a positive
    scale (with ``is_causal`` and a scale ``<= 0`` torch 2.13's kernel returns NaN for finite inputs)."""
    _, _, lq, lk, _, _ = p.sizes
    m = p.mask
    if m is None or m.kind != "causal":
        return False
    return (getattr(m, "align", None) == "top_left" or lq == lk) and p.scale > 0


# ------------------------------------------------------------------ rules of the fast lane
# The fast lane (:mod:`.lane`) calls torch's kernel with no copy, no mask built per call and no pass over the inputs:
# it takes a call where torch-sdpa's rules that read no data pass and these three (:data:`.sdpa.LANE`).

def output_checked(p: Problem) -> str | None:
    """The kernel's answer is checked after it (:func:`checks_output`), so nothing reads the inputs before it."""
    if checks_output(p):
        return None
    return "its answer is checked only from torch's CPU kernel called directly (Dv == D) or its public one off the CPU"


def read_in_place(p: Problem) -> str | None:
    """torch 2.13's CPU kernel misreads an innermost stride other than 1 (RELIABILITY row 28) and its backward
    wants contiguous inputs: the lane calls it on q, k, v as they are (torch-sdpa copies them first)."""
    q, k, v = p.q, p.k, p.v
    if q.is_contiguous() and k.is_contiguous() and v.is_contiguous():  # the common case, and the cheapest test
        return None
    if p.needs_grad:
        return "q, k and v are not contiguous, which torch's backward kernel needs (torch-sdpa copies them)"
    if q.stride(3) == 1 and k.stride(3) == 1 and v.stride(3) == 1:
        return None
    return "an innermost stride other than 1, which torch's kernel misreads (torch-sdpa copies such inputs)"


def mask_keeps_every_row(p: Problem) -> str | None:
    """No mask, or a causal one torch's kernel reads as it is with a key left in every row: ``is_causal``
    (:func:`causal_flag`), or bottom-right with ``Lq <= Lk`` (no mask for one query, a cached float mask for
    several). Other masks are built per call, or leave rows empty (which the kernel answers with lse 0)."""
    m = p.mask
    if m is None or causal_flag(p):
        return None
    if m.kind == "causal" and getattr(m, "align", None) == "bottom_right" and p.sizes[2] <= p.sizes[3]:
        return None
    return "no mask, or a causal one that torch's kernel reads as it is and that leaves no row without a key"


def bounded_band(p: Problem) -> str | None:
    """The band path: a band ``lo <= j - i <= hi`` bounded on both sides that leaves some key out."""
    b = p.band
    if b is None:
        return "the mask is not a band lo <= j - i <= hi bounded on both sides"
    if b[1] < b[0] or b[1] - b[0] + 1 >= p.sizes[3]:
        return "the band is empty or covers every key"
    return None


def fused_cpu_backward(p: Problem) -> str | None:
    """blocksparse-fused: torch's fused CPU kernel has its backward in this build."""
    return "needs torch's fused CPU flash kernel and its backward" if FLASH_BACKWARD is None else None


# fixed-blocks: smaller blocks make many tiny kernel calls; the gathered block paths serve them. Measured at 1 thread,
# L = 4096, fixed-blocks / blocksparse-fused time, forward and forward+backward: block 4: 0.87 / 1.27; 8: 0.46 / 0.75;
# 16: 0.30 / 0.32; 64: 0.17 / 0.21; 128: 0.28 / 0.28 (L = 512, block 8: 0.80 / 0.71).
FIXED_MIN_BLOCK = 8


@fact
def fixed_terms(p: Problem) -> tuple[int, int, bool] | None:
    """``(block, summary, causal)`` when the mask is exactly ``causal() & fixed(block, summary)`` (``causal`` True,
    ``Mask.causal_fixed``) or ``fixed(block, summary)`` alone (False); else None."""
    mask = p.mask
    if mask is None:
        return None
    if mask.causal_fixed is not None:
        return (*mask.causal_fixed, True)
    terms = getattr(mask, "fixed_terms", None)  # set on masks.fixed() itself only
    return None if terms is None else (*terms, False)


def fixed_pattern(p: Problem) -> str | None:
    """fixed-blocks: the mask is exactly ``causal() & fixed(block, summary)`` or ``fixed(block, summary)`` alone
    (:func:`fixed_terms`: any other part, key padding included, goes to the gathered block paths), ``Lq == Lk``,
    blocks of at least :data:`FIXED_MIN_BLOCK` positions; with ``causal()`` a positive scale (its in-block call is
    ``is_causal``, which returns NaN for finite inputs with a scale ``<= 0`` on torch 2.13: :func:`causal_flag`)."""
    terms = fixed_terms(p)
    if terms is None:
        return ("only the Sparse Transformer's fixed pattern, fixed(block, summary) alone or with causal() (other "
                "parts, key padding included: the gathered block paths)")
    if p.sizes[2] != p.sizes[3]:
        return "the fixed pattern with Lq == Lk only"
    if terms[0] < FIXED_MIN_BLOCK:
        return f"blocks of at least {FIXED_MIN_BLOCK} positions (smaller ones: the gathered block paths)"
    if terms[2] and not p.scale > 0:
        return f"a positive scale only (torch's causal kernel returns NaN with scale {p.scale:g})"
    return None


def plain_causal(p: Problem) -> bool:
    """The selected-keys kernels on torch's fused CPU kernel (:mod:`.selected_pairs`, :mod:`.selected_rows`):
    self-attention (``Lq = Lk``) with a causal mask beside the selection, softmax of dot products with nothing
    else (no bias, modifier, sinks, dropout or weights), float32 or float64 on torch's fused CPU kernel; under
    autograd the lse is not asked for (its gradient is not carried). Written here, where both kernels read it,
    so that choosing one enters neither's file."""
    rest = getattr(p.mask, "rest", None)
    return (rest is not None and rest.kind == "causal"
            and p.sizes[2] == p.sizes[3] and cpu_flash(p) and p.q.dtype in (torch.float32, torch.float64)
            and p.k.dtype == p.q.dtype and p.v.dtype == p.q.dtype
            and p.bias is None and p.modifier is None and p.sinks is None and p.dropout_p == 0
            and not p.return_weights and p.normalize == "softmax" and p.score in ("dot", "scaled_dot")
            and not (p.return_lse and p.needs_grad))
