"""transformers models on "attnkit" under torch.compile(fullgraph=True): no graph break, eager's logits.

``aot_eager`` traces exactly what inductor would (dynamo, then AOTAutograd) without generating code, so
a graph break or a traced difference shows here in seconds.
"""

import pytest
import torch
from transformers import Gemma2ForCausalLM, LlamaForCausalLM, MistralForCausalLM

from .helpers import left_padded, tokens, twins
from .test_models import gemma2, llama, mistral

FAMILIES = {"llama": (LlamaForCausalLM, llama), "mistral (window)": (MistralForCausalLM, lambda: mistral(4)),
            "gemma2 (soft-capping)": (Gemma2ForCausalLM, gemma2)}


def _compiled_equals_eager(family):
    torch._dynamo.reset()
    model_class, config = FAMILIES[family]
    eager, ours = twins(model_class, config())

    def logits(ids, keep):
        return ours(input_ids=ids, attention_mask=keep).logits

    ids = tokens(length=14)
    with torch.no_grad():
        explained = torch._dynamo.explain(logits)(ids, left_padded(length=14))
        assert explained.graph_break_count == 0, [reason.reason for reason in explained.break_reasons]
        compiled = torch.compile(logits, fullgraph=True, backend="aot_eager")
        for keep in (left_padded(length=14), torch.ones(2, 14, dtype=torch.long)):  # tokenizers always pass one
            real = keep.bool()
            expected = eager(input_ids=ids, attention_mask=keep).logits
            torch.testing.assert_close(compiled(ids, keep)[real], expected[real], rtol=0, atol=1e-5)


def test_llama_with_an_attention_mask_compiles_whole():
    _compiled_equals_eager("llama")


@pytest.mark.slow
@pytest.mark.parametrize("family", ["mistral (window)", "gemma2 (soft-capping)"])
def test_windows_and_soft_capping_compile_whole(family):
    _compiled_equals_eager(family)


@pytest.mark.slow
def test_static_cache_generation_compiles_whole():
    torch._dynamo.reset()
    eager, ours = twins(LlamaForCausalLM, llama())
    kwargs = dict(attention_mask=left_padded(), max_new_tokens=4, do_sample=False, pad_token_id=0,
                  cache_implementation="static")
    ours.forward = torch.compile(ours.forward, fullgraph=True, backend="aot_eager")
    assert torch.equal(ours.generate(tokens(), **kwargs), eager.generate(tokens(), **kwargs))
