"""Mamba2Mixer: transformers' Mamba-2 mixers (six families) convert and give the same outputs, prefill and decoding."""

import pytest
import torch

from attnkit.errors import ArgumentError, DTypeError, UnsupportedFeature
from attnkit.nn import Mamba2Mixer
from attnkit.registry import get

from .transformers_layers import MAMBA2_FAMILIES, assert_reproduces, mamba2_family_layer, mamba2_layer


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


@pytest.mark.parametrize("family", MAMBA2_FAMILIES)
def test_from_transformers_reproduces_every_family_in_prefill_and_decoding(family):
    theirs, config = mamba2_family_layer(family)
    mine = Mamba2Mixer.from_transformers(theirs)
    assert_reproduces(mine, theirs, config, 16)  # the chunk form, then cached decoding in the recurrent form
    x = torch.randn(2, 11, 16, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(mine(x, form="recurrent"), theirs(x), rtol=1e-5, atol=1e-5)


def test_from_transformers_reads_the_families_layouts():
    nemotron = Mamba2Mixer.from_transformers(mamba2_family_layer("nemotron_h")[0])
    assert nemotron.sizes[0] == 24 != 2 * 16 and nemotron.dt_limit == (0.05, float("inf"))  # heads x head_dim
    falcon = Mamba2Mixer.from_transformers(mamba2_family_layer("falcon_h1 (no norm)")[0])
    assert falcon.norm is None and falcon.in_proj.bias is not None and falcon.out_proj.bias is not None
    assert not Mamba2Mixer.from_transformers(mamba2_family_layer("falcon_h1 (norm before gate)")[0]).norm.gate_first


def test_the_dt_clamp_is_honoured_where_it_bites():
    theirs, _ = mamba2_family_layer("zamba2")  # dt >= 0.05
    with torch.no_grad():
        theirs.dt_bias[:2] = -8.0  # softplus ~ 3e-4: clamped to 0.05 for two heads
    mine = Mamba2Mixer.from_transformers(theirs)
    x = torch.randn(2, 11, 16, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        for form in ("chunk", "recurrent"):
            torch.testing.assert_close(mine(x, form=form), theirs(x), rtol=1e-5, atol=1e-5)
        mine.dt_limit = (0.0, float("inf"))
        assert (mine(x) - theirs(x)).abs().max() > 1e-3  # the clamp changes the output


def test_from_transformers_refuses_other_layers_and_activations():
    with pytest.raises(DTypeError, match=r"takes a .*BambaMixer.*; got Linear"):
        Mamba2Mixer.from_transformers(torch.nn.Linear(2, 2))
    theirs, _ = mamba2_family_layer("bamba")
    theirs.activation = "gelu"
    with pytest.raises(UnsupportedFeature, match="activation must be silu; got 'gelu'"):
        Mamba2Mixer.from_transformers(theirs)
    with pytest.raises(ArgumentError, match="dt_limit"):
        Mamba2Mixer(16, head_dim=8, state_dim=4, dt_limit=(1.0, 0.5))
