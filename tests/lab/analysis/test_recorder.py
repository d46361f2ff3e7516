"""AttentionRecorder: the maps it records equal the weights each mechanism returns; hooks come and go cleanly."""

from __future__ import annotations

import contextlib
import functools
import math
import re
import threading
import warnings

import pytest
import torch
from torch import nn

import attnkit
from attnkit import recording, registry
from attnkit.errors import ArgumentError, DTypeError, ShapeError
from attnkit.kernels import reference
from attnkit.lab.analysis.recorder import AttentionRecorder, RecordedMap
from attnkit.lab.analysis.stats import entropy
from attnkit.nn import HardAttention, LuongAttention, MultiHeadAttention, PointerAttention
from tests.helpers import rand_qkv

ATOL = 1e-6  # recorded maps are float32 copies


def _w(t):
    return t[:, None]  # (B, Lq, Lk) as attention() saw it: (B, 1, Lq, Lk)


def _pool(t):
    return t[:, None, None]  # (N, Lk) pooling weights: (N, 1, 1, Lk)


# Modules that return weights: name -> (call, {recorded map name: API weights in the recorded layout, or None for
# a map the API does not return}). Core attention entries (a partial of attnkit.attention) are handled generically.
WEIGHTS = {
    "multi-head": (lambda f, x: f(*x, average_attn_weights=False), lambda o: {"model": o[1]}),
    "gated-attention": (lambda f, x: f(*x, average_attn_weights=False), lambda o: {"model": o[1]}),
    "qk-norm": (lambda f, x: f(*x, average_attn_weights=False), lambda o: {"model": o[1]}),
    "dot-product-module": (lambda f, x: f(*x, need_weights=True), lambda o: {"model": o[1]}),
    "additive": (None, lambda o: {"model": _w(o.weights)}),
    "derived-key": (None, lambda o: {"model": _w(o.weights)}),
    "luong": (None, lambda o: {"model": o.weights}),
    "coverage-attention": (None, lambda o: {"model": o.weights}),
    "hard-attention": (None, lambda o: {"model": o.weights}),
    "pointer": (None, lambda o: {"model": o.exp()}),
    "attention-pooling": (None, lambda o: {"model": _pool(o.weights)}),
    "hierarchical-attention": (None, lambda o: {"word_attention": _pool(o.word_weights.flatten(0, 1)),
                                                "sentence_attention": _pool(o.sentence_weights)}),
    "memory-attention": (None, lambda o: {"model": _pool(o.weights.flatten(0, 1))}),
    "co-attention-parallel": (None, lambda o: {"model": _pool(o.image_weights),
                                               "model#1": _pool(o.question_weights)}),
    "co-attention-alternating": (None, lambda o: {"model": None, "model#1": _pool(o.image_weights),
                                                  "model#2": _pool(o.question_weights)}),
    "segment-attention": (None, lambda o: {"model": None, "model#1": _w(o.segment_weights)}),
    "tiered-attention": (None, lambda o: {"model": o.segment_weights, "model#1": _w(o.token_weights)}),
}

# Mechanisms that return no weights: the names of the attention() calls they make, which are recorded as they are
# (linformer: over projected keys; sparse-transformer, reformer: partial softmaxes merged later through their lse).
NO_WEIGHTS = {
    "linear-attention": [], "performer": [], "lambda-layer": [], "lambda-layer-local": [], "rotary-embedding": [],
    "sinusoidal-positional-encoding": [], "learned-positional-embedding": [],
    "linformer": ["model"], "local": ["model"], "block-sparse": ["model"], "reformer": ["lsh"],
    "bigbird": ["model", "model#1"], "sparse-transformer": ["model", "model#1"],
    "longformer": ["attention", "attention#1"],  # its example is a closure over the layer: no model to name maps
    "perceiver-attention": ["model"], "perceiver-encoder": ["cross_attn", "blocks.0.attn"],
    "multi-head-latent": ["model"],  # the naive form's h heads
    "differential": ["model", "model#1"],  # both maps as 2h heads, once per half of the values
    "dsa": ["model"], "moba": ["model"],  # over the selected keys
    "forgetting-attention": ["model"],
    "path-attention": [],  # its parallel form computes the scores itself  # the weights with the forget-gate decay
    "native-sparse-attention": ["model", "model#1", "model#2"],  # compressed, selected and window branches
    "retnet": [], "gla": [], "mamba2": [], "deltanet": [], "gated-deltanet": [], "kimi-delta-attention": [],
    "lightning-attention": [], "rwkv4": [], "delta-product": [], "comba": [], "rwkv7": [],
    "log-linear-mamba2": [], "log-linear-gated-deltanet": [],
}
# sigmoid weights (and softpick's, stick-breaking's, a sink's share taken: sums below 1); local-p Luong: softmax
# times a Gaussian (eq. 10)
UNNORMALISED = {"sigmoid", "sigmoid-log-n", "softpick", "stick-breaking", "attention-sinks", "luong"}


