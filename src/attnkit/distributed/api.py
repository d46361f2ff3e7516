"""``attnkit.distributed.attention``: exact attention over a sequence split across the ranks of a process group.

The contract:

* q, k, v are this rank's shards along dim -2 under ``layout``: ``(B, H, L/W, D)``,
  ``(B, H_kv, L/W, D)``, ``(B, H_kv, L/W, Dv)``; zigzag shards hold chunk r, then chunk 2W-1-r.
  The answer is this rank's shard of the output (and of the lse, ``(B, H, L/W)``).
* ``mask`` (any attnkit mask, or a bool tensor broadcastable to ``(B, H, L, L)``) and
  ``bias`` (any modifier, or a float tensor broadcastable to ``(B, H, L, L)``) are read
  at global positions and global head indices: q_len = kv_len = L; segment ids and
  padding lengths are given for the full sequence.
* Ranks are relative to ``group``. Backward is collective: each rank calls backward on
  its own loss and every shard's gradient is that of the sum of all ranks' losses
  (K/V gradients are summed across ranks).
* A query row with no allowed key outputs 0, lse -inf and zero gradients, also when a
  whole block or a whole rank's share is masked.
* ``sinks`` (a logit per head, sample or query row, :mod:`attnkit.functional.sinks`) join once, after the
  partial results are merged: ``(out, lse) -> (out * sigmoid(lse - s), logaddexp(lse, s))``.
  Each rank's sink gradient is its own rows' share: summed over the ranks (as data-parallel
  training all-reduces a replicated parameter) it is the gradient of the sum of the losses.
* Every local computation is one ``attnkit.attention(..., return_lse=True)`` call.
* Every rank makes the same call: one all-gather of a small description checks it first
  (:mod:`.agreement`), so a call the ranks disagree on raises on every rank instead of
  crashing inside the collectives or waiting for the group's timeout.
* ``scheme="tree"`` is for decoding: q is the step's queries ``(B, H, Lq, D)``, the same on
  every rank, k and v the rank's shards of the cache; every rank gets the whole output.
* A global length of 0 (every shard empty) gives empty results, as ``attnkit.attention`` does.

Nothing here is device-specific: tensors stay on their device and the collectives are
``torch.distributed``'s, so NCCL on GPUs runs the same code as gloo on CPUs (with NCCL, each
rank's tensors live on its own GPU, ``torch.cuda.set_device(local_rank)``).
"""

from __future__ import annotations

import zlib

import torch

from ..bias import AdditiveModifier
from ..core import AttentionOutput
from ..core import attention as local_attention
from ..errors import ArgumentError, DTypeError, ShapeError
from ..functional.sinks import join
from ..functional.validate import check_sinks, default_scale
from ..masks import Mask, TensorMask
from . import allgather, ring, tree, ulysses, usp
from .agreement import Field, checked, size, text_of, tracked
from .blocks import Setting, as_rows, chunk_maps
from .comm import Comm
from .layouts import check_layout, chunk_size

__all__ = ["attention", "prepare", "plan", "run", "SCHEMES", "DECODE_SCHEMES"]

SCHEMES = ("ring", "ulysses", "allgather", "usp")  # the query sharded like the keys: every rank its shard
DECODE_SCHEMES = ("tree",)  # the queries of a decoding step on every rank, the cache sharded
_WHO = "attnkit.distributed.attention"


def _check_inputs(q, k, v, decode: bool = False):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise DTypeError(f"{_WHO}: {name} must be a tensor; got {type(t).__name__}")
        if t.dim() != 4:
            raise ShapeError(f"{_WHO}: {name} must be a local shard (B, H, L/W, D); got shape {tuple(t.shape)}")
    if decode and k.shape[-2] != v.shape[-2]:
        raise ShapeError(f"{_WHO}: k and v shards must share their length; got {k.shape[-2]} and {v.shape[-2]}")
    if not decode and not (q.shape[-2] == k.shape[-2] == v.shape[-2]):
        raise ShapeError(f"{_WHO}: q, k and v shards must share their length (dim -2); got "
                         f"{q.shape[-2]}, {k.shape[-2]}, {v.shape[-2]}")
    if q.shape[0] != k.shape[0] or k.shape[:2] != v.shape[:2] or q.shape[1] % k.shape[1] or q.shape[-1] != k.shape[-1]:
        raise ShapeError(f"{_WHO}: expected q (B, H, n, D), k (B, H_kv, n, D), v (B, H_kv, n, Dv) with H % H_kv == 0; "
                         f"got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")


