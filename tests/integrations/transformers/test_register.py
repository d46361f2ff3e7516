"""register(): names transformers would misread, biases that are not modifiers and head counts are refused."""

import pytest
import torch
from transformers import LlamaForCausalLM

import attnkit
from attnkit import masks
from attnkit.errors import ArgumentError, DTypeError, ShapeError
from attnkit.integrations.transformers import register

from .helpers import tokens, twins
from .test_models import llama


@pytest.mark.parametrize("name", [
    "attnkit-flash", "my_sdpa_variant", "attnkit-flex_attention",  # transformers' own checks and kernel loading
    "attnkit/dense", "kernels-community/attnkit", "owner/repo:attention", "repo@v1", "paged|attnkit",  # Hub, paged
    "sdpa", "eager", "flash_attention_2", "flex_attention", "",
])
def test_names_transformers_reads_a_meaning_into_are_refused(name):
    with pytest.raises(ArgumentError, match="name"):
        register(name)


def test_a_name_that_is_not_a_string_is_refused():
    with pytest.raises(DTypeError, match="name must be a string"):
        register(3)


@pytest.mark.parametrize("bias", [attnkit.bias.alibi, torch.zeros(4), lambda scores: scores], ids=str)
def test_a_bias_that_is_not_a_score_modifier_is_refused(bias):
    with pytest.raises(DTypeError, match="bias must be an attnkit score modifier"):
        register("attnkit-test-bias", bias=bias)


@pytest.mark.parametrize("heads", [3, 8])
def test_a_bias_for_another_head_count_is_refused_at_the_first_call(heads):
    _, ours = twins(LlamaForCausalLM, llama(), register("attnkit-test-alibi", bias=attnkit.bias.alibi(heads)))
    with pytest.raises(ShapeError, match=rf"4 query heads.*{heads} heads"), torch.no_grad():
        ours(tokens())


def test_a_mask_for_another_head_count_is_refused_at_the_first_call():
    per_head = masks.TensorMask(torch.ones(1, 3, 1, 12, dtype=torch.bool))
    _, ours = twins(LlamaForCausalLM, llama(), register("attnkit-test-heads", mask=per_head))
    with pytest.raises(ShapeError, match=r"4 query heads.*registered mask.*3 heads"), torch.no_grad():
        ours(tokens())


def test_accepted_names_and_modifiers_run():
    bias = attnkit.bias.alibi(4)
    plain, ours = twins(LlamaForCausalLM, llama(), register("attnkit.alibi_v2", bias=bias))
    lambda_bias, other = twins(LlamaForCausalLM, llama(), register("attnkit-fn", bias=lambda s, b, h, q, k: s))
    with torch.no_grad():
        assert not torch.allclose(ours(tokens()).logits, plain(tokens()).logits)  # the bias is applied
        torch.testing.assert_close(other(tokens()).logits, lambda_bias(tokens()).logits, rtol=0, atol=1e-5)


def test_reloading_the_module_registers_its_names_again_and_foreign_names_stay_refused():
    import importlib

    from transformers import AttentionInterface

    import attnkit.integrations.transformers as module

    register("attnkit-test-reload", mask=masks.sliding_window(8))
    AttentionInterface.register("foreign-test-impl", lambda *args, **kwargs: None)  # another library's name
    try:
        reloaded = importlib.reload(module)  # what a notebook's autoreload does
        assert AttentionInterface._global_mapping["attnkit"].__module__.startswith("attnkit.")
        assert reloaded.register("attnkit-test-reload") == "attnkit-test-reload"  # attnkit's own name again
        for name in ("foreign-test-impl", "sdpa", "eager"):
            with pytest.raises(ArgumentError, match=rf"name '{name}' is .*implementation.*; choose another"):
                reloaded.register(name)
    finally:
        del AttentionInterface._global_mapping["foreign-test-impl"]
