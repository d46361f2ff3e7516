"""KimiDeltaAttention reproduces transformers' Kimi Linear delta-attention layer in prefill and cached decoding."""

import pytest
import torch

from attnkit.errors import DTypeError
from attnkit.nn import KimiDeltaAttention
from attnkit.registry import get

from .transformers_layers import decode, kimi_linear_layer

TOL = dict(rtol=1e-5, atol=1e-5)


def test_from_transformers_reproduces_prefill_and_decoding():
    theirs, config = kimi_linear_layer()
    mine = KimiDeltaAttention.from_transformers(theirs)
    x = torch.randn(2, 11, 24, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(mine(x), theirs(x), **TOL)
        cache = mine.new_cache()
        steps = [mine(x[:, :6], cache=cache)] + [mine.forward_step(x[:, t], cache)[:, None] for t in range(6, 11)]
    torch.testing.assert_close(torch.cat(steps, 1), decode(theirs, config, x, 6), **TOL)


def test_from_transformers_refuses_other_layers():
    with pytest.raises(DTypeError, match="takes a KimiLinearDeltaAttention; got Linear"):
        KimiDeltaAttention.from_transformers(torch.nn.Linear(2, 2))


def test_registry_entry_runs_its_example():
    module, inputs = get("kimi-delta-attention").example()
    assert isinstance(module, KimiDeltaAttention) and module(*inputs).shape == inputs[0].shape
