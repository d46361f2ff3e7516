"""The fast lane's check: what torch's kernel answers for non-finite inputs against the float64 formula.

Without a masked key torch's kernel still answers some rows unlike the formula: a NaN query
over fewer keys than its vector width, keys all NaN or all scoring -inf (rows it zeroes, lse
exactly 0), and finite values near float32's largest (its unnormalised sum overflows to inf).
So the lane's check of the output and the lse runs after every call.
"""

from __future__ import annotations

import math

import pytest
import torch

import attnkit
from attnkit import masks
from attnkit.functional.validate import validate
from attnkit.kernels import lane, paths, rules, sdpa

CASES = ["nan query", "inf query", "huge queries", "nan key", "inf key", "nan value", "inf value", "keys all nan",
         "keys all -inf", "values near the largest float"]


def _inputs(case: str, lk: int):
    g = torch.Generator().manual_seed(lk)
    q, k, v = (torch.randn(1, 2, n, 16, generator=g) for n in (1, lk, lk))
    if case == "nan query":
        q[0, 1, 0, 3] = math.nan
    elif case == "inf query":
        q[0, 1, 0, 3] = math.inf
    elif case == "huge queries":
        q = q * 1e30
    elif case in ("nan key", "inf key"):
        k[0, 1, lk // 2, 3] = math.nan if case == "nan key" else math.inf
    elif case in ("nan value", "inf value"):
        v[0, 1, lk // 2, 3] = math.nan if case == "nan value" else math.inf
    elif case == "keys all nan":
        k[0, 1] = math.nan
    elif case == "values near the largest float":
        v[0, 1, :, 0] = 3e38  # finite, and so is the formula's answer
    else:  # every score of head 1 is -inf
        k[0, 1], q[0, 1] = -math.inf, q[0, 1].abs()
    return q, k, v


def _formula(q, k, v):
    """Float64, no mask: softmax of the scaled dot products times the values (NaN and inf propagate)."""
    s = q.double() @ k.double().transpose(-1, -2) / math.sqrt(q.shape[-1])
    return torch.softmax(s, -1) @ v.double()


@pytest.mark.parametrize("listed", [True, False])  # the lse read as Python floats, or checked by operators
@pytest.mark.parametrize("lk", [3, 16, 1024])
@pytest.mark.parametrize("case", CASES)
def test_where_torchs_kernel_differs_from_the_formula_without_a_mask_the_lanes_check_refuses_it(case, lk, listed,
                                                                                                 monkeypatch):
    monkeypatch.setattr(lane, "LISTED_ROWS", 256 if listed else 0)
    q, k, v = _inputs(case, lk)
    out, lse = rules.FLASH(q, k, v, 0.0, False, scale=0.25)[:2]
    right = torch.isclose(out.double(), _formula(q, k, v), rtol=1e-5, atol=1e-5, equal_nan=True).all()
    assert bool(right) or not lane.trusted(out, lse)


@pytest.mark.parametrize("listed", [True, False])
def test_the_check_refuses_what_it_relies_on_the_output_and_lse_to_show(listed, monkeypatch):
    # a row torch zeroed (output 0, lse exactly 0), NaN and inf in the lse, NaN and inf in the output
    monkeypatch.setattr(lane, "LISTED_ROWS", 256 if listed else 0)
    out, lse = torch.randn(2, 3, 4, 8), torch.randn(2, 3, 4).abs() + 1
    assert lane.trusted(out, lse)
    for where, value in (("lse", 0.0), ("lse", -0.0), ("lse", math.nan), ("lse", math.inf), ("lse", -math.inf),
                         ("out", math.nan), ("out", math.inf), ("out", -math.inf)):
        o, x = out.clone(), lse.clone()
        if where == "lse":
            x[1, 2, 3] = value
        else:
            o[1, 2, 3, 5] = value
        assert not lane.trusted(o, x), (where, value)
    assert lane.trusted(out.requires_grad_(), lse)  # under autograd too, without recording the check


@pytest.mark.parametrize("lq", [1, 2, 3, 16])
@pytest.mark.parametrize("case", CASES)
def test_several_queries_answer_non_finite_inputs_as_the_formula(case, lq):
    q, k, v = _inputs(case, 40)
    q = torch.cat([q] * lq, 2)
    got = attnkit.attention(q, k, v)
    torch.testing.assert_close(got.double(), _formula(q, k, v), rtol=1e-5, atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("lk", [3, 16, 128, 1024])
def test_torchs_kernel_differs_from_the_formula_without_a_mask_in_these_cases(lk):
    # Why the check stays after the kernel on calls with no masked key, decoding steps included: over a cache of
    # any length a head whose every score is -inf is answered 0 (the formula: NaN) and values near float32's
    # largest overflow to inf (the formula: finite); below the vector width (16 keys) NaN queries and all-NaN keys
    # are zeroed too. Only reading the whole cache before the kernel could tell these calls apart.
    differs = []
    for case in CASES:
        q, k, v = _inputs(case, lk)
        out = rules.FLASH(q, k, v, 0.0, False, scale=0.25)[0]
        if not torch.isclose(out.double(), _formula(q, k, v), rtol=1e-5, atol=1e-5, equal_nan=True).all():
            differs.append(case)
    assert {"keys all -inf", "values near the largest float"} <= set(differs)
    if lk < 16:
        assert {"nan query", "keys all nan"} <= set(differs)


@pytest.mark.parametrize("lk", [3, 16, 1024])
@pytest.mark.parametrize("case", CASES)
def test_a_decoding_step_answers_non_finite_inputs_as_the_formula(case, lk):
    q, k, v = _inputs(case, lk)
    for mask in (None, masks.causal()):  # one query, bottom-right: no key is masked
        assert attnkit.explain(q, k, v, mask=mask).lane is not None
        got = attnkit.attention(q, k, v, mask=mask)
        torch.testing.assert_close(got.double(), _formula(q, k, v), rtol=1e-5, atol=1e-5, equal_nan=True)
        assert torch.isfinite(got).all() == torch.isfinite(_formula(q, k, v)).all()


@pytest.mark.parametrize("listed", [True, False])
@pytest.mark.parametrize("case", CASES)
def test_a_grouped_decoding_step_is_checked_in_the_kernels_rows(case, listed, monkeypatch):
    # 8 query heads over 2 key/value heads and enough keys: each group runs as rows of one product, and the lane
    # checks that call's lse in the kernel's shape (B, H_kv, group), not copied to (B, H, 1)
    monkeypatch.setattr(lane, "LISTED_ROWS", 256 if listed else 0)
    q, k, v = _inputs(case, sdpa.GROUPED_KEYS)
    q = q.repeat_interleave(4, 1)  # query heads 4-7 read key/value head 1, where the case is
    assert sdpa.flash(q, k, v, False, None, 0.25, lse_per_head=False)[1].shape == (1, 2, 4)
    assert attnkit.explain(q, k, v).lane is not None
    got = attnkit.attention(q, k, v)
    want = _formula(q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1))
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5, equal_nan=True)


def test_a_masked_nan_key_never_reaches_a_chunked_prefill_through_the_lane():
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(1, 2, 4, 16, generator=g), torch.randn(1, 2, 40, 16, generator=g), torch.randn(
        1, 2, 40, 16, generator=g)
    k[0, 0, -1] = math.nan  # the last key: masked for every query but the last
    got = attnkit.attention(q, k, v, mask=masks.causal())
    assert torch.isfinite(got[:, :, :3]).all() and torch.isnan(got[0, 0, 3]).all() and torch.isfinite(got[0, 1]).all()


# ------------------------------------------------------------------ the lane and the table agree

def _route(q, k, v, mask=None, bias=None, score="scaled_dot", scale=None, normalize="softmax", dropout_p=0.0,
           return_weights=False, return_lse=False, backend="auto", sinks=None):
    return lane.route(q, k, v, mask, bias, score, scale, normalize, dropout_p, return_weights, return_lse, backend,
                      sinks)


def _layout(t: torch.Tensor, how: str) -> torch.Tensor:
    if how == "strided":  # innermost stride 2: torch's kernel misreads it
        return torch.stack([t, t], -1)[..., 0]
    if how == "heads permuted":  # innermost stride 1, not contiguous
        return t.transpose(1, 2).contiguous().transpose(1, 2)
    return t


_MASKS = {"none": None, "causal": masks.causal(), "causal top-left": masks.causal("top_left"),
          "window": masks.sliding_window(2, 0)}
_SIZES = [(1, 8), (3, 8), (8, 8), (8, 3)]


def _calls():
    """A grid of calls the lane might take: options torch-sdpa's rules read, masks, sizes, scales and layouts."""
    g = torch.Generator().manual_seed(0)
    for (lq, lk), mask, scale in ((s, m, c) for s in _SIZES for m in _MASKS for c in (None, 0.5, -0.5)):
        q0, k0, v0 = (torch.randn(1, 4, n, 8, generator=g) for n in (lq, lk, lk))
        for score, normalize, biased, weights in ((s, n, b, w) for s in ("scaled_dot", "dot", "cosine")
                                                  for n in ("softmax", "sparsemax") for b in (False, True)
                                                  for w in (False, True)):
            bias = torch.zeros(1, 4, lq, lk) if biased else None
            yield (q0, k0, v0), dict(mask=_MASKS[mask], bias=bias, score=score, scale=scale, normalize=normalize,
                                     return_weights=weights)
        for layout, grad, dv, hkv in ((a, b, c, d) for a in ("contiguous", "strided", "heads permuted")
                                      for b in (False, True) for c in (8, 4) for d in (4, 2)):
            k, v = k0[:, :hkv], v0[:, :hkv, :, :dv]
            q, k, v = (_layout(t.clone(), layout).requires_grad_(grad) for t in (q0, k, v))
            yield (q, k, v), dict(mask=_MASKS[mask], scale=scale)


def test_the_lane_takes_a_call_exactly_where_the_tables_rules_say_torchs_kernel_answers_it():
    taken = 0
    for (q, k, v), options in _calls():
        p = validate(q, k, v, **options)
        table = rules.first_refusal(p, sdpa.LANE, data=False) is None
        fast = _uncached(q, k, v, **options)  # the rules walked (the cache: the tests below)
        assert (fast is not None) == table, (tuple(q.shape), tuple(k.shape), tuple(v.shape), options)
        if fast is not None:
            taken += 1
            assert paths.BY_NAME["torch-sdpa"].refusal(p, data=False) is None  # the lane's rules include the path's
            km = sdpa.kernel_mask(p, q.dtype)  # and the lane reads the mask as the path does
            assert fast[0] == km.is_causal and fast[1] is km.float_mask and fast[2] == p.scale
    assert taken > 100


def _uncached(q, k, v, **options):
    lane._DECIDED.clear()
    return _route(q, k, v, **options)


def _same(a, b) -> bool:
    """Two answers of the route: equal, the float mask compared by value."""
    if a is None or b is None:
        return a is b
    return a[0] == b[0] and a[2:] == b[2:] and (a[1] is b[1] or (a[1] is not None and b[1] is not None
                                                                 and torch.equal(a[1], b[1])))


def test_the_cached_decision_is_the_walks_on_every_call_of_the_grid_in_any_order():
    calls = list(_calls())
    walked = [_uncached(q, k, v, **options) for (q, k, v), options in calls]
    lane._DECIDED.clear()
    order = torch.randperm(len(calls), generator=torch.Generator().manual_seed(1)).tolist()
    for _ in range(2):  # the first pass fills the cache in a shuffled order, the second reads it
        for i in order:
            (q, k, v), options = calls[i]
            assert _same(_route(q, k, v, **options), walked[i]), (tuple(q.shape), tuple(k.shape), options)
    assert 0 < len(lane._DECIDED) < len(calls)  # calls share signatures


def test_the_cached_decision_follows_the_inputs_when_they_change_class():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, n, 8, generator=g) for n in (1, 9, 9))
    causal, top_left = masks.causal(), masks.causal("top_left")
    lane._DECIDED.clear()
    steps = [
        ((q, k, v), dict(mask=causal)),  # a decoding step
        ((q, k[:, :, :5], v[:, :, :5]), dict(mask=causal)),  # a shorter cache: the same signature, a cache hit
        ((q, k[:, :, :1], v[:, :, :1]), dict(mask=causal)),  # Lq == Lk: is_causal
        ((torch.cat([q] * 3, 2), k, v), dict(mask=causal)),  # chunked prefill: a float mask for these lengths
        ((torch.cat([q] * 4, 2), k, v), dict(mask=causal)),  # another mask, same signature
        ((torch.cat([q] * 12, 2), k, v), dict(mask=causal)),  # Lq > Lk: rows without a key, refused
        ((torch.cat([q] * 3, 2), k, v), dict(mask=top_left)),
        ((q, k, v), dict(mask=causal, scale=-0.5)),
        ((q.double(), k.double(), v.double()), dict(mask=causal)),
        ((q.half(), k.half(), v.half()), dict(mask=causal)),  # not a CPU dtype of the lane
        ((q, k.transpose(2, 3).contiguous().transpose(2, 3), v), dict(mask=causal)),  # innermost stride != 1
        ((q, k.transpose(1, 2).contiguous().transpose(1, 2), v), dict(mask=causal)),  # permuted heads: in place
        ((q.requires_grad_(), k.transpose(1, 2).contiguous().transpose(1, 2), v), dict(mask=causal)),
        ((q, k, v[..., :4]), dict(mask=causal)),  # Dv != D
        ((q, k, v), dict(mask=causal, score="dot")),
        ((q, k, v), dict(mask=causal, normalize="sparsemax")),
        ((q, k, v), dict(mask=causal, normalize=lambda s, allowed: torch.softmax(s, -1))),  # uncached
        ((q, k, v), dict(mask=masks.sliding_window(2, 0))),
        ((q, k, v), dict(mask=None)),
    ]
    for _ in range(2):
        for (a, b, c), options in steps:
            cached = _route(a, b, c, **options)
            keep = dict(lane._DECIDED)
            assert _same(cached, _uncached(a, b, c, **options)), (tuple(a.shape), tuple(b.shape), options)
            lane._DECIDED.update(keep)
    with torch.no_grad():  # the same tensors without autograd: another signature
        assert _same(_route(q, k, v, mask=causal), _uncached(q, k, v, mask=causal))


def test_the_lanes_rules_are_torch_sdpas_data_free_rules_and_its_own():
    assert all(rule in sdpa.LANE for rule in sdpa.REFUSALS if not getattr(rule, "reads_data", False))
    assert not any(getattr(rule, "reads_data", False) for rule in sdpa.LANE)


@pytest.mark.parametrize("outside", [dict(sinks=torch.zeros(1, 4, 1)), dict(return_lse=True), dict(dropout_p=0.1),
                                     dict(backend="sdpa"), dict(rank=3), dict(dtype=torch.float16)])
def test_options_outside_the_lanes_scope_go_to_the_full_route(outside):
    q, k, v = (torch.randn(1, 4, n, 8) for n in (1, 8, 8))
    rank, dtype = outside.pop("rank", 4), outside.pop("dtype", torch.float32)
    q, k, v = (t.to(dtype)[0] if rank == 3 else t.to(dtype) for t in (q, k, v))
    assert _route(q, k, v, **outside) is None
    assert _route(q, k, v) is not None or dtype == torch.float16 or rank == 3
