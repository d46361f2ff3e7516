"""What the spawned ranks run: every scheme x layout x case against single-process attnkit.attention.

Each rank builds the same full float64 tensors, computes the single-process answer
(``attnkit.attention(..., backend="reference")`` on the full tensors: output, lse and the
gradients of q, k, v for a loss on both), takes its shards, runs the distributed call
with the same loss restricted to its shard, and reports the largest differences on its
shard. The parent test asserts them; nothing is asserted inside the ranks.
"""

from __future__ import annotations

import functools
import itertools

import torch
import torch.distributed

import attnkit
from attnkit import bias, masks
from attnkit.distributed import SCHEMES, attention, count_bytes, shard
from attnkit.distributed.accounting import expected_bytes
from tests.oracle import dense_attention

LAYOUTS = ("contiguous", "zigzag")
# Sizes: L divisible by 2W for W = 2, 3, 4; H divisible by 2, 3, 4 (Ulysses); D != Dv.
BATCH, HEADS, LENGTH, HEAD_DIM, VALUE_DIM = 2, 12, 24, 5, 3


def cases(length=LENGTH, heads=HEADS):
    """name -> keyword arguments of the call (``kv_heads`` picks grouped-query K/V heads)."""
    ids = torch.tensor([[0] * 5 + [1] * 11 + [2] * (length - 16), [0] * 13 + [1] * (length - 13)])
    half = length // 2
    return {
        "none": {},
        "causal": {"mask": masks.causal()},
        "causal_window": {"mask": masks.causal() & masks.sliding_window(3)},
        "window_both_sides": {"mask": masks.sliding_window(3, 4)},  # the ring's two-way halo
        "documents": {"mask": masks.segments(ids) & masks.causal()},
        "padding": {"mask": masks.padding([length - 5, 7])},
        "gqa": {"kv_heads": 4, "mask": masks.causal()},
        "alibi": {"bias": bias.alibi(heads), "mask": masks.causal()},
        # Rows past the middle see no key: whole blocks, and the last contiguous rank's whole share, are empty.
        "empty_rows_alibi": {"bias": bias.alibi(heads),
                             "mask": masks.from_function(lambda b, h, i, j: i < half, "first_half") & masks.causal()},
    }


def _tensors(seed, kv_heads, length, device=None):
    g = torch.Generator().manual_seed(seed)
    draw = lambda *shape: torch.randn(*shape, dtype=torch.float64, generator=g).to(device)  # same numbers anywhere
    return (draw(BATCH, HEADS, length, HEAD_DIM), draw(BATCH, kv_heads, length, HEAD_DIM),
            draw(BATCH, kv_heads, length, VALUE_DIM), draw(BATCH, HEADS, length, VALUE_DIM), draw(BATCH, HEADS, length))


def _loss(out, lse, g_out, g_lse):
    return (out * g_out).sum() + (lse.masked_fill(lse == float("-inf"), 0) * g_lse).sum()


def _lse_error(got, want):
    """Largest difference of two lse tensors; inf if they disagree on which rows are -inf."""
    if not torch.equal(got == float("-inf"), want == float("-inf")):
        return float("inf")
    finite = want != float("-inf")
    return (got[finite] - want[finite]).abs().max().item() if finite.any() else 0.0


def compare(scheme, layout, kwargs, *, group=None, seed=0, length=LENGTH, options=None, device=None):
    """``[output, lse, dq, dk, dv]`` largest differences on this rank's shard (``options``: of the distributed call
    only, e.g. ``ulysses_size``; ``device``: where the tensors live, this rank's GPU under NCCL)."""
    kwargs = dict(kwargs)
    q, k, v, g_out, g_lse = _tensors(seed, kwargs.pop("kv_heads", HEADS), length, device)
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    want = attnkit.attention(*full, return_lse=True, backend="reference", **kwargs)
    _loss(want.output, want.lse, g_out, g_lse).backward()
    cut = lambda t, dim=-2: shard(t, dim=dim, layout=layout, group=group)
    local = [cut(t).requires_grad_() for t in (q, k, v)]
    got = attention(*local, scheme=scheme, layout=layout, group=group, return_lse=True, **kwargs, **(options or {}))
    _loss(got.output, got.lse, cut(g_out), cut(g_lse, -1)).backward()
    errors = [(got.output - cut(want.output)).abs().max().item(), _lse_error(got.lse, cut(want.lse, -1))]
    return errors + [(a.grad - cut(b.grad)).abs().max().item() for a, b in zip(local, full, strict=True)]


