"""nn/_recurrent_parts.py: the input side Gated DeltaNet and Comba share (GatedDeltaInputs) keeps each layer's
parameter names, order, initial values and outputs as they were when each layer wrote it out itself."""

from __future__ import annotations

import pytest
import torch

from attnkit.errors import ArgumentError, ShapeError
from attnkit.nn import Comba, GatedDeltaNet
from attnkit.nn._recurrent_parts import GatedDeltaInputs

SHARED = [("A_log", (4,)), ("dt_bias", (4,)), ("q_proj.weight", (8, 16)), ("k_proj.weight", (8, 16)),
          ("v_proj.weight", (16, 16)), ("g_proj.weight", (16, 16)), ("a_proj.weight", (4, 16)),
          ("b_proj.weight", (4, 16)), ("conv1d.weight", (32, 1, 4))]
KEYS = {  # state_dict keys and shapes, in order, of (16, 4, num_key_heads=2), as before the input side was shared
    "GatedDeltaNet": [*SHARED, ("norm.weight", (4,)), ("out_proj.weight", (16, 16))],
    "Comba": [*SHARED[:2], ("decay", (2,)), ("D", (2,)), *SHARED[2:], ("norm.weight", (4,)),
              ("out_proj.weight", (16, 16))],
}
# (sum, sum of |.|) of the float64 output on a fixed input, each layer built under manual_seed(0); recorded from
# the layers as they were before the input side was shared (the parameters are drawn in the same order)
OUTPUTS = {"GatedDeltaNet": (-3.1350479987721735, 39.39102283458297),
           "Comba": (-12.22536873007585, 72.98088847596323)}


def _seeded(cls):
    torch.manual_seed(0)
    kwargs = {"correction_factor": 0.5} if cls is Comba else {}
    return cls(16, 4, num_key_heads=2, **kwargs).double()


@pytest.mark.parametrize("cls", [GatedDeltaNet, Comba])
def test_parameter_names_order_and_outputs_are_unchanged(cls):
    layer = _seeded(cls)
    assert isinstance(layer, GatedDeltaInputs)
    assert [(k, tuple(v.shape)) for k, v in layer.state_dict().items()] == KEYS[cls.__name__]
    x = torch.randn(2, 9, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        y = layer(x)
    torch.testing.assert_close((float(y.sum()), float(y.abs().sum())), OUTPUTS[cls.__name__], rtol=1e-9, atol=1e-9)


def test_both_layers_draw_the_shared_parameters_alike():
    gdn, comba = _seeded(GatedDeltaNet).state_dict(), _seeded(Comba).state_dict()
    for name, _ in [*SHARED, ("out_proj.weight", None)]:
        assert torch.equal(gdn[name], comba[name]), name


@pytest.mark.parametrize("cls", [GatedDeltaNet, Comba])
def test_the_shared_size_checks_name_the_layer(cls):
    who = cls.__name__
    with pytest.raises(ShapeError, match=f"{who}: num_heads must be a multiple of num_key_heads; got 4 and 3"):
        cls(16, 4, num_key_heads=3)
    with pytest.raises(ArgumentError, match=f"{who}: conv_size must be an int >= 1; got 0"):
        cls(16, 4, conv_size=0)
    with pytest.raises(ArgumentError, match=f"{who}: chunk_size must be an int >= 1; got 0"):
        cls(16, 4, chunk_size=0)
