"""core.py, the entry point: the three routes (fast lane, traced, dispatched), how far a call travels, the lane.

The route checks trace every Python call a call makes (``sys.setprofile``): a masked call reads at
most 8 files of ``src/attnkit`` from ``attention()`` down to the arithmetic and a decoding step at
most 6, and on every chain of calls no file is entered again from below (a lower layer never calls
back into a file above it). docs/DESIGN.md lists the files.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import attnkit
from attnkit import masks
from tests.helpers import assert_close_to_oracle, rand_qkv
from tests.oracle import dense_attention

SRC = str(Path(attnkit.__file__).parent) + "/"


def route(fn):
    """``(files, reentries)``: the package files whose code ``fn()`` runs, in first-visit order, and every call
    into a file that is already on the call stack below another file."""
    files, stack, reentries = [], [], []

    def profile(frame, event, arg):
        if event == "call":
            name = frame.f_code.co_filename
            rel = name[len(SRC):] if name.startswith(SRC) else None
            if rel is not None:
                if rel not in files:
                    files.append(rel)
                above = [f for f in stack if f is not None]
                if above and above[-1] != rel and rel in above:
                    reentries.append((rel, above))
            stack.append(rel)
        elif event == "return" and stack:
            stack.pop()

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return files, reentries


def test_a_masked_call_reads_at_most_eight_files_straight_down():
    q = torch.randn(1, 8, 1024, 64)
    mask = masks.causal() & masks.sliding_window(128)
    attnkit.attention(q, q, q, mask=mask)  # caches warm: the route every later call takes
    files, reentries = route(lambda: attnkit.attention(q, q, q, mask=mask))
    assert len(files) <= 8 and not reentries, (files, reentries)
    assert files[0] == "core.py" and "kernels/band.py" in files


@pytest.mark.parametrize("name", ["no mask", "causal", "grouped heads"])
def test_a_decoding_step_reads_at_most_six_files(name):
    q, k, v = rand_qkv(1, 8, 1, 300, 64, hkv=2 if name == "grouped heads" else 8)
    mask = None if name == "no mask" else masks.causal()
    files, reentries = route(lambda: attnkit.attention(q, k, v, mask=mask))
    assert len(files) <= 6 and not reentries, (files, reentries)
    assert "kernels/lane.py" in files and "kernels/dispatch.py" not in files


def test_a_training_call_on_a_structured_mask_also_goes_straight_down():
    q, k, v = rand_qkv(1, 4, 600, 600, 16, requires_grad=True)
    mask = masks.causal() & masks.strided(64)
    step = lambda: attnkit.attention(q, k, v, mask=mask).sum().backward()
    step()  # the block plan and slab biases are built and cached on the mask
    files, reentries = route(step)
    assert "kernels/blocksparse_fused.py" in files and not reentries, reentries


# ------------------------------------------------------------------ every entry point
def _varlen():
    q = torch.randn(300, 4, 16)
    cu = torch.tensor([0, 100, 220, 300], dtype=torch.int32)
    return lambda: attnkit.varlen_attn(q, q, q, cu, cu.clone(), 120, 120, window_size=(-1, 0))


def _sinks(mask):
    q, s = torch.randn(1, 4, 256, 16), torch.randn(4)
    return lambda: attnkit.attention(q, q, q, mask=mask, sinks=s)


def _flex():
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    q = torch.randn(1, 4, 1024, 16)
    block_mask = flex.create_block_mask(lambda b, h, i, j: (i >= j) & (i - j < 200), None, None, 1024, 1024,
                                        device="cpu")
    return lambda: attnkit.flex_attention(q, q, q, block_mask=block_mask)


def _paged_decode():
    g = torch.Generator().manual_seed(0)
    k_pool, v_pool = torch.randn(20, 16, 2, 16, generator=g), torch.randn(20, 16, 2, 16, generator=g)
    table, used = torch.randperm(20, generator=g)[:14].view(2, 7), torch.tensor([100, 37])
    q, mask = torch.randn(2, 4, 1, 16, generator=g), masks.causal()
    return lambda: attnkit.attention(q, k_pool, v_pool, block_table=table, seqused_k=used, mask=mask)


def _selected_keys():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 256, 16, generator=g)
    mask = masks.selected_keys(torch.randint(0, 256, (1, 256, 32), generator=g)) & masks.causal()
    return lambda: attnkit.attention(q, q, q, mask=mask)


def _selected_decode():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 8, 1, 16, generator=g), torch.randn(1, 2, 300, 16, generator=g)
    mask = masks.selected_keys(torch.randint(0, 300, (1, 1, 1, 32), generator=g))
    return lambda: attnkit.attention(q, k, k, mask=mask)


# name: (the call, at most this many files, at most this many re-entries). The bar is 8 files and none; a
# number above it is the call's length today, a ceiling it may not exceed (docs/DESIGN.md lists the files).
ENTRY_POINTS = {
    "varlen_attn, 3 documents, causal": (_varlen, 9, 0),  # the bar + masks/cache.py (its layouts and plans)
    "sinks=, causal (torch-sdpa)": (lambda: _sinks(masks.causal()), 8, 0),
    "sinks=, sliding window (band)": (lambda: _sinks(masks.sliding_window(32)), 8, 0),
    "flex_attention, a windowed block mask, L = 1024": (_flex, 11, 0),  # + the tiles' predicate, every call
    "paged decode, 2 sequences": (_paged_decode, 5, 0),
    "selected keys & causal, 32 a query": (_selected_keys, 8, 0),
    "selected keys, a decoding step (GQA 8:2)": (_selected_decode, 5, 0),
}


@pytest.mark.parametrize("name", list(ENTRY_POINTS))
def test_every_entry_point_reaches_the_arithmetic_in_few_files_straight_down(name):
    build, most_files, most_reentries = ENTRY_POINTS[name]
    call = build()
    call()  # caches warm: the route every later call takes
    files, reentries = route(call)
    assert len(files) <= most_files and len(reentries) <= most_reentries, (len(files), files, reentries)


# registry name: (files, re-entries) of a forward today (no gradient); a module not listed here: at most the
# longest of these. nn/_recurrent.py's base calls the module's _mix, which calls the base's helpers back.
LINEAR_FORWARDS = {"delta-product": (8, 0), "deltanet": (7, 0), "gated-deltanet": (7, 0), "gla": (6, 0),
                   "kimi-delta-attention": (7, 0), "lightning-attention": (7, 0), "mamba2": (7, 0),
                   "retnet": (7, 0), "rwkv4": (5, 0), "comba": (7, 0), "rwkv7": (6, 0),
                   "log-linear-gated-deltanet": (7, 0), "log-linear-mamba2": (8, 0)}


def _linear_modules():
    from attnkit import registry
    return [e.name for e in registry.entries() if e.family == "linear-recurrent"]


@pytest.mark.parametrize("name", _linear_modules())
def test_each_linear_module_forward_reaches_its_recurrence_in_few_files(name):
    from attnkit import registry
    module, inputs = registry.get(name).example()
    most_files, most_reentries = LINEAR_FORWARDS.get(name, max(LINEAR_FORWARDS.values()))
    with torch.no_grad():
        module(*inputs)
        files, reentries = route(lambda: module(*inputs))
    assert "functional/recurrences/forms.py" in files or "functional/recurrences/tree.py" in files
    assert len(files) <= most_files and len(reentries) <= most_reentries, (len(files), files, reentries)


# ------------------------------------------------------------------ the fast lane
LANE = {  # lq, lk, hq, hkv, kwargs
    "decode": (1, 300, 8, 8, {}),
    "decode, causal": (1, 300, 8, 8, {"mask": masks.causal()}),
    "decode, grouped heads": (1, 300, 8, 2, {"mask": masks.causal()}),
    "chunked prefill": (16, 300, 8, 8, {"mask": masks.causal()}),
    "prefill": (40, 40, 4, 4, {"mask": masks.causal()}),
    "top-left causal": (40, 70, 4, 4, {"mask": masks.causal(align="top_left")}),
    "float64, dot score": (3, 30, 2, 2, {"score": "dot"}),
}


@pytest.mark.parametrize("name", list(LANE))
def test_the_lane_serves_generation_calls_without_validation_and_equals_the_oracle(name, monkeypatch):
    lq, lk, hq, hkv, kwargs = LANE[name]
    dtype = torch.float64 if "float64" in name else torch.float32
    q, k, v = rand_qkv(2, hq, lq, lk, 16, hkv=hkv, dtype=dtype, seed=4)
    assert attnkit.explain(q, k, v, **kwargs).lane.startswith("fast lane")
    with monkeypatch.context() as patch:
        patch.setattr("attnkit.core.validate", lambda *a, **kw: pytest.fail("the lane validated the call"))
        got = attnkit.attention(q, k, v, **kwargs)
    assert_close_to_oracle(got, q, k, v, **kwargs)


OFF_LANE = {
    "bool tensor mask": dict(mask=torch.ones(5, 9, dtype=torch.bool)),
    "window": dict(mask=masks.sliding_window(2)),
    "bias": dict(bias=torch.zeros(5, 9)),
    "lse": dict(return_lse=True),
    "weights": dict(return_weights=True),
    "dropout": dict(dropout_p=0.5),
    "forced backend": dict(backend="sdpa"),
    "cosine score": dict(score="cosine"),
    "rows left empty": dict(mask=masks.causal(), q_len=12),
}


@pytest.mark.parametrize("name", list(OFF_LANE))
def test_every_other_call_takes_the_full_route(name):
    kwargs = dict(OFF_LANE[name])
    q, k, v = rand_qkv(2, 3, kwargs.pop("q_len", 5), 9, 8, seed=1)
    assert attnkit.explain(q, k, v, **kwargs).lane is None


@pytest.mark.parametrize("layout", ["transposed innermost", "half precision", "3-D", "meta"])
def test_inputs_the_kernel_would_misread_stay_off_the_lane(layout):
    q, k, v = rand_qkv(1, 2, 4, 9, 8, seed=2)
    if layout == "transposed innermost":
        q = q.transpose(2, 3).contiguous().transpose(2, 3)
    elif layout == "half precision":
        q, k, v = (t.to(torch.bfloat16) for t in (q, k, v))
    elif layout == "3-D":
        q, k, v = (t[0] for t in (q, k, v))
    else:
        q, k, v = (t.to("meta") for t in (q, k, v))
    assert attnkit.explain(q, k, v).lane is None


def test_rows_torch_answers_differently_leave_the_lane_for_the_exact_path():
    """A NaN query row over fewer keys than torch's vector width: torch's kernel answers 0, attnkit NaN."""
    q, k, v = rand_qkv(1, 2, 3, 7, 16, seed=3)
    q[0, 1, 2, 5] = float("nan")
    assert torch.nn.functional.scaled_dot_product_attention(q, k, v)[0, 1, 2].eq(0).all()  # torch's answer
    got = attnkit.attention(q, k, v)
    assert torch.isnan(got[0, 1, 2]).all() and torch.isfinite(got[0, 0]).all()
    torch.testing.assert_close(got, attnkit.attention(q, k, v, backend="reference"), equal_nan=True)


def test_bad_arguments_raise_the_same_errors_on_and_off_the_lane():
    q, k, v = rand_qkv(1, 2, 1, 9, 8)
    with pytest.raises(attnkit.ShapeError, match="feature dim"):
        attnkit.attention(q, k[..., :4], v)
    with pytest.raises(attnkit.DTypeError, match="share a dtype"):
        attnkit.attention(q, k.double(), v)
    with pytest.raises(attnkit.ArgumentError, match="backend"):
        attnkit.attention(q, k, v, backend="nope")


def test_gradients_through_the_lane_equal_the_oracle():
    q, k, v = rand_qkv(4, 8, 32, 32, 16, hkv=2, dtype=torch.float64, seed=6, requires_grad=True)
    assert attnkit.explain(q, k, v, mask=masks.causal()).lane is not None
    out = attnkit.attention(q, k, v, mask=masks.causal())
    exact = dense_attention(q, k, v, mask=masks.causal(), differentiable=True)
    torch.testing.assert_close(out, exact)
    g = torch.randn(out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    for a, b in zip(torch.autograd.grad((out * g).sum(), (q, k, v)),
                    torch.autograd.grad((exact * g).sum(), (q, k, v)), strict=True):
        torch.testing.assert_close(a, b)
