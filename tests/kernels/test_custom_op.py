"""kernels/custom_op.py: the fused paths as the ``attnkit::attention`` operator under torch.compile and export.

The operator must pass torch's own checks (``torch.library.opcheck``: schema, fake
implementation, autograd registration, AOT dispatch); compiled and exported graphs must
contain it, naming the path expected; and what they compute, output and gradients, must
equal the independent float64 oracle, including calls the operator hands back to the
exact path (non-finite inputs).
"""

from __future__ import annotations

import io

import pytest
import torch

import attnkit
from attnkit import masks
from attnkit.kernels import custom_op
from tests.helpers import rand_qkv
from tests.oracle import dense_attention

OP = torch.ops.attnkit.attention.default

MASKS = {  # mask, the path expected when traced at L = 256
    "none": (None, "torch-sdpa"),
    "causal": (masks.causal(), "torch-sdpa"),
    "window": (masks.sliding_window(32, 32), "band-windows"),
    "causal window": (masks.causal() & masks.sliding_window(20), "band-windows"),
    "strided": (masks.causal() & masks.strided(64), "blocksparse-fused"),
    "fixed": (masks.fixed(64), "fixed-blocks"),
    "causal fixed": (masks.causal() & masks.fixed(64, 8), "fixed-blocks"),
}


def _args(mask, length=256, hkv=None, dtype=torch.float32, seed=0):
    q, k, v = rand_qkv(1, 4, length, length, 16, hkv=hkv, dtype=dtype, seed=seed, requires_grad=True)
    return q, k, v, None, custom_op.mask_text(mask), 0.0, 16 ** -0.5, "scaled_dot", "softmax", "auto"


def _oracle_and_grads(q, k, v, mask, dout):
    """Float64 softmax(q k^T / sqrt(D), masked) v written out here, and its gradients by autograd."""
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    groups = q.shape[1] // k.shape[1]
    kr, vr = k64.repeat_interleave(groups, 1), v64.repeat_interleave(groups, 1)
    scores = q64 @ kr.transpose(-1, -2) * q.shape[-1] ** -0.5
    if mask is not None:
        scores = scores.masked_fill(~mask.materialize(q.shape[2], k.shape[2]), float("-inf"))
    out = torch.softmax(scores, -1) @ vr
    return out, torch.autograd.grad(out, (q64, k64, v64), dout.double())


def _assert_matches_oracle(out, grads, q, k, v, mask, dout, tol):
    exact, exact_grads = _oracle_and_grads(q, k, v, mask, dout)
    torch.testing.assert_close(out.double(), exact, atol=tol, rtol=tol)
    for got, want in zip(grads, exact_grads, strict=True):
        torch.testing.assert_close(got.double(), want, atol=tol, rtol=tol)


@pytest.mark.parametrize("name", ["causal", "window", "strided", "causal fixed", "fixed"])
@pytest.mark.parametrize("hkv", [None, 2])
def test_the_operator_passes_opcheck(name, hkv):
    mask, _ = MASKS[name]
    torch.library.opcheck(OP, _args(mask, length=160, hkv=hkv))


def test_the_operator_passes_opcheck_in_float64():
    torch.library.opcheck(OP, _args(masks.sliding_window(16, 8), length=96, dtype=torch.float64))


@pytest.mark.parametrize("name", sorted(MASKS))
def test_a_compiled_call_is_one_operator_node_and_equals_the_float64_oracle(name):
    mask, planned = MASKS[name]
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    compiled = torch.compile(lambda q, k, v: attnkit.attention(q, k, v, mask=mask), backend=backend, fullgraph=True)
    q, k, v, *_ = _args(mask, seed=3)
    out = compiled(q, k, v)
    nodes = [n for n in graphs[0].graph.nodes if n.op == "call_function" and "attnkit" in str(n.target)]
    assert len(nodes) == 1 and nodes[0].args[-1] == planned
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    _assert_matches_oracle(out, grads, q, k, v, mask, dout, 2e-5)


