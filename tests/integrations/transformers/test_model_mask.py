"""ModelMask: model code that reads the mask sees transformers' eager 4-D mask; the common path builds none."""

import pytest
import torch
from transformers import LlamaForCausalLM, MistralForCausalLM
from transformers import masking_utils as hf

from attnkit import masks
from attnkit.integrations.transformers import ModelMask, register
from attnkit.integrations.transformers.model_masks import make_mask_function

from .helpers import left_padded, tokens, twins
from .test_model_masks import BLOCKS, RECOGNISED
from .test_models import llama, mistral


def _padding(block, batch=2):
    q_len, kv_len, q_off, kv_off = block
    keep = torch.ones(batch, max(q_off + q_len, kv_off + kv_len), dtype=torch.bool)
    keep[1, :3] = False
    return keep


def _both(name, block, dtype=torch.float32):
    """(ModelMask, transformers' eager mask) of one recognised mask function on one block, left padding."""
    q_len, kv_len, q_off, kv_off = block
    kwargs = dict(batch_size=2, q_length=q_len, kv_length=kv_len, q_offset=q_off, kv_offset=kv_off,
                  mask_function=RECOGNISED[name], attention_mask=_padding(block), dtype=dtype)
    return make_mask_function()(**kwargs), hf.eager_mask(**kwargs)


@pytest.mark.parametrize("name", list(RECOGNISED))
@pytest.mark.parametrize("block", BLOCKS, ids=str)
def test_the_dense_form_is_transformers_eager_mask(name, block):
    got, expected = _both(name, block)
    assert got.shape == expected.shape and got.dtype == expected.dtype  # answered without building it
    assert got._dense is None
    assert torch.equal(got.dense(), expected)
    assert got.dense() is got.dense()  # built once


def test_indexing_operators_and_torch_functions_see_the_dense_mask():
    block = (4, 13, 9, 0)
    got, expected = _both("sliding causal", block, dtype=torch.float64)
    scores = torch.randn(2, 3, 4, 13, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    assert torch.equal(got[:, 0], expected[:, 0])  # a sparse-attention indexer's read
    assert torch.equal(scores + got, scores + expected)  # an encoder adding it to its own scores
    assert torch.equal(got + scores, expected + scores)
    assert torch.equal(torch.where(got == 0, scores, -1.0), torch.where(expected == 0, scores, -1.0))
    assert torch.equal(scores.masked_fill(got != 0, 7.0), scores.masked_fill(expected != 0, 7.0))
    assert torch.equal(got.to(torch.float32), expected.to(torch.float32))  # a tensor method
    assert got.ndim == 4 and got.device == expected.device
    assert torch.equal(torch.softmax(scores + got, -1), torch.softmax(scores + expected, -1))


def test_a_registered_mask_is_in_the_dense_form():
    extra = masks.sliding_window(2)
    got = make_mask_function(extra)(batch_size=1, q_length=3, kv_length=9, q_offset=6,
                                    mask_function=hf.causal_mask_function)
    allowed = (extra & masks.causal()).materialize(9, 9)[..., 6:, :]
    expected = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
    assert torch.equal(got.dense(), expected)


@pytest.mark.parametrize("model_class, config", [(LlamaForCausalLM, llama()), (MistralForCausalLM, mistral(4))],
                         ids=["causal", "sliding"])
def test_the_common_path_builds_no_dense_mask(monkeypatch, model_class, config):
    built = []
    real = ModelMask.dense
    monkeypatch.setattr(ModelMask, "dense", lambda self: built.append(self) or real(self))
    _, ours = twins(model_class, config)
    with torch.no_grad():
        ours(tokens(length=20), attention_mask=left_padded(length=20))
    ours.generate(tokens(), attention_mask=left_padded(), max_new_tokens=3, do_sample=False, pad_token_id=0)
    ours.set_attn_implementation(register("attnkit-test-lazy", mask=masks.sliding_window(3)))
    with torch.no_grad():
        ours(tokens())
    assert built == []


def test_copies_keep_the_structure():
    import copy
    import pickle

    got, expected = _both("causal", (3, 6, 3, 0))
    for twin in (copy.deepcopy(got), pickle.loads(pickle.dumps(got))):
        assert repr(twin.mask) == repr(got.mask) and torch.equal(twin.dense(), expected)


@pytest.mark.parametrize("name", ["causal", "sliding causal"])
def test_model_code_reading_the_mask_compiles_whole(name):
    block = (4, 13, 9, 0)
    scores = torch.randn(2, 3, 4, 13, generator=torch.Generator().manual_seed(1))

    def read(scores, padding):  # what indexers and encoders do with it
        model_mask = make_mask_function()(batch_size=2, q_length=4, kv_length=13, q_offset=9,
                                          mask_function=RECOGNISED[name], attention_mask=padding)
        return scores + model_mask, model_mask[:, 0], scores.masked_fill(model_mask != 0, 5.0)

    torch._dynamo.reset()
    compiled = torch.compile(read, fullgraph=True, backend="aot_eager")
    _, expected = _both(name, block)
    for got, want in zip(compiled(scores, _padding(block)), (scores + expected, expected[:, 0],
                                                            scores.masked_fill(expected != 0, 5.0)), strict=True):
        assert torch.equal(got, want)


def test_asking_for_a_name_no_tensor_has_builds_nothing():
    got, _ = _both("causal", (3, 6, 3, 0))
    assert not hasattr(got, "is_causal_skip") and got._dense is None
    assert hasattr(got, "masked_fill") and got._dense is not None
