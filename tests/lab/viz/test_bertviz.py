"""attnkit.lab.viz.to_bertviz: the object bertviz's head_view.js / model_view.js read,
from a transformers model's output.

The keys are those bertviz's Python side hands its JavaScript (``params`` in ``head_view.py`` and
``model_view.py``): ``attention`` (filters of ``attn [layer][head][query][key]``, ``left_text``,
``right_text``), ``default_filter``, ``root_div_id`` and the view's own keys.
"""

from __future__ import annotations

import json

import pytest
import torch

from attnkit.errors import ArgumentError
from attnkit.lab.viz import to_bertviz
from tests.lab.analysis.tiny_transformers import TEXTS, tiny_bart, tiny_bert, tokenizer

HEAD_KEYS = {"attention", "default_filter", "root_div_id", "layer", "heads", "include_layers"}
MODEL_KEYS = {"attention", "default_filter", "display_mode", "root_div_id", "include_layers", "include_heads",
              "total_heads"}


@pytest.fixture(scope="module")
def bert_run():
    """A padded batch of two texts through a tiny BERT: (outputs, attention_mask, tokens of the short text)."""
    tok = tokenizer()
    encoded = tok(TEXTS, return_tensors="pt", padding=True)
    with torch.no_grad():
        outputs = tiny_bert()(**encoded, output_attentions=True)
    tokens = tok.convert_ids_to_tokens(tok(TEXTS[1])["input_ids"])
    return outputs, encoded["attention_mask"], tokens


def _shape(nested) -> tuple[int, ...]:
    shape = []
    while isinstance(nested, list):
        shape.append(len(nested))
        nested = nested[0]
    return tuple(shape)


def test_head_view_object_of_a_padded_sample(bert_run, tmp_path):
    outputs, mask, tokens = bert_run
    params = to_bertviz(outputs.attentions, tokens, attention_mask=mask, sample=1, path=tmp_path / "head.json")
    assert set(params) == HEAD_KEYS and params["default_filter"] == "0"
    assert params["include_layers"] == [0, 1] and params["layer"] is None and params["heads"] is None
    (only,) = params["attention"]
    assert only["name"] is None and only["left_text"] == only["right_text"] == tokens and "[PAD]" not in tokens
    n = len(tokens)
    assert _shape(only["attn"]) == (2, 3, n, n)
    attn = torch.tensor(only["attn"])
    for layer in range(2):
        torch.testing.assert_close(attn[layer], outputs.attentions[layer][1, :, :n, :n], rtol=0, atol=0)
    torch.testing.assert_close(attn.sum(-1), torch.ones(2, 3, n), rtol=0, atol=1e-5)  # rows sum to 1
    assert json.loads((tmp_path / "head.json").read_text()) == json.loads(json.dumps(params))


def test_model_view_keeps_the_chosen_layers_and_heads(bert_run):
    outputs, _, _ = bert_run
    tokens = tokenizer().convert_ids_to_tokens(tokenizer()(TEXTS[0])["input_ids"])
    params = to_bertviz(outputs.attentions, tokens, view="model", include_layers=[1], include_heads=[2, 0])
    assert set(params) == MODEL_KEYS
    assert (params["include_layers"], params["include_heads"], params["total_heads"]) == ([1], [2, 0], 3)
    attn = torch.tensor(params["attention"][0]["attn"])
    assert attn.shape == (1, 2, len(tokens), len(tokens))
    torch.testing.assert_close(attn[0], outputs.attentions[1][0, [2, 0]], rtol=0, atol=0)
    head = to_bertviz(outputs.attentions, tokens, include_heads=[2, 0])  # head view: every head, two shown first
    assert _shape(head["attention"][0]["attn"])[:2] == (2, 3) and head["heads"] == [2, 0]


def test_sentence_pairs_give_bertviz_five_filters(bert_run):
    outputs, _, _ = bert_run
    tokens = [f"t{i}" for i in range(outputs.attentions[0].shape[-1])]
    params = to_bertviz(outputs.attentions, tokens, sentence_b_start=4)
    names = [f["name"] for f in params["attention"]]
    assert names == ["All", "Sentence A -> Sentence A", "Sentence B -> Sentence B", "Sentence A -> Sentence B",
                     "Sentence B -> Sentence A"]
    a_to_b = params["attention"][3]
    assert a_to_b["left_text"] == tokens[:4] and a_to_b["right_text"] == tokens[4:]
    torch.testing.assert_close(torch.tensor(a_to_b["attn"])[1], outputs.attentions[1][0, :, :4, 4:], rtol=0, atol=0)


def test_encoder_decoder_filters():
    tok = tokenizer()
    enc, dec = tok(TEXTS[0], return_tensors="pt"), tok("Le chat", return_tensors="pt")
    with torch.no_grad():
        outputs = tiny_bart()(**enc, decoder_input_ids=dec["input_ids"], output_attentions=True)
    enc_tokens, dec_tokens = (tok.convert_ids_to_tokens(x["input_ids"][0]) for x in (enc, dec))
    params = to_bertviz(outputs, enc_tokens, decoder_tokens=dec_tokens, view="model")
    filters = {f["name"]: f for f in params["attention"]}
    assert list(filters) == ["Encoder", "Decoder", "Cross"]
    # 2 encoder layers of 3 heads, 1 decoder layer of 2 heads: each stack keeps all of its own
    assert _shape(filters["Encoder"]["attn"]) == (2, 3, len(enc_tokens), len(enc_tokens))
    assert _shape(filters["Cross"]["attn"]) == (1, 2, len(dec_tokens), len(enc_tokens))
    assert (filters["Cross"]["left_text"], filters["Cross"]["right_text"]) == (dec_tokens, enc_tokens)
    torch.testing.assert_close(torch.tensor(filters["Cross"]["attn"])[0], outputs.cross_attentions[0][0],
                               rtol=0, atol=0)
    assert (params["include_layers"], params["include_heads"], params["total_heads"]) == ([0, 1], [0, 1, 2], 3)
    with pytest.raises(ArgumentError, match=r"include_heads must be distinct head indices in \[0, 2\)"):
        to_bertviz(outputs, enc_tokens, decoder_tokens=dec_tokens, include_heads=[2])  # the decoder has 2


def test_bad_arguments_are_named(bert_run):
    outputs, _, _ = bert_run
    with pytest.raises(ArgumentError, match="view must be one of head, model"):
        to_bertviz(outputs.attentions, view="neuron")
    with pytest.raises(ArgumentError, match=r"include_layers must be distinct layer indices in \[0, 2\)"):
        to_bertviz(outputs.attentions, include_layers=[0, 2])
    with pytest.raises(ArgumentError, match="include_heads must be distinct head indices"):
        to_bertviz(outputs.attentions, include_heads=[1, 1])
    with pytest.raises(ArgumentError, match=r"sentence_b_start must be in \[1, 9\)"):
        to_bertviz(outputs.attentions, sentence_b_start=9)
    with pytest.raises(ArgumentError, match=r"\.json"):
        to_bertviz(outputs.attentions, path="params.txt")
