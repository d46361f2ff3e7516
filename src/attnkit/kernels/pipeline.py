"""The attention pipeline every general path shares: upcasting, the score -> bias -> mask ->
normalise stages applied to one block given its index tensors, and row-chunked execution.

A block is described by broadcasting index tensors ``b, h, q_idx, kv_idx`` (see
:mod:`attnkit.masks.base`), so the same code serves the dense reference
(whole rows), the online softmax (a slab of rows and keys) and the gathered
block-sparse path (gathered key blocks).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import NamedTuple

import torch
import torch.nn.functional as F

from ..bias import apply_modifier
from ..functional import sinks
from ..functional.blockwise import BLOCKWISE
from ..functional.normalize import NORMALIZERS, masked_softmax, softmax
from ..functional.scores import SCORES
from ..functional.validate import Problem
from ..masks.base import gather_at

__all__ = ["KernelOutput", "upcast_inputs", "block_scores", "block_weights", "without_sinks", "join_sinks",
           "zero_padded_keys", "unit_count", "Units", "dense_indices", "row_chunks", "Workspace",
           "in_graph", "shapes_only", "twice_differentiable", "twice_differentiable_node"]


class KernelOutput(NamedTuple):
    out: torch.Tensor  # (B, Hq, Lq, Dv) in the compute dtype
    weights: torch.Tensor | None  # (B, Hq, Lq, Lk)
    lse: torch.Tensor | None  # (B, Hq, Lq)


def in_graph(result: KernelOutput, differentiable: list[torch.Tensor]) -> KernelOutput:
    """``result`` with its output joined to autograd when a path never read the inputs.

    A call whose every row has no allowed key (an empty block layout, an all-False mask)
    is answered with zeros that no input produced; autograd must still reach q, k, v and
    the learned biases (``differentiable``), with zero gradients (RELIABILITY row 1). The
    link is a sum over an empty slice of each input: exactly 0, NaN-free whatever the
    inputs hold, and its backward writes zeros.
    """
    if result.out.requires_grad or not differentiable:
        return result
    link = sum(t[..., :0].sum() for t in differentiable)  # 0-dim zero in the graph of every input
    return result._replace(out=result.out + link.to(result.out.dtype))


class _SecondOrder(torch.autograd.Function):
    """The identity on a path's output and lse, whose gradients come from a differentiable recomputation under
    ``create_graph=True`` (and pass through to the path's own backward otherwise)."""

    @staticmethod
    def forward(ctx, recompute, out, lse, *inputs):
        ctx.recompute, ctx.has_lse = recompute, lse.numel() > 0
        ctx.save_for_backward(*inputs)
        return out.view_as(out), lse.view_as(lse)

    @staticmethod
    def backward(ctx, dout, dlse):
        inputs = ctx.saved_tensors
        if not torch.is_grad_enabled():  # a first derivative: the path's own backward computes it
            return None, dout, dlse, *(None for _ in inputs)
        with torch.enable_grad():  # create_graph=True: gradients that autograd can differentiate again
            out, lse = ctx.recompute(*inputs)
            pairs = [(out, dout)] + ([(lse, dlse)] if ctx.has_lse and dlse is not None else [])
            grads = torch.autograd.grad([o for o, _ in pairs], inputs, [g for _, g in pairs], create_graph=True,
                                        allow_unused=True)
        return None, None, None, *grads


def twice_differentiable(out: torch.Tensor, lse: torch.Tensor | None, inputs: list[torch.Tensor], recompute):
    """``(out, lse)`` of a path whose backward is written by hand (not itself differentiable), made so.

    A second derivative (``create_graph=True``: gradient penalties, meta-learning) through such a path
    would silently lose its second-order term; here the first backward, when autograd records it,
    returns the gradients of ``recompute(*inputs) -> (out, lse)`` (the dense reference: exact, and
    differentiable again) instead. Plain backward passes are untouched.
    """
    empty = out.new_empty(0)
    out2, lse2 = _SecondOrder.apply(recompute, out, empty if lse is None else lse, *inputs)
    return out2, (None if lse is None else lse2)


def twice_differentiable_node(out: torch.Tensor, operands: tuple[torch.Tensor, ...], recompute) -> torch.Tensor:
    """``out``, the output of a torch operator on ``operands`` (its autograd node's inputs, in order) whose
    backward torch computes but cannot differentiate (its fused CPU attention kernel), made twice differentiable.

    The same answer as :func:`twice_differentiable` at a fraction of its cost: no second autograd node and no
    Python in the forward beyond one hook on the operator's own node. A first backward is torch's own (the hook
    returns None); when autograd records it (``create_graph=True``), the hook replaces the node's gradients by
    those of ``recompute(*operands) -> (out, lse)`` (the dense reference: exact, differentiable again) for the
    operands autograd asked for, the others staying None.
    """
    def exact_second_order(grad_inputs, grad_outputs):
        if not torch.is_grad_enabled() or grad_outputs[0] is None:  # a first derivative: torch's backward
            return None
        wanted = [t for t, g in zip(operands, grad_inputs, strict=True) if g is not None]
        with torch.enable_grad():
            again, _ = recompute(*operands)
            grads = iter(torch.autograd.grad(again, wanted, grad_outputs[0], create_graph=True, allow_unused=True))
        return tuple(None if g is None else next(grads) for g in grad_inputs)

    out.grad_fn.register_hook(exact_second_order)
    return out


def shapes_only(p: Problem) -> KernelOutput:
    """The result of a call on meta tensors: its shapes and dtypes on the meta device, no data.

    Meta tensors carry no values, so no path can run (finiteness checks, mask layouts and
    row checks read data); models built on the meta device (FSDP, shape inference) need
    only the result's shapes: output ``(B, Hq, Lq, Dv)``, weights ``(B, Hq, Lq, Lk)`` and
    lse ``(B, Hq, Lq)`` in the compute dtype.
    """
    batch, heads, lq, lk, _, dv = p.sizes
    like = p.q.new_empty(0, dtype=p.compute_dtype)
    return KernelOutput(like.new_empty(batch, heads, lq, dv),
                        like.new_empty(batch, heads, lq, lk) if p.return_weights else None,
                        like.new_empty(batch, heads, lq) if p.return_lse else None)


def upcast_inputs(p: Problem):
    """q, k, v contiguous in the compute dtype, key/value heads repeated for grouped queries.

    Contiguous copies of strided inputs make the matmuls, and so the rounding, the
    same as for ``.contiguous()`` inputs (bitwise on the reference path).
    """
    dt = p.compute_dtype
    k, v = p.k, p.v
    if p.quant is not None:  # codes: the dense paths see them only for empty problems (rules.full_precision_kv)
        k, v = (p.quant.block(which, t, 0, t.shape[2], dt) for which, t in (("k", k), ("v", v)))
    k, v = k.to(dt), v.to(dt)  # cast before repeating: the heads' gradients are summed in the compute dtype
    if p.groups > 1:
        k, v = k.repeat_interleave(p.groups, dim=1), v.repeat_interleave(p.groups, dim=1)
    return p.q.to(dt).contiguous(), k.contiguous(), v.contiguous()


def loop_inputs(p: Problem):
    """q in the compute dtype, k and v as :func:`upcast_inputs` gives them, or their codes when quantized: the
    paths looping over key blocks read each block with :func:`kv_block`."""
    if p.quant is None:
        return upcast_inputs(p)
    return p.q.to(p.compute_dtype).contiguous(), p.k, p.v


def kv_block(p: Problem, t: torch.Tensor, which: str, start: int, stop: int) -> torch.Tensor:
    """Positions ``[start, stop)`` of keys (``which="k"``) or values from :func:`loop_inputs`: a slice, or that
    block of the codes dequantized (heads repeated for grouped queries): never the whole cache at once."""
    if p.quant is None:
        return t[:, :, start:stop]
    block = p.quant.block(which, t, start, stop, p.compute_dtype)
    return block.repeat_interleave(p.groups, dim=1) if p.groups > 1 else block


def dense_indices(batch, heads, q_start, q_stop, kv_start, kv_stop, device):
    """Index tensors for a dense slab: ``(B,1,1,1), (1,H,1,1), (1,1,rows,1), (1,1,1,cols)``."""
    return (torch.arange(batch, device=device).view(-1, 1, 1, 1),
            torch.arange(heads, device=device).view(1, -1, 1, 1),
            torch.arange(q_start, q_stop, device=device).view(1, 1, -1, 1),
            torch.arange(kv_start, kv_stop, device=device).view(1, 1, 1, -1))


def _pairwise_scores(score_fn, q, k):
    """Call a score function with 4-D ``(B, H, L, D)`` tensors, as a user writes it.

    The block-sparse kernel works on 5-D ``(B, H, n, rows, D)`` blocks; their
    ``(H, n)`` dims are folded into one for the call and unfolded afterwards.
    """
    if q.dim() == 4:
        return score_fn(q, k)
    scores = score_fn(q.flatten(1, 2), k.flatten(1, 2))
    return scores.view(*q.shape[:3], *scores.shape[-2:])


def block_scores(p: Problem, q, k, b, h, q_idx, kv_idx, kv_valid=None):
    """Scores (scaled, biased, modified) and the bool ``allowed`` for one block.

    ``kv_valid`` marks real key slots (False for padding lanes of a kernel); it is
    folded into ``allowed`` so padding never enters the normaliser.
    """
    if p.score in ("dot", "scaled_dot"):
        scores = (q * p.scale if p.scale != 1.0 else q) @ k.transpose(-1, -2)  # scale the small operand
    else:
        scores = _pairwise_scores(SCORES[p.score] if isinstance(p.score, str) else p.score, q, k)
        if p.scale != 1.0:
            scores = scores * p.scale
    _, _, lq, lk, _, _ = p.sizes
    if p.bias is not None:
        scores = scores + gather_at(p.bias, b, h, q_idx, kv_idx).to(scores.dtype)
    if p.modifier is not None:
        scores = apply_modifier(p.modifier, scores, b, h, q_idx, kv_idx, lq, lk)
    allowed = kv_valid
    if p.mask is not None:
        m = p.mask.allows(b, h, q_idx, kv_idx, lq, lk)
        allowed = m if allowed is None else allowed & m
    return scores, allowed  # allowed may have size-1 dims where the mask ignores b or h


def _only_mask_makes_inf(p: Problem) -> bool:
    """True when ``-inf`` scores can come from the mask alone (no bias, modifier or custom score)."""
    return p.bias is None and p.modifier is None and p.score in ("dot", "scaled_dot", "cosine")


def block_weights(p: Problem, scores, allowed):
    """Normalise one block of full rows: ``(weights, lse or None)``; masked keys get exactly 0.

    May overwrite ``scores`` in place (it is a fresh temporary in every kernel).
    """
    if p.normalize == "softmax":
        if p.sinks is not None:
            return softmax(scores, allowed, sinks.per_row(p.sinks, scores))
        if _only_mask_makes_inf(p):
            return masked_softmax(scores, allowed, need_lse=p.return_lse)
        return softmax(scores, allowed)
    rule = BLOCKWISE.get(p.normalize) if isinstance(p.normalize, str) else None
    if rule is not None:  # a whole row as one block, its length the call's (sigmoid's -log n)
        return rule.weights(scores, allowed, p.sizes[3]), None
    fn = NORMALIZERS[p.normalize] if isinstance(p.normalize, str) else p.normalize
    weights = fn(scores, allowed)
    if allowed is not None:
        weights = weights.masked_fill(~allowed, 0.0)
    return weights, None


def without_sinks(p: Problem) -> Problem:
    """``p`` without its sinks and asking for the lse: what a path runs before :func:`join_sinks` joins them.

    For the paths whose backward takes an lse gradient (band windows, masked slabs, the soft-cap
    loop); the path calls both itself (``join_sinks(p, inner, run(inner))``), so no call comes back up
    into it from here.
    """
    inner = p.with_inputs(sinks=None, return_lse=True)
    inner.memo.update(p.memo)  # the facts (band, finiteness, ...) do not depend on the sinks
    return inner


def join_sinks(p: Problem, inner: Problem, result: KernelOutput) -> KernelOutput:
    """The ``(out, lse)`` of ``inner`` (:func:`without_sinks`) joined with ``p``'s sinks
    (:class:`~attnkit.functional.sinks.Join`): the join hands the path ``dO = f dO_s`` and
    ``dlse = f (1 - f) rowsum(dO_s O) + f dlse_s``, and its own backward then gives the sink call's
    exact ``dq, dk, dv``."""
    out, lse = sinks.join(result.out, result.lse, p.sinks)
    p.memo.update(inner.memo)
    return KernelOutput(out, result.weights, lse if p.return_lse else None)


def dropout(p: Problem, weights):
    return F.dropout(weights, p.dropout_p, training=True) if p.dropout_p > 0 else weights


def row_chunks(n_rows: int, rows_per_chunk: int, *tensors) -> list[tuple[int, int, bool]]:
    """``(start, stop, checkpointed)`` of each chunk of ``rows_per_chunk`` query rows (dim 2).

    When autograd records through ``tensors`` and there are several chunks, each is to be
    checkpointed (``torch.utils.checkpoint.checkpoint``, non-reentrant, RNG state preserved so
    dropout replays), so backward holds one chunk's intermediates at a time instead of all of
    them. The path calls each chunk itself and joins them with :func:`concat_pieces`: nothing
    here calls back up into it.
    """
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in tensors if isinstance(t, torch.Tensor))
    several = rows_per_chunk < n_rows
    return [(start, min(n_rows, start + rows_per_chunk), grad and several)
            for start in range(0, n_rows, rows_per_chunk)]


