"""The three forms of every linear recurrence against the float64 oracle, against each other, and their properties."""

from __future__ import annotations

import pytest
import torch

from attnkit.functional.recurrences import FORMS, gated_delta_rule, retention

from .cases import NAMES, make

TOL = dict(rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("initial", [True, False])
def test_every_form_equals_the_oracle(name, form, initial):
    case = make(name, initial=initial)
    out, state = case.call(form, chunk_size=4)
    want_out, want_state = case.expected()
    torch.testing.assert_close(out, want_out, **TOL)
    torch.testing.assert_close(state, want_state, **TOL)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("initial", [True, False])
def test_gradients_agree_across_forms(name, initial):
    case = make(name, initial=initial, grad=True)
    g = torch.Generator().manual_seed(5)
    out, state = case.call("parallel")
    w_out, w_state = (torch.randn(t.shape, generator=g, dtype=t.dtype) for t in (out, state))
    grads = []
    for form in FORMS:
        out, state = case.call(form, chunk_size=3)
        loss = (out * w_out).sum() + (state * w_state).sum()
        grads.append(torch.autograd.grad(loss, case.leaves))
    for other in grads[1:]:
        for a, b in zip(grads[0], other, strict=True):
            assert torch.isfinite(a).all()
            torch.testing.assert_close(b, a, **TOL)


@pytest.mark.parametrize("name", NAMES)
def test_gradcheck_of_the_chunk_form(name):
    case = make(name, b=1, h=2, n=5, dk=3, dv=2, grad=True)
    assert torch.autograd.gradcheck(lambda *t: _rebound(case, t), tuple(case.leaves))


def _rebound(case, tensors):
    """The case's chunk form as a function of fresh leaves (gradcheck perturbs its own copies)."""
    saved = [leaf.data for leaf in case.leaves]
    for leaf, t in zip(case.leaves, tensors, strict=True):
        leaf.data = t.data
    try:
        out, state = case.call("chunk", chunk_size=2)
    finally:
        for leaf, s in zip(case.leaves, saved, strict=True):
            leaf.data = s
    return out, state


@pytest.mark.parametrize("name", NAMES)
def test_chunk_size_does_not_change_the_result(name):
    case = make(name)
    want = case.call("parallel")
    for size in (1, 2, 5, 13, 20):
        got = case.call("chunk", chunk_size=size)
        torch.testing.assert_close(got[0], want[0], **TOL)
        torch.testing.assert_close(got[1], want[1], **TOL)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("form", FORMS)
def test_changing_the_future_does_not_move_the_past(name, form):
    case = make(name)
    before = case.call(form, chunk_size=4)[0]
    for leaf in case.leaves[:3]:
        if leaf.dim() >= 3 and leaf.shape[2] == 13:
            leaf.data[:, :, 9:] += 3.0
    after = case.call(form, chunk_size=4)[0]
    torch.testing.assert_close(after[:, :, :9], before[:, :, :9], rtol=0, atol=0)
    assert not torch.allclose(after[:, :, 9:], before[:, :, 9:])


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("form", FORMS)
def test_packed_documents_equal_each_document_run_alone(name, form):
    lengths = [5, 0, 13, 1, 9]
    case = make(name, b=len(lengths), n=13)
    *tensors, s0 = case.leaves
    per_token = [t.dim() >= 3 and t.shape[2] == 13 for t in tensors]  # not a decay, A or D per head
    packed = [torch.cat([t[i : i + 1, :, :n] for i, n in enumerate(lengths)], 2) if tok else t
              for t, tok in zip(tensors, per_token, strict=True)]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    out, state = case.call(form, [*packed, s0], chunk_size=4, cu_seqlens=cu)
    for i, (piece, n) in enumerate(zip(out.split(lengths, 2), lengths, strict=True)):
        alone = [t[i : i + 1, :, :n] if tok else t for t, tok in zip(tensors, per_token, strict=True)]
        want_out, want_state = case.call(form, [*alone, s0[i : i + 1]], chunk_size=4)
        torch.testing.assert_close(piece, want_out, **TOL)
        torch.testing.assert_close(state[i : i + 1], want_state, **TOL)


@pytest.mark.parametrize("form", FORMS)
def test_empty_and_single_token_sequences(form):
    q, k, v = torch.randn(2, 3, 0, 5), torch.randn(2, 3, 0, 5), torch.randn(2, 3, 0, 7)
    s0 = torch.randn(2, 3, 5, 7)
    out, state = retention(q, k, v, torch.full((3,), 0.5), form=form, initial_state=s0)
    assert out.shape == (2, 3, 0, 7) and torch.equal(state, s0)
    leaves = [t.requires_grad_() for t in (q, k, v, torch.zeros(2, 3, 0), torch.zeros(2, 3, 0))]
    gated_delta_rule(*leaves, form=form)[0].sum().backward()  # every input gets its (empty) zero gradient
    assert [t.grad.shape for t in leaves] == [t.shape for t in leaves]
    case = make("kda", n=1)
    torch.testing.assert_close(case.call(form)[0], case.expected()[0], **TOL)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_low_precision_inputs_are_computed_in_float32(dtype):
    case = make("gated_delta", dtype=dtype)
    out, state = case.call("chunk", chunk_size=4)
    assert out.dtype == dtype and state.dtype == torch.float32
    want = case.expected()[0]
    # the float32 recurrence of the rounded inputs, against float64 of the unrounded ones: input rounding dominates
    err = (out.double() - want).abs().max().item()
    assert err < (1e-5 if dtype == torch.float32 else 0.1), err


def _saved_bytes(fn) -> int:
    """Bytes autograd keeps for the backward of ``fn()`` (each storage counted once)."""
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(storages.values())


@pytest.mark.parametrize("name", ["gated_delta", "kda"])
def test_the_chunk_form_keeps_memory_linear_in_the_length(name):
    saved = {}
    for form in ("chunk", "parallel"):
        for n in (256, 1024):
            case = make(name, b=1, h=2, n=n, dk=8, dv=8, grad=True)
            saved[form, n] = _saved_bytes(lambda c=case, f=form: c.call(f, chunk_size=16))
    assert saved["chunk", 1024] / saved["chunk", 256] < 4.2  # linear: ~4
    assert saved["parallel", 1024] / saved["parallel", 256] > 6  # superlinear (L^2, beside kda's L Dk log L terms)
    assert saved["chunk", 1024] < saved["parallel", 1024] / 3


def test_the_oracle_comparison_catches_a_scan_that_forgets_the_decay(monkeypatch):
    from attnkit.functional.recurrences import forms
    real = forms.pass_states

    def no_decay(initial, blocks):
        return real(initial, blocks._replace(decay=torch.ones_like(blocks.decay)))
    monkeypatch.setattr(forms, "pass_states", no_decay)
    case = make("gated_delta")
    with pytest.raises(AssertionError):
        torch.testing.assert_close(case.call("chunk", chunk_size=4)[0], case.expected()[0], **TOL)
    torch.testing.assert_close(case.call("parallel")[0], case.expected()[0], **TOL)  # one block: no scan


DELTA_NAMES = ("delta", "gated_delta", "kda")


@pytest.mark.parametrize("name", DELTA_NAMES)
@pytest.mark.parametrize("form", FORMS)
def test_negative_eigenvalues_every_form_equals_the_oracle(name, form):
    case = make(name, beta_max=2.0, seed=3)
    assert case.leaves[-2].max() > 1  # some transitions do have a negative eigenvalue
    out, state = case.call(form, chunk_size=4)
    want_out, want_state = case.expected()
    torch.testing.assert_close(out, want_out, **TOL)
    torch.testing.assert_close(state, want_state, **TOL)


@pytest.mark.parametrize("name", DELTA_NAMES)
def test_negative_eigenvalues_gradients_agree_across_forms(name):
    case = make(name, beta_max=2.0, seed=4, grad=True)
    g = torch.Generator().manual_seed(6)
    out, state = case.call("parallel")
    w_out, w_state = (torch.randn(t.shape, generator=g, dtype=t.dtype) for t in (out, state))
    grads = [torch.autograd.grad((o * w_out).sum() + (s * w_state).sum(), case.leaves)
             for o, s in (case.call(form, chunk_size=3) for form in FORMS)]
    for other in grads[1:]:
        for a, b in zip(grads[0], other, strict=True):
            torch.testing.assert_close(b, a, **TOL)
    assert torch.autograd.gradcheck(lambda *t: _rebound(case, t), tuple(case.leaves))


@pytest.mark.parametrize("name", DELTA_NAMES)
def test_negative_eigenvalues_equal_flash_linear_attentions_references(name):
    fla = pytest.importorskip("fla.ops.delta_rule.naive")  # test-only oracles, computed in float32
    from fla.ops.gated_delta_rule.naive import naive_recurrent_gated_delta_rule
    from fla.ops.kda.naive import naive_recurrent_kda
    case = make(name, beta_max=2.0, seed=8)
    out, state = case.call("chunk", chunk_size=4)
    q, k, v, *extra, s0 = (t.detach() for t in case.leaves)
    q, k = (t / (t.square().sum(-1, keepdim=True) + 1e-6).sqrt() for t in (q, k))  # what normalize_qk does

    def blh(t):
        return t.transpose(1, 2).float()
    if name == "delta":
        theirs, final = fla.delta_rule_recurrence(q, k, v, extra[0], initial_state=s0.float())
    elif name == "gated_delta":
        theirs, final = naive_recurrent_gated_delta_rule(*map(blh, (q, k, v, extra[1], extra[0])),
                                                         initial_state=s0.float(), output_final_state=True)
        theirs = theirs.transpose(1, 2)
    else:
        theirs, final = naive_recurrent_kda(*map(blh, (q, k, v, extra[0], extra[1])), initial_state=s0.float(),
                                            output_final_state=True)
        theirs = theirs.transpose(1, 2)
    torch.testing.assert_close(out, theirs.double(), rtol=0, atol=1e-4)
    torch.testing.assert_close(state, final.double(), rtol=0, atol=1e-4)
