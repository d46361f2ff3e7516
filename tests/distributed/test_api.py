"""attnkit.distributed.attention on real gloo process groups of 2, 3 and 4 ranks, against one process.

One spawn of 4 processes serves the quick suite: the world group (4 ranks) and two
subgroups, ``[1, 2, 3]`` (3 ranks, group ranks differ from global ranks) and ``[0, 2]``
(2 ranks). On each, every scheme x layout x case of :mod:`tests.distributed.cases` is
compared in float64 with single-process ``attnkit.attention`` on the full tensors
(output, lse, gradients of q, k, v within 1e-12). The same spawn checks the error
contract, ``no_grad``, bool tensor masks and float32 dtypes, and attention sinks on the world
group against the float64 oracle of tests/oracle.py (outputs, lse, gradients of q, k, v and the
sinks, summed over the ranks). The larger sweep (more lengths, seeds, another spawn per world
size) is marked slow.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import attnkit
from attnkit import masks
from attnkit.distributed import SCHEMES, attention, gather, shard

from . import cases, spawn

TOL = 1e-12
GROUPS = {4: None, 3: [1, 2, 3], 2: [0, 2]}


def _errors_raised(rank, pair):
    """Which attnkit error each bad call raises (name and message), on the world group of 4."""
    q = torch.randn(1, 6, 6, 4)
    calls = {
        "learned_bias_ring": lambda: attention(q, q, q, bias=attnkit.bias.RelativePositionBias(6)),
        "ulysses_heads": lambda: attention(q, q, q, scheme="ulysses"),
        "length_zigzag": lambda: attention(q[..., :3, :], q[..., :3, :], q[..., :3, :], layout="zigzag"),
        "scheme": lambda: attention(q, q, q, scheme="star"),
        "layout": lambda: attention(q, q, q, layout="spiral"),
        "float_mask": lambda: attention(q, q, q, mask=torch.zeros(24, 24)),
        "mask_length": lambda: attention(q, q, q, mask=masks.segments(torch.zeros(10, dtype=torch.long))),
        "bool_mask_shape": lambda: attention(q, q, q, mask=torch.ones(6, 24, dtype=torch.bool)),
        "shard_length": lambda: shard(torch.randn(2, 10, 3), layout="zigzag"),
        "kv_length": lambda: attention(q, q[..., :4, :], q[..., :4, :]),
    }
    if rank not in GROUPS[2]:
        calls["not_a_member"] = lambda: attention(q, q, q, group=pair)
    return cases.raised(calls)


def _contract_checks(rank, world):
    """no_grad with lse, lse dtypes, a full-size bool tensor mask equal to the Mask it pictures."""
    q, k, v, _, _ = cases._tensors(3, cases.HEADS, cases.LENGTH)
    local = [shard(t, layout="zigzag") for t in (q, k, v)]
    mask = masks.causal() & masks.sliding_window(5)
    picture = mask.materialize(cases.LENGTH, cases.LENGTH)
    found = {}
    with torch.no_grad():
        r = attention(*local, mask=mask, layout="zigzag", return_lse=True)
        found["no_grad_lse"] = (tuple(r.lse.shape), r.lse.dtype, r.output.requires_grad)
        as_tensor = attention(*local, mask=picture, layout="zigzag")
        found["bool_tensor_mask"] = (as_tensor - r.output).abs().max().item()
        low = attention(*(t.float() for t in local), mask=mask, layout="zigzag", return_lse=True)
        found["float32"] = (low.output.dtype, low.lse.dtype, (low.output.double() - r.output).abs().max().item())
    found["learned_bias"] = {scheme: _learned_bias_error(scheme) for scheme in ("allgather", "ulysses")}
    return found


def _learned_bias_error(scheme):
    """A RelativePositionBias trained under a scheme: its gradient summed over ranks against one process."""
    q, k, v, g_out, _ = cases._tensors(5, cases.HEADS, cases.LENGTH)
    rel = attnkit.bias.RelativePositionBias(cases.HEADS, num_buckets=8, max_distance=16).double()
    torch.nn.init.normal_(rel.table, generator=torch.Generator().manual_seed(6))
    (attnkit.attention(q, k, v, bias=rel, mask=masks.causal()) * g_out).sum().backward()
    want = rel.table.grad.clone()
    rel.table.grad = None
    out = attention(*(shard(t) for t in (q, k, v)), bias=rel, mask=masks.causal(), scheme=scheme)
    (out * shard(g_out)).sum().backward()
    got = rel.table.grad.clone()
    dist.all_reduce(got)
    return (got - want).abs().max().item()


def _zero_length(rank, world):
    """Every scheme x layout on a sequence of length 0 (every shard empty): shapes, dtypes and gradients."""
    found = {}
    for scheme in SCHEMES:
        for layout in cases.LAYOUTS:
            q = torch.zeros(2, 12, 0, 5, dtype=torch.float64, requires_grad=True)
            k = torch.zeros(2, 4, 0, 5, dtype=torch.float64, requires_grad=True)
            v = torch.zeros(2, 4, 0, 3, dtype=torch.float64, requires_grad=True)
            got = attention(q, k, v, mask=masks.causal(), bias=attnkit.bias.alibi(12), scheme=scheme, layout=layout,
                            return_lse=True)
            (got.output.sum() + got.lse.sum()).backward()
            found[scheme, layout] = (tuple(got.output.shape), tuple(got.lse.shape), got.lse.dtype,
                                     [tuple(t.grad.shape) for t in (q, k, v)])
    x = torch.zeros(2, 0, 3)
    found["shard_gather"] = (tuple(shard(x, dim=1).shape), tuple(gather(shard(x, dim=1), dim=1).shape))
    return found


def _quick(rank, world):
    groups = {w: None if ranks is None else dist.new_group(ranks) for w, ranks in GROUPS.items()}
    found = {"sweep": {}}
    for w, ranks in GROUPS.items():
        if ranks is None or rank in ranks:
            found["sweep"][w] = cases.sweep(groups[w])
    found["errors"] = _errors_raised(rank, groups[2])
    found["contract"] = _contract_checks(rank, world)
    found["zero_length"] = _zero_length(rank, world)
    found["sinks"] = cases.sink_sweep()
    return found


@pytest.fixture(scope="module")
def quick():
    return spawn.run(_quick, 4)


def _sweep_keys():
    return [(w, s, lay, name) for w in GROUPS for s in SCHEMES for lay in cases.LAYOUTS for name in cases.cases()]


@pytest.mark.parametrize(("world", "scheme", "layout", "case"), _sweep_keys())
def test_matches_one_process_in_float64(quick, world, scheme, layout, case):
    members = range(4) if GROUPS[world] is None else GROUPS[world]
    for rank in members:
        errors = quick[rank]["sweep"][world][(scheme, layout, case)]
        assert max(errors) <= TOL, f"rank {rank}: output, lse, dq, dk, dv errors {errors}"


@pytest.mark.parametrize(("name", "kind", "words"), [
    ("ulysses_heads", "ShapeError", "heads=6"), ("length_zigzag", "ShapeError", "divisible by 8"),
    ("scheme", "ArgumentError", "'star'"), ("layout", "ArgumentError", "'spiral'"),
    ("float_mask", "DTypeError", "bool"), ("mask_length", "ShapeError", "q_len=10"),
    ("bool_mask_shape", "ShapeError", "(B, H, L, L)"), ("shard_length", "ShapeError", "divisible by 8"),
    ("kv_length", "ShapeError", "share their length"), ("learned_bias_ring", "ArgumentError", "learned bias"),
    ("not_a_member", "ArgumentError", "not a member"),
])
def test_bad_calls_raise_clear_errors(quick, name, kind, words):
    for rank in [r for r in range(4) if name != "not_a_member" or r not in GROUPS[2]]:
        got_kind, message = quick[rank]["errors"][name]
        assert got_kind == kind and words in message, (got_kind, message)


def test_no_grad_lse_dtypes_bool_tensor_masks_and_learned_biases(quick):
    local = cases.LENGTH // 4
    for rank in range(4):
        found = quick[rank]["contract"]
        assert found["no_grad_lse"] == ((cases.BATCH, cases.HEADS, local), torch.float64, False)
        assert found["bool_tensor_mask"] <= TOL
        out_dtype, lse_dtype, error = found["float32"]
        assert (out_dtype, lse_dtype) == (torch.float32, torch.float32) and error < 1e-5
        assert max(found["learned_bias"].values()) <= TOL, found["learned_bias"]


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("layout", cases.LAYOUTS)
def test_a_sequence_of_length_zero_gives_empty_results_on_every_scheme(quick, scheme, layout):
    for found in quick:
        out, lse, lse_dtype, grads = found["zero_length"][scheme, layout]
        assert (out, lse, lse_dtype) == ((2, 12, 0, 3), (2, 12, 0), torch.float64)
        assert grads == [(2, 12, 0, 5), (2, 4, 0, 5), (2, 4, 0, 3)]
        assert found["zero_length"]["shard_gather"] == ((2, 0, 3), (2, 0, 3))


@pytest.mark.parametrize(("scheme", "layout", "case"), [(s, lay, name) for s in SCHEMES for lay in cases.LAYOUTS
                                                        for name in cases.sink_cases()])
def test_sinks_join_once_after_the_merge_and_equal_the_float64_oracle(quick, scheme, layout, case):
    for rank in range(4):
        errors = quick[rank]["sinks"][(scheme, layout, case)]
        assert all(e <= TOL for e in errors), f"rank {rank}: output, lse, dq, dk, dv, dsinks errors {errors}"


def _slow(rank, world):
    return {seed: cases.sweep(seed=seed, length=length) for seed, length in ((1, 48), (2, 96))}


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3, 4])
def test_larger_sweep_matches_one_process(world):
    answers = spawn.run(_slow, world)
    for rank, found in enumerate(answers):
        for seed, results in found.items():
            for key, errors in results.items():
                assert max(errors) <= TOL, f"world {world} rank {rank} seed {seed} {key}: {errors}"
