"""LogAnomalyDetector (Brown et al. 2018) against a float64 loop over the history, causality, masks, anomaly ranking."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from attnkit.errors import ArgumentError, ShapeError
from attnkit.models.log_anomaly import LogAnomalyDetector

B, L, V, E, H, A = 2, 7, 11, 5, 6, 4
EVENTS = torch.tensor([[1, 4, 4, 2, 7, 10, 3], [3, 3, 5, 9, 0, 0, 0]])
KEEP = torch.arange(L) < torch.tensor([[L], [4]])
VARIANTS = ("fixed", "syntax", "semantic", "none")


def _model(attention, seed=0):
    torch.manual_seed(seed)
    return LogAnomalyDetector(V, embed_dim=E, hidden_dim=H, attention=attention, attn_dim=A, max_len=9).double()


@torch.no_grad()
def _reference(m, events, keep):
    """Per sample, unpadded: h_t = LSTM(start, x_0..x_{t-1}); K_j = tanh(W_a h_j), j <= t; d = softmax(q_t . K); ..."""
    nll = torch.zeros(events.shape, dtype=torch.float64)
    weights = torch.zeros(*events.shape, events.shape[1], dtype=torch.float64)
    for b in range(events.shape[0]):
        n = int(keep[b].sum())
        x = torch.cat([m.start[None], m.embed(events[b, :n - 1])])
        h = m.lstm(x[None])[0][0]  # (n, H)
        for t in range(n):
            feats = h[t]
            if m.variant != "none":
                if m.variant == "fixed":
                    q = m.attention.query
                elif m.variant == "syntax":
                    q = m.position_queries[t]
                else:
                    q = torch.tanh(m.query_proj.weight @ h[t])
                scores = torch.stack([q @ torch.tanh(m.attention.key_proj.weight @ h[j]) for j in range(t + 1)])
                d = torch.exp(scores - scores.max()) / torch.exp(scores - scores.max()).sum()
                feats = torch.cat([h[t], sum(d[j] * h[j] for j in range(t + 1))])
                weights[b, t, :t + 1] = d
            logits = m.out.weight @ feats + m.out.bias
            nll[b, t] = torch.logsumexp(logits, 0) - logits[events[b, t]]
    return nll, weights


@pytest.mark.parametrize("attention", VARIANTS)
def test_matches_hand_computation_with_padding(attention):
    m = _model(attention)
    out = m(EVENTS, mask=KEEP)
    nll, weights = _reference(m, EVENTS, KEEP)
    torch.testing.assert_close(out.nll, nll, rtol=0, atol=1e-12)
    if attention == "none":
        assert out.weights is None
    else:
        torch.testing.assert_close(out.weights, weights, rtol=0, atol=1e-12)
    per = F.cross_entropy(out.logits.transpose(1, 2), EVENTS, reduction="none")
    torch.testing.assert_close(out.nll, per * KEEP)


@pytest.mark.parametrize("attention", VARIANTS)
def test_predictions_never_see_the_future(attention):
    m = _model(attention)
    base = m(EVENTS).logits
    for k in (2, 5):
        changed = EVENTS.clone()
        changed[:, k] = (changed[:, k] + 1) % V
        logits = m(changed).logits
        torch.testing.assert_close(logits[:, :k + 1], base[:, :k + 1], rtol=0, atol=0)  # event k predicted from < k
        assert not torch.allclose(logits[:, k + 1], base[:, k + 1])


def test_padding_never_changes_real_events():
    m = _model("semantic")
    out = m(EVENTS, mask=KEEP)
    noisy = torch.where(KEEP, EVENTS, 8)
    got = m(noisy, mask=KEEP)
    torch.testing.assert_close(got.logits[KEEP], out.logits[KEEP], rtol=0, atol=0)  # padded rows: don't care
    torch.testing.assert_close((got.nll, got.weights), (out.nll, out.weights), rtol=0, atol=0)
    alone = m(EVENTS[1:, :4])
    torch.testing.assert_close(alone.nll, out.nll[1:, :4], rtol=0, atol=1e-12)
    torch.testing.assert_close(alone.weights, out.weights[1:, :4, :4], rtol=0, atol=1e-12)
    assert out.nll[1, 4:].eq(0).all() and out.weights[1, 4:].eq(0).all()


def test_explain_reports_scores_and_where_each_prediction_looked():
    m = _model("fixed")
    out = m(EVENTS, mask=KEEP)
    rep = m.explain(EVENTS, mask=KEEP)
    torch.testing.assert_close(rep.event_scores, out.nll, rtol=0, atol=0)
    torch.testing.assert_close(rep.total, torch.stack([out.nll[0].sum(), out.nll[1, :4].sum()]))
    torch.testing.assert_close(rep.worst, torch.stack([out.nll[0].max(), out.nll[1, :4].max()]))
    assert torch.equal(rep.looked_at[0], out.weights[0].argmax(-1) - 1) and rep.looked_at[1, 4:].eq(-1).all()
    assert rep.looked_at[:, 0].eq(-1).all()  # the first event can only look at the start state
    assert torch.triu(rep.weights, 1).eq(0).all()
    assert m.explain(EVENTS[:, :3]).weights.shape == (B, 3, 3)
    assert _model("none").explain(EVENTS).looked_at.eq(-1).all()


def test_learns_a_routine_and_scores_the_deviation_highest():
    torch.manual_seed(0)
    m = LogAnomalyDetector(6, embed_dim=8, hidden_dim=16, attention="semantic")
    routine = torch.tensor([1, 2, 3, 4, 5] * 2)
    normal = torch.stack([routine.roll(-s) for s in range(5)])  # (5, 10): every phase of the routine
    opt = torch.optim.Adam(m.parameters(), lr=0.03)
    for _ in range(80):
        opt.zero_grad()
        loss = m(normal).nll[:, 1:].mean()  # the first event has no context to predict from
        loss.backward()
        opt.step()
    assert loss < 0.05
    odd = normal[:1].clone()
    odd[0, 6] = 5  # 1 2 3 4 5 1 [5] 3 4 5
    rep = m.explain(odd)
    assert int(rep.event_scores[0, 1:].argmax()) + 1 == 6
    assert rep.total[0] > 10 * m.explain(normal[:1]).total[0] - 1e-9


def test_bad_arguments_raise_attnkit_errors():
    with pytest.raises(ArgumentError, match="attention"):
        LogAnomalyDetector(V, attention="tiered")
    with pytest.raises(ArgumentError, match="max_len"):
        LogAnomalyDetector(V, attention="syntax")
    m = _model("syntax")
    with pytest.raises(ArgumentError, match="max_len=9"):
        m(torch.zeros(B, 10, dtype=torch.long))
    with pytest.raises(ArgumentError, match=r"events ids must lie in \[0, 11\)"):
        m(EVENTS + V)
    with pytest.raises(ShapeError, match="events"):
        m(EVENTS[:, :0])
    with pytest.raises(ArgumentError, match="left-aligned"):
        m(EVENTS, mask=~KEEP)
