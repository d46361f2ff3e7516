"""The long suite's roster (src/attnkit/tour/long/roster.py): every long-sequence mechanism, from attnkit modules."""

from __future__ import annotations

import pytest
import torch

from attnkit.errors import ArgumentError
from attnkit.lab.tour.long.roster import MECHANISMS, SELECTED, Sizes, block, mechanism
from attnkit.models import TransformerEncoder
from attnkit.nn import MoBA, NativeSparseAttention

ISSUE_ROSTER = {"softmax", "local", "sliding-window", "sparse-strided", "sparse-fixed", "longformer", "bigbird",
                "block-sparse", "reformer", "linformer", "linear", "performer", "perceiver", "lambda", "nsa", "moba"}


def test_the_roster_holds_every_long_sequence_mechanism_once():
    assert set(MECHANISMS) == ISSUE_ROSTER
    assert [m for m in MECHANISMS.values() if m.images_only] == [MECHANISMS["lambda"]]
    assert {m.name for m in MECHANISMS.values() if m.global_tokens} == {"longformer", "bigbird"}
    assert {m.name for m in MECHANISMS.values() if m.fixed_state} == {"linformer", "linear", "performer"}
    assert {m.name for m in MECHANISMS.values() if m.chosen_blocks} == {"nsa", "moba"}
    assert not MECHANISMS["softmax"].linear_time


def test_block_is_the_power_of_two_nearest_the_square_root():
    assert [block(n) for n in (16, 256, 1024, 4096)] == [8, 16, 32, 64]


@pytest.mark.parametrize("name", sorted(ISSUE_ROSTER - {"perceiver"}))
def test_each_factory_is_a_self_attention_of_the_encoder(name):
    sizes = Sizes(64, 16, 2, side=8)
    enc = TransformerEncoder(16, 2, 1, attention=mechanism(name).factory(sizes), max_len=64).eval()
    x = torch.randn(2, 64, 16, generator=torch.Generator().manual_seed(0))
    y = enc(x)
    assert y.shape == x.shape and torch.isfinite(y).all()
    x2 = x.clone()
    x2[:, 0] += 1.0  # the first token changes: the attention mixes it into some other position
    assert not torch.allclose(enc(x2)[:, 1:], y[:, 1:])


@pytest.mark.parametrize("length", [64, 576, 2048, 4096])
def test_nsa_and_moba_take_their_blocks_and_window_from_the_length(length):
    b = block(length)
    nsa = mechanism("nsa").factory(Sizes(length, 16, 2))(16, 2)
    moba = mechanism("moba").factory(Sizes(length, 16, 2))(16, 2)
    assert isinstance(nsa, NativeSparseAttention) and isinstance(moba, MoBA)
    assert (nsa.compress_block, nsa.compress_stride, nsa.select_block, nsa.window) == (b // 2, b // 4, b, b)
    assert (moba.block_size, nsa.num_selected, moba.top_k) == (b, SELECTED, SELECTED)


def test_unknown_names_and_lambda_off_images_are_clear_errors():
    with pytest.raises(ArgumentError, match="did you mean 'linear'"):
        mechanism("linaer")
    with pytest.raises(ArgumentError, match="image tasks only"):
        MECHANISMS["lambda"].factory(Sizes(64, 16, 2))
    assert MECHANISMS["perceiver"].factory(Sizes(64, 16, 2)) is None
