"""The table of execution paths (kernels/paths.py) and the dispatcher that reads it (kernels/dispatch.py).

- the table is well formed: unique names, every public backend served, each path's
  module with refusal/run/cost/describe, the last path of a backend its most general;
- every path is reachable: a call that takes it under ``backend="auto"``, where
  ``explain()`` names it, ``attention()`` runs it, and the result is the oracle's;
- the common calls are decided in O(1): no block layout, no mask picture, no pass over
  q, k, v (a spy makes each of those raise);
- torch's kernel checks its own output: NaN or inf anywhere in q, k, v gives the exact
  path's answer, never torch's zeros;
- the device column: each row serves the devices it says, decided from the problem's
  facts and a device type given to it (CUDA and MPS decided here, without either).
"""

from __future__ import annotations

from pathlib import Path as FilePath

import pytest
import torch

import attnkit
from attnkit import masks
from attnkit.bias import ALiBi, Softcap
from attnkit.core import _prepare
from attnkit.functional.validate import Problem
from attnkit.kernels import dispatch, paths, rules
from attnkit.kernels.paths import BACKENDS
from attnkit.masks.base import Mask
from tests.helpers import assert_close_to_oracle, on_device, oracle, rand_qkv

SRC = FilePath(attnkit.__file__).parent


def test_the_table_is_well_formed():
    names = [path.name for path in paths.PATHS]
    assert len(names) == len(set(names))
    assert {path.backend for path in paths.PATHS} == set(BACKENDS) - {"auto"} == set(paths.BACKEND_NAMES)
    for path in paths.PATHS:
        assert all(callable(rule) for rule in path.refusals)
        assert callable(path.module.run) and callable(path.module.cost)
        assert (SRC / path.source).is_file(), path.source
    assert paths.of_backend("reference")[-1].name == "dense-reference"
    assert paths.of_backend("chunked")[-1].name == "online-softmax"
    assert paths.of_backend("blocksparse")[-1].name == "blocksparse-gathered"


