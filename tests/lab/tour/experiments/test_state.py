"""The state-tracking experiments: the split (short training, long test), the models, the length bands, and
DeltaNet's beta range."""

import inspect

import pytest
import torch

from attnkit.errors import ArgumentError
from attnkit.lab.tour.experiments import _train, experiments
from attnkit.lab.tour.experiments import state as st
from attnkit.lab.tour.experiments.train import Budget
from attnkit.nn import DeltaNet


def test_every_task_has_every_mechanism_and_the_default_tour_is_unchanged():
    from attnkit.lab.tour.experiments import default_set

    exps = experiments()
    assert all(key in exps for key in st.KEYS)
    mechanisms = {k.split("/")[1] for k in st.KEYS if k.startswith("parity/")}
    assert mechanisms | {"deltanet-neg"} == set(st.MECHANISMS)
    assert ("deltanet-neg" in mechanisms) == st.NEGATIVE_BETA == ("parity/deltanet-neg" in exps)
    assert not set(st.KEYS) & set(default_set(False))  # run on their own: attnkit tour --tasks parity ...


def test_the_split_trains_short_and_scores_only_the_longer_states():
    built = st._build("parity", "lstm")
    assert built.task.seq_len == st.TRAIN_LENGTH and built.task.scored_from == 0
    assert built.test_task.seq_len == 4 * st.TRAIN_LENGTH and built.test_task.scored_from == st.TRAIN_LENGTH
    a5 = st._build("word_problem_a5", "softmax-nope")
    assert a5.task.group == "A5" and a5.model(torch.zeros(2, 7, dtype=torch.long)).shape == (2, 7, 60)


@pytest.mark.parametrize("mechanism", ["softmax-rope", "softmax-nope", "gated-deltanet", "mamba2", "lstm"])
def test_each_model_runs_on_lengths_past_training(mechanism):
    model = st._build("modular_count", mechanism).model
    with torch.no_grad():
        assert model(torch.randint(0, 2, (2, 3 * st.TRAIN_LENGTH))).shape == (2, 3 * st.TRAIN_LENGTH, 3)


def test_the_length_bands_score_a_perfect_model_fully_and_a_constant_one_at_chance():
    task = st._build("parity", "lstm").test_task

    class Oracle(torch.nn.Module):
        def forward(self, tokens):
            return torch.nn.functional.one_hot(tokens.cumsum(1) % 2, 2).float()

    class Constant(torch.nn.Module):
        def forward(self, tokens):
            return torch.zeros(*tokens.shape, 2)

    bands = st.StateObjective().extra(Oracle(), None, task)
    assert list(bands) == [f"length_{end}" for end in st.BANDS] and set(bands.values()) == {1.0}
    assert all(abs(v - 0.5) < 0.05 for v in st.StateObjective().extra(Constant(), None, task).values())


def test_a_tiny_run_records_the_bands_and_a_test_accuracy():
    exp = experiments()["parity/softmax-nope"]
    result = _train(exp.key, exp, Budget(steps=2, batch_size=8, eval_size=16, test_size=16), 0, None)
    assert 0.0 <= result.accuracy <= 1.0 and set(result.extra) == {f"length_{end}" for end in st.BANDS}


def test_negative_deltanet_asks_for_allow_neg_eigval_or_says_it_is_missing(monkeypatch):
    assert isinstance(st.deltanet(8, 2), DeltaNet)
    if "allow_neg_eigval" not in inspect.signature(DeltaNet).parameters:
        with pytest.raises(ArgumentError, match="allow_neg_eigval"):
            st.deltanet(8, 2, negative=True)
    seen = {}

    class WithOption(DeltaNet):
        def __init__(self, dim, num_heads, *, allow_neg_eigval=False):
            seen["allow_neg_eigval"] = allow_neg_eigval
            super().__init__(dim, num_heads)

    monkeypatch.setattr(st, "DeltaNet", WithOption)
    assert isinstance(st.deltanet(8, 2, negative=True), WithOption) and seen == {"allow_neg_eigval": True}
