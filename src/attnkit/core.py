"""``attnkit.core``: the one entry point, :func:`attention` (and :func:`explain`). Validate once, dispatch, return.

The pipeline every mechanism shares::

    score(q, k) * scale -> + bias / modifier -> mask (select) -> normalise -> dropout -> @ v

A call takes one of three routes, decided here and nowhere else:

1. the fast lane (:mod:`attnkit.kernels.lane`): the calls generation makes, on torch's
   kernel after attribute checks only;
2. traced (``torch.compile``, ``torch.export``): one ``attnkit::attention`` operator node
   that decides at run time (:mod:`attnkit.kernels.custom_op`), or plain torch
   operations for the calls it does not carry;
3. everything else: :func:`~attnkit.functional.validate.validate` builds the
   :class:`~attnkit.functional.validate.Problem`, and
   :func:`attnkit.kernels.dispatch.execute` runs the path that
   :func:`~attnkit.kernels.dispatch.choose` picks from the table in
   :mod:`attnkit.kernels.paths`.

``explain()`` shows that choice, why no other path was taken, and how the call runs when traced.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Literal, NamedTuple, overload

import torch

from . import recording
from .errors import ArgumentError
from .functional.validate import Problem, validate
from .kernels import custom_op, lane, paged, rules, selected_decode
from .kernels.dispatch import Decision, decide, execute
from .kernels.paths import BACKENDS
from .masks.base import Mask
from .masks.selected import SelectedKeys

__all__ = ["attention", "explain", "AttentionOutput"]

Score = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Normalizer = Callable[[torch.Tensor, "torch.Tensor | None"], torch.Tensor]
Bias = "torch.Tensor | Callable[..., torch.Tensor]"


class AttentionOutput(NamedTuple):
    """Returned when weights or lse are asked for; the fields not asked for are None.

    output: ``(..., Lq, Dv)`` in the input dtype. weights: ``(..., H, Lq, Lk)`` per
    head, post-normalisation, pre-dropout. lse: ``(..., Lq)`` log-sum-exp of the
    masked scaled scores, float32 (float64 for float64 inputs), ``-inf`` for rows
    with no allowed key.
    """

    output: torch.Tensor
    weights: torch.Tensor | None
    lse: torch.Tensor | None


def _autocast_inputs(q, k, v):
    """Under autocast, float32 q/k/v are cast to the autocast dtype, as torch's SDPA does.

    The kernels then run with autocast off, so the scores, softmax and lse are
    computed in float32 whatever the input dtype (RELIABILITY row 39).
    """
    tensors = (q, k, v)
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        return tensors  # validate() reports it
    device = q.device.type
    if not _autocast_enabled(device):
        return tensors
    low = torch.get_autocast_dtype(device)
    return tuple(t.to(low) if t.dtype == torch.float32 else t for t in tensors)


def _autocast_enabled(device_type: str) -> bool:
    try:
        return torch.is_autocast_enabled(device_type)
    except RuntimeError:  # a device type autocast does not know (meta): never enabled there
        return False


def _autocast_off(device_type: str):
    return torch.autocast(device_type, enabled=False) if _autocast_enabled(device_type) else contextlib.nullcontext()


def _prepare(q, k, v, backend: str = "auto", **kwargs) -> Problem:
    """Everything before dispatch, shared by attention() and explain(): autocast, validation, tracing."""
    q, k, v = _autocast_inputs(q, k, v)
    if backend not in BACKENDS:
        raise ArgumentError(f"attnkit.attention: backend must be one of {BACKENDS}; got {backend!r}")
    tracing = torch.compiler.is_compiling() or any(
        isinstance(size, torch.SymInt) for t in (q, k) if isinstance(t, torch.Tensor) for size in t.shape)
    return validate(q, k, v, tracing=tracing, **kwargs)


def _refuse_baked_aliasing(q, k, v) -> None:
    """Under ``torch.export`` the same tensor passed as two of q, k, v becomes one input of the program."""
    if torch.compiler.is_exporting() and (q is k or k is v or q is v):
        raise ArgumentError("attnkit.attention: under torch.export, query, key and value must be distinct tensors: "
                            "the same tensor passed twice becomes one input of the exported program, which then "
                            "ignores the other (export with distinct example inputs, e.g. k=q.clone())")


def _to_user_rank(t: torch.Tensor, rank: int) -> torch.Tensor:
    """Undo the 4-D view of :func:`~attnkit.functional.validate.validate`: (B, H, ...) back to the input's rank."""
    return t if rank == 4 else t.select(1, 0) if rank == 3 else t[0, 0]


