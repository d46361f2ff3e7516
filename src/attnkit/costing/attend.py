"""The cost of one :func:`attnkit.attention` call, following the execution path the dispatcher picks.

:func:`attend` asks the dispatcher (:func:`attnkit.kernels.dispatch.choose`, the one decision
:func:`attnkit.attention` and :func:`attnkit.explain` take) which path ``backend="auto"`` (or a
forced backend) runs, on stand-in tensors of the right shapes (one element each, expanded), and
records that path's own cost formula (``cost(p, grad)`` beside its code in
:mod:`attnkit.kernels`, one formula per path; see :mod:`attnkit.kernels.path_cost`): products that
autograd differentiates (the backward costs once per operand needing a gradient, once more when a
slab is checkpointed), or a fused kernel's forward and backward formulas.

The decision reads nothing for a call with no mask (or a causal mask that torch's kernel takes
as its flag) and no bias. Otherwise the dispatcher reads the mask's blocks and passes over q, k
and v once: stand-ins of more than :data:`QUESTION_LIMIT` elements are not asked about
(ArgumentError), so that no cost question builds a layout of a billion-token sequence.

Elementwise work (scaling, masking, softmax at ~5 operations per score) goes to
``other_flops``; the path's workspace is the peak memory beyond q, k, v and the output.
:func:`attention_spec` is the spec of a plain :func:`attnkit.attention` call with given options.
"""

from __future__ import annotations

import functools

import torch

from ..core import attention
from ..errors import ArgumentError
from ..functional.validate import validate
from ..kernels.dispatch import choose
from ..kernels.sdpa import causal_flag
from .spec import Spec
from .tally import Tally, dtype_of, randn, zeros

__all__ = ["attend", "check_question", "projections", "kv_cache", "attention_spec", "attention_inputs",
           "derive_lengths", "ATTENTION_SIZES", "ATTENTION_FORMULA", "QUESTION_LIMIT"]

QUESTION_LIMIT = 1 << 31  # q, k, v elements a masked call's decision may read (one pass: about a second)
ATTENTION_FORMULA = ("attention: 2 B H Lq Lk (D + Dv) on the sdpa/reference/chunked kernels; "
                     "2 B H n_blocks bs (w bs) (D + Dv) over the active key blocks on the blocksparse kernel")
ATTENTION_SIZES = {"batch": 2, "heads": 3, "kv_heads": None, "q_len": 16, "kv_len": None, "head_dim": 8,
                   "value_dim": None, "dtype": "float32", "backend": "auto"}
_SOFTMAX_OPS = 5  # max, subtract, exp, sum, divide per score entry


def attend(t: Tally, label: str, b: int, h: int, lq: int, lk: int, d: int, dv: int, *, hkv: int | None = None,
           grads: tuple[bool, bool, bool] = (True, True, True), weights_grad: bool = False,
           pairwise: bool = True, dtype: torch.dtype = torch.float32, **kwargs) -> str:
    """Record one ``attention(q, k, v, **kwargs)`` with q ``(b, h, lq, d)``, k/v ``(b, hkv, lk, d|dv)``.

    Args:
        label: prefix of the term names ("" for a lone call).
        grads: which of q, k, v need a gradient (for the backward count).
        weights_grad: the weights need a gradient besides through q and k (a bias that needs one).
        pairwise: the score is ``q k^T`` ("dot", "scaled_dot", "cosine"); False for a score function
            whose own products the caller counts.
        kwargs: the attention() keyword arguments (mask, bias, score, normalize, ...); a bias tensor
            may be a stand-in of the right shape.

    Returns:
        The backend that runs.
    """
    hkv = h if hkv is None else hkv
    gq, gk, gv = grads
    grad = t.backward and (gq or gk or gv)  # kernels plan differently under autograd: decide as the run does
    with torch.enable_grad() if grad else torch.no_grad():
        q, k, v = (zeros(dtype, *shape, requires_grad=grad) for shape in
                   ((b, h, lq, d), (b, hkv, lk, d), (b, hkv, lk, dv)))
        backend = kwargs.pop("backend", "auto")
        p = validate(q, k, v, **kwargs)
        p.memo["inputs_finite"] = True  # zeros: finite, known without a pass over the stand-ins (O(1) at any size)
        _check_askable(p, label)
        path = choose(p, backend).path
        t.io(q.numel() + k.numel() + v.numel() + b * h * lq * dv)
        if 0 in (b, h, lq, lk):
            return path.backend
        cost = path.module.cost(p, p.needs_grad)
        grads = (gq or gk or gv, int(gq) + int(gk), int(gq or gk or weights_grad) + int(gv))
        computed = _kernel(t, label, cost, grads, pairwise)
    t.transient(cost.workspace_bytes)
    t.ew(f"{label}softmax and mask", computed, _SOFTMAX_OPS + (kwargs.get("mask") is not None))
    t.ew(f"{label}scale", b * h * lq * d)
    t.inter(b * h * lq * dv)
    return path.backend


def _check_askable(p, label: str) -> None:
    """Refuse a call whose decision would read more than :data:`QUESTION_LIMIT` stand-in elements.

    No mask, or causality as torch's kernel flag (no weights asked), is decided without a look at
    the data or a block layout; any other mask, a bias or a score modifier is not, past the limit.
    """
    biased = p.bias is not None or p.modifier is not None
    if not biased and (p.mask is None or (causal_flag(p) and not p.return_weights)):
        return
    check_question(p.sizes, "bias" if p.mask is None else "mask and bias" if biased else "mask", label)


