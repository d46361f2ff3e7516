"""LSHAttention / ReformerAttention against loops over the paper's definitions (Kitaev et al. 2020, Sec. 2)."""

import math

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import attnkit
from attnkit.errors import ArgumentError, ShapeError
from attnkit.nn.reformer import LSHAttention, ReformerAttention, bucket_order

B, H, N, D = 2, 3, 11, 5


def _t(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _hash(qk, rotations, n_buckets):
    """h(x) = argmax([x R; -x R]) per round (eq. in Sec. 2, 'Hashing attention')."""
    if n_buckets == 1:
        return torch.zeros(*qk.shape[:2], rotations.shape[0], qk.shape[2], dtype=torch.long)
    rounds = []
    for rot in rotations.double():
        proj = qk @ rot
        rounds.append(torch.cat([proj, -proj], -1).argmax(-1))
    return torch.stack(rounds, 2)


def _softmax_rows(q, k, v, allowed_sets, bias=None):
    """Per query i: softmax over the keys in allowed_sets[i] of q_i . k_j / sqrt(d) (+ bias); (o, lse)."""
    outs, lses = [], []
    for i, js in enumerate(allowed_sets):
        if not js:
            outs.append(torch.zeros(v.shape[-1], dtype=torch.float64))
            lses.append(-math.inf)
            continue
        s = torch.stack([q[i] @ k[j] / math.sqrt(q.shape[-1]) + (bias(i, j) if bias else 0.0) for j in js])
        outs.append(torch.softmax(s, 0) @ v[js])
        lses.append(torch.logsumexp(s, 0).item())
    return torch.stack(outs), torch.tensor(lses, dtype=torch.float64)


def _rounds_shared(bk, i, j):
    """N_ij: the number of rounds in which positions i and j share a bucket."""
    return sum(int(bk[r, i] == bk[r, j]) for r in range(bk.shape[0]))


def _lsh_reference(qk, v, buckets, chunk, causal, keep=None):
    """Sort by (bucket, position), chunk, own + previous chunk, same bucket, -log N_ij, combine by lse."""
    b, h, n, _ = qk.shape
    rounds = buckets.shape[2]
    keep = torch.ones(b, n, dtype=torch.bool) if keep is None else keep
    out = torch.zeros(b, h, n, v.shape[-1], dtype=torch.float64)
    for bi in range(b):
        for hi in range(h):
            q, vv, bk = qk[bi, hi], v[bi, hi], buckets[bi, hi]
            k = q / q.norm(dim=-1, keepdim=True)
            per_round = []
            for r in range(rounds):
                order = sorted(range(n), key=lambda p: (bk[r, p].item(), p))
                slot = {p: s for s, p in enumerate(order)}
                sets = []
                for i in range(n):
                    window = [order[t] for t in range(n) if slot[i] // chunk - 1 <= t // chunk <= slot[i] // chunk]
                    sets.append([j for j in window if bk[r, j] == bk[r, i] and j != i and keep[bi, j]
                                 and (not causal or j <= i)])
                per_round.append(_softmax_rows(q, k, vv, sets, lambda i, j, bk=bk: -math.log(_rounds_shared(bk, i, j))))
            lse = torch.stack([lse for _, lse in per_round])  # (R, n)
            for i in range(n):
                if torch.isinf(lse[:, i]).all():
                    out[bi, hi, i] = vv[i] if keep[bi, i] else 0.0  # nothing else to attend: itself
                else:
                    w = torch.softmax(lse[:, i], 0)
                    out[bi, hi, i] = sum(w[r] * per_round[r][0][i] for r in range(rounds))
    return out


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_hashes", [1, 3])
def test_one_bucket_one_chunk_equals_dense_attention_without_self(causal, n_hashes):
    lsh = LSHAttention(D, n_buckets=1, n_hashes=n_hashes, chunk_size=N, causal=causal)
    qk, v = _t(B, H, N, D), _t(B, H, N, D + 2, seed=1)
    k = qk / qk.norm(dim=-1, keepdim=True)
    ref = torch.zeros(B, H, N, D + 2, dtype=torch.float64)
    for i in range(N):
        others = [j for j in range(N) if j != i and (not causal or j < i)]
        if not others:
            ref[:, :, i] = v[:, :, i]  # self-exclusion: a token attends to itself only when alone
            continue
        w = torch.softmax(torch.einsum("bhd,bhjd->bhj", qk[:, :, i], k[:, :, others]) / math.sqrt(D), -1)
        ref[:, :, i] = torch.einsum("bhj,bhjd->bhd", w, v[:, :, others])
    torch.testing.assert_close(lsh(qk, v), ref, rtol=1e-10, atol=1e-12)


def test_one_chunk_several_rounds_is_softmax_over_the_union_of_buckets():
    lsh = LSHAttention(D, n_buckets=4, n_hashes=3, chunk_size=N, seed=2)
    qk, v = _t(B, H, N, D), _t(B, H, N, D, seed=1)
    bk = _hash(qk, lsh.rotations, 4)
    ref = torch.zeros(B, H, N, D, dtype=torch.float64)
    for bi in range(B):
        for hi in range(H):
            k = qk[bi, hi] / qk[bi, hi].norm(dim=-1, keepdim=True)
            sets = [[j for j in range(N) if j != i and (bk[bi, hi, :, i] == bk[bi, hi, :, j]).any()] for i in range(N)]
            out, _ = _softmax_rows(qk[bi, hi], k, v[bi, hi], sets)
            alone = torch.tensor([not s for s in sets])
            ref[bi, hi] = torch.where(alone[:, None], v[bi, hi], out)
    torch.testing.assert_close(lsh(qk, v), ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("n_buckets", [1, 4])  # one bucket: every chunk sees exactly its predecessor
@pytest.mark.parametrize("causal", [False, True])
def test_chunked_multi_round_matches_paper_reference(causal, n_buckets):
    lsh = LSHAttention(D, n_buckets=n_buckets, n_hashes=3, chunk_size=3, causal=causal, seed=1)
    qk, v = _t(B, H, N, D), _t(B, H, N, D, seed=1)
    keep = torch.ones(B, N, dtype=torch.bool)
    keep[1, 8:] = False
    bad_qk, bad_v = qk.clone(), v.clone()
    bad_qk[1, :, 8:], bad_v[1, :, 8:] = float("nan"), float("inf")
    got = lsh(bad_qk, bad_v, key_keep_mask=keep)
    bk = _hash(torch.where(keep[:, None, :, None], qk, 0.0), lsh.rotations, n_buckets)
    ref = _lsh_reference(torch.where(keep[:, None, :, None], qk, 0.0), v, bk, 3, causal, keep)
    torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-12)


def test_hashing_is_deterministic_given_the_generator():
    a, b = LSHAttention(D, n_buckets=4, n_hashes=2, seed=3), LSHAttention(D, n_buckets=4, n_hashes=2, seed=3)
    qk = _t(B, H, N, D)
    assert torch.equal(a.hash(qk), b.hash(qk))
    assert torch.equal(a.hash(qk), _hash(qk, a.rotations, 4))
    a.redraw(torch.Generator().manual_seed(9))
    b.redraw(torch.Generator().manual_seed(9))
    assert torch.equal(a.rotations, b.rotations)
    assert not torch.equal(a.rotations, LSHAttention(D, n_buckets=4, n_hashes=2, seed=3).rotations)


def test_ties_in_the_bucket_sort_are_broken_by_position():
    buckets = torch.randint(0, 3, (2, 2, 2, 17), generator=torch.Generator().manual_seed(0))
    order = bucket_order(buckets)
    for idx in torch.cartesian_prod(torch.arange(2), torch.arange(2), torch.arange(2)).tolist():
        row = buckets[tuple(idx)].tolist()
        assert order[tuple(idx)].tolist() == sorted(range(17), key=lambda p: (row[p], p))
    lsh = LSHAttention(D, n_buckets=4, n_hashes=2)
    same = _t(1, 1, 1, D).expand(1, 1, 9, D)  # identical tokens: one bucket, order = positions
    assert torch.equal(bucket_order(lsh.hash(same)), torch.arange(9).expand(1, 1, 2, 9))


def test_recomputation_sees_the_same_buckets():
    layer = ReformerAttention(12, 3, n_buckets=4, n_hashes=2, chunk_size=3).double()
    x = _t(B, N, 12).requires_grad_()
    plain = layer(x)
    (gx,) = torch.autograd.grad(plain.sum(), x)
    again = checkpoint(layer, x, use_reentrant=False)
    (gx2,) = torch.autograd.grad(again.sum(), x)
    assert torch.equal(plain, again) and torch.equal(gx, gx2)


def test_causal_one_chunk_future_cannot_move_the_past():
    layer = ReformerAttention(12, 3, n_buckets=4, n_hashes=2, chunk_size=N, causal=True).double()
    x = _t(B, N, 12)
    moved = x.clone()
    moved[:, 6:] = _t(B, N - 6, 12, seed=5)
    torch.testing.assert_close(layer(moved)[:, :6], layer(x)[:, :6], rtol=1e-12, atol=1e-12)


def test_causal_chunked_no_gradient_from_later_positions():
    layer = ReformerAttention(6, 2, n_buckets=2, n_hashes=2, chunk_size=2, causal=True).double()
    x = _t(1, 7, 6)
    jac = torch.autograd.functional.jacobian(lambda t: layer(t)[0], x)[:, :, 0]  # (n, dim, n, dim)
    per_pair = jac.abs().sum((1, 3))  # (out position, in position)
    assert torch.equal(per_pair.triu(1), torch.zeros_like(per_pair))
    assert per_pair.tril(-1).sum() > 0


def test_gradcheck():
    lsh = LSHAttention(3, n_buckets=2, n_hashes=2, chunk_size=2, causal=False, seed=4)
    qk, v = _t(1, 2, 5, 3).requires_grad_(), _t(1, 2, 5, 4, seed=1).requires_grad_()
    keep = torch.tensor([[True, True, False, True, True]])
    assert torch.autograd.gradcheck(lambda a, b: lsh(a, b, key_keep_mask=keep), (qk, v))


def test_state_dict_round_trip_carries_the_rotations():
    a = ReformerAttention(12, 3, n_buckets=4, n_hashes=2, chunk_size=3, seed=1).double()
    b = ReformerAttention(12, 3, n_buckets=4, n_hashes=2, chunk_size=3, seed=2).double()
    assert not torch.equal(a.lsh.rotations, b.lsh.rotations)
    b.load_state_dict(a.state_dict())
    x = _t(B, N, 12)
    assert torch.equal(a(x), b(x))


def test_bad_arguments_raise():
    with pytest.raises(ArgumentError, match="n_buckets"):
        LSHAttention(D, n_buckets=3)
    with pytest.raises(ShapeError, match="multiple"):
        ReformerAttention(10, 3)
    lsh = LSHAttention(D)
    with pytest.raises(ShapeError, match="qk must be"):
        lsh(_t(B, H, N, D + 1), _t(B, H, N, D))
    with pytest.raises(ShapeError, match="qk must be"):
        lsh(_t(B, H, N, D), _t(B, H, N + 1, D))


def test_registry_entry_runs_and_cost_is_linear_in_n():
    entry = attnkit.registry.get("reformer")
    fn, inputs = entry.example()
    assert fn(*inputs).shape == inputs[0].shape
    # n_buckets fixed: the default (None) grows the buckets with n, and the hashing with them
    costs = [entry.cost(length=n, n_buckets=32, n_hashes=4, chunk_size=64) for n in (1024, 2048, 4096)]
    for key in ("flops", "bytes_moved"):
        small, mid, big = (getattr(c, key) for c in costs)
        assert big - mid == pytest.approx(2 * (mid - small), rel=1e-9) and mid > small > 0


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n", [0, 1])
def test_empty_and_length_one_sequences(causal, n):
    layer = ReformerAttention(12, 3, n_buckets=4, n_hashes=2, chunk_size=3, causal=causal).double()
    x = _t(B, n, 12).requires_grad_()
    out = layer(x)
    assert out.shape == (B, n, 12) and torch.isfinite(out).all()
    out.sum().backward()
    if n == 1:  # alone: a token attends to itself
        torch.testing.assert_close(out, layer.out_proj(layer.v_proj(x.detach())), rtol=1e-10, atol=1e-12)


def test_empty_batch_gives_an_empty_result():
    out = ReformerAttention(8, 2, n_buckets=2, n_hashes=2, chunk_size=4)(torch.randn(0, 10, 8))
    assert out.shape == (0, 10, 8)