def _full_size(name, t, batch, heads, length, q_len=None):
    """A tensor mask/bias broadcastable to ``(B, H, L, L)`` (``(B, H, Lq, L)`` for decoding), as 4-D."""
    shape = "(B, H, L, L)" if q_len is None else "(B, H, Lq, L)"
    q_len = length if q_len is None else q_len
    t4 = t.reshape((1,) * (4 - t.dim()) + tuple(t.shape)) if t.dim() <= 4 else t
    ok = t.dim() <= 4 and t4.shape[-1] == length and all(
        s in (1, f) for s, f in zip(t4.shape, (batch, heads, q_len, length), strict=True))
    if not ok:
        raise ShapeError(f"{_WHO}: a {name} tensor must broadcast to the global scores {shape} = "
                         f"{(batch, heads, q_len, length)} (last dim exactly L); got {tuple(t.shape)}")
    return t4


def _check_mask(mask, batch, heads, length, q_len=None):
    if mask is None:
        return None
    if isinstance(mask, torch.Tensor):
        if mask.dtype != torch.bool:
            raise DTypeError(f"{_WHO}: mask must be a bool tensor (True = attend) or an attnkit mask; got {mask.dtype}")
        return TensorMask(_full_size("mask", mask, batch, heads, length, q_len))
    if not isinstance(mask, Mask):
        raise DTypeError(f"{_WHO}: mask must be an attnkit.masks.Mask or a bool tensor; got {type(mask).__name__}")
    for name, want, got in (("batch", mask.batch_size, batch), ("heads", mask.num_heads, heads),
                            ("q_len", mask.q_len, length if q_len is None else q_len), ("kv_len", mask.kv_len, length)):
        if want is not None and want != got:
            raise ShapeError(f"{_WHO}: mask {mask!r} holds data for {name}={want}; the global problem has {got} "
                             "(masks are given for the full sequence)")
    return mask


def _learned(bias) -> bool:
    if isinstance(bias, torch.Tensor):
        return bias.requires_grad and torch.is_grad_enabled()
    if isinstance(bias, AdditiveModifier):
        return bool(bias.parameters_needing_grad())
    return isinstance(bias, torch.nn.Module) and any(p.requires_grad for p in bias.parameters())


def _check_bias(bias, batch, heads, length, q_len=None):
    if isinstance(bias, torch.Tensor):
        if not bias.is_floating_point():
            raise DTypeError(f"{_WHO}: a bias tensor must be floating point; got {bias.dtype}")
        return _full_size("bias", bias, batch, heads, length, q_len)
    if bias is not None and not callable(bias):
        raise DTypeError(f"{_WHO}: bias must be a modifier or a float tensor; got {type(bias).__name__}")
    return bias


