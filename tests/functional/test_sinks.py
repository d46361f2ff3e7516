"""Learned attention sinks (``attention(..., sinks=s)``) on every execution path, against float64 oracles.

The oracle (tests/oracle.py) appends the sink as one more column of every row's softmax and drops
its weight; it shares no code with functional/sinks.py or the kernels. Outputs and the gradients of
q, k, v and the sinks are compared on every path (``backend="auto"`` reaching each row of the
table), on every public backend with causal, window, block-sparse and padding masks, for rows
with no allowed key, and at ``s = -inf`` (plain softmax). The error of a float32 run is at most
2x (3x for gradients) the plain float32 oracle's, plus a small floor (DESIGN.md section 5).
"""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit import masks
from attnkit.bias import ALiBi, Softcap
from attnkit.errors import ArgumentError, BackendError, DeviceError, DTypeError, ShapeError
from attnkit.functional import sinks as sink_ops
from attnkit.kernels import paths
from tests.helpers import BACKENDS, rand_qkv
from tests.oracle import dense_attention

FLOOR = {torch.float32: 3e-6, torch.float64: 1e-12}


def _sinks(heads, shape=None, seed=9, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (2.0 * torch.randn(shape or (heads,), generator=g, dtype=torch.float64)).to(dtype).requires_grad_()


def _err(got, exact):
    """Largest difference; equal infinities (the lse of a row with no key and a ``-inf`` sink) differ by 0."""
    if not exact.numel():
        return 0.0
    got, exact = got.double(), exact.double()
    same = (got == exact) & exact.isinf()
    return (got - exact).masked_fill(same, 0.0).abs().max().item()


def _loss_and_probe(out, lse=None, seed=3):
    g = torch.Generator().manual_seed(seed)
    probe = torch.randn(out.shape, generator=g, dtype=torch.float64)
    loss = (out.double() * probe).sum()
    if lse is not None:  # an lse of -inf (no key and a -inf sink) has no gradient to follow
        finite = lse.double().masked_fill(lse == float("-inf"), 0.0)
        loss = loss + (finite * torch.randn(lse.shape, generator=g, dtype=torch.float64)).sum()
    return loss


def check_against_oracle(q, k, v, s, *, with_lse=False, factor=2.0, **kwargs):
    """Output (and lse) and the gradients of q, k, v and the sinks vs float64, within the tolerance rule."""
    got = attnkit.attention(q, k, v, sinks=s, return_lse=with_lse, **kwargs)
    out, lse = (got.output, got.lse) if with_lse else (got, None)
    inputs = [q, k, v, s]
    answers = {}
    for dtype in (torch.float64, torch.float32):
        exact = dense_attention(q, k, v, sinks=s, dtype=dtype, differentiable=True, return_lse=with_lse, **kwargs)
        e_out, e_lse = (exact.output, exact.lse) if with_lse else (exact, None)
        grads = torch.autograd.grad(_loss_and_probe(e_out, e_lse), inputs, allow_unused=True)
        answers[dtype] = (e_out, e_lse, grads)
    grads = torch.autograd.grad(_loss_and_probe(out, lse), inputs, allow_unused=True)
    (x_out, x_lse, x_grads), (p_out, p_lse, p_grads) = answers[torch.float64], answers[torch.float32]
    floor = FLOOR[q.dtype]
    pairs = [("output", out, x_out, p_out, factor)] + ([("lse", lse, x_lse, p_lse, factor)] if with_lse else [])
    pairs += [(name, g, x, p, 1.5 * factor) for name, g, x, p in zip("qkvs", grads, x_grads, p_grads, strict=True)]
    for name, g, x, p, f in pairs:
        g = torch.zeros_like(x) if g is None else g
        p = torch.zeros_like(x) if p is None else p
        scale = 1.0 + x.masked_fill(x.isinf(), 0).abs().max().item() if x.numel() else 1.0
        assert g.shape == x.shape, (name, g.shape, x.shape)
        assert _err(g, x) <= f * _err(p, x) + floor * scale, f"{name}: {_err(g, x):.3g} vs plain {_err(p, x):.3g}"
    return out


# ------------------------------------------------------------------ the sink algebra
def test_join_and_its_backward_are_the_sink_softmax_in_float64():
    q, k, v = rand_qkv(2, 3, 5, 7, 11, dtype=torch.float64, requires_grad=True, seed=1)
    s = _sinks(3, dtype=torch.float64)
    mask = masks.causal(align="top_left") & masks.keys(torch.tensor([[True] * 7, [False] * 2 + [True] * 5]))
    plain = attnkit.attention(q, k, v, mask=mask, return_lse=True, backend="reference")
    out, lse = sink_ops.join(plain.output, plain.lse, s[None])  # sinks as (B|1, H|1)
    exact = dense_attention(q, k, v, mask=mask, sinks=s, return_lse=True, differentiable=True)
    assert _err(out, exact.output) < 1e-13 and _err(lse, exact.lse) < 1e-13
    grads = torch.autograd.grad(_loss_and_probe(out, lse), [q, k, v, s])
    want = torch.autograd.grad(_loss_and_probe(exact.output, exact.lse), [q, k, v, s])
    assert max(_err(g, w) for g, w in zip(grads, want, strict=True)) < 1e-12
    o, l_ = (torch.randn(2, 3, 4, 5, dtype=torch.float64, requires_grad=True) for _ in range(2))
    assert torch.autograd.gradcheck(sink_ops.join, (o, l_[..., 0], s.detach()[None].clone().requires_grad_()))


def test_kernel_gradient_is_the_joins_gradient_of_the_sinks():
    out, lse = torch.randn(2, 3, 6, 4, dtype=torch.float64), torch.randn(2, 3, 6, dtype=torch.float64)
    lse[0, 1, 2] = float("-inf")  # a row with no key
    out[0, 1, 2] = 0
    s = torch.randn(1, 3, dtype=torch.float64, requires_grad=True)
    dout, dlse = torch.randn(2, 3, 6, 4, dtype=torch.float64), torch.randn(2, 3, 6, dtype=torch.float64)
    out_s, lse_s = sink_ops.join(out, lse, s)
    (want,) = torch.autograd.grad((out_s * dout).sum() + (lse_s * dlse).sum(), s)
    got = sink_ops.kernel_gradient(dout, out_s.detach(), lse_s.detach(), s.detach(), dlse)
    assert got.shape == s.shape and _err(got, want) < 1e-13


# ------------------------------------------------------------------ every path, every backend
# One call per path that backend="auto" sends there, with sinks.
REACH = {
    "torch-sdpa": (dict(lq=64, lk=64, hkv=1), dict(mask=masks.causal())),
    "band-windows": (dict(lq=300, lk=300), dict(mask=masks.sliding_window(16, 16))),
    "fixed-blocks": (dict(lq=300, lk=300, hkv=1), dict(mask=masks.causal() & masks.fixed(64, 8))),
    "blocksparse-fused": (dict(lq=512, lk=512), dict(mask=masks.segments(torch.arange(512) // 64))),
    "blocksparse-masked": (dict(lq=512, lk=512, dv=13), dict(mask=masks.segments(torch.arange(512) // 64))),
    "blocksparse-gathered": (dict(lq=512, lk=512), dict(mask=masks.segments(torch.arange(512) // 64),
                                                        score="cosine")),
    "bias-slabs": (dict(lq=300, lk=300), dict(bias=ALiBi(3), mask=masks.causal())),
    "softcap-loop": (dict(lq=300, lk=300), dict(bias=Softcap(5.0))),
    "online-softmax": (dict(lq=300, lk=300, hkv=1), dict(score="cosine", mask=masks.causal())),
    "dense-reference": (dict(lq=30, lk=40), dict(mask=masks.causal(), score=lambda q, k: q @ k.transpose(-1, -2))),
}


def test_every_path_is_reached_with_sinks():
    # paged calls (block_table=) with sinks: tests/kernels/test_paged.py; flex runs on CUDA only, and refuses sinks
    assert set(REACH) | {"flex", "paged-split-kv"} == set(paths.BY_NAME)
    assert "no_sinks" in [rule.__name__ for rule in paths.BY_NAME["flex"].refusals]


@pytest.mark.parametrize("name", list(REACH))
def test_every_path_with_sinks_equals_the_oracle(name):
    sizes, kwargs = REACH[name]
    q, k, v = rand_qkv(2, 3, sizes["lq"], sizes["lk"], 11, sizes.get("dv"), hkv=sizes.get("hkv"), seed=5,
                       requires_grad=True)
    s = _sinks(3, (2, 3) if name == "bias-slabs" else None)
    assert attnkit.explain(q, k, v, sinks=s, **kwargs).path == name
    assert attnkit.explain(q, k, v, sinks=s, **kwargs).lane is None  # the fast lane refuses sinks
    check_against_oracle(q, k, v, s, **kwargs)


# A sink per query row (B, H, Lq), per sample (B, H, 1) and per head (1, H, 1): the three broadcast shapes.
@pytest.mark.parametrize("name", list(REACH))
@pytest.mark.parametrize("shape", ["token", "sample", "head"])
def test_every_path_with_per_token_sinks_equals_the_oracle(name, shape):
    sizes, kwargs = REACH[name]
    q, k, v = rand_qkv(2, 3, sizes["lq"], sizes["lk"], 11, sizes.get("dv"), hkv=sizes.get("hkv"), seed=5,
                       requires_grad=True)
    s = _sinks(3, {"token": (2, 3, sizes["lq"]), "sample": (2, 3, 1), "head": (1, 3, 1)}[shape])
    assert attnkit.explain(q, k, v, sinks=s, **kwargs).path == name
    check_against_oracle(q, k, v, s, **kwargs)


RETURNS_LSE = ["band-windows", "blocksparse-masked", "blocksparse-gathered", "softcap-loop", "online-softmax",
               "dense-reference"]


@pytest.mark.parametrize("name", RETURNS_LSE)
def test_per_token_sinks_join_the_lse_exactly(name):
    sizes, kwargs = REACH[name]
    q, k, v = rand_qkv(2, 3, sizes["lq"], sizes["lk"], 11, sizes.get("dv"), hkv=sizes.get("hkv"), seed=6,
                       requires_grad=True)
    s = _sinks(3, (2, 1, sizes["lq"]))
    assert attnkit.explain(q, k, v, sinks=s, return_lse=True, **kwargs).path == name
    check_against_oracle(q, k, v, s, with_lse=True, **kwargs)


@pytest.mark.parametrize("backend", BACKENDS)
def test_per_token_sinks_in_float64_on_every_backend_to_twelve_digits(backend):
    q, k, v = rand_qkv(2, 3, 130, 130, 8, dtype=torch.float64, seed=4, requires_grad=True)
    s = _sinks(3, (2, 3, 130), dtype=torch.float64)
    s.detach()[0, 1, :40] = float("-inf")  # rows whose sink is plain softmax beside rows with a sink
    try:
        check_against_oracle(q, k, v, s, mask=masks.causal() & masks.sliding_window(20), backend=backend)
    except BackendError:
        assert backend != "auto"


def test_per_token_sinks_of_rows_with_no_key_are_their_lse():
    q, k, v = rand_qkv(2, 3, 60, 70, 11, dtype=torch.float64, seed=8, requires_grad=True)
    s = _sinks(3, (2, 3, 60), dtype=torch.float64)
    mask = masks.padding([0, 70])
    got = attnkit.attention(q, k, v, sinks=s, mask=mask, return_lse=True)
    assert got.output[0].abs().max() == 0 and torch.equal(got.lse[0], s.detach()[0])
    check_against_oracle(q, k, v, s, mask=mask)


MASKS = {
    "none": lambda n: None,
    "causal": lambda n: masks.causal(),
    "window": lambda n: masks.causal() & masks.sliding_window(24),
    "block-sparse": lambda n: masks.causal() & masks.strided(32),
    "padding": lambda n: masks.padding([n - 37, n]),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mask", list(MASKS))
def test_every_backend_and_mask_with_sinks_equals_the_oracle(backend, mask):
    q, k, v = rand_qkv(2, 4, 200, 200, 16, hkv=2, seed=7, requires_grad=True)
    s = _sinks(4)
    try:
        check_against_oracle(q, k, v, s, mask=MASKS[mask](200), backend=backend)
    except BackendError:  # a forced backend may refuse; it names why
        assert backend != "auto"


@pytest.mark.parametrize("name", RETURNS_LSE)
def test_the_lse_includes_the_sink_and_its_gradient_is_exact(name):
    sizes, kwargs = REACH[name]
    q, k, v = rand_qkv(2, 3, sizes["lq"], sizes["lk"], 11, sizes.get("dv"), hkv=sizes.get("hkv"), seed=6,
                       requires_grad=True)
    s = _sinks(3)
    assert attnkit.explain(q, k, v, sinks=s, return_lse=True, **kwargs).path == name
    check_against_oracle(q, k, v, s, with_lse=True, **kwargs)


EMPTY_ROWS = {  # every row of the first sample, and the first rows of the second, have no allowed key
    "torch-sdpa": dict(mask=masks.keys(torch.tensor([[False] * 70, [True] * 70]))),
    "band-windows": dict(mask=masks.diagonals(90, 110)),
    "blocksparse-fused": dict(mask=masks.diagonals(None, -100) | masks.global_tokens([10000])),
    "blocksparse-masked": dict(mask=masks.diagonals(None, -100) | masks.global_tokens([10000])),
    "dense-reference": dict(mask=masks.padding([0, 70]), normalize="softmax", return_weights=True),
}


@pytest.mark.parametrize("name", list(EMPTY_ROWS))
def test_rows_with_no_key_output_zero_and_their_lse_is_the_sink(name):
    short = name in ("torch-sdpa", "dense-reference")
    dv = 13 if name == "blocksparse-masked" else None  # the fused kernel needs Dv == D
    q, k, v = rand_qkv(2, 3, 60 if short else 200, 70 if short else 200, 11, dv, seed=8, requires_grad=True)
    kwargs = dict(EMPTY_ROWS[name])
    weights = kwargs.pop("return_weights", False)
    s = _sinks(3)
    p = attnkit.explain(q, k, v, sinks=s, **kwargs, backend=paths.BY_NAME[name].backend)
    assert p.path == name
    out = check_against_oracle(q, k, v, s, backend=paths.BY_NAME[name].backend, **kwargs)
    allowed = dense_attention(q, k, v, return_weights=True, **kwargs).weights.sum(-1) > 0
    assert (~allowed).any() and out[~allowed].abs().max() == 0
    if weights:
        got = attnkit.attention(q, k, v, sinks=s, return_weights=True, return_lse=True, backend="reference", **kwargs)
        assert torch.equal(got.lse[~allowed], s.detach().expand(2, 3)[..., None].expand_as(got.lse)[~allowed])
        exact = dense_attention(q, k, v, sinks=s, return_weights=True, **kwargs).weights
        assert _err(got.weights, exact) < 1e-6 and (got.weights.sum(-1) < 1).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_sinks_at_minus_infinity_are_plain_softmax(backend):
    q, k, v = rand_qkv(2, 3, 150, 150, 16, seed=2, requires_grad=True)
    mask = masks.causal() & masks.sliding_window(40)
    s = torch.full((3,), float("-inf"), requires_grad=True)
    try:
        got = attnkit.attention(q, k, v, mask=mask, sinks=s, backend=backend)
    except BackendError:
        return
    plain = attnkit.attention(q, k, v, mask=mask, backend=backend)
    torch.testing.assert_close(got, plain, rtol=0, atol=1e-6)
    grads = torch.autograd.grad(got.sum(), [q, k, v, s])
    want = torch.autograd.grad(plain.sum(), [q, k, v])
    for g, w in zip(grads, want, strict=False):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-5)
    assert grads[3].abs().max() == 0 and not grads[3].isnan().any()


def test_float64_every_backend_to_twelve_digits():
    q, k, v = rand_qkv(2, 3, 130, 130, 8, dtype=torch.float64, seed=4, requires_grad=True)
    s = _sinks(3, dtype=torch.float64)
    for backend in BACKENDS:
        check_against_oracle(q, k, v, s, mask=masks.causal() & masks.sliding_window(20), backend=backend)


def test_second_derivatives_through_a_hand_written_path_with_sinks():
    q, k, v = rand_qkv(1, 2, 120, 120, 8, dtype=torch.float64, seed=3, requires_grad=True)
    s = _sinks(2, dtype=torch.float64)
    mask = masks.sliding_window(10, 10)
    assert attnkit.explain(q, k, v, mask=mask, sinks=s).path == "band-windows"
    out = attnkit.attention(q, k, v, mask=mask, sinks=s)
    exact = dense_attention(q, k, v, mask=mask, sinks=s, differentiable=True)
    penalty = lambda o: torch.autograd.grad(o.square().sum(), q, create_graph=True)[0].square().sum()
    got = torch.autograd.grad(penalty(out), [q, k, v, s])
    want = torch.autograd.grad(penalty(exact), [q, k, v, s])
    assert max(_err(g, w) for g, w in zip(got, want, strict=True)) < 1e-9


def test_sinks_trace_under_torch_compile():
    q, k, v = rand_qkv(1, 2, 40, 40, 8, seed=2)
    s = _sinks(2).detach()
    fn = lambda q, k, v, s: attnkit.attention(q, k, v, mask=masks.causal(), sinks=s)
    got = torch.compile(fn, fullgraph=True, backend="eager")(q, k, v, s)
    assert _err(got, dense_attention(q, k, v, mask=masks.causal(), sinks=s)) < 1e-5


# ------------------------------------------------------------------ the error contract
@pytest.mark.parametrize(("sinks", "error", "words"), [
    (torch.zeros(4), ShapeError, "(H_q,) = (3,)"),
    (torch.zeros(3, 2), ShapeError, "(batch, H_q) = (2, 3)"),
    (torch.zeros(1, 1, 3), ShapeError, "(batch, H_q, L_q) = (2, 3, 5)"),
    (torch.zeros(2, 3, 5, 1), ShapeError, "got (2, 3, 5, 1)"),
    (torch.zeros(3, dtype=torch.long), DTypeError, "floating"),
    ([0.0, 0.0, 0.0], DTypeError, "list"),
    (torch.zeros(3, device="meta"), DeviceError, "sinks is on meta"),
])
def test_bad_sinks_raise_errors_naming_them(sinks, error, words):
    q, k, v = rand_qkv(2, 3, 5, 7, 11)
    with pytest.raises(error, match="sinks") as caught:
        attnkit.attention(q, k, v, sinks=sinks)
    assert words in str(caught.value)


def test_sinks_need_softmax():
    q, k, v = rand_qkv(2, 3, 5, 7, 11)
    with pytest.raises(ArgumentError, match="normalize must be 'softmax'"):
        attnkit.attention(q, k, v, sinks=torch.zeros(3), normalize="sigmoid")


def test_sinks_broadcast_from_heads_and_per_sample():
    q, k, v = rand_qkv(2, 3, 5, 7, 11, dtype=torch.float64)
    s = torch.randn(2, 3, dtype=torch.float64)
    for given in (s, s[:1], s[:, :1], s[0]):
        got = attnkit.attention(q, k, v, sinks=given)
        assert _err(got, dense_attention(q, k, v, sinks=given)) < 1e-12
    three = attnkit.attention(q[:, 0], k[:, 0], v[:, 0], sinks=s[:, :1])  # (B, L, D): one head
    assert _err(three, dense_attention(q[:, 0], k[:, 0], v[:, 0], sinks=s[:, :1])) < 1e-12
    per_token = torch.randn(2, 3, 5, dtype=torch.float64)
    for given in (per_token, per_token[:1], per_token[:, :1], per_token[..., :1]):
        got = attnkit.attention(q, k, v, sinks=given)
        assert _err(got, dense_attention(q, k, v, sinks=given)) < 1e-12
    same = attnkit.attention(q, k, v, sinks=s[..., None].expand(2, 3, 5))  # a sink per head, repeated per row
    assert _err(same, attnkit.attention(q, k, v, sinks=s)) < 1e-15


# ------------------------------------------------------------------ any sink value with rows that have no key
def _mixed_sinks(heads, dtype=torch.float32):
    """Sinks with ``-inf`` (plain softmax) on some heads and finite logits on the others."""
    s = 2.0 * torch.randn(heads, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    s[0::2] = float("-inf")
    return s.to(dtype).requires_grad_()


EMPTY_ROW_MASKS = {  # (Lq, Lk) and a mask leaving some query rows of the batch no allowed key
    "zero-length padding": ((24, 20), lambda lq, lk: masks.padding([0, lk])),
    "causal Lq > Lk": ((30, 20), lambda lq, lk: masks.causal()),
    "window Lq > Lk": ((30, 20), lambda lq, lk: masks.causal() & masks.sliding_window(4)),
    "dilated Lq > Lk": ((30, 20), lambda lq, lk: masks.causal() & masks.dilated(6, 2)),
    "bool row": ((24, 20), lambda lq, lk: (torch.arange(lq)[:, None] % 3 != 0).expand(lq, lk)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("hkv", [4, 2])
@pytest.mark.parametrize("mask", list(EMPTY_ROW_MASKS))
@pytest.mark.parametrize("backend", ["auto", *BACKENDS])
def test_sinks_at_minus_infinity_with_rows_that_have_no_key_give_the_oracles_gradients(backend, mask, hkv, dtype):
    (lq, lk), build = EMPTY_ROW_MASKS[mask]
    q, k, v = rand_qkv(2, 4, lq, lk, 8, hkv=hkv, dtype=dtype, seed=11, requires_grad=True)
    s = _mixed_sinks(4, dtype)
    m = build(lq, lk)
    assert (~dense_attention(q, k, v, mask=m, return_weights=True).weights.sum(-1).bool()).any()
    try:
        out = check_against_oracle(q, k, v, s, mask=m, backend=backend, with_lse=backend != "sdpa")
    except BackendError:
        assert backend != "auto"
        return
    assert not out.isnan().any()


# Rows with no allowed key on every path ``auto`` reaches, with ``-inf`` and finite sinks on different heads.
EMPTY_ROWS_PATHS = {
    "torch-sdpa": (dict(lq=60, lk=70), dict(mask=masks.keys(torch.tensor([[False] * 70, [True] * 70])))),
    "band-windows": (dict(lq=300, lk=300), dict(mask=masks.diagonals(90, 110))),
    "blocksparse-fused": (dict(lq=512, lk=512), dict(mask=masks.diagonals(None, -100) | masks.global_tokens([10000]))),
    "blocksparse-masked": (dict(lq=512, lk=512, dv=13),
                           dict(mask=masks.diagonals(None, -100) | masks.global_tokens([10000]))),
    "blocksparse-gathered": (dict(lq=512, lk=512), dict(mask=masks.diagonals(None, -100) | masks.global_tokens([10000]),
                                                        score="cosine")),
    "bias-slabs": (dict(lq=300, lk=280), dict(bias=ALiBi(4), mask=masks.causal())),
    "softcap-loop": (dict(lq=300, lk=280), dict(bias=Softcap(5.0), mask=masks.causal())),
    "online-softmax": (dict(lq=300, lk=280, hkv=2), dict(score="cosine", mask=masks.causal())),
    "dense-reference": (dict(lq=30, lk=20), dict(mask=masks.causal(), score=lambda q, k: q @ k.transpose(-1, -2))),
}


def test_every_path_is_reached_with_sinks_and_rows_that_have_no_key():
    # fixed-blocks: causal with Lq == Lk, every row has a key (its sinks: tests/kernels/test_fixed_blocks.py)
    assert set(EMPTY_ROWS_PATHS) | {"flex", "paged-split-kv", "fixed-blocks"} == set(paths.BY_NAME)


@pytest.mark.parametrize("name", list(EMPTY_ROWS_PATHS))
def test_every_path_with_minus_infinity_sinks_and_rows_that_have_no_key_equals_the_oracle(name):
    sizes, kwargs = EMPTY_ROWS_PATHS[name]
    q, k, v = rand_qkv(2, 4, sizes["lq"], sizes["lk"], 11, sizes.get("dv"), hkv=sizes.get("hkv"), seed=12,
                       requires_grad=True)
    s = _mixed_sinks(4)
    assert attnkit.explain(q, k, v, sinks=s, **kwargs).path == name
    out = check_against_oracle(q, k, v, s, **kwargs)
    assert not out.isnan().any()


def test_a_sink_of_plus_infinity_is_refused_naming_the_head():
    q, k, v = rand_qkv(2, 3, 5, 7, 11)
    with pytest.raises(ArgumentError, match=r"sinks .*\+inf.*head 1"):
        attnkit.attention(q, k, v, sinks=torch.tensor([0.0, float("inf"), float("-inf")]))
