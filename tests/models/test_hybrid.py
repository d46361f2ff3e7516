"""Hybrid stacks: linear-recurrent layers with a softmax layer every few layers, in TransformerLM."""

import pytest
import torch

from attnkit import masks
from attnkit.errors import ArgumentError
from attnkit.models import TransformerLM
from attnkit.models.hybrid import RECURRENT, hybrid_attention
from attnkit.nn import PagedKVCache
from attnkit.nn._recurrent import RecurrentLayer

from .test_language_model import check_tree_verification

V, DIM, H = 17, 12, 3


def _lm(name="gated-deltanet", every=4, layers=8, **kw):
    torch.manual_seed(0)
    return TransformerLM(V, dim=DIM, num_heads=H, num_layers=layers, dropout=0.0, attention=name, softmax_every=every,
                         **kw).eval()


def test_every_fourth_layer_is_softmax():
    kinds = [type(layer.self_attn).__name__ for layer in _lm().body.layers]
    assert kinds == ["GatedDeltaNet"] * 3 + ["SoftmaxSelfAttention"] + ["GatedDeltaNet"] * 3 + ["SoftmaxSelfAttention"]
    assert {type(layer.self_attn).__name__ for layer in _lm(every=None, layers=3).body.layers} == {"GatedDeltaNet"}


@pytest.mark.parametrize("name", RECURRENT)
def test_hybrid_models_are_causal_and_generate(name):
    lm = _lm(name, every=2, layers=2)
    tokens = torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(1))
    logits = lm(tokens)
    changed = tokens.clone()
    changed[:, 6:] = (changed[:, 6:] + 1) % V
    torch.testing.assert_close(lm(changed)[:, :6], logits[:, :6], rtol=0, atol=1e-6)
    out, scores = lm.generate(tokens[:, :5], 3, return_logits=True)
    torch.testing.assert_close(scores[:, 0], logits[:, 4], rtol=0, atol=1e-5)
    assert out.shape == (2, 8) and torch.equal(out[:, :5], tokens[:, :5])


def test_left_padding_leaves_the_real_tokens_alone():
    lm = _lm(every=2, layers=4, positional=None)
    tokens = torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(2))
    keep = torch.ones(2, 9, dtype=torch.bool)
    keep[1, :3] = False
    torch.testing.assert_close(lm(tokens, key_keep_mask=keep)[1, 3:], lm(tokens[1:, 3:])[0], rtol=0, atol=1e-5)


def test_bad_options_are_named():
    with pytest.raises(ArgumentError, match="linear-recurrent layers are causal; got causal=False"):
        TransformerLM(V, dim=DIM, num_heads=H, attention="retnet", causal=False)
    with pytest.raises(ArgumentError, match="linear must be one of 'retnet'"):
        TransformerLM(V, dim=DIM, num_heads=H, softmax_every=2)
    with pytest.raises(ArgumentError, match="softmax_every must be an int >= 1; got 0"):
        hybrid_attention("gla", 0)
    with pytest.raises(ArgumentError, match="gate, qk_norm apply to the softmax layers"):
        TransformerLM(V, dim=DIM, num_heads=H, attention="gla", gate=True, qk_norm=True)
    with pytest.raises(ArgumentError, match="unknown softmax option"):
        hybrid_attention("gla", 2, sinks=True)


def test_the_softmax_layers_take_the_gate_qk_norm_and_rotary_positions():
    """Qwen3-Next's layout: gated, QK-normed, partly rotated full attention after linear layers."""
    lm = _lm(every=2, layers=4, positional="rotary", gate=True, qk_norm=True, rotary={"pairing": "half",
                                                                                       "fraction": 0.5})
    softmax = [layer.self_attn for layer in lm.body.layers if type(layer.self_attn).__name__ == "SoftmaxSelfAttention"]
    assert len(softmax) == 2
    assert all(a.gate is not None and a.qk_norm is not None and a.rotary is not None for a in softmax)
    assert softmax[0].rotary.rotated == 2  # half of the 4 features of a head
    tokens = torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(3))
    out, scores = lm.generate(tokens[:, :5], 3, return_logits=True)
    torch.testing.assert_close(scores[:, 0], lm(tokens[:, :5])[:, 4], rtol=0, atol=1e-5)
    assert torch.equal(out[:, 5:], scores.argmax(-1))  # greedy: each new token is its row's best


@pytest.mark.parametrize("name", ["deltanet", "gated-deltanet", "kimi-delta-attention"])
def test_a_hybrid_stack_verifies_a_draft_tree_in_one_forward_and_commit_leaves_a_plain_decodes_caches(name):
    check_tree_verification(_lm(name, every=2, layers=4, positional="rotary", norm_first=True), 12, 3)


def test_a_hybrid_stack_generates_through_its_caches_as_it_does_recomputing():
    lm = _lm("gated-deltanet", every=2, layers=4, positional="rotary").double()
    prefix = torch.randint(0, V, (2, 5), generator=torch.Generator().manual_seed(0))
    assert lm.body.cacheable
    cached, logits = lm.generate(prefix, 6, return_logits=True)
    again, relogits = lm.generate(prefix, 6, use_cache=False, return_logits=True)
    assert torch.equal(cached, again)
    torch.testing.assert_close(logits, relogits, rtol=0, atol=1e-10)


def test_a_hybrid_stack_verifies_and_commits_a_draft_tree_over_paged_softmax_caches_as_over_contiguous_ones():
    lm = _lm("gated-deltanet", every=2, layers=4, positional="rotary", norm_first=True).double()
    g = torch.Generator().manual_seed(2)
    prompt, draft = torch.randint(0, V, (2, 7), generator=g), torch.randint(0, V, (2, 9), generator=g)
    tree = masks.tree([-1, 0, 0, 1, 2, 2, 5, -1, 7])
    contiguous = lm.body.new_caches(2, 17)

    def pool():
        p = PagedKVCache(12, 4, H, DIM // H, dtype=torch.float64)
        return p.batch([p.allocate(), p.allocate()])

    paged = [layer.self_attn.new_cache() if isinstance(layer.self_attn, RecurrentLayer) else pool()
             for layer in lm.body.layers]
    assert sum(hasattr(c, "cache") for c in paged) == 2
    with torch.no_grad():
        for caches in (contiguous, paged):
            lm(prompt, caches=caches)
        torch.testing.assert_close(lm.verify(draft, tree, paged), lm.verify(draft, tree, contiguous), rtol=0,
                                   atol=1e-12)
        for caches in (contiguous, paged):
            lm.commit(caches, tree, [0, 2, 5, 6])
        nxt = torch.randint(0, V, (2, 1), generator=g)
        torch.testing.assert_close(lm(nxt, caches=paged), lm(nxt, caches=contiguous), rtol=0, atol=1e-12)
