"""The long suite's model (src/attnkit/tour/long/model.py): matched parameters, pooling, one label per position."""

from __future__ import annotations

import pytest
import torch

from attnkit.lab.tour.experiments.train import count_parameters
from attnkit.lab.tour.long.model import MIN_LATENTS, TOLERANCE, LongClassifier, build, matched_width
from attnkit.lab.tour.long.roster import MECHANISMS, Sizes
from attnkit.lab.tour.long.suite import plan, sizes_of


def _counts(scale: str):
    for setup in plan(scale).setups:
        task = setup.make()
        sizes, per_position = sizes_of(setup, task), task.kind == "tokens"
        args = (task.vocab_size, task.num_classes, sizes)
        for name in setup.mechanisms:
            with torch.device("meta"):
                count = count_parameters(build(*args, layers=setup.model.layers, ff=setup.model.ff, name=name,
                                               per_position=per_position))
                dense = count_parameters(build(*args, layers=setup.model.layers, ff=setup.model.ff,
                                               name="softmax", per_position=per_position))
            width = matched_width(*args, setup.model.layers, setup.model.ff, name, per_position)
            yield setup.task, name, count, dense, width


@pytest.mark.parametrize("scale", ["default", "quick"])
def test_every_mechanism_matches_softmax_parameter_count_or_is_at_its_smallest(scale):
    seen = set()
    for task, name, count, dense, width in _counts(scale):
        smallest = MIN_LATENTS if MECHANISMS[name].build is None else 1
        # Linformer's k x L projection at 2048 tokens and the Perceiver's latent MLP exceed a small model's
        # feed-forward block: they can only be made as small as they go (the report shows their counts)
        assert abs(count - dense) <= TOLERANCE * dense or (width == smallest and count > dense), (task, name)
        seen.add(name)
    assert seen == set(MECHANISMS)


def test_mean_pooling_averages_the_real_positions_only():
    torch.manual_seed(0)
    model = LongClassifier(20, 3, Sizes(32, 16, 2), layers=1, width=32, name="softmax").eval()
    tokens = torch.randint(1, 20, (2, 32), generator=torch.Generator().manual_seed(1))
    head = model.head.weight.double(), model.head.bias.double()
    hidden = model.body(model.embed(tokens)).double().mean(1)
    assert torch.allclose(model(tokens).double(), hidden @ head[0].T + head[1], atol=1e-5)
    padded = tokens.clone()
    padded[:, -4:] = 0
    hidden = model.body(model.embed(padded)).double()[:, :-4].mean(1)  # the padded positions are left out
    assert torch.allclose(model(padded).double(), hidden @ head[0].T + head[1], atol=1e-5)


@pytest.mark.parametrize("name", ["softmax", "perceiver", "bigbird", "linear"])
def test_per_position_logits_have_one_row_per_token_and_depend_on_distant_tokens(name):
    torch.manual_seed(0)
    width = MIN_LATENTS if name == "perceiver" else 32
    model = LongClassifier(20, 3, Sizes(64, 16, 2), layers=2, width=width, name=name, per_position=True).eval()
    tokens = torch.randint(1, 20, (2, 64), generator=torch.Generator().manual_seed(1))
    logits = model(tokens)
    assert logits.shape == (2, 64, 3) and torch.isfinite(logits).all()
    changed = tokens.clone()
    changed[:, 0] = (changed[:, 0] % 19) + 1  # the first token changes: the last position's logits move
    assert not torch.allclose(model(changed)[:, -1], logits[:, -1])


def _reach(questions):
    """Logits of a 1-layer Longformer model at positions 100 (a question) and 60 (not one) before and after
    the token at 30, beyond the window of both, changes."""
    torch.manual_seed(0)
    model = LongClassifier(20, 3, Sizes(128, 16, 2), layers=1, width=32, name="longformer", per_position=True,
                           questions=questions).eval()
    tokens = torch.randint(1, 19, (2, 128), generator=torch.Generator().manual_seed(1))
    tokens[:, 100] = 19  # the question token
    changed = tokens.clone()
    changed[:, 30] = changed[:, 30] % 18 + 1
    with torch.no_grad():
        return model(tokens), model(changed)


def test_longformer_puts_its_global_tokens_on_the_tasks_questions_else_on_a_class_token():
    before, after = _reach(lambda inputs: inputs == 19)
    assert not torch.allclose(before[:, 100], after[:, 100])  # the question reads the whole sequence
    assert torch.allclose(before[:, 60], after[:, 60])  # a plain token reads its window and the question only
    before, after = _reach(None)  # no questions: the first position is the global (class) token
    assert torch.allclose(before[:, 100], after[:, 100]) and torch.allclose(before[:, 60], after[:, 60])
    before, after = _reach(lambda inputs: None)  # a task that marks none: the class token too
    assert torch.allclose(before[:, 100], after[:, 100])


def test_the_suite_builds_its_models_with_the_tasks_question_positions(monkeypatch):
    from attnkit.lab.tour.long import train

    seen = []

    def capture(*args, **kw):
        seen.append(kw["questions"])
        raise StopIteration  # what this test reads is the model's arguments, not the training

    monkeypatch.setattr(train, "build", capture)
    setup = plan("quick").setup("associative_recall")
    with pytest.raises(StopIteration):
        train.train_pair("associative_recall", "longformer", [0], scale="quick")
    assert seen[0].__self__ == setup.make() and seen[0].__name__ == "question_positions"