def concat_pieces(pieces):
    """Join per-chunk output tuples along dim 2 (a single chunk is returned as is, not copied)."""
    if len(pieces) == 1:
        return tuple(pieces[0])
    return tuple(torch.cat(parts, dim=2) if parts[0] is not None else None for parts in zip(*pieces, strict=True))


class Workspace:
    """Scratch buffers reused by every slab of one kernel call, one per name, grown on demand.

    Slab temporaries of a few MB are otherwise freed and page-faulted in afresh for
    every slab (glibc returns them to the OS), which costs as much as the arithmetic
    on them. A view taken here is valid until the next :meth:`take` of the same name.
    """

    def __init__(self, like: torch.Tensor):
        self.like, self.buffers = like, {}

    def take(self, name: str, *shape: int) -> torch.Tensor:
        """A contiguous tensor of ``shape`` (uninitialised), a view of the buffer called ``name``."""
        numel = 1
        for size in shape:
            numel *= size
        buf = self.buffers.get(name)  # one made under torch.inference_mode is read-only outside it: made anew
        if buf is None or buf.numel() < numel or (buf.is_inference() and not torch.is_inference_mode_enabled()):
            buf = self.buffers[name] = self.like.new_empty(numel)
        return buf[:numel].view(shape)


def zero_padded_keys(p: Problem) -> Problem | None:
    """The call with the K/V rows the mask rejects for every query (padding) zeroed, when the inputs are not finite.

    Masked scores are selected away already; zeroing the rows too means that NaN or inf
    past a sequence's valid length cannot reach the output or the gradients through
    ``0 * NaN`` (RELIABILITY row 22). With finite inputs, or no padded key, nothing
    changes and None is returned; otherwise a new problem, whose finiteness is learnt
    anew (those rows may have been the only non-finite ones).
    """
    compiling = torch.compiler.is_compiling()
    if not compiling and p.finiteness_known and p.inputs_finite():
        return None  # a rule has already read the inputs finite: nothing to zero, and the mask is not asked
    keys = p.mask.key_padding() if p.mask is not None else None
    if keys is None or (not compiling and p.inputs_finite()):
        return None
    batch, _, _, lk, _, _ = p.sizes
    dev = p.q.device
    zero = torch.zeros(1, 1, 1, 1, dtype=torch.long, device=dev)
    keep = keys.allows(torch.arange(batch, device=dev).view(-1, 1, 1, 1), zero, zero,
                       torch.arange(lk, device=dev).view(1, 1, -1, 1), p.sizes[2], lk)  # (B|1, 1, Lk, 1)
    keep = torch.broadcast_to(keep, (batch, 1, lk, 1))
    if not compiling and bool(keep.all()):  # the check needs the data: skip it when tracing
        return None
    if p.quant is not None:  # codes: zero bits are the code 0 in every format
        return p.with_inputs(**{name: t.view(torch.uint8).masked_fill(~keep, 0).view(t.dtype)
                                for name, t in (("k", p.k), ("v", p.v))})
    return p.with_inputs(k=p.k.masked_fill(~keep, 0.0), v=p.v.masked_fill(~keep, 0.0))