# One call per path that backend="auto" sends there (sizes large enough to leave the small-problem rule).
REACH = {
    "torch-sdpa": (dict(lq=64, lk=64), dict(mask=masks.causal())),
    # a contiguous cache whose rows are full: the oracle's causal call (seqused_k is not its argument)
    "paged-split-kv": (dict(lq=4, lk=300), dict(mask=masks.causal(), seqused_k=torch.tensor([300, 300]))),
    "band-windows": (dict(lq=300, lk=300), dict(mask=masks.sliding_window(16, 16))),
    "fixed-blocks": (dict(lq=512, lk=512), dict(mask=masks.causal() & masks.fixed(64, 8))),
    "blocksparse-fused": (dict(lq=512, lk=512), dict(mask=masks.segments(torch.arange(512) // 64))),
    "blocksparse-masked": (dict(lq=512, lk=512, dv=13), dict(mask=masks.segments(torch.arange(512) // 64))),
    "blocksparse-gathered": (dict(lq=512, lk=512), dict(mask=masks.segments(torch.arange(512) // 64),
                                                        score="cosine")),
    "bias-slabs": (dict(lq=300, lk=300), dict(bias=ALiBi(3))),
    "softcap-loop": (dict(lq=300, lk=300), dict(bias=Softcap(5.0))),
    "online-softmax": (dict(lq=300, lk=300), dict(score="cosine")),
    "dense-reference": (dict(lq=300, lk=300), dict(normalize="sparsemax")),
}


# Paths that serve no CPU call: reached under backend="auto" on the device named (decided, not run, here).
REACH_ON = {"flex": ("cuda", dict(lq=300, lk=300), dict(mask=masks.sliding_window(16, 16)))}


def test_every_path_is_reached():
    assert set(REACH) == {path.name for path in paths.PATHS if path.serves("cpu")}
    assert set(REACH) | set(REACH_ON) == set(paths.BY_NAME)


@pytest.mark.parametrize("name", list(REACH_ON))
def test_auto_chooses_a_path_on_the_device_it_serves(name):
    device, sizes, kwargs = REACH_ON[name]
    q, k, v = rand_qkv(2, 3, sizes["lq"], sizes["lk"], 11, seed=5)
    p = on_device(_prepare(q, k, v, **kwargs), device)
    assert dispatch.choose(p).path.name == name == dispatch.choose(p, data=False).path.name


@pytest.mark.parametrize("name", list(REACH))
def test_auto_runs_the_path_explain_names_and_it_equals_the_oracle(name):
    sizes, kwargs = REACH[name]
    q, k, v = rand_qkv(2, 3, sizes["lq"], sizes["lk"], 11, sizes.get("dv"), seed=5)
    decision = attnkit.explain(q, k, v, **kwargs)
    assert decision.path == name and decision.backend == paths.BY_NAME[name].backend
    assert decision.reasons[name].startswith("chosen:") and paths.BY_NAME[name].source in decision.reasons[name]
    assert all(why.startswith(("refused: ", "able, not preferred: ")) for n, why in decision.reasons.items()
               if n != name)
    assert decision.cost is not None and decision.flops == decision.cost.flops > 0
    _, ran = dispatch.execute(_prepare(q, k, v, **kwargs))
    assert ran.name == name
    same = {key: value for key, value in kwargs.items() if key != "seqused_k"}
    assert_close_to_oracle(attnkit.attention(q, k, v, **kwargs), q, k, v, **same)


def test_forced_backend_runs_its_first_able_path_or_names_its_general_refusal():
    q, k, v = rand_qkv(1, 2, 300, 300, 8)
    assert attnkit.explain(q, k, v, mask=masks.causal(), backend="blocksparse").path == "blocksparse-fused"
    assert attnkit.explain(q, k, v, bias=ALiBi(2), backend="chunked").path == "bias-slabs"
    d = attnkit.explain(q, k, v, backend="reference")
    assert d.reasons["torch-sdpa"] == "able, not preferred: not asked: backend='reference' was forced"
    with pytest.raises(attnkit.BackendError, match=r"blocksparse.*return_weights"):
        attnkit.attention(q, k, v, backend="blocksparse", return_weights=True)


# ------------------------------------------------------------------ O(1) decisions

@pytest.fixture
def no_data_passes(monkeypatch):
    """Returns ``activate()``: from then on block layouts, mask pictures over query rows and finiteness passes raise."""
    return lambda: _refuse_data_passes(monkeypatch)


def _refuse_data_passes(monkeypatch):
    def refuse(what):
        def raiser(*args, **kwargs):
            raise AssertionError(f"the dispatcher computed {what} for a common call")
        return raiser
    monkeypatch.setattr(Mask, "block_layout", refuse("a block layout"))
    monkeypatch.setattr(Problem, "inputs_finite", refuse("a finiteness pass over q, k, v"))
    original = Mask.materialize

    def materialize(self, q_len, kv_len, **kwargs):
        assert q_len == 1, "the dispatcher built an (Lq, Lk) mask picture"  # key padding: a (B, 1, 1, Lk) row
        return original(self, q_len, kv_len, **kwargs)
    monkeypatch.setattr(Mask, "materialize", materialize)


COMMON = {
    "no mask": (1, 1, 8, 8, {}),
    "decode, causal": (1, 300, 8, 8, {"mask": masks.causal()}),
    "decode, causal, GQA": (1, 300, 8, 2, {"mask": masks.causal()}),
    "chunked prefill, causal": (16, 300, 8, 8, {"mask": masks.causal()}),
    "prefill, top-left causal": (300, 300, 8, 8, {"mask": masks.causal(align="top_left")}),
    "key padding": (40, 300, 8, 8, {"mask": masks.padding([300, 120])}),
    "bool tensor": (40, 300, 8, 8, {"mask": torch.rand(40, 300, generator=torch.Generator().manual_seed(0)) > 0.3}),
}


@pytest.mark.parametrize("name", list(COMMON))
def test_common_calls_are_decided_without_layouts_pictures_or_data_passes(name, no_data_passes):
    lq, lk, hq, hkv, kwargs = COMMON[name]
    q, k, v = rand_qkv(2, hq, lq, lk, 16, hkv=hkv, seed=7)
    expected = oracle(q, k, v, **kwargs).float()
    no_data_passes()
    got = attnkit.attention(q, k, v, **kwargs)
    assert dispatch.choose(_prepare(q, k, v, **kwargs)).path.name == "torch-sdpa"
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_a_mask_reused_over_many_lengths_keeps_bounded_caches():
    mask = masks.global_tokens([0]) | masks.sliding_window(32)
    band = masks.causal() & masks.sliding_window(32)
    for length in range(200, 1000, 4):
        q = torch.zeros(1, 1, length, 8)
        attnkit.explain(q, q, q, mask=mask)  # builds (or reuses) its block plan for the density
        assert attnkit.explain(q, q, q, mask=band).path == "band-windows"
    assert 0 < len(mask._cache_block_plans) <= 8
    assert all(0 < len(part._cache_layouts) <= 16 for part in mask.parts)
    assert not hasattr(band, "_cache_block_plans")  # a band's density comes from its window plan: no layouts


# ------------------------------------------------------------------ torch's kernel checks its own output

@pytest.mark.parametrize("head_dim", [11, 16])
@pytest.mark.parametrize("where", ["q", "k", "v"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("mask_name", ["none", "causal", "decode", "padding", "one key"])
def test_non_finite_inputs_give_the_exact_answer(head_dim, where, value, mask_name):
    lq = 1 if mask_name == "decode" else 9
    q, k, v = rand_qkv(2, 2, lq, 9, head_dim, seed=3)
    mask = {"none": None, "causal": masks.causal(), "decode": masks.causal(), "padding": masks.padding([9, 5]),
            "one key": masks.padding([1, 1])}[mask_name]
    target = {"q": q, "k": k, "v": v}[where]
    target[1, 0, 0, 3] = value  # row 0: the first query, or the first key (seen by every query)
    got = attnkit.attention(q, k, v, mask=mask)
    # What the exact path gives (an inf query can make a row's only score -inf: NaN there, by the library's
    # rule that non-finite allowed inputs propagate), never torch's zeros for a NaN row.
    expected = attnkit.attention(q, k, v, mask=mask, backend="reference")
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5, equal_nan=True)
    assert torch.isfinite(got[0]).all()  # the other batch element is untouched


def test_nan_in_a_key_another_document_sees_never_reaches_this_one():
    """Dense enough for torch's kernel after a block-sparse rule learnt the inputs are not finite (rule 3)."""
    q, k, v = rand_qkv(1, 1, 128, 128, 16, seed=1)
    k[0, 0, 100, 0] = float("nan")  # a key of document 1 only
    mask = masks.segments(torch.arange(128) // 64)
    got = attnkit.attention(q, k, v, mask=mask)
    assert torch.isfinite(got[..., :64, :]).all() and torch.isnan(got[..., 64:, :]).all()
    torch.testing.assert_close(got, attnkit.attention(q, k, v, mask=mask, backend="reference"), equal_nan=True)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_padded_keys_reach_neither_output_nor_gradients(value):
    q, k, v = rand_qkv(2, 4, 1, 30, 16, seed=2)
    k[0, :, 19:] = value
    v[0, :, 19:] = value
    mask = masks.padding([19, 30]) & masks.causal()  # decoding over a padded KV cache
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = attnkit.attention(q, k, v, mask=mask)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    ref = attnkit.attention(q, k, v, mask=mask, backend="reference")
    ref_grads = torch.autograd.grad(ref.sum(), (q, k, v))
    for got, want in zip((out, *grads), (ref, *ref_grads), strict=True):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_padded_minus_inf_key_gives_finite_query_gradients():
    """-inf in a padded key: torch's output is finite, but 0 * inf in dQ; padded rows are zeroed under autograd."""
    q = torch.rand(1, 1, 1, 4, requires_grad=True)
    k = torch.randn(1, 1, 3, 4)
    k[0, 0, 2] = -float("inf")
    k.requires_grad_()
    v = torch.randn(1, 1, 3, 4, requires_grad=True)
    attnkit.attention(q, k, v, mask=masks.padding([2])).sum().backward()
    q2, k2, v2 = (t.detach().clone().requires_grad_() for t in (q, k, v))
    attnkit.attention(q2, k2, v2, mask=masks.padding([2]), backend="reference").sum().backward()
    torch.testing.assert_close(q.grad, q2.grad)


@pytest.mark.parametrize("scale", [0.0, -1.0, -1e-30])
@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
def test_causal_with_a_scale_at_most_zero_is_exact(scale, align):
    q, k, v = rand_qkv(1, 2, 4, 4, 8, dtype=torch.float64, seed=4)
    mask = masks.causal(align=align)
    got = attnkit.attention(q, k, v, mask=mask, scale=scale)
    torch.testing.assert_close(got, oracle(q, k, v, mask=mask, scale=scale))
    _, ran = dispatch.execute(_prepare(q, k, v, mask=mask, scale=scale))
    if scale != 0.0:  # (scale 0 gives the one-key first row an lse of exactly log 1 = 0: run again, exactly)
        assert ran.name == "torch-sdpa"  # a float mask instead of is_causal: trusted at once


@pytest.mark.parametrize("mask", [masks.padding([0, 30]), masks.causal(), "tensor"],
                         ids=["length 0", "Lq > Lk", "bool"])
def test_rows_with_no_allowed_key_are_trusted_without_a_second_run(mask, monkeypatch):
    q, k, v = rand_qkv(2, 2, 40, 30, 16, seed=5)
    if mask == "tensor":
        mask = torch.rand(40, 30, generator=torch.Generator().manual_seed(0)) > 0.5
        mask[3] = False  # a query with no key (a left-padded row)
    calls = []
    kernel = rules.FLASH

    def counting(*args, **kwargs):
        calls.append(1)
        return kernel(*args, **kwargs)
    monkeypatch.setattr(rules, "FLASH", counting)
    _, ran = dispatch.execute(_prepare(q, k, v, mask=mask))
    assert ran.name == "torch-sdpa" and len(calls) == 1  # the kernel's lse 0 there is expected: no second run
    torch.testing.assert_close(attnkit.attention(q, k, v, mask=mask), oracle(q, k, v, mask=mask).float(),
                               rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ the device column

CPU_ONLY = {"band-windows", "fixed-blocks", "blocksparse-fused", "blocksparse-masked", "bias-slabs"}
SIMPLE = {  # lq, lk, hq, hkv, kwargs: calls torch's kernel takes as they are
    "no mask": (300, 300, 4, 4, {}),
    "causal": (300, 300, 4, 4, {"mask": masks.causal()}),
    "GQA, causal": (300, 300, 4, 2, {"mask": masks.causal()}),
    "decode over a cache": (1, 300, 4, 2, {"mask": masks.causal()}),
    "key padding": (300, 300, 4, 4, {"mask": masks.padding([300, 120])}),
}
STRUCTURED = {
    "window": {"mask": masks.sliding_window(32, 32)},
    "causal window": {"mask": masks.causal() & masks.sliding_window(64)},
    "Sparse Transformer strided": {"mask": masks.causal() & masks.strided(17)},
    "Sparse Transformer fixed": {"mask": masks.causal() & masks.fixed(64, 8)},
    "documents": {"mask": masks.segments(torch.arange(300) // 70) & masks.causal()},
    "prefix LM": {"mask": masks.prefix_lm(40)},
    "dilated": {"mask": masks.dilated(16, 3)},
    "ALiBi": {"bias": ALiBi(4), "mask": masks.causal()},
    "relative positions": {"bias": attnkit.bias.RelativePositionBias(4)},
    "soft-cap": {"bias": Softcap(20.0), "mask": masks.causal()},
    "tensor bias": {"bias": torch.randn(1, 4, 300, 300, generator=torch.Generator().manual_seed(1))},
    "lse": {"return_lse": True},
}


def _decided(device, lq=300, lk=300, hq=4, hkv=4, data=True, **kwargs):
    q, k, v = rand_qkv(2, hq, lq, lk, 16, hkv=hkv, seed=3)
    return dispatch.choose(on_device(_prepare(q, k, v, **kwargs), device), data=data)


def test_each_row_says_which_devices_it_serves():
    assert {path.name for path in paths.PATHS if path.devices == ("cpu",)} == CPU_ONLY
    assert paths.BY_NAME["flex"].devices == ("cuda",)
    assert all(path.devices is None for path in paths.PATHS if path.name not in CPU_ONLY | {"flex"})
    rule = rules.serves(("cpu",))
    q = torch.zeros(1, 1, 4, 8)
    assert rule(_prepare(q, q, q)) is None and rule(on_device(_prepare(q, q, q), "cuda")) == "CPU only"
    assert rules.serves(None) is None


@pytest.mark.parametrize("data", [True, False])
@pytest.mark.parametrize("device", ["cuda", "mps", "cpu"])
@pytest.mark.parametrize("name", list(SIMPLE))
def test_no_mask_causal_gqa_and_padding_go_to_torch_sdpa_on_every_device(name, device, data):
    lq, lk, hq, hkv, kwargs = SIMPLE[name]
    assert _decided(device, lq, lk, hq, hkv, data, **kwargs).path.name == "torch-sdpa"


@pytest.mark.parametrize("data", [True, False])
@pytest.mark.parametrize("name", list(STRUCTURED))
def test_on_cuda_every_structured_mask_and_bias_goes_to_flex(name, data):
    choice = _decided("cuda", data=data, **STRUCTURED[name])
    assert choice.path.name == "flex" and choice.rule == "flex"


@pytest.mark.parametrize("name", list(STRUCTURED))
def test_off_cuda_no_structured_call_takes_flex_or_a_cpu_only_path(name):
    for device in ("mps", "cpu"):
        chosen = _decided(device, **STRUCTURED[name]).path
        assert chosen.name != "flex" and chosen.serves(device)
    assert _decided("mps", **STRUCTURED[name]).path.name not in CPU_ONLY


@pytest.mark.parametrize("kwargs", [dict(return_weights=True), dict(normalize="sparsemax"), dict(dropout_p=0.1),
                                    dict(score="cosine")], ids=["weights", "sparsemax", "dropout", "cosine"])
def test_on_cuda_a_structured_call_flex_refuses_says_why_and_serves_its_device(kwargs):
    q, k, v = rand_qkv(2, 4, 300, 300, 16, seed=3)
    p = on_device(_prepare(q, k, v, mask=masks.sliding_window(16, 16), **kwargs), "cuda")
    decision = dispatch.decide(p)
    assert decision.reasons["flex"].startswith("refused: ") and "CUDA only" not in decision.reasons["flex"]
    assert paths.BY_NAME[decision.path].serves("cuda")
    if decision.path == "dense-reference":  # by a rule that says why: no chunked path honours it, or too dense
        assert dispatch.choose(p).rule == "no chunked path"
        assert all(why.startswith("refused: ") or "density" in why
                   for name, why in decision.reasons.items() if name != decision.path)


def test_explain_names_the_device_in_the_reasons_of_rows_serving_another():
    q, k, v = rand_qkv(1, 2, 300, 300, 16, seed=1)
    mask = masks.causal() & masks.sliding_window(32)
    on_cuda = dispatch.decide(on_device(_prepare(q, k, v, mask=mask), "cuda"))
    assert on_cuda.reasons["band-windows"] == "refused: CPU only; on cuda: flex"
    assert on_cuda.reasons["flex"].startswith("chosen: torch's FlexAttention")
    on_cpu = attnkit.explain(q, k, v, mask=mask)
    assert on_cpu.path == "band-windows" and on_cpu.reasons["flex"] == "refused: CUDA only; on cpu: band-windows"


def test_forcing_flex_off_cuda_names_the_device():
    q, k, v = rand_qkv(1, 2, 300, 300, 16)
    with pytest.raises(attnkit.BackendError, match=r"backend='flex'.*CUDA only"):
        attnkit.attention(q, k, v, mask=masks.sliding_window(8), backend="flex")
    forced = dispatch.choose(on_device(_prepare(q, k, v, mask=masks.sliding_window(8)), "cuda"), "blocksparse")
    assert forced.path.name == "blocksparse-gathered"  # the block path that serves every device
