"""PointerNetwork (Vinyals et al. 2015) against a float64 hand computation of eq. 3, decoding, masks and training."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from attnkit.errors import ArgumentError, DTypeError, ShapeError
from attnkit.models.pointer_network import PointerNetwork

B, N, D, H, T = 2, 5, 3, 7, 4


def _model(seed=0, **kwargs):
    torch.manual_seed(seed)
    return PointerNetwork(D, H, **kwargs).double()


def _points(seed=0, b=B, n=N):
    return torch.randn(b, n, D, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _reference(m, points, targets, lengths, exclude):
    """Per sample, unpadded: LSTMs run by torch; u_j = v . tanh(W1 e_j + W2 d_i) and the log-softmax by hand."""
    n_out = points.shape[1] + m.end_token
    out = torch.full((points.shape[0], targets.shape[1], n_out), float("-inf"), dtype=torch.float64)
    w1, w2, v = m.pointer.encoder_proj.weight, m.pointer.decoder_proj.weight, m.pointer.v
    for b in range(points.shape[0]):
        n = int(lengths[b])
        enc, state = m.encoder(points[b, :n][None])
        e = [enc[0, j] for j in range(n)]
        inputs = [points[b, j] for j in range(n)]
        cols = list(range(n))
        if m.end_token:  # the end position sits at the padded width
            e.append(m.end_state)
            inputs.append(m.end_input)
            cols.append(points.shape[1])
        col_of = {c: i for i, c in enumerate(cols)}
        fed = [m.start] + [inputs[col_of[int(c)]] for c in targets[b, :-1]]
        d = m.decoder(torch.stack(fed)[None], state)[0][0]
        for i in range(targets.shape[1]):
            used = {int(c) for c in targets[b, :i]} if exclude else set()
            ok = [k for k, c in enumerate(cols) if c not in used or (m.end_token and c == points.shape[1])]
            if not ok:  # every position used: probability 0 everywhere
                continue
            u = torch.stack([v @ torch.tanh(w1 @ e[k] + w2 @ d[i]) for k in ok])
            logp = u - torch.logsumexp(u, 0)
            for k, val in zip(ok, logp, strict=True):
                out[b, i, cols[k]] = val.detach()
    return out


@pytest.mark.parametrize("end_token", [False, True])
@pytest.mark.parametrize("exclude", [False, True])
def test_matches_hand_computation(end_token, exclude):
    m = _model(end_token=end_token, exclude_chosen=exclude)
    points = _points()
    targets = torch.tensor([[3, 1, 3 if not exclude else 0, N if end_token else 2], [2, 0, 1, 2]])
    lengths = torch.tensor([N, 3])
    got = m(points, targets, mask=torch.arange(N) < lengths[:, None])
    assert got.shape == (B, T, N + end_token)
    torch.testing.assert_close(got, _reference(m, points, targets, lengths, exclude), rtol=0, atol=1e-12)


def test_probabilities_sum_to_one_and_chosen_are_excluded():
    m = _model(end_token=True)
    targets = torch.tensor([[4, 0, 2, 1], [1, 3, 5, 5]])
    logp = m(_points(), targets)
    torch.testing.assert_close(logp.exp().sum(-1), torch.ones(B, T, dtype=torch.float64))
    for b in range(B):
        for i in range(T):
            for c in targets[b, :i].tolist():
                assert (logp[b, i, c] == float("-inf")) == (c != N)  # the end position is never used up
    free = _model(end_token=True, exclude_chosen=False)(_points(), targets)
    assert torch.isfinite(free).all()


@pytest.mark.parametrize("end_token", [False, True])
def test_greedy_decode_equals_teacher_forced(end_token):
    m = _model(end_token=end_token)
    points = _points(1)
    dec = m.greedy_decode(points)
    assert dec.ids.shape == (B, N + end_token) and dec.log_probs.shape == (B, N + end_token, N + end_token)
    logp = m(points, dec.ids)
    torch.testing.assert_close(logp, dec.log_probs, rtol=0, atol=1e-12)
    if not end_token:
        assert torch.equal(logp.argmax(-1), dec.ids)
        assert (dec.ids.sort(1).values == torch.arange(N)).all()  # each position once
    else:
        for b in range(B):
            stop = int((dec.ids[b] == N).int().argmax()) if (dec.ids[b] == N).any() else N
            assert torch.equal(logp[b, :stop + 1].argmax(-1), dec.ids[b, :stop + 1])
            assert dec.ids[b, stop:].eq(N).all()


def test_padded_points_never_change_outputs_and_are_never_chosen():
    m = _model(end_token=True)
    points = _points()
    mask = torch.arange(N) < torch.tensor([[N], [3]])
    targets = torch.tensor([[0, 4, 1, 5], [2, 0, 1, 5]])
    out = m(points, targets, mask=mask)
    noisy = points.clone()
    noisy[1, 3:] = 1e6
    torch.testing.assert_close(m(noisy, targets, mask=mask), out, rtol=0, atol=0)
    assert out[1, :, 3:N].eq(float("-inf")).all()
    dec = m.greedy_decode(noisy, mask=mask)
    assert not ((dec.ids[1] >= 3) & (dec.ids[1] < N)).any()
    assert dec.ids[1, 3:].eq(N).all()  # all real points used: the end is forced


@pytest.mark.parametrize("end_token", [False, True])
def test_overfits_sorting_a_single_batch(end_token):
    torch.manual_seed(0)
    m = PointerNetwork(1, 32, end_token=end_token)
    points = torch.rand(6, N, 1, generator=torch.Generator().manual_seed(2))
    targets = points[..., 0].argsort(1)
    if end_token:
        targets = torch.cat([targets, torch.full((6, 1), N)], 1)
    opt = torch.optim.Adam(m.parameters(), lr=0.02)
    for _ in range(100):
        opt.zero_grad()
        loss = F.nll_loss(m(points, targets).transpose(1, 2), targets)
        loss.backward()
        opt.step()
    assert loss < 0.05
    assert torch.equal(m.greedy_decode(points).ids, targets)


def test_bad_arguments_raise_attnkit_errors():
    m = _model(end_token=True)
    points = _points()
    with pytest.raises(ShapeError, match="points"):
        m(points[..., :2], torch.zeros(B, 2, dtype=torch.long))
    with pytest.raises(ArgumentError, match=r"targets must lie in \[0, 6\)"):
        m(points, torch.full((B, 2), N + 1))
    with pytest.raises(DTypeError, match="targets"):
        m(points, torch.zeros(B, 2))
    with pytest.raises(ShapeError, match="targets"):
        m(points, torch.zeros(B + 1, 2, dtype=torch.long))
    with pytest.raises(DTypeError, match="mask"):
        m(points, torch.zeros(B, 2, dtype=torch.long), mask=torch.ones(B, N))
    with pytest.raises(ArgumentError, match="max_len"):
        m.greedy_decode(points, max_len=-2)
    with pytest.raises(ArgumentError, match="hidden_dim"):
        PointerNetwork(D, 0)