UNIT_WORK = 1 << 20  # elements of work (scores) below which a call is one unit, run by the caller


def unit_count(heads: int, work: int) -> int:
    """Into how many units (runs of heads) a call splits (:class:`Units`): two per torch thread, one per head at most.

    One unit (the caller's threads, as any torch code) on one thread, while compiling, or
    for a call of under :data:`UNIT_WORK` elements, where starting a thread costs more than it saves.
    """
    threads = torch.get_num_threads()
    if threads <= 1 or work < UNIT_WORK or torch.compiler.is_compiling():
        return 1
    return max(1, min(heads, 2 * threads))


class Units:
    """The units ``0 .. count - 1`` of one call (runs of heads), taken in turn by the threads of :meth:`helping`.

    Every parallel torch operator ends at a barrier of its thread team. When more threads
    are runnable than there are cores (other processes busy), a team member that lost its
    core holds the others at the barrier until it is scheduled again: a scheduler time
    slice, milliseconds, per operator that itself takes microseconds to milliseconds. A
    path of tens of operators per call (the band windows: a few per slab) then pays tens
    of time slices, torch's fused SDPA kernel (one operator) one. Measured on 2 cores with
    six busy processes besides (window +-128, L = 4096, 8 heads, forward): the band path's
    ratio to SDPA with the dense mask went from 0.11 to 1.0-1.2 on two threads, to 0.16 on
    one, and stayed at 0.10-0.12 split into units this way. So such a path splits its work
    into independent units (which write disjoint rows of the outputs and gradients): inside
    :meth:`helping`, torch's threads less one Python threads started for the call and the
    caller each run the path's ``share()``, which takes units from :meth:`take` until none
    is left, every operator on one torch thread. No operator waits for another thread, and
    a thread that lost its core takes fewer units. A unit's operators are the same
    whichever thread runs it, so the bits do not depend on the scheduling; on one thread
    (or one unit) the caller runs every unit, on the caller's threads.

    Torch's thread count is process-wide: it reads 1 inside (threads first used by another
    part of the program meanwhile start with one) and the caller's after. The helpers run
    in the caller's grad and inference modes. The first exception of any thread is raised
    when the block ends, after every thread has stopped.
    """

    def __init__(self, count: int):
        self.count, self.errors = count, []
        self._next, self._lock = 0, threading.Lock()

    def take(self) -> Iterator[int]:
        """The next units not yet taken by any thread (none after an error)."""
        while not self.errors:
            with self._lock:
                unit, self._next = self._next, self._next + 1
            if unit >= self.count:
                return
            yield unit

    @contextlib.contextmanager
    def helping(self, share: Callable[[], None]) -> Iterator[None]:
        """Helper threads run ``share()`` while the caller runs its own share inside the block."""
        threads = min(self.count, torch.get_num_threads())
        if threads <= 1:
            yield
            return
        caller, grad, inference = torch.get_num_threads(), torch.is_grad_enabled(), torch.is_inference_mode_enabled()

        def helper() -> None:
            torch.set_num_threads(1)  # this thread's team (and MKL's): one
            try:
                with torch.inference_mode(inference), torch.set_grad_enabled(grad):
                    share()
            except BaseException as err:  # raised again in the caller's thread
                self.errors.append(err)

        torch.set_num_threads(1)
        helpers = [threading.Thread(target=helper, name=f"attnkit-units-{t}", daemon=True) for t in range(1, threads)]
        try:
            for i, t in enumerate(helpers):
                try:
                    t.start()
                except RuntimeError:  # no thread to be had: the caller and the helpers started share the units
                    helpers = helpers[:i]
                    break
            try:
                yield
            except BaseException as err:
                self.errors.insert(0, err)  # the helpers stop at their next unit
            for t in helpers:
                t.join()
        finally:
            torch.set_num_threads(caller)
        if self.errors:
            raise self.errors[0]
