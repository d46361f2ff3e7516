"""KimiDeltaAttention reproduces transformers' Kimi Linear delta-attention layer in prefill and cached decoding."""

import pytest
import torch

from attnkit.errors import DTypeError, UnsupportedFeature
from attnkit.nn import KimiDeltaAttention
from attnkit.registry import get

from .transformers_layers import assert_reproduces, kimi_linear_layer


def test_from_transformers_reproduces_prefill_and_decoding():
    theirs, config = kimi_linear_layer()
    assert_reproduces(KimiDeltaAttention.from_transformers(theirs), theirs, config, 24)


def test_from_transformers_refuses_other_layers_and_activations():
    with pytest.raises(DTypeError, match="takes a KimiLinearDeltaAttention; got Linear"):
        KimiDeltaAttention.from_transformers(torch.nn.Linear(2, 2))
    theirs, _ = kimi_linear_layer()
    theirs.activation = "gelu"
    with pytest.raises(UnsupportedFeature, match="activation must be silu; got 'gelu'"):
        KimiDeltaAttention.from_transformers(theirs)


def test_registry_entry_runs_its_example():
    module, inputs = get("kimi-delta-attention").example()
    assert isinstance(module, KimiDeltaAttention) and module(*inputs).shape == inputs[0].shape
