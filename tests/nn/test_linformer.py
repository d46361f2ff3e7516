"""LinformerAttention against a float64 transcription of eq. 7 and against dense attention (k = n, E = F = I)."""

from functools import partial

import pytest
import torch

import attnkit
from attnkit.errors import ArgumentError, ShapeError
from attnkit.nn.linformer import LinformerAttention, SequenceProjection
from tests.nn.projected_reference import output, project_heads, reference, seeded_input

B, N, DIM, H, K = 2, 7, 12, 3, 5

_x = partial(seeded_input, b=B, n=N, dim=DIM)


def _eq7(layer, x, e, f, keep=None):
    """head_i = softmax(Q W^Q (E_i K W^K)^T / sqrt(d)) F_i V W^V, with E_i, F_i given as (h|1, k, n)."""
    q, k, v = project_heads(layer, x)
    if keep is not None:
        w = keep[:, None, :, None].double()
        k, v = torch.nan_to_num(k) * w, torch.nan_to_num(v) * w
    kp = torch.einsum("hkn,bhnd->bhkd", e.expand(layer.num_heads, -1, -1), k)
    vp = torch.einsum("hkn,bhnd->bhkd", f.expand(layer.num_heads, -1, -1), v)
    scores = torch.einsum("bhnd,bhkd->bhnk", q, kp) / q.shape[-1] ** 0.5
    return output(layer, torch.einsum("bhnk,bhkd->bhnd", torch.softmax(scores, -1), vp))


@pytest.mark.parametrize("sharing", ["none", "headwise", "key-value"])
def test_identity_projections_reduce_to_dense_attention(sharing):
    layer = LinformerAttention(DIM, H, max_len=N, k_proj_dim=N, sharing=sharing).double()
    with torch.no_grad():
        for proj in (layer.proj_k, layer.proj_v):
            proj.weight.copy_(torch.eye(N).expand_as(proj.weight))
    x = _x()
    torch.testing.assert_close(layer(x), reference(layer, x), rtol=1e-10, atol=1e-12)  # plain dense attention


@pytest.mark.parametrize("sharing", ["none", "headwise", "key-value"])
def test_matches_eq7_for_inputs_shorter_than_max_len(sharing):
    layer = LinformerAttention(DIM, H, max_len=N + 4, k_proj_dim=K, sharing=sharing).double()
    x = _x()
    e, f = layer.proj_k.weight[:, :, :N], layer.proj_v.weight[:, :, :N]
    torch.testing.assert_close(layer(x), _eq7(layer, x, e, f), rtol=1e-10, atol=1e-12)


def test_sharing_options_share_what_the_paper_says():
    none = LinformerAttention(DIM, H, max_len=N, k_proj_dim=K, sharing="none")
    assert none.proj_k.weight.shape == (H, K, N) and none.proj_k is not none.proj_v
    headwise = LinformerAttention(DIM, H, max_len=N, k_proj_dim=K)
    assert headwise.proj_k.weight.shape == (1, K, N) and headwise.proj_k is not headwise.proj_v
    kv = LinformerAttention(DIM, H, max_len=N, k_proj_dim=K, sharing="key-value")
    assert kv.proj_k is kv.proj_v
    shared = SequenceProjection(N, K)
    layers = [LinformerAttention(DIM, H, max_len=N, sharing="layerwise", shared_projection=shared) for _ in range(2)]
    assert all(layer.proj_k is shared and layer.proj_v is shared for layer in layers)
    stack = torch.nn.ModuleList(layers)
    assert sum(p is shared.weight for p in stack.parameters()) == 1
    x = _x(dim=DIM).float()
    stack[1](stack[0](x)).sum().backward()
    assert shared.weight.grad is not None and shared.weight.grad.abs().sum() > 0


def test_padding_zeroes_keys_before_projection_and_cannot_leak():
    layer = LinformerAttention(DIM, H, max_len=N, k_proj_dim=K).double()
    keep = torch.ones(B, N, dtype=torch.bool)
    keep[0, 4:] = False
    x = _x()
    bad = x.clone()
    bad[0, 4:] = float("nan")
    got = layer(bad, key_keep_mask=keep)
    e, f = layer.proj_k.weight, layer.proj_v.weight
    torch.testing.assert_close(got[:, :4], _eq7(layer, x, e, f, keep)[:, :4], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(got[1], layer(x)[1], rtol=1e-12, atol=1e-12)
    # the same as projecting with only the kept columns of E and F
    alone = _eq7(layer, x[:1, :4], e[:, :, :4], f[:, :, :4])
    torch.testing.assert_close(got[:1, :4], alone, rtol=1e-10, atol=1e-12)


def test_bad_arguments_raise():
    layer = LinformerAttention(DIM, H, max_len=N, k_proj_dim=K)
    with pytest.raises(ShapeError, match="max_len=7"):
        layer(torch.randn(B, N + 1, DIM))
    with pytest.raises(ShapeError, match="x must have shape"):
        layer(torch.randn(B, N, DIM + 1))
    with pytest.raises(ArgumentError, match="sharing"):
        LinformerAttention(DIM, H, max_len=N, sharing="all")
    with pytest.raises(ArgumentError, match="shared_projection"):
        LinformerAttention(DIM, H, max_len=N, sharing="layerwise")
    with pytest.raises(ArgumentError, match="shared_projection"):
        LinformerAttention(DIM, H, max_len=N, shared_projection=SequenceProjection(N, K))
    with pytest.raises(ShapeError, match="multiple"):
        LinformerAttention(10, H, max_len=N)


def test_dropout_only_in_training():
    layer = LinformerAttention(DIM, H, max_len=N, k_proj_dim=K, dropout=0.5).double()
    x = _x()
    layer.eval()
    assert torch.equal(layer(x), layer(x))
    layer.train()
    torch.manual_seed(0)
    assert not torch.allclose(layer(x), layer.eval()(x))


def test_gradcheck():
    layer = LinformerAttention(6, 2, max_len=5, k_proj_dim=3, sharing="none").double()
    x = _x(b=1, n=4, dim=6).requires_grad_()
    keep = torch.tensor([[True, True, False, True]])
    params = (layer.proj_k.weight, layer.q_proj.weight)
    assert torch.autograd.gradcheck(lambda t, *p: layer(t, key_keep_mask=keep), (x, *params))


@pytest.mark.parametrize("sharing", ["none", "headwise", "key-value"])
def test_state_dict_round_trip(sharing):
    a = LinformerAttention(DIM, H, max_len=N, k_proj_dim=K, sharing=sharing).double()
    b = LinformerAttention(DIM, H, max_len=N, k_proj_dim=K, sharing=sharing).double()
    b.load_state_dict(a.state_dict())
    x = _x()
    assert torch.equal(a(x), b(x))


def test_registry_entry_runs_and_cost_is_linear_in_n():
    entry = attnkit.registry.get("linformer")
    fn, inputs = entry.example()
    assert fn(*inputs).shape == inputs[0].shape
    costs = [entry.cost(length=n, k_proj_dim=64) for n in (1024, 2048, 4096)]  # the one cost model
    for key in ("flops", "bytes_moved"):
        small, mid, big = (getattr(c, key) for c in costs)
        assert big - mid == pytest.approx(2 * (mid - small), rel=1e-9) and mid > small > 0


@pytest.mark.parametrize("n", [0, 1])
def test_empty_and_length_one_sequences(n):
    layer = LinformerAttention(DIM, H, max_len=N, k_proj_dim=K).double()
    x = _x(n=n).requires_grad_()
    out = layer(x)
    assert out.shape == (B, n, DIM) and torch.isfinite(out).all()
    out.sum().backward()
