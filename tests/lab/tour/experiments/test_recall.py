"""Recall against state size: the experiments, the state each run reports, and (slow) the claim on 3 seeds."""

from __future__ import annotations

import dataclasses
import sys

import pytest
import torch

import attnkit.lab.tour as tour
from attnkit.lab.tour.experiments import catalog
from attnkit.lab.tour.experiments import recall as rc
from attnkit.lab.tour.experiments.train import Budget
from attnkit.lab.tour.report.recall import Cell, claim_verdict
from attnkit.nn import DeltaNet, GatedDeltaNet, GatedLinearAttention, LinearAttention, Mamba2Mixer

LAYER_TYPES = {"linear": LinearAttention, "gla": GatedLinearAttention, "mamba2": Mamba2Mixer, "deltanet": DeltaNet,
               "gated-deltanet": GatedDeltaNet}


def _state(name: str, w: int, n: int) -> int:
    """The decoding state of one layer for one sequence, from the papers' definitions (float32, one head)."""
    conv = 3 * (4 - 1) * 4  # three projections' last 3 inputs per channel, kernel 4
    return {"softmax": 2 * n * w * 4,  # keys and values of every token
            "linear": w * (w + 1) * 4,  # S and z
            "gla": (w // 2) * w * 4,  # keys half as wide as values
            "mamba2": 16 * 2 * w * 4 + (2 * w + 2 * 16) * 3 * 4,  # N x P, and the convolution over x, B, C
            "deltanet": w * w * 4 + conv * w, "gated-deltanet": w * w * 4 + conv * w}[name]


def test_every_mechanism_and_width_is_an_experiment_of_the_default_tour():
    exps = tour.experiments()
    keys = [k for k, e in exps.items() if getattr(e.build, "func", None) is rc._build]  # built by this sweep
    assert keys == list(rc.KEYS) and len(keys) == len(rc.MECHANISMS) * len(rc.WIDTHS)
    assert all(exps[k].task == rc.TASK == "mqar" for k in keys)
    assert set(rc.KEYS) <= set(catalog.DEFAULT)
    assert {rc.CLAIM["better"], rc.CLAIM["worse"]} <= set(rc.MECHANISMS)


@pytest.mark.parametrize("name", list(rc.MECHANISMS))
def test_each_model_has_its_layer_and_the_state_it_decodes_from(name):
    width = rc.WIDTHS[1]
    built = tour.experiments()[f"{rc.TASK}/{name}-d{width}"].build()
    layers = [m for m in built.model.modules() if isinstance(m, tuple(LAYER_TYPES.values()))]
    assert len(layers) == (0 if name == "softmax" else 2)
    assert all(type(m) is LAYER_TYPES[name] for m in layers)
    state = torch.get_rng_state()
    assert rc.state_bytes(name, width) == rc.layer_state_bytes(built.model, 12) == _state(name, width, 12)
    assert torch.equal(torch.get_rng_state(), state)  # building the model to read its state draws nothing


def test_a_run_of_the_sweep_trains_through_the_tour(monkeypatch):
    key = f"{rc.TASK}/deltanet-d{rc.WIDTHS[0]}"
    exps = tour.experiments()
    tiny = Budget(steps=2, batch_size=4, eval_size=4, test_size=8)
    module = sys.modules["attnkit.lab.tour.experiments"]  # the package; its name is also a function of attnkit.lab.tour
    monkeypatch.setattr(module, "_registry", lambda: {**exps, key: dataclasses.replace(exps[key], budget=tiny)})
    result = tour.run(key, 1)
    assert result.key == key and 0.0 <= result.accuracy <= 1.0 and len(result.curve) == 2


@pytest.mark.slow  # 18 runs at the default budget
def test_the_delta_rule_recalls_better_than_linear_attention_on_three_seeds():
    cells = [Cell(name, width, {seed: tour.run(f"{rc.TASK}/{name}-d{width}", seed).accuracy for seed in range(3)})
             for name in (rc.CLAIM["better"], rc.CLAIM["worse"]) for width in rc.WIDTHS]
    result, _, detail = claim_verdict(cells)
    assert result == "held", detail
