"""agreement.py: ranks that make different calls get the same clear error on every rank, never a crash or a hang.

One spawn of 4 gloo processes; in each scenario rank 2 (the odd one) makes a call that differs
from the others' (its shard length, heads, head dim, dtype, mask, a failing check of its own,
another function). Every rank must raise an attnkit error that names what differs and rank 2;
before the check, these calls crashed inside gloo or waited for the group timeout.
"""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit import masks
from attnkit.distributed import agreement, attention, gather
from attnkit.distributed.linear import sequence_parallel
from attnkit.distributed.modules import SequenceParallelSelfAttention
from attnkit.nn import LinearAttention

from . import spawn

WORLD, ODD = 4, 2


def _qkv(heads=3, length=5, dim=11, dtype=torch.float64):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(2, heads, length, dim, generator=g, dtype=dtype) for _ in range(3)]


def _scenarios(rank):
    odd = rank == ODD
    return {
        "length": lambda: attention(*_qkv(length=4 if odd else 5)),
        "heads": lambda: attention(*_qkv(heads=2 if odd else 3)),
        "head_dim": lambda: attention(*_qkv(dim=7 if odd else 11), scheme="allgather"),
        "dtype": lambda: attention(*_qkv(dtype=torch.float32 if odd else torch.float64)),
        "mask_on_the_ring": lambda: attention(*_qkv(length=6), mask=masks.sliding_window(2, 0) if odd
                                              else masks.causal()),
        "own_check_fails": lambda: attention(*_qkv(), scheme="star" if odd else "ring"),
        "sinks_on_one_rank": lambda: attention(*_qkv(), sinks=torch.zeros(3, dtype=torch.float64) if odd else None),
        "other_function": lambda: gather(torch.ones(2, 5)) if odd else attention(*_qkv()),
        "gather_shapes": lambda: gather(torch.ones(2, 4 if odd else 5), dim=1),
        "linear_length": lambda: sequence_parallel(_linear(), torch.randn(2, 4 if odd else 6, 12, dtype=torch.float64)),
        "module_keep_mask": lambda: _module()(torch.randn(2, 3, 12, dtype=torch.float64),
                                              key_keep_mask=torch.ones(2, 3, dtype=torch.bool) if odd else None),
    }


def _linear():
    torch.manual_seed(0)
    return LinearAttention(12, 3).double()


def _module():
    torch.manual_seed(0)
    return SequenceParallelSelfAttention(12, 3).double()


def _run(rank, world):
    found = {}
    for name, call in _scenarios(rank).items():
        try:
            call()
            found[name] = ("no error", "")
        except attnkit.AttnkitError as e:
            found[name] = (type(e).__name__, str(e))
    with torch.no_grad():  # after the errors above, the group still works
        found["still_works"] = attention(*_qkv(), mask=masks.causal()).shape
    return found


@pytest.fixture(scope="module")
def results():
    return spawn.run(_run, WORLD)


@pytest.mark.parametrize(("name", "kind", "words"), [
    ("length", "ShapeError", ["shard length (q.shape[-2]): 5 on ranks 0, 1, 3; 4 on rank 2"]),
    ("heads", "ShapeError", ["query heads (q.shape[1]): 3 on ranks 0, 1, 3; 2 on rank 2"]),
    ("head_dim", "ShapeError", ["head dim (q.shape[-1]): 11 on ranks 0, 1, 3; 7 on rank 2"]),
    ("dtype", "DTypeError", ["dtypes of q, k, v", "rank 2"]),
    ("mask_on_the_ring", "ArgumentError", ["the mask", "rank 2", "chunk plan"]),
    ("sinks_on_one_rank", "ArgumentError", ["the sinks", "rank 2"]),
    ("other_function", "ArgumentError", ["not making the same call", "rank 2"]),
    ("gather_shapes", "ShapeError", ["x.shape[1]: 5 on ranks 0, 1, 3; 4 on rank 2"]),
    ("linear_length", "ShapeError", ["x.shape[1]): 6 on ranks 0, 1, 3; 4 on rank 2"]),
    ("module_keep_mask", "ArgumentError", ["key_keep_mask is given: 0 on ranks 0, 1, 3; 1 on rank 2"]),
])
def test_every_rank_names_what_differs_and_where(results, name, kind, words):
    for rank, found in enumerate(results):
        got_kind, message = found[name]
        assert got_kind == kind and all(w in message for w in words), (rank, got_kind, message)


def test_a_rank_whose_own_check_fails_raises_its_error_and_the_others_name_it(results):
    kind, message = results[ODD]["own_check_fails"]
    assert kind == "ArgumentError" and "'star'" in message
    for rank in (0, 1, 3):
        kind, message = results[rank]["own_check_fails"]
        assert kind == "ArgumentError" and "rank 2 refused the call" in message, message


def test_the_group_still_works_after_the_errors(results):
    assert all(found["still_works"] == (2, 3, 5, 11) for found in results)


def test_texts_hold_no_addresses_and_fields_are_bounded():
    def f(x):
        return x

    assert " at 0x" not in agreement.text_of(f) and "f" in agreement.text_of(f)
    assert agreement.text_of(torch.ones(2, 3, dtype=torch.bool)) == "tensor(2, 3) torch.bool"
    assert agreement.size(torch.ones(2, 3), 1) == 3 and agreement.size(torch.ones(2), 1) == -1
    assert agreement.size("not a tensor", 0) == -1
    assert agreement.bytes_sent(4) == 3 * agreement.SLOTS * 8
