"""The size vocabulary (commands/sizes.py): one set of options and defaults, mapped onto each mechanism's names."""

from __future__ import annotations

import argparse

import pytest

from attnkit.costing.analytic import cost, sizes
from attnkit.errors import ArgumentError
from attnkit.lab.commands.sizes import DEFAULTS, add_size_args, mechanism_sizes, title, values

COMMON = {"batch": 2, "heads": 3, "q_len": 50, "kv_len": None, "head_dim": 7}


def test_the_defaults_are_one_realistic_layer():
    args = argparse.Namespace(**DEFAULTS)
    assert values(args) == {"batch": 1, "heads": 8, "q_len": 4096, "kv_len": None, "head_dim": 64}
    p = argparse.ArgumentParser()
    add_size_args(p)
    assert vars(p.parse_args([])) == DEFAULTS
    with pytest.raises(SystemExit):
        p.parse_args(["--q-len", "0"])


def test_attention_sizes_keep_their_names_and_kv_len_follows_q_len():
    assert mechanism_sizes("dense", COMMON, {}) == {"batch": 2, "heads": 3, "head_dim": 7, "q_len": 50, "kv_len": 50}
    got = mechanism_sizes("dense", {**COMMON, "kv_len": 9}, {})
    assert (got["q_len"], got["kv_len"]) == (50, 9)
    got = mechanism_sizes("dense", COMMON, {"q_len": 11})  # an option of the vocabulary's name counts as it
    assert (got["q_len"], got["kv_len"]) == (11, 11)


def test_a_module_with_one_length_takes_q_len_and_its_width_is_heads_times_head_dim():
    got = mechanism_sizes("longformer", COMMON, {"window": 3})
    assert got == {"batch": 2, "heads": 3, "dim": 21, "length": 50, "window": 3}
    assert mechanism_sizes("longformer", COMMON, {"q_len": 64})["length"] == 64
    assert mechanism_sizes("multi-head", COMMON, {})["embed_dim"] == 21
    with pytest.raises(ArgumentError, match=r"longformer takes one sequence length \(length\)"):
        mechanism_sizes("longformer", {**COMMON, "kv_len": 9}, {})


def test_every_mechanism_accepts_its_mapped_sizes():
    for name in ("dense", "sliding-window", "additive", "pointer", "memory-attention", "hierarchical-attention",
                 "perceiver-attention", "rotary-embedding", "reformer", "linformer"):
        got = mechanism_sizes(name, {**COMMON, "q_len": 32}, {})
        assert set(got) <= set(sizes(name)), name
        assert 32 in got.values(), name  # the length reached it, under its own name
        cost(name, **got)  # and the cost model takes them


def test_without_lengths_only_the_shape_is_given():
    got = mechanism_sizes("dense", COMMON, {}, lengths=False)
    assert got == {"batch": 2, "heads": 3, "head_dim": 7}


def test_title():
    assert title({"batch": 1, "heads": 8, "q_len": 4096, "kv_len": None, "head_dim": 64}) == "B=1 H=8 Lq=4096 D=64"
