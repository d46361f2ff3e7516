"""SparseTransformerAttention against brute-force loops over Child et al. 2019's pattern definitions."""

from functools import partial

import pytest
import torch

import attnkit.nn.sparse_transformer as st_module
from attnkit.errors import ArgumentError
from attnkit.nn.sparse_transformer import SparseTransformerAttention, _OtherBlockSummaries
from attnkit.registry import get
from tests.nn.projected_reference import record_backends, reference, run_with_grad, seeded_input, seeded_layer

B, N, DIM, H = 2, 13, 12, 3  # head width 4; n = 13 is no multiple of the strides used

_x = partial(seeded_input, b=B, n=N, dim=DIM)
_layer = partial(seeded_layer, SparseTransformerAttention)


def paper_pattern(n, pattern, l, c, causal):
    """S_i = A_i^(1) ∪ A_i^(2) of Sec. 4.2, one (i, j) at a time; two-sided when not causal."""
    allowed = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        for j in range(n):
            if causal and j > i:
                continue
            if pattern == "strided":
                a1 = max(0, i - l) <= j <= i if causal else abs(i - j) <= l
                a2 = (i - j) % l == 0
            else:
                a1 = j // l == i // l
                a2 = j % l in range(l - c, l)
            allowed[i, j] = a1 or a2
    return allowed


CASES = [(3, 1), (4, 2), (5, 5), (1, 1), (20, 3)]  # (l, c): n/l not whole, c = l, l = 1, l > n


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("pattern", ["strided", "fixed"])
@pytest.mark.parametrize(("stride", "summary"), CASES)
def test_matches_brute_force_pattern(pattern, stride, summary, causal):
    layer = _layer(DIM, H, pattern, stride=stride, summary=summary, causal=causal)
    expected = reference(layer, _x(), paper_pattern(N, pattern, stride, summary, causal))
    torch.testing.assert_close(layer(_x()), expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("causal", [True, False])
def test_stride_covering_the_sequence_is_dense_attention(causal):
    layer = _layer(DIM, H, "strided", stride=N + 1, causal=causal)
    full = torch.ones(N, N, dtype=torch.bool)
    allowed = torch.tril(full) if causal else full
    torch.testing.assert_close(layer(_x()), reference(layer, _x(), allowed), rtol=1e-10, atol=1e-12)


def test_fixed_with_every_position_a_summary_is_dense_attention():
    layer = _layer(DIM, H, "fixed", stride=4, summary=4, causal=False)
    full = torch.ones(N, N, dtype=torch.bool)
    torch.testing.assert_close(layer(_x()), reference(layer, _x(), full), rtol=1e-10, atol=1e-12)


def test_float32_is_close_to_the_float64_reference():
    layer = _layer(DIM, H, "strided", stride=3)
    exact = reference(layer, _x(), paper_pattern(N, "strided", 3, 1, True))
    torch.testing.assert_close(layer.float()(_x().float()).double(), exact, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pattern", ["strided", "fixed"])
def test_causal_outputs_ignore_the_future(pattern):
    layer = _layer(DIM, H, pattern, stride=3, summary=1)
    x = _x()
    moved = x.clone()
    moved[:, 8:] += 3 * torch.randn(B, N - 8, DIM, dtype=torch.float64)
    before, after = layer(x), layer(moved)
    torch.testing.assert_close(after[:, :8], before[:, :8], rtol=0, atol=1e-12)
    assert (after[:, 8:] - before[:, 8:]).abs().max() > 1e-3


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("pattern", ["strided", "fixed"])
def test_gradcheck_float64(pattern, causal):
    layer = _layer(4, 2, pattern, stride=2, summary=1, causal=causal)
    x = torch.randn(1, 7, 4, dtype=torch.float64, requires_grad=True)  # 7: partial last block/fold
    assert torch.autograd.gradcheck(layer, (x,))


def test_state_dict_round_trip():
    layer = _layer(DIM, H, "fixed", stride=4, summary=2, seed=1)
    other = _layer(DIM, H, "fixed", stride=4, summary=2, seed=2)
    assert not torch.equal(layer(_x()), other(_x()))
    other.load_state_dict(layer.state_dict())
    torch.testing.assert_close(other(_x()), layer(_x()), rtol=0, atol=0)


@pytest.mark.parametrize("pattern", ["strided", "fixed"])
def test_long_inputs_run_the_local_half_on_the_blocksparse_kernel(monkeypatch, pattern):
    seen = record_backends(monkeypatch, st_module)
    torch.manual_seed(0)
    SparseTransformerAttention(8, 2, pattern, stride=32, summary=2)(torch.randn(1, 1024, 8))
    assert len(seen) == 2 and seen[0][1] == "blocksparse"


@pytest.mark.parametrize("causal", [True, False])
def test_summary_key_mask_has_an_exact_block_layout(causal):
    for stride, summary, bs in [(4, 1, 3), (5, 2, 4), (3, 3, 2), (8, 2, 16), (2, 1, 1)]:
        mask = _OtherBlockSummaries(stride, summary, causal)
        n, ns = 29, summary * (29 // stride)
        fast, exact = mask.block_layout(n, ns, bs), mask.block_layout(n, ns, bs, exact=True)
        assert torch.equal(fast.active, exact.active) and torch.equal(fast.full, exact.full), (stride, summary, bs)


def test_bad_arguments_raise_named_errors():
    with pytest.raises(ArgumentError, match="pattern"):
        SparseTransformerAttention(DIM, H, "dilated")
    with pytest.raises(ArgumentError, match="summary"):
        SparseTransformerAttention(DIM, H, "fixed", stride=4, summary=5)
    with pytest.raises(ArgumentError, match="stride"):
        SparseTransformerAttention(DIM, H, stride=0)


def test_registry_entry_runs_and_cost_is_subquadratic():
    entry = get("sparse-transformer")
    assert entry.target is SparseTransformerAttention and entry.family == "long-sequence"
    fn, inputs = entry.example()
    assert fn(*inputs).shape == inputs[0].shape
    projections = 8 * 4096 * 512**2  # q, k, v, out: 2 n dim^2 each
    dense = get("scaled-dot-product").cost(batch=1, heads=8, q_len=4096, head_dim=64).flops  # 4 H n^2 D
    assert dense == 4 * 8 * 4096 * 4096 * 64
    cost = entry.cost(batch=1, length=4096, heads=8, dim=512, stride=64)
    assert cost.name == "sparse-transformer"
    assert projections < cost.flops < projections + dense / 16


@pytest.mark.parametrize("shape", [(2, 0, DIM), (0, 5, DIM), (2, 1, DIM)])
def test_empty_and_length_one_inputs(shape):
    layer = _layer(DIM, H, "strided", stride=2)
    x, out = run_with_grad(layer, shape)
    assert out.shape == shape and torch.isfinite(x.grad).all()
    if shape[1] == 1:  # softmax over one key: that key's value
        torch.testing.assert_close(out, reference(layer, x, torch.ones(1, 1, dtype=torch.bool)), rtol=1e-10, atol=1e-12)