def _is_core(entry) -> bool:
    fn, _ = entry.example()
    return isinstance(fn, functools.partial) and fn.func is attnkit.attention


ENTRIES = {e.name: e for e in registry.entries()}


def _record(fn, inputs, call=None):
    with AttentionRecorder(fn if isinstance(fn, nn.Module) else None) as rec:
        out = (call or (lambda f, x: f(*x)))(fn, inputs)
    return rec, out


@pytest.fixture
def reference_runs(monkeypatch):
    """One entry per run of the reference kernel: True when it ran while recording (then it is an attention() call
    whose weights go to the recorder), False otherwise."""
    runs = []
    run = reference.run
    monkeypatch.setattr(reference, "run", lambda p: runs.append(recording.is_recording()) or run(p))
    return runs


def test_every_registry_entry_is_classified():
    unclassified = [n for n, e in ENTRIES.items() if n not in WEIGHTS and n not in NO_WEIGHTS and not _is_core(e)]
    assert not unclassified, f"classify these entries in WEIGHTS or NO_WEIGHTS: {unclassified}"
    assert not set(WEIGHTS) & set(NO_WEIGHTS) and set(WEIGHTS) | set(NO_WEIGHTS) <= set(ENTRIES)


def _check_rows(name, w, normalised=True):
    """Float32 CPU copies without grad; rows of non-negative weights summing to 1 (or 0: no allowed key)."""
    assert w.dtype == torch.float32 and w.device.type == "cpu" and not w.requires_grad
    assert (w >= 0).all(), name
    if normalised:
        sums = w.sum(-1)
        assert torch.all(((sums - 1).abs() < 1e-5) | (sums == 0)), name


@pytest.mark.parametrize("name", sorted(n for n, e in ENTRIES.items() if _is_core(e)))
def test_core_entries_record_exactly_the_returned_weights(name, reference_runs):
    fn, inputs = ENTRIES[name].example()
    torch.manual_seed(0)  # gumbel-softmax draws from the global generator
    rec, out = _record(fn, inputs, lambda f, x: f(*x, return_weights=True))
    assert rec.names() == ["attention"] and reference_runs == [True]
    assert rec.maps[0].source is None and rec.maps[0].index == 0
    torch.testing.assert_close(rec["attention"].weights, out.weights, rtol=0, atol=ATOL)
    _check_rows(name, rec["attention"].weights, name not in UNNORMALISED)


@pytest.mark.parametrize("name", sorted(WEIGHTS))
def test_modules_record_exactly_the_weights_they_return(name, reference_runs):
    fn, inputs = ENTRIES[name].example()
    call, expected = WEIGHTS[name]
    torch.manual_seed(0)
    rec, out = _record(fn, inputs, call)
    want = expected(out)
    assert rec.names() == list(want)
    assert sum(reference_runs) == sum(m.source is None for m in rec.maps)  # the others were self-reported
    for m in rec.maps:
        _check_rows(m.name, m.weights, name not in UNNORMALISED)
        if want[m.name] is not None:
            assert m.weights.shape == want[m.name].shape, m.name
            torch.testing.assert_close(m.weights, want[m.name].float(), rtol=0, atol=ATOL)


def test_segment_token_weights_are_the_recorded_segment_weights_times_the_pooling():
    fn, inputs = ENTRIES["segment-attention"].example()
    rec, out = _record(fn, inputs)
    beta, alpha = rec["model"].weights[:, 0], rec["model#1"].weights[:, 0]  # (B, S, n), (B, Lq, S)
    torch.testing.assert_close(alpha @ beta, out.token_weights, rtol=0, atol=ATOL)


@pytest.mark.parametrize("name", sorted(NO_WEIGHTS))
def test_modules_without_weights_record_their_attention_calls_or_nothing(name, reference_runs):
    fn, inputs = ENTRIES[name].example()
    torch.manual_seed(0)
    quiet = contextlib.nullcontext() if NO_WEIGHTS[name] else pytest.warns(RuntimeWarning, match="no attention map")
    with quiet:  # a block that records nothing says so
        rec, _ = _record(fn, inputs)
    assert rec.names() == NO_WEIGHTS[name]
    assert sum(reference_runs) == len(rec.maps) and all(m.source is None for m in rec.maps)
    for m in rec.maps:
        _check_rows(m.name, m.weights)


