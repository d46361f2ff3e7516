"""GatedDeltaNet reproduces transformers' Qwen3-Next linear-attention layer in prefill and in cached decoding."""

import pytest
import torch

from attnkit.errors import DTypeError
from attnkit.nn import GatedDeltaNet
from attnkit.registry import get

from .transformers_layers import assert_reproduces, qwen3_next_layer


def test_from_transformers_reproduces_prefill_and_decoding():
    theirs, config = qwen3_next_layer()
    mine = GatedDeltaNet.from_transformers(theirs)
    assert (mine.num_heads, mine.num_key_heads) == (4, 2)  # grouped values, as Qwen3-Next
    assert_reproduces(mine, theirs, config, 24)


def test_from_transformers_refuses_other_layers():
    with pytest.raises(DTypeError, match="takes a Qwen3NextGatedDeltaNet; got Linear"):
        GatedDeltaNet.from_transformers(torch.nn.Linear(2, 2))


def test_registry_entry_runs_its_example():
    module, inputs = get("gated-deltanet").example()
    assert isinstance(module, GatedDeltaNet) and module(*inputs).shape == inputs[0].shape
