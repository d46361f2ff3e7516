"""The linear-recurrent layers' cost spec: FLOPs in each form, the decoding state a cache really holds.

That the counted FLOPs equal FlopCounterMode's, forward and backward, is checked for every registry
entry in ``tests/costing/test_analytic.py``; here: the forms, the state and the errors.
"""

import pytest
import torch

from attnkit.costing.analytic import cost
from attnkit.errors import ArgumentError
from attnkit.functional.recurrences import FORMS

from .recurrent_layers import LAYERS

NAMES = {"retnet": "retnet", "gla": "gla", "mamba2": "mamba2", "deltanet": "deltanet",
         "gated_deltanet": "gated-deltanet", "kda": "kimi-delta-attention", "lightning": "lightning-attention",
         "rwkv4": "rwkv4", "comba": "comba", "rwkv7": "rwkv7",
         "log_linear_mamba2": "log-linear-mamba2", "log_linear_gdn": "log-linear-gated-deltanet"}
LAYER_ENTRIES = {**NAMES, "comba_after_decay": "comba", "deltanet_neg": "deltanet",
                 "gated_deltanet_neg": "gated-deltanet",
                 "kda_neg": "kimi-delta-attention", "delta_product": "delta-product",
                 "delta_product_neg": "delta-product"}


@pytest.mark.parametrize("layer", LAYERS)
def test_the_decoding_state_is_what_a_filled_cache_holds_at_any_length(layer):
    built = LAYERS[layer](4)
    cache = built.new_cache()
    for length in (5, 40):
        built(torch.randn(3, length, 12), cache=cache)
        held = cache.state.nbytes + (0 if cache.conv is None else cache.conv.nbytes)
        c = cost(built, batch=3, length=length)
        assert 3 * c.state_fixed == held and c.state_per_token == 0 and c.state_bytes == c.state_fixed
        assert c.name == LAYER_ENTRIES[layer]
        assert c.sizes.get("allow_neg_eigval", False) == getattr(built, "allow_neg_eigval", False)


@pytest.mark.parametrize("name", NAMES.values())
def test_every_form_is_priced_and_the_chosen_one_is_the_count(name):
    for backward in (False, True):
        forms = cost(name, backward=backward, length=37, chunk_size=8).forms
        assert list(forms) == list(FORMS)
        for form in FORMS:
            assert cost(name, backward=backward, length=37, chunk_size=8, form=form).flops == forms[form]
    with pytest.raises(ArgumentError, match="form must be one of"):
        cost(name, form="fast")


def test_the_chunk_form_grows_linearly_the_parallel_form_quadratically_and_the_state_stays():
    short, long = (cost("gated-deltanet", q_len=n) for n in (4096, 8192))
    recurrence = {form: [c.forms[form] - c.terms["projections (q_proj, k_proj, v_proj, g_proj, a_proj, b_proj, "
                                                   "out_proj)"] - c.terms["short convolution (depthwise)"]
                         for c in (short, long)] for form in FORMS}
    assert recurrence["chunk"][1] == 2 * recurrence["chunk"][0]
    assert recurrence["recurrent"][1] == 2 * recurrence["recurrent"][0]
    assert recurrence["parallel"][1] > 3.9 * recurrence["parallel"][0]
    assert short.state_fixed == long.state_fixed > 0
    assert long.state_bytes / long.context == short.state_bytes / short.context / 2  # per token: halved