def check_question(sizes, what: str, label: str = "") -> None:
    """ArgumentError when a call of ``sizes`` (B, H, Lq, Lk, D, Dv) with a ``what`` (mask, bias) is too large to ask."""
    b, h, lq, lk, d, dv = sizes
    size = b * h * (lq * d + lk * (d + dv))
    if size > QUESTION_LIMIT:
        raise ArgumentError(f"cost: the {label.rstrip(': ') or 'attention'} call (B, H, Lq, Lk, D, Dv) = "
                            f"{tuple(sizes)} has a {what}: the dispatcher decides its path from the data (a pass over "
                            f"q, k and v, the mask's blocks), here {size} elements, over {QUESTION_LIMIT}; price a "
                            "shorter sequence")


def _kernel(t: Tally, label: str, cost, grads, pairwise: bool) -> int:
    """Record a path's :class:`~attnkit.kernels.path_cost.PathCost`; returns the number of score entries computed.

    ``grads``: (any gradient, operands of the score product needing one, of the output product).
    """
    grad, s_grads, o_grads = grads
    for pr in cost.products:
        if pr.operands == "scores" and not pairwise:
            continue  # a score function whose own products the caller counts
        t.mm(f"{label}{pr.label}", pr.batch, pr.m, pr.k, pr.n,
             grads=s_grads if pr.operands == "scores" else o_grads, recompute=pr.recompute)
    if cost.fused is not None:
        name, forward, backward = cost.fused
        t.fused(f"{label}{name}", forward, backward, grad=grad)
    if cost.materialized:
        t.inter(cost.scores, cost.scores, keep=False)
    return cost.scores


def projections(t: Tally, s, count: int = 4, label: str = "projections (q, k, v, out)") -> None:
    """``count`` ``dim x dim`` linear maps of the ``(B, n, dim)`` input of a self-attention module."""
    b, n, dim = s["batch"], s["length"], s["dim"]
    t.mm(label, count, b * n, dim, dim)
    t.inter(count * b * n * dim)
    t.io(b * n * dim, count * dim * (dim + 1), b * n * dim)


def kv_cache(t: Tally, kv_heads: int, head_dim: int, value_dim: int) -> None:
    """A decoder's KV cache: every token of context keeps its keys and values, ``Hkv (D + Dv)`` numbers."""
    t.decoding(per_token=kv_heads * (head_dim + value_dim) * t.itemsize)


def derive_lengths(s: dict) -> dict:
    """The defaults of an attention call's sizes: ``kv_heads`` = heads, ``kv_len`` = q_len, ``value_dim`` = head_dim."""
    s["kv_heads"] = s["heads"] if s["kv_heads"] is None else s["kv_heads"]
    s["kv_len"] = s["q_len"] if s["kv_len"] is None else s["kv_len"]
    if "value_dim" in s:
        s["value_dim"] = s["head_dim"] if s["value_dim"] is None else s["value_dim"]
    return s


def attention_inputs(s) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Seeded q ``(B, H, Lq, D)``, k ``(B, Hkv, Lk, D)``, v ``(B, Hkv, Lk, Dv)`` at the sizes ``s``."""
    b, h, hkv, lq, lk = s["batch"], s["heads"], s["kv_heads"], s["q_len"], s["kv_len"]
    shapes = ((b, h, lq, s["head_dim"]), (b, hkv, lk, s["head_dim"]), (b, hkv, lk, s["value_dim"]))
    return tuple(randn(*shape, seed=i, dtype=dtype_of(s)) for i, shape in enumerate(shapes))


def attention_spec(kwargs_of, formula: str = ATTENTION_FORMULA, *, at_scale=None, source: str = "", name: str = "",
                   derive=None, nullable: frozenset = frozenset(), sized_mask: bool = False, **extra) -> Spec:
    """The spec of ``attention(q, k, v, **kwargs_of(sizes))``: the sizes of :data:`ATTENTION_SIZES` plus ``extra``
    (the options ``kwargs_of`` reads, with the example's values); ``derive`` fills ``extra``'s None values.
    ``sized_mask``: the mask holds tensors of the sequence's length, so the size check comes before it is made."""
    def count(t, s, module=None):
        if sized_mask:
            check_question(tuple(s[k] for k in ("batch", "heads", "q_len", "kv_len", "head_dim", "value_dim")), "mask")
        attend(t, "", s["batch"], s["heads"], s["q_len"], s["kv_len"], s["head_dim"], s["value_dim"],
               hkv=s["kv_heads"], dtype=dtype_of(s), backend=s["backend"], **kwargs_of(s))
        kv_cache(t, s["kv_heads"], s["head_dim"], s["value_dim"])

    def inputs(s, module=None):
        return functools.partial(attention, backend=s["backend"], **kwargs_of(s)), attention_inputs(s)

    return Spec({**ATTENTION_SIZES, **extra}, count, inputs, formula, length=("q_len", "kv_len"),
                at_scale=at_scale or {}, source=source, nullable=nullable, name=name,
                derive=derive_lengths if derive is None else lambda s: derive(derive_lengths(s)))