@overload
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, mask: Mask | torch.Tensor | None = None,
              bias: torch.Tensor | Callable[..., torch.Tensor] | None = None, score: str | Score = "scaled_dot",
              scale: float | None = None, normalize: str | Normalizer = "softmax", dropout_p: float = 0.0,
              return_weights: Literal[False] = False, return_lse: Literal[False] = False,
              backend: str = "auto", sinks: torch.Tensor | None = None, block_table: torch.Tensor | None = None,
              seqused_k: torch.Tensor | None = None, k_scale: torch.Tensor | None = None,
              v_scale: torch.Tensor | None = None) -> torch.Tensor: ...


@overload
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, mask: Mask | torch.Tensor | None = None,
              bias: torch.Tensor | Callable[..., torch.Tensor] | None = None, score: str | Score = "scaled_dot",
              scale: float | None = None, normalize: str | Normalizer = "softmax", dropout_p: float = 0.0,
              return_weights: bool = False, return_lse: bool = False,
              backend: str = "auto", sinks: torch.Tensor | None = None, block_table: torch.Tensor | None = None,
              seqused_k: torch.Tensor | None = None, k_scale: torch.Tensor | None = None,
              v_scale: torch.Tensor | None = None) -> torch.Tensor | AttentionOutput: ...


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, mask: Mask | torch.Tensor | None = None,
              bias: torch.Tensor | Callable[..., torch.Tensor] | None = None, score: str | Score = "scaled_dot",
              scale: float | None = None, normalize: str | Normalizer = "softmax", dropout_p: float = 0.0,
              return_weights: bool = False, return_lse: bool = False,
              backend: str = "auto", sinks: torch.Tensor | None = None, block_table: torch.Tensor | None = None,
              seqused_k: torch.Tensor | None = None, k_scale: torch.Tensor | None = None,
              v_scale: torch.Tensor | None = None) -> torch.Tensor | AttentionOutput:
    """Attention over keys and values: ``normalize(score(q, k) * scale + bias, mask) @ v``.

    Args:
        q: queries ``(L, D)``, ``(B, L, D)`` or ``(B, H, L, D)``.
        k: keys, same rank; ``(B, H_kv, Lk, D)`` with ``H % H_kv == 0`` (grouped queries).
        v: values ``(B, H_kv, Lk, Dv)``; Dv may differ from D.
        mask: an :mod:`attnkit.masks` mask or a bool tensor broadcastable to the scores
            ``(..., Lq, Lk)`` (last dim exactly Lk). True = attend. Never a float.
            Tensors broadcast right-aligned, as in torch's SDPA: with 4-D inputs a 3-D mask
            is ``(H, Lq, Lk)`` and a 2-D one ``(Lq, Lk)``; per-sample key padding is
            ``masks.padding(lengths)`` or ``masks.keys(keep)``.
        bias: a float tensor broadcastable like ``mask``, added to the scores in float32,
            or a modifier ``(scores, b, h, q_idx, kv_idx) -> scores`` (see :mod:`attnkit.bias`).
        score: "scaled_dot" (default), "dot", "cosine" or a pairwise ``(q, k) -> scores``.
        scale: multiplies the scores; default ``1/sqrt(D)`` for "scaled_dot", else 1.
        normalize: "softmax", "sparsemax", "sigmoid", "sigmoid_log_n", "softpick", "stick_breaking",
            "hard", "gumbel" or ``(scores, allowed) -> weights``; sigmoid, softpick and stick-breaking
            also run on the O(L)-memory paths (:mod:`attnkit.functional.blockwise`).
        dropout_p: dropout on the weights; pass ``p if module.training else 0.0``.
        return_weights: also return per-head weights (forces an exact dense path).
        return_lse: also return the log-sum-exp of each row (softmax only).
        backend: "auto", "reference", "chunked", "sdpa", "blocksparse" or "flex" (CUDA)
            (:data:`attnkit.kernels.paths.BACKENDS`).
        sinks: learned attention sinks, a float tensor ``(H,)`` (gpt-oss: a logit per query head), or
            broadcastable to ``(B, H)`` (per sample) or to ``(B, H, Lq)`` (a logit per query row, e.g.
            computed from each token): it joins that row's softmax denominator and takes no value,
            ``out = softmax([scores, s])[:-1] @ v`` (:mod:`attnkit.functional.sinks`); softmax only,
            differentiable on every path. lse and weights include it; a row with no allowed key
            outputs 0 and has lse ``s``. ``s = -inf`` is plain softmax (gradients included, rows with no
            key too); ``+inf`` is refused (it would take every row's whole weight).
        block_table: a paged KV cache's page table ``(B, max_pages)`` (integers): ``k`` and ``v`` are then
            pools of pages ``(num_pages, page_size, H_kv, D)`` (``D_v``), read in place, and sequence ``b``'s
            keys are its first ``seqused_k[b]`` positions on the pages ``block_table[b]`` (as
            ``torch.nn.attention.varlen.varlen_attn``; :class:`attnkit.nn.PagedKVCache` keeps them).
        seqused_k: ``(B,)`` integers, the keys each sequence holds (a paged cache's lengths; with a
            contiguous ``(B, H_kv, Lk, D)`` cache, its first ``seqused_k[b]`` keys). ``mask`` is then read at
            each sequence's own positions and length: ``masks.causal()`` puts the ``Lq`` queries at its last
            ``Lq`` positions (decoding, chunked prefill). No bias with either.
        k_scale, v_scale: ``k`` and ``v`` are then codes of a quantized cache (float8_e4m3fn, float8_e5m2, int8,
            or uint8: int4 packed two per byte, :class:`attnkit.functional.quantize.KVFormat`), and these their
            float32 scales, ``()`` (per tensor) or ``k.shape[:-1]`` (per token and head; with ``block_table``,
            ``(num_pages, page_size, H_kv)``): the keys are ``code * scale``. Each key block is dequantized as the
            loop reaches it (paths ``online-softmax`` and ``paged-split-kv``; never a full-precision copy of the
            cache), so the result equals attention over the dequantized tensors. Both or neither.

    Returns:
        The output ``(..., Lq, Dv)`` in the input dtype, or an :class:`AttentionOutput`
        when ``return_weights`` or ``return_lse`` is set. A query row with no allowed
        key outputs 0 (lse ``-inf``, zero gradients); NaN in allowed inputs propagates.
        Keys masked for every query (padding) have their K/V rows zeroed, so nothing
        there can reach the output or the gradients. A key masked for some queries only
        (causal, windows) never changes the output, but NaN/inf in it can still reach
        ``dQ`` (through ``0 * NaN`` in ``dS @ K``) and NaN in its V row can reach the
        output of queries that do not attend it (``0 * NaN`` in ``weights @ V``).
        Under ``torch.autocast``, float32 inputs are cast to the autocast dtype (as
        torch's SDPA does) and the scores, softmax and lse stay float32.

    Example:
        >>> import torch, attnkit
        >>> q = k = v = torch.randn(2, 3, 5, 8)
        >>> out = attnkit.attention(q, k, v, mask=attnkit.masks.causal())
        >>> out.shape
        torch.Size([2, 3, 5, 8])
    """
    # the only masks the fast lane serves; paged and quantized calls are never its
    if ((mask is None or getattr(mask, "kind", None) == "causal") and block_table is None and seqused_k is None
            and k_scale is None and v_scale is None):
        fast = lane.route(q, k, v, mask, bias, score, scale, normalize, dropout_p, return_weights, return_lse,
                          backend, sinks)
        if fast is not None:
            out = lane.run(q, k, v, mask, fast)
            if out is not None:
                return out
    if (type(mask) is SelectedKeys and mask.indices.shape[2] == 1 and block_table is None and seqused_k is None
            and k_scale is None and v_scale is None):  # a decoding step over selected keys (DSA): its own checks
        step = selected_decode.lane(q, k, v, mask, bias, score, scale, normalize, dropout_p, return_weights,
                                    return_lse, backend, sinks)
        if step is not None:
            return AttentionOutput(step[0], None, step[1]) if return_lse else step[0]
    if seqused_k is not None and bias is None and sinks is None and k_scale is None and v_scale is None:
        out = paged.lane(q, k, v, mask, score, scale, normalize, dropout_p, return_weights, return_lse, backend,
                         block_table, seqused_k)  # decoding and chunked prefill over a paged or ragged cache
        if out is not None:
            return out
    record = recording.listening and recording.is_recording()  # a recorder listens: the path with the weights
    if record:
        backend = "reference"
    p = _prepare(q, k, v, mask=mask, bias=bias, score=score, scale=scale, normalize=normalize, dropout_p=dropout_p,
                 return_weights=return_weights or record, return_lse=return_lse, backend=backend, sinks=sinks,
                 block_table=block_table, seqused_k=seqused_k, k_scale=k_scale, v_scale=v_scale)
    with _autocast_off(p.q.device.type):  # scores and softmax stay in float32
        if p.tracing:
            _refuse_baked_aliasing(q, k, v)
        if p.tracing and rules.operator_carries(p, backend):
            result = custom_op.run(p)
        else:
            result, _ = execute(p, backend)
    rank, dtype = p.user_rank, p.q.dtype
    weights = result.weights.to(dtype) if result.weights is not None else None  # asked for (or recorded)
    if record and weights is not None:
        recording.report(weights)
    out = _to_user_rank(result.out if result.out.dtype == dtype else result.out.to(dtype), rank)
    if not (return_weights or return_lse):
        return out
    return AttentionOutput(out, _to_user_rank(weights, rank) if return_weights and weights is not None else None,
                           _to_user_rank(result.lse, rank) if return_lse and result.lse is not None else None)