def test_perceiver_map_equals_an_independent_float64_softmax():
    module, (latents, context) = ENTRIES["perceiver-attention"].example()
    rec, _ = _record(module, (latents, context))
    heads, d = module.num_heads, module.q_proj.out_features // module.num_heads
    lin = lambda layer, x: x.double() @ layer.weight.double().T + layer.bias.double()
    q = lin(module.q_proj, latents).unflatten(-1, (heads, d)).transpose(1, 2)  # (B, h, N, d)
    k = lin(module.k_proj, context).unflatten(-1, (heads, d)).transpose(1, 2)  # (B, h, M, d)
    want = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d), dim=-1)
    torch.testing.assert_close(rec["model"].weights.double(), want, rtol=0, atol=ATOL)


def _tensors(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _tensors(o)]
    return []


@pytest.mark.filterwarnings("ignore:AttentionRecorder. no attention map")
@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_recording_does_not_change_the_output(name):
    fn, inputs = ENTRIES[name].example()
    torch.manual_seed(0)
    plain = _tensors(fn(*inputs))
    torch.manual_seed(0)
    recorded = _tensors(_record(fn, inputs)[1])
    assert len(plain) == len(recorded) > 0
    for a, b in zip(plain, recorded, strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=ATOL, equal_nan=True)