def attention(q, k, v, *, mask=None, bias=None, scale=None, scheme="ring", layout="contiguous", group=None,
              return_lse=False, ulysses_size=None, sinks=None):
    """Exact softmax attention of this rank's query shard against the whole sequence split over ``group``.

    Every rank must make the same call (its own shards of one global problem, the same mask,
    bias, scale, scheme and layout): one small all-gather checks that first, and a call the
    ranks disagree on raises the same error on every rank, naming what differs on which rank
    (:mod:`attnkit.distributed.agreement`). A global length of 0 gives empty results.

    Args:
        q, k, v: this rank's shards ``(B, H, L/W, D)``, ``(B, H_kv, L/W, D)``, ``(B, H_kv, L/W, Dv)``.
        mask: an attnkit mask or a bool tensor for the global ``L x L`` problem; True = attend.
        bias: an attnkit modifier (ALiBi, soft-cap, ...) or a float tensor for the global problem.
        scale: multiplies ``q . k``; default ``1 / sqrt(D)``.
        scheme: "ring" (K/V passed around the ring, the backward runs the ring again), "ulysses"
            (all-to-all to head shards; needs H divisible by W), "allgather" (gather K/V), "usp"
            (Ulysses over ``ulysses_size`` ranks, the ring across them: :mod:`.usp`) or "tree"
            (decoding: q the step's queries on every rank, the cache sharded: :mod:`.tree`).
        layout: "contiguous" or "zigzag" (see :mod:`attnkit.distributed.layouts`).
        group: the process group (default: the world); ranks are relative to it.
        return_lse: also return the lse shard ``(B, H, L/W)`` (float32; float64 for float64 inputs).
        ulysses_size: ``scheme="usp"``: the ranks of a Ulysses group, dividing W and H
            (default ``gcd(H_kv, W)``: no K/V head repeated).
        sinks: attention sinks ``(H,)`` or broadcastable to ``(B, H)`` (the same on every rank), or to
            ``(B, H, L/W)``: a logit per row of this rank's query shard, in its layout's order (as ``q``);
            applied once after the merge (as ``attnkit.attention(..., sinks=)``); a row with no allowed key
            then has lse ``s``.

    Returns:
        This rank's output shard ``(B, H, L/W, Dv)`` in q's dtype, or an
        :class:`~attnkit.AttentionOutput` ``(output, None, lse)`` with ``return_lse``
        (``"tree"``: the whole output ``(B, H, Lq, Dv)`` and lse, on every rank).
    """
    comm, setting = prepare(q, k, v, mask=mask, bias=bias, scale=scale, scheme=scheme, layout=layout, group=group,
                            return_lse=return_lse, ulysses_size=ulysses_size, sinks=sinks)
    return run(q, k, v, setting, comm, scheme=scheme, layout=layout, return_lse=return_lse, sinks=sinks)


def run(q, k, v, setting: Setting, comm: Comm, *, scheme: str, layout: str, return_lse: bool, sinks=None):
    """The scheme's collectives and blocks for a call every rank has checked and agreed on (:func:`prepare`)."""
    if setting.length == 0:  # every rank holds no position: nothing to exchange, the local call is the answer
        result = local_attention(q, k, v, scale=setting.scale, return_lse=True, sinks=sinks)
        out, lse = result.output, result.lse
    else:
        with_lse = return_lse or sinks is not None
        if scheme == "ring":
            out, lse = ring.ring_attention(q, k, v, setting, comm, layout, plan_class=ring.RingPlan)
        elif scheme == "ulysses":
            out, lse = ulysses.ulysses_attention(q, k, v, setting, comm, layout, with_lse=with_lse)
        elif scheme == "usp":
            out, lse = usp.usp_attention(q, k, v, setting, comm, layout, setting.ulysses_size, with_lse=with_lse)
        elif scheme == "tree":
            out, lse = tree.tree_attention(q, k, v, setting, comm, layout)
        else:
            out, lse = allgather.allgather_attention(q, k, v, setting, comm, layout)
        if sinks is not None:  # once, on the merged rows
            out, lse = join(out, lse, check_sinks(sinks, q, q, who=_WHO))
            out = out.to(q.dtype)
    return AttentionOutput(out, None, lse) if return_lse else out


def prepare(q, k, v, *, mask, bias, scale, scheme, layout, group, return_lse=False,
            ulysses_size=None, sinks=None) -> tuple[Comm, Setting]:
    """Validate a call, build what its blocks share (the chunk plan included) and check that every rank agrees."""
    comm = Comm(group)
    setting = checked(comm, _WHO, lambda: plan(q, k, v, mask=mask, bias=bias, scale=scale, scheme=scheme,
                                               layout=layout, world=comm.world, ulysses_size=ulysses_size,
                                               sinks=sinks),
                      lambda setting: _call_fields(q, k, v, mask=mask, bias=bias, scale=scale, scheme=scheme,
                                                   layout=layout, return_lse=return_lse, setting=setting,
                                                   ulysses_size=ulysses_size, sinks=sinks),
                      device=getattr(q, "device", None))
    return comm, setting


