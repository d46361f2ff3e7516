"""attnkit.lab.analysis.model_maps: a transformers output's per-layer tuples as named maps of one sample,
padding removed.

The inputs are synthetic: every weight encodes its own (batch, head, query, key) index, so any
cropping or axis mix-up shows as a wrong number. Real models: tests/lab/analysis/test_transformers_run.py.
"""

from __future__ import annotations

import pytest
import torch

from attnkit.errors import ArgumentError, DTypeError, ShapeError
from attnkit.lab.analysis import AttentionRecorder, layer_maps, recording_from_outputs, summary
from attnkit.lab.analysis.model_maps import is_attention_output, maps_and_tokens


def _coded(b: int, h: int, lq: int, lk: int, layer: int = 0) -> torch.Tensor:
    """w[b, h, i, j] = 10000 * layer + 1000 * b + 100 * h + 10 * i + j (distinct sizes, every entry its own)."""
    idx = torch.meshgrid(*(torch.arange(n) for n in (b, h, lq, lk)), indexing="ij")
    return (10000 * layer + 1000 * idx[0] + 100 * idx[1] + 10 * idx[2] + idx[3]).float()


def _expected(layer: int, sample: int, h: int, q: list[int], k: list[int]) -> torch.Tensor:
    return torch.tensor([[[10000 * layer + 1000 * sample + 100 * hh + 10 * i + j for j in k] for i in q]
                         for hh in range(h)], dtype=torch.float32)


def test_layers_are_named_and_padding_is_removed_per_sample():
    attentions = (_coded(2, 3, 5, 5, 0), _coded(2, 3, 5, 5, 1))
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])  # sample 1 is left padded (GPT-2 style)
    tokens = ["<pad>", "<pad>", "a", "b", "c"]
    maps = layer_maps(attentions, attention_mask=mask, tokens=tokens, sample=1)
    assert [m.name for m in maps] == ["layers.0", "layers.1"]
    for layer, m in enumerate(maps):
        assert torch.equal(m.weights, _expected(layer, 1, 3, [2, 3, 4], [2, 3, 4]))
        assert m.q_tokens == m.k_tokens == ["a", "b", "c"]
    full = layer_maps(attentions, attention_mask=mask, sample=0)  # nothing padded in sample 0
    assert torch.equal(full[1].weights, _expected(1, 0, 3, range(5), range(5))) and full[1].q_tokens is None
    # Labels may name every position or the real tokens only; negative samples count from the end.
    again = layer_maps(attentions, attention_mask=mask, tokens=["a", "b", "c"], sample=-1)
    assert again[0].k_tokens == ["a", "b", "c"] and torch.equal(again[0].weights, maps[0].weights)


def test_queries_of_a_cached_step_are_the_last_positions():
    """A decode step over a KV cache: 2 queries (the newest positions) over 6 keys, right padding in sample 0."""
    step = _coded(2, 3, 2, 6)
    mask = torch.tensor([[1, 1, 1, 1, 0, 1], [1, 1, 1, 1, 1, 1]])
    (m,) = layer_maps((step,), attention_mask=mask, tokens=list("uvwxyz"), sample=0)
    assert torch.equal(m.weights, _expected(0, 0, 3, [1], [0, 1, 2, 3, 5]))  # query 0 is position 4: padding
    assert m.q_tokens == ["z"] and m.k_tokens == ["u", "v", "w", "x", "z"]
    with pytest.raises(ShapeError, match=r"'layers.0' has 7 key positions but its input has 6"):
        layer_maps((_coded(2, 3, 2, 7),), attention_mask=mask)


def test_encoder_decoder_stacks_follow_their_own_inputs():
    out = {"encoder_attentions": (_coded(2, 3, 4, 4),), "decoder_attentions": (_coded(2, 2, 3, 3),),
           "cross_attentions": (_coded(2, 2, 3, 4),), "last_hidden_state": torch.zeros(2, 3, 8)}
    enc_mask, dec_mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]]), torch.tensor([[1, 1, 1], [1, 0, 0]])
    maps = {m.name: m for m in layer_maps(out, attention_mask=enc_mask, decoder_attention_mask=dec_mask,
                                          tokens=["e0", "e1"], decoder_tokens=["d0"], sample=1)}
    assert list(maps) == ["encoder.layers.0", "decoder.layers.0", "cross.layers.0"]
    assert torch.equal(maps["encoder.layers.0"].weights, _expected(0, 1, 3, [0, 1], [0, 1]))
    assert torch.equal(maps["decoder.layers.0"].weights, _expected(0, 1, 2, [0], [0]))
    cross = maps["cross.layers.0"]
    assert torch.equal(cross.weights, _expected(0, 1, 2, [0], [0, 1]))
    assert (cross.q_tokens, cross.k_tokens) == (["d0"], ["e0", "e1"])