@pytest.mark.parametrize("mode", ["stochastic", "gumbel"])
def test_stochastic_module_with_a_seeded_generator(mode):
    g = torch.Generator().manual_seed(1)
    attn = HardAttention(4, 6, 5, mode=mode, tau=0.7)
    query, key = torch.randn(2, 3, 4, generator=g), torch.randn(2, 7, 6, generator=g)
    plain = attn(query, key, generator=torch.Generator().manual_seed(3))
    with AttentionRecorder(attn) as rec:
        out = attn(query, key, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(out.context, plain.context, rtol=0, atol=0)
    torch.testing.assert_close(rec["model"].weights, out.weights, rtol=0, atol=0)
    assert rec.names() == ["model"] and rec["model"].source is attn


def test_gumbel_attention_with_the_global_seed_records_what_it_returns():
    q, k, v = rand_qkv()
    torch.manual_seed(5)
    plain = attnkit.attention(q, k, v, normalize="gumbel", return_weights=True)
    torch.manual_seed(5)
    with AttentionRecorder() as rec:
        out = attnkit.attention(q, k, v, normalize="gumbel", return_weights=True)
    torch.testing.assert_close(out.output, plain.output, rtol=0, atol=ATOL)
    torch.testing.assert_close(rec["attention"].weights, out.weights, rtol=0, atol=0)


def _mha_and_input(seed=0):
    torch.manual_seed(seed)
    return MultiHeadAttention(12, 3, batch_first=True), torch.randn(2, 5, 12)


def test_gradients_flow_and_equal_the_unrecorded_ones():
    mha, x = _mha_and_input()
    x.requires_grad_(True)
    mha(x, x, x, need_weights=False)[0].square().sum().backward()
    want_x, want_w = x.grad.clone(), mha.in_proj_weight.grad.clone()
    x.grad, mha.in_proj_weight.grad = None, None
    with AttentionRecorder(mha) as rec:
        out = mha(x, x, x, need_weights=False)[0]
    assert out.requires_grad and not rec["model"].weights.requires_grad
    out.square().sum().backward()
    torch.testing.assert_close(x.grad, want_x, rtol=0, atol=1e-6)
    torch.testing.assert_close(mha.in_proj_weight.grad, want_w, rtol=0, atol=1e-6)


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_records_under_no_grad_and_inference_mode(mode):
    mha, x = _mha_and_input()
    with getattr(torch, mode)(), AttentionRecorder(mha) as rec:
        _, w = mha(x, x, x, average_attn_weights=False)
    torch.testing.assert_close(rec["model"].weights, w, rtol=0, atol=ATOL)
    assert entropy(rec["model"].weights).shape == (2, 3)  # usable outside the mode


def test_recorded_weights_are_taken_before_dropout():
    torch.manual_seed(0)
    mha, x = MultiHeadAttention(12, 3, batch_first=True, dropout=0.5).train(), torch.randn(2, 5, 12)
    with AttentionRecorder(mha) as rec:
        mha(x, x, x, need_weights=False)
    torch.testing.assert_close(rec["model"].weights.sum(-1), torch.ones(2, 3, 5), rtol=0, atol=1e-6)
    assert (rec["model"].weights > 0).all()  # no entry dropped


def test_records_under_bf16_autocast():
    mha, x = _mha_and_input()
    with torch.autocast("cpu", dtype=torch.bfloat16), AttentionRecorder(mha) as rec:
        _, w = mha(x, x, x, average_attn_weights=False)
    assert rec["model"].weights.dtype == torch.float32 and w.dtype == torch.bfloat16
    torch.testing.assert_close(rec["model"].weights, w.float(), rtol=0, atol=0)  # the bf16 weights, exactly


def test_compiled_code_runs_records_nothing_and_says_so():
    mha, x = _mha_and_input()
    want, before = mha(x, x, x, need_weights=False)[0], _hook_state(mha)
    torch._dynamo.reset()
    compiled = torch.compile(mha, fullgraph=True, backend="eager")  # fullgraph: the hooks must not break the graph
    with pytest.warns(RuntimeWarning, match="torch.compile"), AttentionRecorder(mha) as rec:
        out = compiled(x, x, x, need_weights=False)[0]
    assert rec.names() == [] and _hook_state(mha) == before
    torch.testing.assert_close(out, want, rtol=0, atol=1e-6)


def test_modules_running_on_another_thread_do_not_name_the_maps():
    """A second thread inside a hooked module (the same model served concurrently) must not steal the names."""
    torch.manual_seed(0)
    model, x = _Encoder(), torch.randn(2, 5, 12)
    inside, leave = threading.Event(), threading.Event()
    ff = model.layers[1].ff
    ff.register_forward_hook(lambda m, a, o: (inside.set(), leave.wait(10)) if threading.current_thread() is not
                             threading.main_thread() else None)
    other = threading.Thread(target=lambda: ff(torch.zeros(1, 12)))

    def start_other(module, args):  # runs after the recorder's pre-hook: this thread is inside self_attn now
        other.start()
        assert inside.wait(10)  # and the other thread is inside layers.1.ff, where it stays until `leave`

    with AttentionRecorder(model) as rec:
        handle = model.layers[0].self_attn.register_forward_pre_hook(start_other)
        try:
            model.layers[0](x)
        finally:
            handle.remove()
            leave.set()
            other.join(10)
    assert rec.names() == ["layers.0.self_attn"]


class _Layer(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.self_attn = MultiHeadAttention(dim, heads, batch_first=True)
        self.ff = nn.Linear(dim, dim)

    def forward(self, x):
        return self.ff(x + self.self_attn(x, x, x, need_weights=False)[0])


class _Encoder(nn.Module):
    """Two layers, the first applied twice, plus a bare attention() call in the root's forward."""

    def __init__(self, dim=12, heads=3):
        super().__init__()
        self.layers = nn.ModuleList([_Layer(dim, heads), _Layer(dim, heads)])

    def forward(self, x):
        x = self.layers[1](self.layers[0](self.layers[0](x)))
        q = x.unflatten(-1, (3, 4)).transpose(1, 2)  # (B, 3, L, 4)
        return attnkit.attention(q, q, q).transpose(1, 2).flatten(2)


def _hook_state(model):
    return {name: (dict(m._forward_hooks), dict(m._forward_pre_hooks), dict(m._forward_hooks_always_called))
            for name, m in model.named_modules()}


def _module_state(model):
    """Every attribute, buffer and parameter name of every submodule: recording must add none."""
    return {name: (set(vars(m)), set(m._buffers), set(m._parameters)) for name, m in model.named_modules()}


def test_names_follow_the_innermost_module_with_repeat_suffixes():
    torch.manual_seed(0)
    model, x = _Encoder(), torch.randn(2, 5, 12)
    with AttentionRecorder(model) as rec:
        model(x)
        attnkit.attention(*rand_qkv())  # outside the model: a bare call
        attnkit.attention(*rand_qkv())
    assert rec.names() == ["layers.0.self_attn", "layers.0.self_attn#1", "layers.1.self_attn", "model",
                           "attention", "attention#1"]
    assert [m.index for m in rec.maps] == list(range(6))
    assert all(isinstance(m, RecordedMap) for m in rec) and len(rec) == 6
    assert {k: tuple(v.shape) for k, v in rec.as_dict().items()}["model"] == (3, 5, 5)


def test_hooks_are_removed_and_the_fast_path_returns(reference_runs):
    torch.manual_seed(0)
    model, x = _Encoder(), torch.randn(2, 5, 12)
    model.layers[0].register_forward_hook(lambda m, a, o: None)  # a user's hook must survive
    model.register_forward_pre_hook(lambda m, a: None)
    before, attributes = _hook_state(model), _module_state(model)
    with AttentionRecorder(model) as rec:
        assert _hook_state(model) != before
        model(x)
        assert _module_state(model) == attributes  # no weights stored on the modules
    assert _hook_state(model) == before
    assert reference_runs == [True] * 4 and len(rec) == 4
    q = x.unflatten(-1, (3, 4)).transpose(1, 2)
    assert attnkit.explain(q, q, q).backend != "reference"  # these sizes normally skip the reference kernel
    model(x)
    assert reference_runs == [True] * 4 and len(rec) == 4  # nothing recorded, no forced reference path
    assert not recording.is_recording()


def test_an_exception_inside_the_block_still_removes_everything():
    torch.manual_seed(0)
    model, x = _Encoder(), torch.randn(2, 5, 12)
    before = _hook_state(model)
    with pytest.raises(RuntimeError, match="boom"), AttentionRecorder(model):
        model(x)
        raise RuntimeError("boom")
    assert _hook_state(model) == before and not recording.is_recording()


def test_an_exception_inside_a_submodule_leaves_no_stale_name():
    torch.manual_seed(0)
    model = _Encoder()
    with AttentionRecorder(model) as rec:
        with pytest.raises(ValueError):
            model.layers[0](torch.randn(2, 5, 7))  # wrong width: fails inside the layer
        attnkit.attention(*rand_qkv())
    assert rec.names() == ["attention"]  # not attributed to the layer that failed


def test_nested_recorders_both_get_every_map():
    mha, x = _mha_and_input()
    with AttentionRecorder(mha) as outer:
        with AttentionRecorder() as inner:
            mha(x, x, x)
        mha(x, x, x)
    assert inner.names() == ["attention"] and outer.names() == ["model", "model#1"]
    torch.testing.assert_close(inner["attention"].weights, outer["model"].weights, rtol=0, atol=0)


def test_self_reporting_modules_outside_a_model_and_suspension():
    g = torch.Generator().manual_seed(0)
    luong, pointer = LuongAttention(4, 6, score="concat", mode="local-m", window=1), PointerAttention(6, 4, 5)
    query, memory = torch.randn(2, 3, 4, generator=g), torch.randn(2, 7, 6, generator=g)
    with AttentionRecorder() as rec:
        out = luong(query, memory)
        logp = pointer(query[:, 0], memory)  # a single decoder step: (B, n)
        with recording.suspended():
            luong(query, memory)
    assert rec.names() == ["LuongAttention", "PointerAttention"]
    torch.testing.assert_close(rec["LuongAttention"].weights, out.weights, rtol=0, atol=0)
    torch.testing.assert_close(rec["PointerAttention"].weights, logp.exp(), rtol=0, atol=ATOL)
    assert tuple(rec.as_dict()["PointerAttention"].shape) == (1, 1, 7)


def test_as_dict_layouts_samples_and_errors():
    with AttentionRecorder() as rec:
        recording.report(torch.arange(24.0).view(2, 3, 4))  # (B, Lq, Lk)
        recording.report(torch.arange(8.0).view(2, 4))  # (B, Lk)
        recording.report(torch.arange(48.0).view(2, 2, 3, 4))  # (B, H, Lq, Lk)
    maps = rec.as_dict(sample=1)
    assert list(maps) == ["attention", "attention#1", "attention#2"]
    torch.testing.assert_close(maps["attention"], torch.arange(12.0, 24.0).view(1, 3, 4))
    torch.testing.assert_close(maps["attention#1"], torch.arange(4.0, 8.0).view(1, 1, 4))
    torch.testing.assert_close(maps["attention#2"], torch.arange(24.0, 48.0).view(2, 3, 4))
    with pytest.raises(ArgumentError, match="sample=2"):
        rec.as_dict(sample=2)
    with pytest.raises(KeyError, match="attention#1"):
        rec["nosuch"]
    with AttentionRecorder() as rec:
        recording.report(torch.zeros(1, 1, 1, 2, 2))
    with pytest.raises(ShapeError, match=r"shape \(1, 1, 1, 2, 2\)"):
        rec.as_dict()


def test_max_maps_to_cpu_dtype_and_clear():
    q, k, v = rand_qkv(dtype=torch.float64)
    with pytest.warns(RuntimeWarning, match="2 more maps"), AttentionRecorder(max_maps=1, to_cpu=False) as rec:
        for _ in range(3):
            attnkit.attention(q, k, v)
    assert rec.names() == ["attention"] and rec.dropped == 2
    assert rec["attention"].weights.dtype == torch.float32
    rec.clear()
    assert len(rec) == 0 and rec.dropped == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with rec:  # a recorder can be used again; names count from the start after clear()
            attnkit.attention(q, k, v)
    assert rec.names() == ["attention"]


def test_recorded_maps_are_copies():
    q, k, v = rand_qkv()
    with AttentionRecorder() as rec:
        w = attnkit.attention(q, k, v, return_weights=True).weights
    w.zero_()
    assert rec["attention"].weights.sum() > 0


def test_bad_arguments():
    with pytest.raises(DTypeError, match="an nn\\.Module"):
        AttentionRecorder(lambda x: x)
    with pytest.raises(ArgumentError, match="max_maps"):
        AttentionRecorder(max_maps=0)
    rec = AttentionRecorder()
    with pytest.warns(RuntimeWarning, match="no attention map"), rec, pytest.raises(ArgumentError, match="already"):
        rec.__enter__()


# ------------------------------------------------------------------ choosing and showing maps
def _model_like():
    """A recording like a transformers model's: 4 layers of (1, 3, 5, 5), tokens, and a pooling map."""
    g = torch.Generator().manual_seed(5)
    maps = {f"layers.{i}": torch.softmax(torch.randn(1, 3, 5, 5, generator=g), -1) for i in range(4)}
    maps["pool"] = torch.softmax(torch.randn(2, 5, generator=g), -1)  # (N, Lk): one query per batch entry
    tokens = {f"layers.{i}": (list("abcde"), list("vwxyz")) for i in range(4)}
    return AttentionRecorder.from_maps(maps, tokens=tokens), maps


def test_select_picks_maps_by_index_name_and_pattern_and_heads_in_the_order_given():
    rec, maps = _model_like()
    got = rec.select(layers=[-2, "layers.0", "lay*.1"], heads=[2, 0])
    assert got.names() == ["layers.0", "layers.1", "layers.3"]  # the recording's order, each once
    for name in got.names():
        torch.testing.assert_close(got[name].weights, maps[name][:, [2, 0]], rtol=0, atol=0)
    assert got.tokens == {n: rec.tokens[n] for n in got.names()} and len(rec) == 5  # the original is untouched
    assert rec.select().names() == rec.names() and rec.select(layers="pool", heads=[-1]).names() == ["pool"]
    assert rec.select(heads=-1)["layers.2"].weights.shape == (1, 1, 5, 5)


@pytest.mark.parametrize(("kwargs", "error", "words"), [
    ({"layers": [4 + 1]}, ArgumentError, "layer index 5 is out of range for 5 maps"),
    ({"layers": ["decoder.*"]}, ArgumentError, "no map is named 'decoder.*'; the maps: layers.0, layers.1"),
    ({"layers": [1.5]}, DTypeError, "layers must be map names, patterns or indices; got 1.5"),
    ({"heads": [3]}, ArgumentError, "map 'layers.0' has 3 heads; heads [3] do not exist"),
    ({"layers": ["pool"], "heads": [1]}, ArgumentError, "map 'pool' has 1 head; heads [1] do not exist"),
    ({"heads": []}, DTypeError, "heads must be a non-empty list of head indices"),
    ({"heads": [True]}, DTypeError, "heads must be a non-empty list"),
])
def test_select_names_what_it_cannot_find(kwargs, error, words):
    rec, _ = _model_like()
    with pytest.raises(error, match=re.escape(f"AttentionRecorder.select: {words}")):
        rec.select(**kwargs)


def test_picture_maps_and_labels():
    rec, maps = _model_like()
    shown = rec.picture_maps()
    torch.testing.assert_close(shown["pool"], maps["pool"][None], rtol=0, atol=0)  # batch entries as rows
    torch.testing.assert_close(shown["layers.1"], maps["layers.1"][0], rtol=0, atol=0)
    labels = rec.labels()
    assert labels["q_tokens"]["layers.2"] == list("abcde") and labels["k_tokens"]["layers.2"] == list("vwxyz")
    assert AttentionRecorder.from_maps({"m": torch.ones(1, 2, 2)}).labels() == {}