def test_inductor_compiled_training_step_equals_eager_bit_for_bit():
    """Inductor calls the operator as an extern kernel: the same path runs, so the same numbers come out."""
    mask = masks.sliding_window(32, 32)
    fn = lambda q, k, v: attnkit.attention(q, k, v, mask=mask)
    compiled = torch.compile(fn, fullgraph=True)
    q, k, v, *_ = _args(mask, seed=4)
    got = compiled(q, k, v)
    want = fn(q, k, v)
    assert torch.equal(got, want)
    dout = torch.randn_like(got)
    for a, b in zip(torch.autograd.grad(got, (q, k, v), dout), torch.autograd.grad(want, (q, k, v), dout),
                    strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("name", ["causal", "window"])
def test_inductor_backward_with_inputs_viewed_from_a_model_layout(name):
    """Models view (B, L, H, D) projections as (B, H, L, D): the gradients come back contiguous, as the fake says."""
    mask, _ = MASKS[name]
    x = torch.randn(1, 256, 4, 16, generator=torch.Generator().manual_seed(9), requires_grad=True)
    fn = lambda x: attnkit.attention(*(x.transpose(1, 2),) * 3, mask=mask).sum()
    grad = torch.autograd.grad(torch.compile(fn, fullgraph=True)(x), x)[0]
    torch.testing.assert_close(grad, torch.autograd.grad(fn(x), x)[0], atol=1e-5, rtol=1e-4)


class Windowed(torch.nn.Module):
    def __init__(self, mask):
        super().__init__()
        self.mask = mask

    def forward(self, q, k, v):
        return attnkit.attention(q, k, v, mask=self.mask)


def test_an_exported_program_keeps_the_band_path_at_every_length_and_after_saving():
    mask = masks.sliding_window(32, 32)
    q, k, v, *_ = _args(mask)
    length = torch.export.Dim("L", min=2, max=4096)
    exported = torch.export.export(Windowed(mask), (q.detach(), k.detach(), v.detach()),
                                   dynamic_shapes=({2: length},) * 3)
    nodes = [n for n in exported.graph.nodes if n.op == "call_function" and "attnkit" in str(n.target)]
    assert len(nodes) == 1 and nodes[0].args[4] == repr(mask)
    buffer = io.BytesIO()
    torch.export.save(exported, buffer)
    buffer.seek(0)
    loaded = torch.export.load(buffer)
    for n in (5, 300, 1000):
        q, k, v = rand_qkv(1, 4, n, n, 16, seed=n)
        exact = dense_attention(q.double(), k.double(), v.double(), mask=mask)
        torch.testing.assert_close(loaded.module()(q, k, v).double(), exact, atol=2e-6, rtol=1e-5)


def test_the_static_export_names_the_band_path():
    mask = masks.sliding_window(32, 32)
    q, k, v, *_ = _args(mask)
    exported = torch.export.export(Windowed(mask), (q.detach(), k.detach(), v.detach()))
    planned = [n.args[-1] for n in exported.graph.nodes if "attnkit" in str(n.target)]
    assert planned == ["band-windows"]


@pytest.mark.parametrize("name", ["causal", "window", "strided"])
def test_non_finite_inputs_run_the_exact_path_inside_the_operator(name):
    """The data checks are part of the operator: a NaN key is handled as eager attention handles it."""
    mask, _ = MASKS[name]
    q, k, v, *_ = _args(mask, seed=5)
    with torch.no_grad():
        k[0, 1, 200] = float("nan")
    fn = lambda q, k, v: attnkit.attention(q, k, v, mask=mask)
    got = torch.compile(fn, fullgraph=True, backend="aot_eager")(q, k, v)
    want = fn(q, k, v)
    torch.testing.assert_close(got, want, equal_nan=True)
    dout = torch.ones_like(got)
    for a, b in zip(torch.autograd.grad(got, (q, k, v), dout), torch.autograd.grad(want, (q, k, v), dout),
                    strict=True):
        torch.testing.assert_close(a, b, equal_nan=True)


def test_grouped_queries_and_bfloat16_through_the_operator():
    mask = masks.sliding_window(32, 0)
    q, k, v = rand_qkv(2, 4, 200, 200, 16, hkv=2, dtype=torch.bfloat16, seed=6, requires_grad=True)
    compiled = torch.compile(lambda q, k, v: attnkit.attention(q, k, v, mask=mask), fullgraph=True,
                             backend="aot_eager")
    out = compiled(q, k, v)
    assert out.dtype == torch.bfloat16
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    assert [g.dtype for g in grads] == [torch.bfloat16] * 3 and grads[1].shape == k.shape
    _assert_matches_oracle(out, grads, q, k, v, mask, dout, 3e-2)


def test_the_operator_passes_opcheck_with_a_learned_bias_and_a_softcap():
    q, k, v, _, mask, _, scale, score, normalize, path = _args(masks.causal(), length=64)
    bias = torch.randn(1, 4, 64, 64, dtype=torch.float32, requires_grad=True)
    torch.library.opcheck(OP, (q, k, v, bias, mask, 0.0, scale, score, normalize, path))
    torch.library.opcheck(OP, (q, k, v, None, mask, 30.0, scale, score, normalize, path))


@pytest.mark.parametrize("kind", ["bias", "softcap"])
def test_a_compiled_call_with_a_bias_or_softcap_equals_eager_with_its_gradients(kind):
    mask = masks.sliding_window(40, 0)
    q, k, v, *_ = _args(mask, seed=8)
    bias = (torch.randn(1, 4, 256, 256, generator=torch.Generator().manual_seed(1)).requires_grad_()
            if kind == "bias" else attnkit.bias.softcap(2.0))
    fn = lambda q, k, v, b: attnkit.attention(q, k, v, mask=mask, bias=b)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    got = torch.compile(fn, fullgraph=True, backend=backend)(q, k, v, bias)
    assert sum("attnkit" in str(n.target) for n in graphs[0].graph.nodes) == 1
    want = fn(q, k, v, bias)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    leaves = (q, k, v, bias) if kind == "bias" else (q, k, v)
    dout = torch.randn_like(got)
    for a, b in zip(torch.autograd.grad(got, leaves, dout), torch.autograd.grad(want, leaves, dout), strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_calls_the_operator_cannot_take_are_traced_on_the_exact_path():
    """A tensor mask has no text: the graph holds plain torch operations, and the result is exact."""
    q, k, v = rand_qkv(1, 2, 64, 64, 8, seed=7)
    keep = torch.rand(1, 1, 64, 64, generator=torch.Generator().manual_seed(0)) > 0.3
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    compiled = torch.compile(lambda q, k, v, m: attnkit.attention(q, k, v, mask=m), backend=backend, fullgraph=True)
    got = compiled(q, k, v, keep)
    assert not any("attnkit" in str(n.target) for n in graphs[0].graph.nodes)
    torch.testing.assert_close(got.double(), dense_attention(q.double(), k.double(), v.double(), mask=keep),
                               atol=2e-6, rtol=1e-5)


def test_mask_text_rebuilds_the_mask_and_is_none_for_masks_holding_data():
    for mask, _ in MASKS.values():
        text = custom_op.mask_text(mask)
        assert text == "" if mask is None else repr(masks.parse(text)) == text
    assert custom_op.mask_text(masks.padding(torch.tensor([3, 5]))) is None
    assert custom_op.mask_text(masks.causal() & masks.keys(torch.ones(2, 5, dtype=torch.bool))) is None


def test_the_masks_the_operator_parses_are_kept_within_a_byte_budget(monkeypatch):
    """Each text's mask keeps layouts and plans; 40 texts at L = 512 must not keep them all."""
    monkeypatch.setattr(custom_op, "MASK_CACHE_BYTES", 1 << 20)
    monkeypatch.setattr(custom_op, "_MASKS", custom_op._ParsedMasks())
    q, k, v = rand_qkv(1, 2, 512, 512, 16, seed=1)
    for width in range(1, 41):
        text = repr(masks.causal() & masks.strided(width + 7))
        out, _, _ = OP(q, k, v, None, text, 0.0, 0.25, "scaled_dot", "softmax", "blocksparse-fused")
        assert out.shape == q.shape
    kept = list(custom_op._MASKS._masks.values())
    assert 1 <= len(kept) < 40
    assert sum(m.cached_bytes() for m in kept[:-1]) <= custom_op.MASK_CACHE_BYTES  # the newest is always kept


def test_a_mask_captured_in_a_closure_compiles_with_dynamic_shapes():
    def attend_with(mask):
        return lambda q, k, v: attnkit.attention(q, k, v, mask=mask)

    fn = attend_with(masks.sliding_window(8, 8) & masks.causal())
    compiled = torch.compile(fn, fullgraph=True, dynamic=True, backend="aot_eager")
    for length in (40, 90):
        q, k, v = rand_qkv(1, 2, length, length, 8, seed=length)
        torch.testing.assert_close(compiled(q, k, v), fn(q, k, v), atol=1e-6, rtol=1e-5)


def test_export_refuses_one_tensor_passed_as_two_inputs():
    """The exported program would read q for k and v: the README's old example computed attention(q, q, q)."""
    q = torch.randn(1, 2, 16, 8)
    with pytest.raises(attnkit.ArgumentError, match="distinct tensors"):
        torch.export.export(Windowed(masks.causal()), (q, q, q))
    k, v = q.clone(), q.clone()
    exported = torch.export.export(Windowed(masks.causal()), (q, k, v))
    q2, k2, v2 = rand_qkv(1, 2, 16, 16, 8, seed=9)
    torch.testing.assert_close(exported.module()(q2, k2, v2), attnkit.attention(q2, k2, v2, mask=masks.causal()))


def test_compiled_and_eager_decisions_agree_on_every_row_of_the_table():
    """For one call per path, the path named by the compiled graph's operator node is eager's choice."""
    from tests.kernels.test_paths import REACH
    textual = masks.prefix_lm(64) & masks.sliding_window(64, 0)  # the operator carries masks that have a text
    carried = {"blocksparse-fused": dict(mask=textual), "blocksparse-masked": dict(mask=textual),
               "blocksparse-gathered": dict(mask=textual, score="cosine")}
    for name, (sizes, kwargs) in REACH.items():
        if name == "paged-split-kv":  # a page table is a tensor the operator does not carry: plain ops when traced
            continue
        kwargs = carried.get(name, kwargs)
        if name == "bias-slabs":  # an ALiBi modifier is a Python object: the operator carries a bias tensor
            kwargs = dict(bias=torch.randn(1, 3, sizes["lq"], sizes["lk"]))
        q, k, v = rand_qkv(2, 3, sizes["lq"], sizes["lk"], 11, sizes.get("dv"), seed=5)
        eager = attnkit.explain(q, k, v, **kwargs)
        assert eager.path == name and eager.compiled.startswith(f"one {custom_op.OPERATOR} node, expected path "
                                                                f"{name}:"), (name, eager.compiled)
        graphs = []
        torch._dynamo.reset()  # one compilation per row, not recompilations of one lambda

        def backend(gm, example_inputs, graphs=graphs):
            graphs.append(gm)
            return gm.forward

        fn = lambda q, k, v, kwargs=kwargs: attnkit.attention(q, k, v, **kwargs)
        compiled = torch.compile(fn, backend=backend, fullgraph=True, dynamic=False)
        torch.testing.assert_close(compiled(q, k, v), fn(q, k, v), atol=2e-5, rtol=1e-4)
        nodes = [n for n in graphs[0].graph.nodes if "attnkit" in str(n.target)]
        assert len(nodes) == 1 and nodes[0].args[-1] == name, (name, [n.args[-1] for n in nodes])


def test_the_operator_reads_a_kv_cache_prefix_view_in_place_as_it_reads_a_copy():
    """A decoding step's keys and values are a prefix view of the cache's buffers (rows of stride 1, heads strided
    by the capacity): the kernel reads them as they are, with the result of contiguous copies bit for bit, and both
    equal the float64 oracle (one query, grouped heads, bottom-right causal: every key)."""
    from attnkit.kernels.paths import INDEX
    from attnkit.nn.kv_cache import CAUSAL

    gen = torch.Generator().manual_seed(0)
    buffers = [torch.randn(1, 2, 40, 16, generator=gen) for _ in range(2)]  # (B, Hkv, capacity, D)
    q = torch.randn(1, 4, 1, 16, generator=gen)
    k, v = (b[:, :, :29] for b in buffers)
    assert not k.is_contiguous()
    options = (None, custom_op.mask_text(CAUSAL), 0.0, 16 ** -0.5, "scaled_dot", "softmax", "auto")
    viewed = OP(q, k, v, *options)
    copied = OP(q, k.contiguous(), v.contiguous(), *options)
    assert int(viewed[2]) == int(copied[2]) == INDEX["torch-sdpa"]
    assert torch.equal(viewed[0], copied[0]) and torch.equal(viewed[1], copied[1])
    exact, _ = _oracle_and_grads(q, k, v, None, torch.ones(1, 4, 1, 16))
    torch.testing.assert_close(viewed[0].double(), exact, atol=1e-5, rtol=1e-5)


def test_the_operator_answers_a_decoding_step_on_the_lane_without_validating_it(monkeypatch):
    """A call the eager fast lane takes (one query over a cache, bottom-right causal) runs torch's kernel after the
    lane's attribute checks alone, inside the operator too: no validation, the torch-sdpa row's index and lse kept for
    its backward, the float64 oracle's output. A call the lane declines (a window) still validates."""
    from attnkit.kernels.paths import INDEX
    from attnkit.nn.kv_cache import CAUSAL

    calls = []
    real = custom_op.validate
    monkeypatch.setattr(custom_op, "validate", lambda *a, **kw: (calls.append(1), real(*a, **kw))[1])
    q, k, v = rand_qkv(1, 4, 1, 33, 16, hkv=2, seed=3)
    out, lse, ran = OP(q, k, v, None, custom_op.mask_text(CAUSAL), 0.0, 16 ** -0.5, "scaled_dot", "softmax", "auto")
    assert calls == [] and int(ran) == INDEX["torch-sdpa"] and lse.shape == (1, 4, 1)
    exact, _ = _oracle_and_grads(q, k, v, None, torch.ones_like(out))
    torch.testing.assert_close(out.double(), exact, atol=1e-5, rtol=1e-5)
    OP(q, k, v, None, custom_op.mask_text(masks.sliding_window(4, 0)), 0.0, 16 ** -0.5, "scaled_dot", "softmax",
       "auto")
    assert calls == [1]


@pytest.mark.filterwarnings("ignore:Warning only once for all operators")  # (the test registers the kernel again)
def test_a_call_recording_no_gradient_runs_the_implementation_past_the_autograd_wrapper():
    """The operator's autograd kernel hands a call that records no gradient (plain tensors; grad mode off or no input
    requiring one) straight to the implementation, the same function torch.library's kernel reaches through a second
    dispatch: the same outputs bit for bit. A call recording a gradient, fake tensors, ``make_fx`` and a user's
    dispatch mode go through torch.library's kernel: the node with its backward, the node in the traced graph, the
    node seen by the mode; a compiled graph's call (inductor, no gradient) takes the direct way."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.utils._python_dispatch import TorchDispatchMode

    from attnkit.nn.kv_cache import CAUSAL

    seen = []

    def spy(*args):
        seen.append(type(args[0]))
        return custom_op._attention_impl(*args)

    q, k, v = rand_qkv(1, 4, 1, 33, 16, hkv=2, seed=5, requires_grad=True)
    options = (None, custom_op.mask_text(CAUSAL), 0.0, 16 ** -0.5, "scaled_dot", "softmax", "auto")

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            names.append(str(func))
            return func(*args, **(kwargs or {}))

    custom_op._direct_when_no_gradient(custom_op._attention, spy)
    try:
        recorded = OP(q, k, v, *options)
        assert seen == [] and recorded[0].grad_fn is not None
        with torch.no_grad():
            direct = OP(q, k, v, *options)
        assert seen == [torch.Tensor] and direct[0].grad_fn is None
        for a, b in zip(direct, recorded, strict=True):
            assert torch.equal(a, b.detach())
        OP(q.detach(), k.detach(), v.detach(), *options)  # grad mode on, no input requiring a gradient
        assert len(seen) == 2
        names: list[str] = []
        with torch.no_grad(), Ops():
            OP(q, k, v, *options)
        assert len(seen) == 2 and names[0].startswith("attnkit.attention")
        with torch.no_grad():
            graph = make_fx(lambda *t: OP(*t, *options))(q, k, v)
        assert len(seen) == 2 and "attnkit.attention" in str(graph.graph)
        compiled = torch.compile(lambda *t: attnkit.attention(*t, mask=CAUSAL), fullgraph=True, dynamic=False)
        with torch.no_grad():  # (the first call compiles; a decoding step's inputs require no gradient)
            compiled(q.detach(), k.detach(), v.detach())
            del seen[2:]
            out = compiled(q.detach(), k.detach(), v.detach())
        assert seen[2:] == [torch.Tensor]
        torch.testing.assert_close(out, direct[0], atol=0, rtol=0)
    finally:
        custom_op._direct_when_no_gradient(custom_op._attention, custom_op._attention_impl)
        torch._dynamo.reset()


@pytest.mark.parametrize("case", ["dynamic, no mask", "causal, 1 < Lq < Lk"])
def test_a_call_compiled_with_grad_mode_off_traces_and_equals_eager(case):
    """Inference graphs (grad mode off) trace as gradient graphs do: symbolic sizes (a scale 1/sqrt(D) that is a
    SymFloat) and a causal mask aligned to the end of the keys, with fullgraph=True."""
    g = torch.Generator().manual_seed(3)
    lq, mask, dynamic = (1, None, True) if case.startswith("dynamic") else (5, masks.causal(), False)
    q, k, v = (torch.randn(2, h, n, 16, generator=g) for h, n in ((4, lq), (1, 17), (1, 17)))
    fn = lambda q, k, v: attnkit.attention(q, k, v, mask=mask)
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True, dynamic=dynamic)
    with torch.no_grad():
        torch.testing.assert_close(compiled(q, k, v), fn(q, k, v), rtol=0, atol=0)