def sink_cases(length=LENGTH):
    """name -> keyword arguments of the calls with attention sinks: causal, window, block-sparse, padding masks."""
    return {"none": {}, "causal": {"mask": masks.causal()},
            "window": {"mask": masks.causal() & masks.sliding_window(3), "kv_heads": 4},
            "block_sparse": {"mask": masks.causal() & masks.strided(5)},
            "padding": {"mask": masks.padding([length - 5, 7])},
            # Rows past the middle see no key, and every other head's sink is -inf (plain softmax there).
            "empty_rows_minus_inf": {"mask": masks.from_function(lambda b, h, i, j: i < length // 2, "first_half")
                                     & masks.causal(), "minus_inf_heads": True},
            "per_token": {"mask": masks.causal(), "per_token": True}}


def compare_sinks(scheme, layout, kwargs, *, group=None, seed=0, length=LENGTH):
    """``[output, lse, dq, dk, dv, dsinks]`` largest differences against the float64 oracle (tests/oracle.py);
    the sinks' gradient summed over the ranks (``per_token``: a sink per row ``(B, H, L)``, each rank given its
    rows' share in the layout's order, its gradient compared on the shard)."""
    kwargs = dict(kwargs)
    per_token = kwargs.pop("per_token", False)
    q, k, v, g_out, g_lse = _tensors(seed, kwargs.pop("kv_heads", HEADS), length)
    shape = (BATCH, HEADS, length) if per_token else (HEADS,)
    sinks = 2 * torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed + 1))
    if kwargs.pop("minus_inf_heads", False):
        (sinks[:, ::2] if per_token else sinks[::2]).fill_(float("-inf"))
    full = [t.clone().requires_grad_() for t in (q, k, v, sinks)]
    want = dense_attention(*full[:3], sinks=full[3], return_lse=True, differentiable=True, **kwargs)
    _loss(want.output, want.lse, g_out, g_lse).backward()
    cut = lambda t, dim=-2: shard(t, dim=dim, layout=layout, group=group)
    local = [cut(t).requires_grad_() for t in (q, k, v)] + [(cut(sinks, -1) if per_token else sinks.clone())
                                                            .requires_grad_()]
    got = attention(*local[:3], sinks=local[3], scheme=scheme, layout=layout, group=group, return_lse=True,
                    **kwargs)
    _loss(got.output, got.lse, cut(g_out), cut(g_lse, -1)).backward()
    dsinks = local[3].grad.clone()
    if per_token:
        sink_error = (dsinks - cut(full[3].grad, -1)).abs().max().item()
    else:
        torch.distributed.all_reduce(dsinks, group=group)  # each rank holds its rows' share
        sink_error = (dsinks - full[3].grad).abs().max().item()
    errors = [(got.output - cut(want.output)).abs().max().item(), _lse_error(got.lse, cut(want.lse, -1))]
    errors += [(a.grad - cut(b.grad)).abs().max().item() for a, b in zip(local[:3], full[:3], strict=True)]
    return errors + [sink_error]  # NaN anywhere makes the error NaN: fails


def sink_sweep(group=None):
    """Every scheme x layout x sink case: ``{(scheme, layout, case): errors}``."""
    return {(scheme, layout, name): compare_sinks(scheme, layout, kw, group=group)
            for (name, kw), scheme, layout in itertools.product(sink_cases().items(), SCHEMES, LAYOUTS)}


