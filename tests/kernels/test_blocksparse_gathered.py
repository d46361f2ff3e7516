"""kernels/blocksparse_gathered.py: any score, bias and normaliser on gathered key blocks.

Query blocks with no allowed key block are in no slab: their output is 0 and their lse
``-inf``, also when the slabs' softmax returns an lse the call did not ask for.
"""

from __future__ import annotations

import torch

import attnkit
from attnkit import masks
from attnkit.bias import ALiBi, softcap
from tests.helpers import assert_close_to_oracle, rand_qkv


def test_query_blocks_with_no_key_and_a_bias_tensor():
    q, k, v = rand_qkv(1, 1, 129, 5, 16, seed=1)
    bias = torch.zeros(129, 5)
    got = attnkit.attention(q, k, v, mask=masks.causal(), bias=bias, backend="blocksparse")
    assert_close_to_oracle(got, q, k, v, mask=masks.causal(), bias=bias)
    assert (got[..., :124, :] == 0).all()  # bottom-right: the first 124 queries see no key


def test_query_blocks_with_no_key_and_a_modifier_through_auto():
    q, k, v = rand_qkv(1, 9, 257, 5, 16, hkv=3, seed=2)
    for bias in (softcap(5.0), ALiBi(9)):
        got = attnkit.attention(q, k, v, mask=masks.causal(), bias=bias)
        assert_close_to_oracle(got, q, k, v, mask=masks.causal(), bias=bias)
