"""Mamba2Mixer: transformers' Mamba2Mixer state_dict loads as is and gives the same outputs, prefill and decoding."""

from attnkit.nn import Mamba2Mixer
from attnkit.registry import get

from .transformers_layers import assert_reproduces, mamba2_layer


def test_loads_transformers_mamba2_weights_and_matches_it():
    theirs, config = mamba2_layer()
    mine = Mamba2Mixer(16, head_dim=8, state_dim=5, num_groups=2, eps=config.layer_norm_epsilon)
    mine.load_state_dict(theirs.state_dict())
    assert_reproduces(mine, theirs, config, 16)


def test_registry_entry_runs_its_example():
    module, inputs = get("mamba2").example()
    assert isinstance(module, Mamba2Mixer) and module(*inputs).shape == inputs[0].shape