def sweep(group=None, *, seed=0, length=LENGTH, device=None):
    """Every scheme x layout x case on ``group``: ``{(scheme, layout, case): errors}``."""
    return {(scheme, layout, name): compare(scheme, layout, kw, group=group, seed=seed, length=length, device=device)
            for (name, kw), scheme, layout in itertools.product(cases(length).items(), SCHEMES, LAYOUTS)}


def measured_bytes(scheme, layout, *, mask=None, kv_heads=HEADS, length=LENGTH, dtype=torch.float64,
                   return_lse=False, expected=False, options=None):
    """``(forward, backward)`` bytes this rank sent in one call, counted by attnkit.distributed.count_bytes.

    With ``expected``, also what :func:`attnkit.distributed.accounting.expected_bytes` says for that call.
    ``options``: more keyword arguments of both (``ulysses_size``).
    """
    q, k, v, _, _ = _tensors(4, kv_heads, length)
    local = [shard(t.to(dtype), layout=layout).requires_grad_() for t in (q, k, v)]
    options = options or {}
    if expected:
        want = expected_bytes(*local, mask=mask, scheme=scheme, layout=layout, return_lse=return_lse, **options)
        return measured_bytes(scheme, layout, mask=mask, kv_heads=kv_heads, length=length, dtype=dtype,
                              return_lse=return_lse, options=options), want
    with count_bytes() as forward:
        got = attention(*local, mask=mask, scheme=scheme, layout=layout, return_lse=return_lse, **options)
    out = got.output if return_lse else got
    loss = out.sum() + (got.lse.masked_fill(got.lse == float("-inf"), 0).sum() if return_lse else 0)
    with count_bytes() as backward:
        loss.backward()
    return forward.total, backward.total


def padded_run(build, call, *, layout, fill, padded, length=LENGTH, dim=12):
    """A module on this rank's shards of ``(2, length, dim)`` inputs whose sample 1 ends in ``padded`` padding
    positions holding ``fill``; a loss over the real positions only. Answers the outputs at real positions,
    the parameter gradients summed over ranks and the input shard's gradient."""
    torch.manual_seed(0)
    module = build().double()
    cut = lambda t: shard(t, dim=1, layout=layout)
    keep = cut(torch.arange(length)[None, :] < torch.tensor([[length], [length - padded]]))
    x = cut(torch.randn(2, length, dim, dtype=torch.float64, generator=torch.Generator().manual_seed(3)))
    x[~keep] = fill
    x.requires_grad_()
    out = call(module, x, keep)
    out[keep].sum().backward()
    grads = [p.grad.clone() for p in module.parameters()]
    for g in grads:
        torch.distributed.all_reduce(g)
    return out[keep].detach(), grads, x.grad


def padding_is_inert(build, call, *, layout, padded):
    """Per non-finite fill: (everything finite, largest difference from the run with zeros at the padding)."""
    run = functools.partial(padded_run, build, call, layout=layout, padded=padded)
    ref_out, ref_grads, _ = run(fill=0.0)
    found = {}
    for fill in (float("nan"), float("inf"), -float("inf")):
        out, grads, x_grad = run(fill=fill)
        finite = all(bool(torch.isfinite(t).all()) for t in (out, x_grad, *grads))
        diff = max((a - b).abs().max().item() for a, b in zip((out, *grads), (ref_out, *ref_grads), strict=True))
        found[fill] = (finite, diff if finite else float("inf"))
    return found


def raised(calls) -> dict:
    """``name -> (error class name, message)`` of each call (``("no error", "")`` when it returned)."""
    found = {}
    for name, call in calls.items():
        try:
            call()
            found[name] = ("no error", "")
        except attnkit.AttnkitError as e:
            found[name] = (type(e).__name__, str(e))
    return found
