"""The fuzzer's other entry points: packed documents, paged caches, the linear recurrences and FlexAttention's API.

:mod:`tests.fuzz.cases` draws calls of :func:`attnkit.attention` (sinks, selected keys, block
masks and every normaliser among them); here hypothesis draws calls of the surfaces that reach
it another way, each checked against a float64 oracle written in the tests:

- :func:`attnkit.varlen_attn`: documents of lengths 0 to 40 (keys per document the same or not,
  ``seqused_k``, grouped heads, any window), against each document alone (:func:`tests.oracle.dense_attention`);
- a paged KV cache (``block_table=``, ``seqused_k=``, pages permuted among spare pages holding NaN,
  empty sequences, sinks, causal or a window) on every backend, against each sequence alone;
- the linear recurrences (retention, GLA, SSD, DeltaNet, Gated DeltaNet, KDA) in each form and chunk size,
  against the token-by-token recurrence of :mod:`tests.functional.recurrences.cases`;
- :func:`attnkit.flex_attention` with a ``BlockMask`` (per batch and head, or ``B=None``/``H=None`` with a
  ``mask_mod`` that reads neither) and a ``score_mod``, against the dense mask and modifier.

Outputs and gradients obey the rule of :mod:`tests.fuzz.differential`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from hypothesis import strategies as st

import attnkit
from attnkit import masks
from attnkit.errors import BackendError
from tests.functional.recurrences import cases as linear_cases
from tests.fuzz.differential import GRAD_TOL, OUT_TOL, _close
from tests.helpers import BACKENDS
from tests.oracle import dense_attention

DTYPES = (torch.float64, torch.float32)


@dataclass
class Surface:
    """One drawn call: ``kind`` names the surface, ``options`` what was drawn, ``seed`` the tensors."""

    kind: str
    seed: int
    dtype: torch.dtype
    options: dict


def _randn(g, *shape, dtype):
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)


def _compare(what, got, exact, plain, grads, exact_grads, plain_grads, dtype):
    _close(f"{what}: output", got, exact, OUT_TOL[dtype], plain)
    for name, g, e, p in zip("qkvs", grads, exact_grads, plain_grads, strict=False):
        _close(f"{what}: d{name}", g, e, GRAD_TOL[dtype], p)


def _grads(out, inputs, probe):
    found = torch.autograd.grad((out * probe.to(out.dtype)).sum(), inputs, allow_unused=True)
    return [torch.zeros_like(t) if g is None else g for g, t in zip(found, inputs, strict=True)]


# ------------------------------------------------------------------ packed documents
@st.composite
def varlen_calls(draw) -> Surface:
    docs = draw(st.integers(1, 4))
    q_lengths = draw(st.lists(st.integers(0, 40), min_size=docs, max_size=docs))
    k_lengths = q_lengths if draw(st.booleans()) else draw(st.lists(st.integers(0, 40), min_size=docs, max_size=docs))
    used = None if draw(st.booleans()) else [draw(st.integers(0, n)) for n in k_lengths]
    left, right = draw(st.sampled_from([-1, 0, 3, 10])), draw(st.sampled_from([-1, 0, 2]))
    return Surface("varlen", draw(st.integers(0, 2**31 - 1)), draw(st.sampled_from(DTYPES)), dict(
        q_lengths=q_lengths, k_lengths=k_lengths, used=used, window=(left, right), kv_heads=draw(st.integers(1, 2)),
        groups=draw(st.integers(1, 2)), d=draw(st.sampled_from([3, 8])), grad=draw(st.booleans())))


def _window(lq, lk, left, right):
    """FlashAttention's window, bottom-right: query i sits at i + lk - lq (-1: unbounded)."""
    i = torch.arange(lq)[:, None] + lk - lq
    j = torch.arange(lk)[None, :]
    return ((j >= i - left) | (left < 0)) & ((j <= i + right) | (right < 0))


