"""transformers' mask functions read back as attnkit masks: the same picture as transformers' own, and sparse."""

import pytest
import torch
from transformers import masking_utils as hf

from attnkit import masks
from attnkit.integrations.transformers import ModelMask, whole_sequence_mask
from attnkit.integrations.transformers.model_masks import make_mask_function

RECOGNISED = {
    "causal": hf.causal_mask_function,
    "bidirectional": hf.bidirectional_mask_function,
    "sliding causal": hf.sliding_window_causal_mask_function(4),
    "sliding bidirectional": hf.sliding_window_bidirectional_mask_function(3),
    "or of windows": hf.or_masks(hf.sliding_window_overlay(2), hf.causal_mask_function),
}
# (q_length, kv_length, q_offset, kv_offset): one pass, decoding, chunked prefill, a static cache longer than
# the tokens seen, a sliding cache that keeps only the last keys.
BLOCKS = [(9, 9, 0, 0), (1, 10, 9, 0), (4, 13, 9, 0), (3, 16, 5, 0), (1, 5, 11, 7), (3, 6, 10, 7)]


def _hf_picture(fn, block, padding):
    q_len, kv_len, q_off, kv_off = block
    return hf.sdpa_mask(batch_size=2, q_length=q_len, kv_length=kv_len, q_offset=q_off, kv_offset=kv_off,
                        mask_function=fn, attention_mask=padding, allow_is_causal_skip=False)


def _picture(model_mask: ModelMask, q_len, kv_len):
    if model_mask.mask is None:
        return torch.ones(1, 1, q_len, kv_len, dtype=torch.bool)
    if torch.is_tensor(model_mask.mask):
        return model_mask.mask
    return model_mask.mask.materialize(q_len, kv_len, batch=2)


@pytest.mark.parametrize("name", list(RECOGNISED))
@pytest.mark.parametrize("block", BLOCKS, ids=str)
@pytest.mark.parametrize("padded", [False, True])
def test_recognised_masks_give_transformers_picture_without_a_dense_tensor(name, block, padded):
    q_len, kv_len, q_off, kv_off = block
    seen = max(q_off + q_len, kv_off + kv_len)
    padding = None
    if padded:  # left padding on sample 1 (its first 3 positions), none on sample 0
        padding = torch.ones(2, seen, dtype=torch.bool)
        padding[1, :3] = False
    fn = RECOGNISED[name]
    got = make_mask_function()(batch_size=2, q_length=q_len, kv_length=kv_len, q_offset=q_off, kv_offset=kv_off,
                               mask_function=fn, attention_mask=padding)
    assert not torch.is_tensor(got.mask)  # structured: attnkit can skip blocks
    assert (got.q_offset, got.kv_offset, got.length) == (q_off, kv_off, seen)
    expected = torch.broadcast_to(_hf_picture(fn, block, padding), (2, 1, q_len, kv_len))
    assert torch.equal(torch.broadcast_to(_picture(got, q_len, kv_len), (2, 1, q_len, kv_len)), expected)


def test_plain_causal_over_a_dynamic_cache_is_attnkit_causal():
    fn = make_mask_function()
    assert repr(fn(batch_size=1, q_length=4, kv_length=10, q_offset=6, mask_function=hf.causal_mask_function).mask) \
        == repr(masks.causal())
    assert fn(batch_size=1, q_length=4, kv_length=4, mask_function=hf.bidirectional_mask_function).mask is None
    window = fn(batch_size=1, q_length=64, kv_length=64, mask_function=hf.sliding_window_causal_mask_function(8))
    assert window.mask.band(64, 64) == (-7, 0)  # the band path serves it
    # a window that cuts nothing of the block is no mask at all: the O(1) paths serve it
    short = fn(batch_size=1, q_length=6, kv_length=6, mask_function=hf.sliding_window_causal_mask_function(8))
    assert repr(short.mask) == repr(masks.causal())
    step = fn(batch_size=1, q_length=1, kv_length=7, q_offset=12, kv_offset=6,
              mask_function=hf.sliding_window_causal_mask_function(8))
    assert step.mask is None


@pytest.mark.parametrize("block", BLOCKS + [(1, 256, 255, 0), (5, 8, 2, 0), (2, 300, 310, 12)], ids=str)
def test_a_causal_layer_without_padding_gets_the_general_routes_mask(block):
    # the plain causal function is read from its band directly; an AND of it alone takes the general route
    q_len, kv_len, q_off, kv_off = block
    fn, sizes = make_mask_function(), dict(batch_size=1, q_length=q_len, kv_length=kv_len, q_offset=q_off,
                                           kv_offset=kv_off)
    fast = fn(mask_function=hf.causal_mask_function, **sizes)
    general = fn(mask_function=hf.and_masks(hf.causal_mask_function), **sizes)
    assert repr(fast) == repr(general) and repr(fast.mask) == repr(general.mask)
    assert (fast.sizes, fast.dtype, fast.device, fast.packing) == (general.sizes, general.dtype, general.device, None)


def test_an_unknown_pattern_is_evaluated_exactly_by_transformers():
    chunked = hf.chunked_causal_mask_function(3, torch.zeros(2, dtype=torch.long))
    padding = torch.ones(2, 8, dtype=torch.bool)
    padding[0, -2:] = False
    got = make_mask_function()(batch_size=2, q_length=8, kv_length=8, mask_function=chunked, attention_mask=padding)
    assert torch.is_tensor(got.mask)
    assert torch.equal(got.mask, _hf_picture(chunked, (8, 8, 0, 0), padding))
    assert whole_sequence_mask(chunked) is None


def test_a_registered_mask_is_anded_on_whole_sequence_positions():
    extra = masks.global_tokens([0]) | masks.sliding_window(2)
    fn = make_mask_function(extra)
    got = fn(batch_size=1, q_length=2, kv_length=9, q_offset=7, mask_function=hf.causal_mask_function)
    whole = (extra & masks.causal()).materialize(9, 9)[..., 7:9, :]
    assert torch.equal(got.mask.materialize(2, 9), whole)
