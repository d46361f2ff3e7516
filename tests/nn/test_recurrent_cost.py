"""The linear-recurrent layers' FLOP formulas equal FlopCounterMode; the decoding state is what the cache holds."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from attnkit.errors import ArgumentError, DTypeError
from attnkit.functional.linear.cost import recurrence_flops
from attnkit.nn.recurrent_cost import layer_flops, state_bytes

from .recurrent_layers import LAYERS


@pytest.mark.parametrize("name", LAYERS)
@pytest.mark.parametrize("form", ["parallel", "chunk", "recurrent"])
def test_layer_flops_equal_the_flop_counter(name, form):
    layer = LAYERS[name](4)
    x = torch.randn(2, 10, 12)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        layer(x, form=form)
    assert layer_flops(layer, 10, batch=2, form=form) == counter.get_total_flops()


@pytest.mark.parametrize("name", LAYERS)
def test_state_bytes_are_the_filled_cache(name):
    layer = LAYERS[name](4)
    cache = layer.new_cache()
    layer(torch.randn(3, 5, 12), cache=cache)
    held = cache.state.nbytes + (0 if cache.conv is None else cache.conv.nbytes)
    assert state_bytes(layer, batch=3) == held
    layer(torch.randn(3, 40, 12), cache=cache)  # longer: the same
    assert state_bytes(layer, batch=3) == cache.state.nbytes + (0 if cache.conv is None else cache.conv.nbytes)


def test_the_chunk_form_grows_linearly_and_the_parallel_form_quadratically():
    sizes = dict(batch=1, heads=4, key_dim=64, value_dim=64, chunk_size=64, delta=True)
    chunk = [recurrence_flops("chunk", length=n, **sizes) for n in (4096, 8192)]
    parallel = [recurrence_flops("parallel", length=n, **sizes) for n in (4096, 8192)]
    assert chunk[1] == 2 * chunk[0] and parallel[1] > 3.9 * parallel[0]
    with pytest.raises(ArgumentError, match="form must be one of"):
        recurrence_flops("fast", length=4, **sizes)
    with pytest.raises(DTypeError, match="expected a linear-recurrent layer"):
        layer_flops(torch.nn.Linear(2, 2), 4)
