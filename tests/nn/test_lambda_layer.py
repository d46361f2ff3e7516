"""LambdaLayer against a float64 loop over the paper's equations (Bello 2021, Sec. 3)."""

from functools import partial

import pytest
import torch

import attnkit
from attnkit.errors import ArgumentError, ShapeError
from attnkit.nn.lambda_layer import LambdaLayer
from tests.nn.projected_reference import seeded_input

B, N, DIM, K, H, DOUT = 2, 7, 11, 5, 3, 12  # |v| = 4

_x = partial(seeded_input, b=B, n=N, dim=DIM)


def _reference(layer, x, embedding):
    """y_n = concat_h((K^T V + E_n^T V)^T q_n^h), K softmax-normalised over positions; loops over n and m.

    ``embedding(n, m)`` returns R[m - n] (|k|,) or None when m is outside n's context.
    """
    b, n, _ = x.shape
    q = layer.q_proj(x).view(b, n, layer.num_heads, layer.key_dim)
    keys = torch.softmax(layer.k_proj(x), dim=1)
    v = layer.v_proj(x)
    out = torch.zeros(b, n, layer.num_heads, layer.value_dim, dtype=torch.float64)
    for i in range(n):
        lam = torch.zeros(b, layer.key_dim, layer.value_dim, dtype=torch.float64)
        for m in range(n):
            lam += keys[:, m, :, None] * v[:, m, None, :]  # content lambda
            e = embedding(i, m)
            if e is not None:
                lam += e[None, :, None] * v[:, m, None, :]  # position lambda
        out[:, i] = torch.einsum("bkv,bhk->bhv", lam, q[:, i])
    return out.reshape(b, n, -1)


def test_global_context_matches_equations():
    layer = LambdaLayer(DIM, key_dim=K, num_heads=H, dim_out=DOUT, max_len=N + 3).double()
    x = _x()
    ref = _reference(layer, x, lambda i, m: layer.rel_pos[m - i + layer.max_len - 1])
    torch.testing.assert_close(layer(x), ref, rtol=1e-10, atol=1e-12)


def test_local_context_matches_equations():
    r = 3
    layer = LambdaLayer(DIM, key_dim=K, num_heads=H, dim_out=DOUT, local_context=r).double()
    x = _x()
    ref = _reference(layer, x, lambda i, m: layer.rel_pos[m - i + r // 2] if abs(m - i) <= r // 2 else None)
    torch.testing.assert_close(layer(x), ref, rtol=1e-10, atol=1e-12)


def test_local_context_covering_the_sequence_equals_global_context():
    r = 2 * N - 1
    local = LambdaLayer(DIM, key_dim=K, num_heads=H, dim_out=DOUT, local_context=r).double()
    glob = LambdaLayer(DIM, key_dim=K, num_heads=H, dim_out=DOUT, max_len=N).double()
    glob.load_state_dict(local.state_dict())
    x = _x()
    torch.testing.assert_close(local(x), glob(x), rtol=1e-10, atol=1e-12)


def _position_part(layer, x):
    """The layer's output minus the content-lambda term K^T V applied to q (computed here)."""
    b, n, _ = x.shape
    q = layer.q_proj(x).view(b, n, layer.num_heads, layer.key_dim)
    content = torch.softmax(layer.k_proj(x), dim=1).transpose(1, 2) @ layer.v_proj(x)  # (b, k, v)
    return layer(x) - torch.einsum("bnhk,bkv->bnhv", q, content).reshape(b, n, -1)


def test_local_position_lambdas_see_only_the_scope():
    layer = LambdaLayer(DIM, key_dim=K, num_heads=H, dim_out=DOUT, local_context=3).double()
    x = _x()
    moved = x.clone()
    moved[:, 6] += 1.0
    before, after = _position_part(layer, x), _position_part(layer, moved)
    torch.testing.assert_close(after[:, :5], before[:, :5], rtol=1e-12, atol=1e-12)  # scope n +- 1
    assert not torch.allclose(after[:, 5], before[:, 5])


def test_inputs_shorter_than_max_len_and_errors():
    layer = LambdaLayer(DIM, key_dim=K, num_heads=H, dim_out=DOUT, max_len=N)
    assert layer(torch.randn(B, 3, DIM)).shape == (B, 3, DOUT)
    with pytest.raises(ShapeError, match="max_len=7"):
        layer(torch.randn(B, N + 1, DIM))
    with pytest.raises(ArgumentError, match="exactly one"):
        LambdaLayer(DIM, dim_out=DOUT, max_len=4, local_context=3)
    with pytest.raises(ArgumentError, match="odd"):
        LambdaLayer(DIM, dim_out=DOUT, local_context=4)
    with pytest.raises(ArgumentError, match="divisible"):
        LambdaLayer(DIM, num_heads=3, dim_out=10, local_context=3)


@pytest.mark.parametrize("kwargs", [{"max_len": 6}, {"local_context": 3}])
def test_gradcheck(kwargs):
    layer = LambdaLayer(5, key_dim=3, num_heads=2, dim_out=4, **kwargs).double()
    x = _x(b=1, n=4, dim=5).requires_grad_()
    assert torch.autograd.gradcheck(lambda t, p: layer(t), (x, layer.rel_pos))


@pytest.mark.parametrize("kwargs", [{"max_len": N}, {"local_context": 5}])
def test_state_dict_round_trip(kwargs):
    a = LambdaLayer(DIM, key_dim=K, num_heads=H, dim_out=DOUT, **kwargs).double()
    b = LambdaLayer(DIM, key_dim=K, num_heads=H, dim_out=DOUT, **kwargs).double()
    b.load_state_dict(a.state_dict())
    x = _x()
    assert torch.equal(a(x), b(x))


def test_registry_entries_run_and_costs_scale_as_stated():
    for name in ("lambda-layer", "lambda-layer-local"):
        fn, inputs = attnkit.registry.get(name).example()
        assert fn(*inputs).shape == inputs[0].shape
    glob, local = attnkit.registry.get("lambda-layer").cost, attnkit.registry.get("lambda-layer-local").cost
    costs = [local(length=n) for n in (1024, 2048, 4096)]  # the one cost model
    for key in ("flops", "bytes_moved"):  # the local context: affine in n
        small, mid, big = (getattr(c, key) for c in costs)
        assert big - mid == pytest.approx(2 * (mid - small), rel=1e-9) and mid > small > 0
    assert glob(length=4096).flops > 3.5 * glob(length=2048).flops  # the global context is quadratic
    assert glob(length=4096).flops > 10 * local(length=4096).flops


@pytest.mark.parametrize("kwargs", [{"max_len": N}, {"local_context": 3}])
@pytest.mark.parametrize("n", [0, 1])
def test_empty_and_length_one_sequences(kwargs, n):
    layer = LambdaLayer(DIM, key_dim=K, num_heads=H, dim_out=DOUT, **kwargs).double()
    x = _x(n=n).requires_grad_()
    out = layer(x)
    assert out.shape == (B, n, DOUT) and torch.isfinite(out).all()
    out.sum().backward()
