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


def test_takes_dim_and_heads_as_the_other_layers_and_keeps_its_keywords():
    import pytest
    import torch

    from attnkit.errors import ShapeError

    by_heads = Mamba2Mixer(64, 4, state_dim=8)
    assert by_heads.num_heads == 4 and by_heads.core_sizes == (4, 8, 32)  # expand 2: 128 features in 4 heads
    assert Mamba2Mixer(64, head_dim=32, state_dim=8).core_sizes == by_heads.core_sizes
    assert Mamba2Mixer(64, num_heads=4, head_dim=32, state_dim=8).num_heads == 4
    assert Mamba2Mixer(64, state_dim=8).num_heads == 2  # head_dim 64 by default, as before
    assert by_heads(torch.randn(1, 5, 64)).shape == (1, 5, 64)
    with pytest.raises(ShapeError, match="num_heads"):
        Mamba2Mixer(64, 3)
    with pytest.raises(ShapeError, match="num_heads \\* head_dim"):
        Mamba2Mixer(64, 4, head_dim=16)