def explain(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, mask: Mask | torch.Tensor | None = None,
            bias: torch.Tensor | Callable[..., torch.Tensor] | None = None, score: str | Score = "scaled_dot",
            scale: float | None = None, normalize: str | Normalizer = "softmax", dropout_p: float = 0.0,
            return_weights: bool = False, return_lse: bool = False, backend: str = "auto",
            sinks: torch.Tensor | None = None, block_table: torch.Tensor | None = None,
            seqused_k: torch.Tensor | None = None, k_scale: torch.Tensor | None = None,
            v_scale: torch.Tensor | None = None, read_data: bool = True) -> Decision:
    """Which execution path ``attention(q, k, v, ...)`` would run, why no other path, its cost, how it compiles.

    ``str()`` of the answer lists every path of :mod:`attnkit.kernels.paths` with the
    reason it was not taken (refused, or able but not preferred), names the fast lane
    when the call takes it, and says how the call runs under ``torch.compile`` and
    ``torch.export`` (``Decision.compiled``). With ``read_data=False`` nothing reads the
    values of q, k, v or the mask's block layout: the checks of the values are taken to
    pass (the decision a traced call expects), so sizes no machine could hold can be
    explained from zero-stride views (``torch.zeros(()).expand(B, H, L, D)``); a
    block-sparse density and its cost are then left to run time.

    Example:
        >>> import torch, attnkit
        >>> q = torch.randn(1, 2, 512, 16)
        >>> d = attnkit.explain(q, q, q, mask=attnkit.masks.sliding_window(32, 32))
        >>> d.backend, d.path
        ('blocksparse', 'band-windows')
    """
    paged_or_quantized = block_table is not None or seqused_k is not None or k_scale is not None or v_scale is not None
    fast = None if paged_or_quantized else lane.route(
        q, k, v, mask, bias, score, scale, normalize, dropout_p, return_weights, return_lse, backend,
        sinks)
    p = _prepare(q, k, v, backend=backend, mask=mask, bias=bias, score=score, scale=scale, normalize=normalize,
                 dropout_p=dropout_p, return_weights=return_weights, return_lse=return_lse, sinks=sinks,
                 block_table=block_table, seqused_k=seqused_k, k_scale=k_scale, v_scale=v_scale)
    with _autocast_off(p.q.device.type):
        if p.tracing and rules.operator_carries(p, backend):
            return custom_op.traced_decision(p, backend)
        return decide(p, backend, data=read_data, lane=lane.describe(fast) if fast is not None else None,
                      compiled=custom_op.compiled_route(p, backend))