def _per_document(q, k, v, o, dtype):
    outs, start_q, start_k = [], 0, 0
    for n, (lq, lk) in enumerate(zip(o["q_lengths"], o["k_lengths"], strict=True)):
        keys = lk if o["used"] is None else o["used"][n]
        qd = q[start_q:start_q + lq].transpose(0, 1)[None]
        kd, vd = (t[start_k:start_k + keys].transpose(0, 1)[None] for t in (k, v))
        out = dense_attention(qd, kd, vd, mask=_window(lq, keys, *o["window"]), dtype=dtype, differentiable=True)
        outs.append(out[0].transpose(0, 1))
        start_q, start_k = start_q + lq, start_k + lk
    return torch.cat(outs)


def check_varlen(s: Surface) -> None:
    o = s.options
    g = torch.Generator().manual_seed(s.seed)
    heads, hkv = o["kv_heads"] * o["groups"], o["kv_heads"]
    q = _randn(g, sum(o["q_lengths"]), heads, o["d"], dtype=s.dtype).requires_grad_(o["grad"])
    k, v = (_randn(g, sum(o["k_lengths"]), hkv, o["d"], dtype=s.dtype).requires_grad_(o["grad"]) for _ in range(2))
    cu = lambda lengths: torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    used = None if o["used"] is None else torch.tensor(o["used"])
    got = attnkit.varlen_attn(q, k, v, cu(o["q_lengths"]), cu(o["k_lengths"]), max(o["q_lengths"]),
                              max(o["k_lengths"]), window_size=o["window"], enable_gqa=o["groups"] > 1, seqused_k=used)
    exact = _per_document(q, k, v, o, torch.float64)
    plain = None if s.dtype == torch.float64 else _per_document(q, k, v, o, torch.float32)
    inputs = [q, k, v] if o["grad"] else []
    probe = _randn(g, *got.shape, dtype=torch.float64)
    grads = [_grads(t, inputs, probe) if inputs and t is not None and t.numel() else [] for t in (got, exact, plain)]
    _compare("varlen_attn", got, exact, plain, *grads, s.dtype)


# ------------------------------------------------------------------ paged caches
@st.composite
def paged_calls(draw) -> Surface:
    batch = draw(st.integers(1, 3))
    return Surface("paged", draw(st.integers(0, 2**31 - 1)), draw(st.sampled_from(DTYPES)), dict(
        lengths=draw(st.lists(st.integers(0, 60), min_size=batch, max_size=batch)),
        page_size=draw(st.sampled_from([1, 3, 8, 16])), spare=draw(st.integers(0, 3)), lq=draw(st.integers(1, 4)),
        kv_heads=draw(st.integers(1, 2)), groups=draw(st.integers(1, 3)), d=draw(st.sampled_from([3, 8])),
        window=draw(st.sampled_from([None, None, 0, 5])), sinks=draw(st.sampled_from([None, "plain", "-inf"]))))