def test_cross_attention_of_a_decoder_only_stack_keeps_its_memory_keys_whole():
    out = {"attentions": (_coded(1, 2, 3, 3),), "cross_attentions": (_coded(1, 2, 3, 5),)}
    maps = layer_maps(out, attention_mask=torch.tensor([[1, 1, 0]]), tokens=["a", "b", "<pad>"])
    assert [m.name for m in maps] == ["layers.0", "cross.layers.0"]
    assert torch.equal(maps[1].weights, _expected(0, 0, 2, [0, 1], range(5)))
    assert maps[1].q_tokens == ["a", "b"] and maps[1].k_tokens is None


def test_a_recording_goes_where_recordings_go():
    w = torch.softmax(torch.randn(2, 3, 4, 4, generator=torch.Generator().manual_seed(0)), -1)
    rec = recording_from_outputs((w, w.flip(-1)), attention_mask=torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]),
                                 tokens=["x", "y", "z"], source="model")
    assert isinstance(rec, AttentionRecorder) and rec.names() == ["layers.0", "layers.1"]
    assert all(m.weights.shape == (1, 3, 3, 3) and m.source == "model" for m in rec.maps)
    assert rec.tokens == {"layers.0": (["x", "y", "z"],) * 2, "layers.1": (["x", "y", "z"],) * 2}
    torch.testing.assert_close(rec.as_dict()["layers.1"], w.flip(-1)[0, :, :3, :3], rtol=0, atol=0)
    names = [r.name for r in summary(rec)]
    assert names == ["layers.0"] * 3 + ["layers.1"] * 3
    # summary takes the tuple itself too (sample 0, nothing cropped): the same as the dict of its layers
    assert list(summary((w, w.flip(-1)), sample=1)) == list(summary({"layers.0": w[1], "layers.1": w.flip(-1)[1]}))


def test_what_counts_as_a_model_output():
    w = torch.rand(1, 2, 3, 3)
    assert is_attention_output((w,)) and is_attention_output({"attentions": (w,)})
    assert is_attention_output({"attentions": ()})  # an sdpa model's empty tuple: an output, with no weights
    assert not is_attention_output({"layer": w}) and not is_attention_output([torch.eye(3)])
    assert not is_attention_output(w)
    maps, labels = maps_and_tokens({"a": w[0]}, "who")
    assert list(maps) == ["a"] and labels == {}


def test_bad_inputs_are_named():
    w = torch.rand(2, 3, 4, 4)
    with pytest.raises(ArgumentError, match=r"no attention weights: call the model with output_attentions=True"):
        layer_maps({"attentions": (), "last_hidden_state": torch.zeros(1)})
    with pytest.raises(ShapeError, match=r"attentions\[1\] must have shape \(B=2, H, Lq, Lk\) like the layers"):
        layer_maps({"attentions": (w, torch.rand(3, 3, 4, 4))})
    with pytest.raises(DTypeError, match=r"attentions\[0\] must be a floating-point tensor; got torch.int64"):
        layer_maps({"attentions": (torch.ones(1, 1, 2, 2, dtype=torch.long),)})
    with pytest.raises(ArgumentError, match=r"sample must be an int in \[-2, 2\)"):
        layer_maps((w,), sample=2)
    with pytest.raises(ShapeError, match=r"attention_mask must have shape \(B=2, L\)"):
        layer_maps((w,), attention_mask=torch.ones(3, 4))
    with pytest.raises(ShapeError, match=r"must number 4 \(every position\) or 3 \(the real ones\); got 2"):
        layer_maps((w,), attention_mask=torch.tensor([[1, 1, 1, 0]] * 2), tokens=["a", "b"])
    with pytest.raises(ArgumentError, match="non-empty mapping name -> tensor, an AttentionRecorder, or a "):
        maps_and_tokens(42, "head_grid")
