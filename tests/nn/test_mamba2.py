"""Mamba2Mixer: transformers' Mamba2Mixer state_dict loads as is and gives the same outputs, prefill and decoding."""

import torch

from attnkit.nn import Mamba2Mixer
from attnkit.registry import get

from .transformers_layers import decode, mamba2_layer

TOL = dict(rtol=1e-5, atol=1e-5)


def test_loads_transformers_mamba2_weights_and_matches_it():
    theirs, config = mamba2_layer()
    mine = Mamba2Mixer(16, head_dim=8, state_dim=5, num_groups=2, eps=config.layer_norm_epsilon)
    mine.load_state_dict(theirs.state_dict())
    x = torch.randn(2, 11, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(mine(x), theirs(x), **TOL)
        cache = mine.new_cache()
        steps = [mine(x[:, :6], cache=cache)] + [mine.forward_step(x[:, t], cache)[:, None] for t in range(6, 11)]
    torch.testing.assert_close(torch.cat(steps, 1), decode(theirs, config, x, 6), **TOL)


def test_registry_entry_runs_its_example():
    module, inputs = get("mamba2").example()
    assert isinstance(module, Mamba2Mixer) and module(*inputs).shape == inputs[0].shape