def _pool(g, keys, values, page_size, spare):
    """Each sequence's keys ``(Hkv, L_b, D)`` on randomly permuted pages of a pool whose other lanes hold NaN."""
    counts = [-(-k.shape[1] // page_size) for k in keys]
    order = torch.randperm(sum(counts) + spare, generator=g)
    pools = [torch.full((len(order), page_size, t[0].shape[0], t[0].shape[2]), math.nan, dtype=t[0].dtype)
             for t in (keys, values)]
    table = torch.zeros(len(keys), max(1, *counts), dtype=torch.long)
    used = 0
    for b, kv in enumerate(zip(keys, values, strict=True)):
        table[b, :counts[b]] = order[used:used + counts[b]]
        for t in range(kv[0].shape[1]):
            for pool, x in zip(pools, kv, strict=True):
                pool[table[b, t // page_size], t % page_size] = x[:, t]
        used += counts[b]
    return (*pools, table)


def _per_sequence(q, keys, values, window, sinks, dtype):
    outs = []
    for b, (k, v) in enumerate(zip(keys, values, strict=True)):
        i = torch.arange(q.shape[2])[:, None] + k.shape[1] - q.shape[2]
        j = torch.arange(k.shape[1])[None, :]
        allowed = (j <= i) & ((j >= i - window) if window is not None else True)
        outs.append(dense_attention(q[b:b + 1], k[None], v[None], mask=allowed, sinks=sinks, dtype=dtype,
                                    differentiable=True))
    return torch.cat(outs)


def check_paged(s: Surface) -> None:
    o = s.options
    g = torch.Generator().manual_seed(s.seed)
    hkv, heads = o["kv_heads"], o["kv_heads"] * o["groups"]
    keys = [_randn(g, hkv, n, o["d"], dtype=s.dtype) for n in o["lengths"]]
    values = [_randn(g, hkv, n, o["d"], dtype=s.dtype) for n in o["lengths"]]
    k_pool, v_pool, table = _pool(g, keys, values, o["page_size"], o["spare"])
    q = _randn(g, len(keys), heads, o["lq"], o["d"], dtype=s.dtype).requires_grad_()
    sinks = None if o["sinks"] is None else (2 * _randn(g, heads, dtype=s.dtype))
    if o["sinks"] == "-inf":
        sinks[::2] = -math.inf
    sinks = None if sinks is None else sinks.requires_grad_()
    mask = masks.causal() if o["window"] is None else masks.sliding_window(o["window"], 0)
    inputs = [q] + ([] if sinks is None else [sinks])
    exact = _per_sequence(q, keys, values, o["window"], sinks, torch.float64)
    plain = None if s.dtype == torch.float64 else _per_sequence(q, keys, values, o["window"], sinks, torch.float32)
    probe = _randn(g, *exact.shape, dtype=torch.float64)
    want = [_grads(t, inputs, probe) if t is not None else [] for t in (exact, plain)]
    for backend in ("auto", *BACKENDS):
        try:
            got = attnkit.attention(q, k_pool, v_pool, block_table=table, seqused_k=torch.tensor(o["lengths"]),
                                    mask=mask, sinks=sinks, backend=backend)
        except BackendError:
            assert backend != "auto", "backend='auto' raised BackendError"
            continue
        _compare(f"paged, backend={backend}", got, exact, plain, _grads(got, inputs, probe), *want, s.dtype)


# ------------------------------------------------------------------ the linear recurrences
@st.composite
def linear_calls(draw) -> Surface:
    return Surface("linear", draw(st.integers(0, 2**31 - 1)), torch.float64, dict(
        name=draw(st.sampled_from(linear_cases.NAMES)), b=draw(st.integers(1, 2)), h=draw(st.integers(1, 4)),
        n=draw(st.sampled_from([0, 1, 2, 5, 9, 16, 23])), dk=draw(st.integers(1, 6)), dv=draw(st.integers(1, 6)),
        initial=draw(st.booleans()), form=draw(st.sampled_from(["parallel", "chunk", "recurrent"])),
        chunk_size=draw(st.integers(1, 8))))


def check_linear(s: Surface) -> None:
    o = dict(s.options)
    name, form, chunk = o.pop("name"), o.pop("form"), o.pop("chunk_size")
    case = linear_cases.make(name, seed=s.seed % 10_000, grad=True, **o)
    out, state = case.call(form, chunk_size=chunk)
    want_out, want_state = case.expected()
    what = f"{name} ({form}, chunk {chunk})"
    _close(f"{what}: output", out, want_out, OUT_TOL[torch.float64])
    _close(f"{what}: final state", state, want_state, OUT_TOL[torch.float64])
    # q, k, v (SSD: x, dt, A): the ones the oracle differentiates (it derives the decays from the others up front)
    leaves = case.leaves[:3]
    if out.numel():
        probe = torch.randn(out.shape, generator=torch.Generator().manual_seed(s.seed), dtype=torch.float64)
        for i, (g, e) in enumerate(zip(_grads(out, leaves, probe), _grads(want_out, leaves, probe), strict=True)):
            _close(f"{what}: gradient of input {i}", g, e, GRAD_TOL[torch.float64])


# ------------------------------------------------------------------ FlexAttention's API
_MASK_MODS = {  # name -> (mask_mod, reads b or h)
    "causal": (lambda b, h, i, j: i >= j, False),
    "window": (lambda b, h, i, j: (i - j).abs() <= 9, False),
    "documents": (lambda b, h, i, j: i // 24 == j // 24, False),
    "pattern": (lambda b, h, i, j: (i + 2 * j) % 3 != 0, False),
    "per head and batch": (lambda b, h, i, j: (i >= j) | ((b + h) % 2 == 1), True),
}
_SCORE_MODS = {
    "none": None,
    "relative": lambda score, b, h, i, j: score + (j - i) / 16,
    "soft-cap": lambda score, b, h, i, j: 5 * torch.tanh(score / 5),
}


@st.composite
def flex_calls(draw) -> Surface:
    mask_mod = draw(st.sampled_from(list(_MASK_MODS)))
    return Surface("flex", draw(st.integers(0, 2**31 - 1)), draw(st.sampled_from(DTYPES)), dict(
        batch=draw(st.integers(1, 2)), heads=draw(st.integers(1, 3)), lq=draw(st.integers(1, 80)),
        lk=draw(st.integers(1, 80)), d=draw(st.sampled_from([4, 8])), mask_mod=mask_mod,
        sized=_MASK_MODS[mask_mod][1] or draw(st.booleans()), block=draw(st.sampled_from([16, 32, 128])),
        score_mod=draw(st.sampled_from(list(_SCORE_MODS))), lse=draw(st.booleans())))


def check_flex(s: Surface) -> None:
    from torch.nn.attention.flex_attention import create_block_mask

    o = s.options
    g = torch.Generator().manual_seed(s.seed)
    q, k, v = (_randn(g, o["batch"], o["heads"], n, o["d"], dtype=s.dtype).requires_grad_()
               for n in (o["lq"], o["lk"], o["lk"]))
    mod = _MASK_MODS[o["mask_mod"]][0]
    sizes = (o["batch"], o["heads"]) if o["sized"] else (None, None)
    bm = create_block_mask(mod, *sizes, o["lq"], o["lk"], device="cpu", BLOCK_SIZE=o["block"])
    b, h = torch.arange(o["batch"]).view(-1, 1, 1, 1), torch.arange(o["heads"]).view(1, -1, 1, 1)
    allowed = mod(b, h, torch.arange(o["lq"]).view(-1, 1), torch.arange(o["lk"]))
    score_mod = _SCORE_MODS[o["score_mod"]]
    got = attnkit.flex_attention(q, k, v, block_mask=bm, score_mod=score_mod, return_lse=o["lse"])
    out, lse = got if o["lse"] else (got, None)
    kwargs = dict(mask=torch.broadcast_to(allowed, (o["batch"], o["heads"], o["lq"], o["lk"])), bias=score_mod,
                  differentiable=True, return_lse=True)
    exact = dense_attention(q, k, v, **kwargs)
    plain = None if s.dtype == torch.float64 else dense_attention(q, k, v, dtype=torch.float32, **kwargs).output
    if lse is not None:
        _close("flex_attention: lse", lse, exact.lse, OUT_TOL[s.dtype])
    probe = _randn(g, *out.shape, dtype=torch.float64)
    inputs = [q, k, v]
    grads = [_grads(t, inputs, probe) if t is not None else [] for t in (out, exact.output, plain)]
    _compare(f"flex_attention ({o['mask_mod']}, {o['score_mod']})", out, exact.output, plain, *grads, s.dtype)


CHECKS = {"varlen": check_varlen, "paged": check_paged, "linear": check_linear, "flex": check_flex}


SURFACES = {"varlen": varlen_calls(), "paged": paged_calls(), "linear": linear_calls(), "flex": flex_calls()}


def surface_calls():
    """One strategy over every surface."""
    return st.one_of(*SURFACES.values())


def check_surface(s: Surface) -> None:
    CHECKS[s.kind](s)