def _call_fields(q, k, v, *, mask, bias, scale, scheme, layout, return_lse, setting,
                 ulysses_size=None, sinks=None) -> list[Field]:
    """What every rank's call must share, read without raising (a rank whose checks failed still reports)."""
    chunk_plan = "none" if setting is None else _plan_text(setting.active_map, setting.full_map)
    return [Field("the batch (q.shape[0])", size(q, 0), ShapeError),
            Field("the query heads (q.shape[1])", size(q, 1), ShapeError),
            Field("the K/V heads (k.shape[1])", size(k, 1), ShapeError),
            Field("the shard length (q.shape[-2])", size(q, 2), ShapeError),
            Field("the K/V shard length (k.shape[-2])", size(k, 2), ShapeError),
            Field("the head dim (q.shape[-1])", size(q, 3), ShapeError),
            Field("the value dim (v.shape[-1])", size(v, 3), ShapeError),
            Field("the dtypes of q, k, v", ", ".join(str(getattr(t, "dtype", type(t).__name__)) for t in (q, k, v)),
                  DTypeError),
            Field("scheme", repr(scheme)), Field("layout", repr(layout)),
            Field("the mask", text_of(mask)), Field("the bias", text_of(bias)), Field("scale", repr(scale)),
            Field("return_lse", int(bool(return_lse))), Field("ulysses_size", repr(ulysses_size)),
            Field("the sinks", text_of(sinks)), tracked(q, k, v, sinks),
            Field("the mask's chunk plan", chunk_plan)]


def _plan_text(active: torch.Tensor, full: torch.Tensor) -> str:
    crc = zlib.crc32(active.numpy().tobytes() + full.numpy().tobytes())
    return f"{int(active.sum())} active and {int(full.sum())} full of {active.numel()} chunk pairs (CRC {crc:08x})"


def plan(q, k, v, *, mask, bias, scale, scheme, layout, world: int, ulysses_size=None, sinks=None) -> Setting:
    """Check one rank's call on its own (no communication) and build its :class:`Setting`."""
    if scheme not in SCHEMES + DECODE_SCHEMES:
        raise ArgumentError(f"{_WHO}: scheme must be one of {SCHEMES + DECODE_SCHEMES}; got {scheme!r}")
    if ulysses_size is not None and scheme != "usp":
        raise ArgumentError(f"{_WHO}: ulysses_size is for scheme='usp'; got scheme={scheme!r}")
    check_layout(layout)
    decode = scheme in DECODE_SCHEMES
    _check_inputs(q, k, v, decode)
    check_sinks(sinks, q, q, who=_WHO)
    batch, heads, q_local, head_dim = q.shape
    length = k.shape[-2] * world
    q_len = q_local if decode else length
    chunk = chunk_size(length, layout, world, "the global length L = W * k.shape[-2]")
    if scheme == "ulysses":
        ulysses.check_heads(heads, world)
    size = usp.ulysses_size(heads, k.shape[1], world, ulysses_size) if scheme == "usp" else None
    mask = _check_mask(mask, batch, heads, length, q_len if decode else None)
    bias = _check_bias(bias, batch, heads, length, q_len if decode else None)
    if scheme in ("ring", "usp") and _learned(bias):
        raise ArgumentError(f"{_WHO}: scheme={scheme!r} runs the ring, which recomputes its blocks in its own "
                            "backward and gives no gradient to a learned bias (a bias tensor or modifier with "
                            "parameters that require grad); use scheme='ulysses' or 'allgather', whose backward "
                            "is autograd's")
    if decode:  # every rank computes each of its chunks: a decoding step's plan is the whole row of chunks
        active_map = full_map = torch.ones(1, length // chunk if length else 0, dtype=torch.bool)
    else:
        active_map, full_map = chunk_maps(mask, length, chunk, batch, heads, q.device)
    return Setting(mask=mask, bias=bias, scale=default_scale("scaled_dot", head_dim) if scale is None else scale,
                   length=length, chunk=chunk, active=as_rows(active_map), full=as_rows(full_map),
                   active_map=active_map, full_map=full_map, ulysses_size=size)
