"""TransformerLM's recent-model options (RMSNorm, SwiGLU, half-split and partial RoPE, gate, QK-norm) and save/load.

The oracle for the block is transformers' Llama: with ``norm="rms", activation="swiglu",
norm_first=True, positional="rotary", rotary={"pairing": "half"}`` the model is Llama's, and a
tiny random Llama's weights copied in (the embedding divided by sqrt(dim), which TokenEmbedding
multiplies back) give its logits to 1e-5.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch
import transformers as hf

from attnkit import masks
from attnkit.errors import ArgumentError, DTypeError, ShapeError, UnsupportedFeature
from attnkit.models import TransformerLM
from attnkit.nn import LocalAttention, PagedKVCache, YarnScaling
from attnkit.nn.kv_policies import HeavyHitterCache, QuestCache, SinkWindowCache, SnapKVCache

V, DIM, H, FF = 23, 12, 3, 20
LLAMA = dict(norm="rms", activation="swiglu", norm_first=True, positional="rotary", rotary={"pairing": "half"})


def _tokens(n=9, seed=0):
    return torch.randint(0, V, (2, n), generator=torch.Generator().manual_seed(seed))


def _from_llama(llama) -> TransformerLM:
    lm = TransformerLM(V, dim=DIM, num_heads=H, num_layers=2, ff_dim=FF, dropout=0.0, max_len=None, **LLAMA).eval()
    m = llama.model
    with torch.no_grad():
        lm.embed.embed.weight.copy_(m.embed_tokens.weight / math.sqrt(DIM))
        for ours, theirs in zip(lm.body.layers, m.layers, strict=True):
            a = theirs.self_attn
            ours.self_attn.in_proj_weight.copy_(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]))
            ours.self_attn.in_proj_bias.zero_()
            ours.self_attn.out_proj.weight.copy_(a.o_proj.weight)
            ours.self_attn.out_proj.bias.zero_()
            ours.norm1.weight.copy_(theirs.input_layernorm.weight)
            ours.norm3.weight.copy_(theirs.post_attention_layernorm.weight)
            ours.linear1.weight.copy_(torch.cat([theirs.mlp.gate_proj.weight, theirs.mlp.up_proj.weight]))
            ours.linear2.weight.copy_(theirs.mlp.down_proj.weight)
        lm.body.norm.weight.copy_(m.norm.weight)
        lm.head.weight.copy_(llama.lm_head.weight)
    return lm


def test_the_llama_block_equals_transformers_llama():
    config = hf.LlamaConfig(vocab_size=V, hidden_size=DIM, num_attention_heads=H, num_key_value_heads=H,
                            intermediate_size=FF, num_hidden_layers=2, rms_norm_eps=1e-5, tie_word_embeddings=False,
                            rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    torch.manual_seed(0)
    llama = hf.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for p in llama.parameters():
            p.normal_(0, 0.3)
    lm = _from_llama(llama)
    tokens = _tokens()
    with torch.no_grad():
        torch.testing.assert_close(lm(tokens), llama(tokens).logits, rtol=0, atol=1e-5)
    gen = llama.generate(tokens, max_new_tokens=5, do_sample=False, attention_mask=torch.ones_like(tokens))
    assert torch.equal(lm.generate(tokens, 5), gen)


def test_the_blocks_parts_are_rmsnorm_and_swiglu():
    lm = TransformerLM(V, dim=DIM, num_heads=H, num_layers=1, dropout=0.0, **LLAMA).double()
    layer = lm.body.layers[0]
    assert layer.ff_dim == math.ceil(8 * DIM / 3) and layer.linear1.bias is None
    x = torch.randn(2, 5, DIM, dtype=torch.float64)
    w, v = layer.linear1.weight[:layer.ff_dim], layer.linear1.weight[layer.ff_dim:]
    want = ((x @ w.T) * torch.sigmoid(x @ w.T) * (x @ v.T)) @ layer.linear2.weight.T  # Swish(xW) * xV, then W_2
    torch.testing.assert_close(layer._ff(x), want, rtol=0, atol=1e-12)
    rms = x / torch.sqrt((x ** 2).mean(-1, keepdim=True) + 1e-5) * layer.norm1.weight
    torch.testing.assert_close(layer.norm1(x), rms, rtol=0, atol=1e-12)


def test_gate_qk_norm_and_scaled_partial_rope_decode_as_the_full_pass():
    rotary = {"pairing": "half", "fraction": 0.5, "scaling": YarnScaling(4.0, 8)}
    lm = TransformerLM(V, dim=DIM, num_heads=H, dropout=0.0, norm="rms", activation="swiglu", norm_first=True,
                       positional="rotary", rotary=rotary, gate=True, qk_norm=True).eval()
    attn = lm.body.layers[0].self_attn
    assert attn.gate is not None and attn.qk_norm is not None and attn.rotary.rotated == 2
    tokens = _tokens(6)
    a, la = lm.generate(tokens, 7, return_logits=True)
    b, lb = lm.generate(tokens, 7, use_cache=False, return_logits=True)
    assert torch.equal(a, b)
    torch.testing.assert_close(la, lb, rtol=0, atol=1e-5)


def test_save_and_load_round_trip(tmp_path):
    torch.manual_seed(0)
    lm = TransformerLM(V, dim=DIM, num_heads=H, dropout=0.0, positional="rotary", gate=True, norm="rms",
                       rotary={"pairing": "half", "scaling": YarnScaling(2.0, 4)},
                       attention_mask=masks.sliding_window(3, 0)).eval()
    path = tmp_path / "lm.pt"
    lm.save(path)
    again = TransformerLM.load(path)
    assert again.config["rotary"]["scaling"] == {"type": "yarn", **YarnScaling(2.0, 4).as_dict()}
    assert again.body.layers[0].self_attn.rotary.scaling == YarnScaling(2.0, 4)
    tokens = _tokens()
    assert torch.equal(again(tokens), lm(tokens)) and not again.training
    other = TransformerLM(V, dim=DIM, num_heads=H)  # the weights came with it, not from a seed
    assert not torch.equal(other(tokens), lm(tokens))


def test_what_cannot_be_saved_or_loaded(tmp_path):
    lm = TransformerLM(V, dim=DIM, num_heads=H, attention=functools.partial(LocalAttention, size=2))
    with pytest.raises(ArgumentError, match="attention is a partial, which cannot be saved"):
        lm.save(tmp_path / "x.pt")
    torch.save({"format": "Transformer", "config": "{}", "state_dict": {}}, tmp_path / "y.pt")
    with pytest.raises(ArgumentError, match="is not a saved TransformerLM; got 'Transformer'"):
        TransformerLM.load(tmp_path / "y.pt")


def test_option_errors():
    with pytest.raises(ArgumentError, match="rotary options need positional='rotary'"):
        TransformerLM(V, dim=DIM, num_heads=H, rotary={"pairing": "half"})
    with pytest.raises(ArgumentError, match="norm must be one of"):
        TransformerLM(V, dim=DIM, num_heads=H, norm="batch")
    with pytest.raises(ArgumentError, match="gate apply to attention='softmax' only"):
        TransformerLM(V, dim=DIM, num_heads=H, attention="linear-attention", gate=True)
    with pytest.raises(ArgumentError, match="pairing must be one of"):
        TransformerLM(V, dim=DIM, num_heads=H, positional="rotary", rotary={"pairing": "odd"})


def test_generation_runs_through_step_so_a_compiled_step_generates(monkeypatch):
    from attnkit.models import _rnn

    torch.manual_seed(0)
    lm = TransformerLM(V, dim=DIM, num_heads=H, num_layers=2, ff_dim=FF, dropout=0.0).eval()
    prefix = _tokens(5)
    expected = torch.cat([prefix, torch.zeros(2, 0, dtype=prefix.dtype)], 1)
    for _ in range(6):  # the oracle: one full forward pass per token, greedy
        expected = torch.cat([expected, lm(expected)[:, -1].argmax(-1, keepdim=True)], 1)
    real, calls, checked = lm.step, [], []
    lm.step = lambda *args, **kw: (calls.append(args[0].shape[1]), real(*args, **kw))[1]  # as compile would
    real_check = _rnn.check_tokens
    monkeypatch.setattr(_rnn, "check_tokens", lambda *a, **kw: (checked.append(a[1]), real_check(*a, **kw))[1])
    for use_cache, fed in ((True, [5, 1, 1, 1, 1, 1]), (False, [5, 6, 7, 8, 9, 10])):
        calls.clear()
        checked.clear()
        assert torch.equal(lm.generate(prefix, 6, use_cache=use_cache), expected)
        assert calls == fed  # the prefix, then one new token a step (the cache) or the whole sequence
        assert checked == ["prefix"]  # the steps feed tokens the loop chose itself: no check per token


def test_every_cached_generation_step_reuses_one_causal_mask(monkeypatch):
    from attnkit.models import self_attention
    from attnkit.nn import multihead
    from attnkit.nn.kv_cache import CAUSAL

    torch.manual_seed(0)
    lm = TransformerLM(V, dim=DIM, num_heads=H, num_layers=2, ff_dim=FF, dropout=0.0, positional="rotary").eval()
    seen = []
    real = multihead.attention
    spy = lambda *args, **kw: (seen.append(kw["mask"]), real(*args, **kw))[1]
    for module in (multihead, self_attention):  # the prefill's call and the decoding steps'
        monkeypatch.setattr(module, "attention", spy)
    lm.generate(_tokens(5), 4)
    assert len(seen) == 2 * 4  # two layers, the prefill and three steps
    assert all(mask is CAUSAL for mask in seen)
    assert CAUSAL.kind == "causal" and CAUSAL.align == "bottom_right"



def _fp8_agreement(seed: int, prompts: int = 4, new: int = 64):
    """A Llama-style model (random weights, fixed seed) generating ``new`` greedy tokens after 8-token prompts with
    a float32 KV cache and with a float8 e4m3 per-(token, head) cache.

    Returns the float32 run's tokens and logits ``(prompts, new)``, ``(prompts, new, vocab)``, the fp8 run's
    tokens (free running), and the fp8 cache's choices given the float32 run's tokens so far (teacher forced)."""
    torch.manual_seed(seed)
    lm = TransformerLM(256, dim=128, num_heads=2, num_layers=2, dropout=0.0, max_len=None, **LLAMA).eval()
    prefix = torch.randint(0, 256, (prompts, 8))
    with torch.no_grad():
        full, logits = lm.generate(prefix, new, return_logits=True)
        free = lm.generate(prefix, new, kv_format="float8_e4m3")
        caches = lm.body.new_caches(prompts, 8 + new, kv_format="float8_e4m3")
        forced = [lm.step(prefix, caches)] + [lm.step(full[:, i:i + 1], caches) for i in range(8, 7 + new)]
    return full[:, 8:], logits, free[:, 8:], torch.stack(forced, 1).argmax(-1)


def test_greedy_generation_with_an_fp8_cache_picks_the_float32_caches_tokens():
    """Measured (seed 0, 4 prompts x 64 tokens): 99.2 % of the fp8 cache's choices equal the float32 cache's
    given the same tokens so far (teacher forced; seeds 1-3: 99.6, 99.6, 99.2 %). Free running, the fp8 run's
    tokens equal the float32 run's on 71.5 % (seeds 1-3: 89, 98, 74 %): a random-weight model's logits are
    nearly tied (median top-2 gap about 0.14), and one flipped near-tie sends the rest of a continuation
    elsewhere. So the test asserts the per-step agreement, that every free-running continuation matches up to
    its first flipped choice, and that the flips were near-ties of the float32 logits."""
    chosen, logits, free, forced = _fp8_agreement(0)
    assert bool((logits.argmax(-1) == chosen).all())  # the float32 run is greedy
    same = forced == chosen
    assert same.float().mean().item() >= 0.95, same.float().mean().item()
    for row in range(chosen.shape[0]):
        flips = torch.nonzero(~same[row]).flatten()
        first = int(flips[0]) if len(flips) else chosen.shape[1]
        assert free[row, :first].equal(chosen[row, :first]) and (first == chosen.shape[1]) == free[row].equal(
            chosen[row])
        gap = logits[row, flips, chosen[row, flips]] - logits[row, flips, forced[row, flips]]
        assert bool((gap < 0.05 * logits[row].std()).all()), gap  # near-ties only


def _counting(generator: torch.Generator, batch: int, n: int, vocab: int) -> torch.Tensor:
    """Arithmetic progressions modulo ``vocab``: a random start and a random step in 1..3 per row ``(batch, n)``."""
    start = torch.randint(0, vocab, (batch, 1), generator=generator)
    step = torch.randint(1, 4, (batch, 1), generator=generator)
    return (start + step * torch.arange(n)) % vocab


def test_a_trained_models_free_running_fp8_generation_keeps_95_percent_of_the_float32_tokens():
    """The criterion as stated, free running: a small Llama-style model, briefly trained (fixed seeds, 40 Adam
    steps on counting sequences modulo 32) so its next-token logits are decisive rather than the near-ties of
    random weights, generates 64 greedy tokens after 8-token prompts with a float32 cache and with a float8 e4m3
    per-(token, head) cache; the two runs pick the same token on at least 95 % of the 4 x 64 positions.
    Measured: 100 %, smallest top-2 logit gap of the float32 run about 0.04; about 7 s on a loaded CPU."""
    vocab = 32
    torch.manual_seed(0)
    lm = TransformerLM(vocab, dim=32, num_heads=2, num_layers=2, dropout=0.0, max_len=None, **LLAMA)
    opt = torch.optim.Adam(lm.parameters(), lr=1e-2)
    data = torch.Generator().manual_seed(0)
    for _ in range(40):
        x = _counting(data, 16, 16, vocab)
        loss = torch.nn.functional.cross_entropy(lm(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.5, loss.item()  # it learnt the task: its choices are no longer near-ties
    lm.eval()
    prefix = _counting(data, 4, 8, vocab)
    with torch.no_grad():
        full, logits = lm.generate(prefix, 64, return_logits=True)
        free = lm.generate(prefix, 64, kv_format="float8_e4m3")
    assert bool((logits.argmax(-1) == full[:, 8:]).all())
    agreement = (free[:, 8:] == full[:, 8:]).float().mean().item()
    assert agreement >= 0.95, agreement


def _tree(nodes: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return [-1] + [int(torch.randint(-1, i, (1,), generator=g)) for i in range(1, nodes)]


def _path(parents: list[int], node: int) -> list[int]:
    out = [node]
    while parents[out[-1]] >= 0:
        out.append(parents[out[-1]])
    return out[::-1]


def check_tree_verification(lm: TransformerLM, nodes: int, seed: int = 0) -> None:
    """``lm.verify`` of a random draft tree after an 8-token prompt: every node's logits equal the whole-sequence
    forward (no cache) of the prompt and the node's path; after ``commit`` of the path to the last node, the caches
    equal those of decoding the path plainly (their keys, values and states, and the next step's logits)."""
    lm = lm.double().eval()
    g = torch.Generator().manual_seed(seed)
    prompt, draft = torch.randint(0, lm.vocab_size, (2, 8), generator=g), torch.randint(0, lm.vocab_size, (2, nodes),
                                                                                        generator=g)
    parents = _tree(nodes, seed + 1)
    with torch.no_grad():
        caches = lm.body.new_caches(2, 9 + nodes)
        lm(prompt, caches=caches)
        logits = lm.verify(draft, masks.tree(parents), caches)
        for node in range(nodes):
            whole = lm(torch.cat([prompt, draft[:, _path(parents, node)]], 1))[:, -1]
            torch.testing.assert_close(logits[:, node], whole, rtol=0, atol=1e-10)
        path = _path(parents, nodes - 1)
        lm.commit(caches, masks.tree(parents), path)
        plain = lm.body.new_caches(2, 9 + nodes)
        lm(torch.cat([prompt, draft[:, path]], 1), caches=plain)
        for ours, theirs in zip(caches, plain, strict=True):
            assert len(ours) == len(theirs) == 8 + len(path)
            if hasattr(ours, "keys"):
                torch.testing.assert_close(ours.keys, theirs.keys, rtol=0, atol=1e-12)
                torch.testing.assert_close(ours.values, theirs.values, rtol=0, atol=1e-12)
            else:
                torch.testing.assert_close(ours.state, theirs.state, rtol=0, atol=1e-12)
        nxt = torch.randint(0, lm.vocab_size, (2, 1), generator=g)
        torch.testing.assert_close(lm(nxt, caches=caches), lm(nxt, caches=plain), rtol=0, atol=1e-12)


@pytest.mark.parametrize("nodes", [1, 6, 20])
def test_a_llama_model_verifies_a_draft_tree_in_one_forward_and_commit_leaves_a_plain_decodes_caches(nodes):
    torch.manual_seed(0)
    check_tree_verification(TransformerLM(V, dim=DIM, num_heads=H, num_layers=2, ff_dim=FF, dropout=0.0,
                                          max_len=None, qk_norm=True, **LLAMA), nodes, nodes)


def test_verify_refuses_added_positions_and_a_commit_off_the_tree():
    torch.manual_seed(0)
    lm = TransformerLM(V, dim=DIM, num_heads=H, dropout=0.0, positional="sinusoidal").eval()
    with pytest.raises(UnsupportedFeature, match=r"positional='rotary' or None; got .*'sinusoidal'"):
        lm.verify(torch.zeros(1, 2, dtype=torch.long), [-1, 0], lm.body.new_caches(1, 4))
    lm = TransformerLM(V, dim=DIM, num_heads=H, dropout=0.0, **LLAMA).eval()
    caches = lm.body.new_caches(1, 6)
    with torch.no_grad():
        lm.verify(torch.zeros(1, 3, dtype=torch.long), [-1, 0, 0], caches)
    with pytest.raises(ArgumentError, match="root-to-node path"):
        lm.commit(caches, masks.tree([-1, 0, 0]), [1, 2])
    with pytest.raises(ArgumentError, match="precede its node"):
        lm.verify(torch.zeros(1, 2, dtype=torch.long), [0, -1], lm.body.new_caches(1, 4))


def _policy_lm(layers: int = 2, seed: int = 0) -> TransformerLM:
    torch.manual_seed(seed)
    return TransformerLM(V, dim=16, num_heads=4, num_kv_heads=2, num_layers=layers, dropout=0.0, max_len=None,
                         **LLAMA).double().eval()


@pytest.mark.parametrize("policy", [SinkWindowCache(20, 4), HeavyHitterCache(20, 4), SnapKVCache(20, window=4),
                                    QuestCache(20, 4)], ids=lambda p: type(p).__name__)
def test_generate_through_a_kv_policy_whose_budget_covers_the_sequence_is_plain_generation(policy):
    lm, prefix = _policy_lm(), _tokens(8, seed=3)
    tokens, logits = lm.generate(prefix, 12, return_logits=True)
    got, got_logits = lm.generate(prefix, 12, return_logits=True, kv_policy=policy)
    assert torch.equal(got, tokens)
    torch.testing.assert_close(got_logits, logits, rtol=0, atol=1e-10)
    assert policy.seen == 0  # the argument is a template: generate decoded through fresh copies


def test_generate_through_a_small_streaming_llm_cache_is_a_plain_forward_over_the_sinks_and_the_window():
    """One layer: a token's logits with SinkWindowCache(6, 2) are those of the model run on the 2 first and the 4
    last tokens alone (positions within the cache, StreamingLLM Sec. 3.2); the cache stays at its budget."""
    lm, prefix = _policy_lm(layers=1), _tokens(3, seed=4)
    tokens, logits = lm.generate(prefix, 13, return_logits=True, kv_policy=SinkWindowCache(6, 2))
    assert tokens.shape == (2, 16)
    for i in range(13):
        n = 3 + i  # tokens before the choice
        kept = list(range(n)) if n <= 6 else [0, 1, *range(n - 4, n)]
        torch.testing.assert_close(logits[:, i], lm(tokens[:, kept])[:, -1], rtol=0, atol=1e-10)
    caches = [SinkWindowCache(6, 2)]
    with torch.no_grad():
        lm.step(tokens[:, :3], caches)
        for t in range(3, 16):
            lm.step(tokens[:, t:t + 1], caches)
            assert len(caches[0]) == min(t + 1, 6) and caches[0].seen == t + 1
    assert caches[0].evicted == 10


def test_generate_through_small_h2o_and_snapkv_budgets_keeps_each_layers_cache_at_its_budget():
    lm, prefix = _policy_lm(), _tokens(12, seed=5)
    heavy = [HeavyHitterCache(8, 3) for _ in range(2)]
    snap = [SnapKVCache(8, window=3) for _ in range(2)]
    with torch.no_grad():
        for caches in (heavy, snap):
            lm.step(prefix, caches)
            for t in range(6):
                lm.step(torch.full((2, 1), t), caches)
    assert all(len(c) == 8 and c.seen == 18 for c in heavy)
    assert all(bool((c.positions[..., -3:] == torch.arange(15, 18)).all()) for c in heavy)  # the recent kept
    assert all(len(c) == 8 + 6 and c.positions.shape[-1] == 14 for c in snap)  # the prompt compressed, then grown
    tokens = lm.generate(prefix, 6, kv_policy=HeavyHitterCache(8, 3))
    assert tokens.shape == (2, 18) and torch.equal(tokens[:, :12], prefix)


def test_generate_with_a_kv_policy_refuses_what_it_cannot_decode():
    lm, prefix = _policy_lm(), _tokens(4)
    with pytest.raises(DTypeError, match=r"kv_policy must be a KV policy.*got int"):
        lm.generate(prefix, 2, kv_policy=8)
    with pytest.raises(ArgumentError, match="kv_policy is the KV cache: it takes neither use_cache=False nor"):
        lm.generate(prefix, 2, kv_policy=SinkWindowCache(8), kv_format="int8")
    hybrid = TransformerLM(V, dim=16, num_heads=2, attention="gated-deltanet", softmax_every=2)
    with pytest.raises(UnsupportedFeature, match="kv_policy selects the keys of softmax attention"):
        hybrid.generate(prefix, 2, kv_policy=SinkWindowCache(8))
    masked = TransformerLM(V, dim=16, num_heads=2, dropout=0.0, attention_mask=masks.sliding_window(3, 0)).eval()
    with pytest.raises(UnsupportedFeature, match=r"lacks \['no other mask'\]"):
        masked.generate(prefix, 2, kv_policy=SinkWindowCache(8))


def _pools(lm: TransformerLM, pages: int = 24) -> list[PagedKVCache]:
    attn = lm.body.layers[0].self_attn
    return [PagedKVCache(pages, 4, attn.num_kv_heads, attn.head_dim, dtype=torch.float64) for _ in lm.body.layers]


def test_a_model_decodes_and_verifies_a_draft_tree_over_paged_caches_forked_from_one_prompt():
    """Two sequences forked from one 9-token prompt (pages shared, copied on write) verify a tree per row in one
    forward: each node's logits equal the whole-sequence forward of the prompt and its path; after a commit of a
    path per row, the next step's logits equal those of contiguous caches that decoded the paths plainly."""
    lm, g = _policy_lm(), torch.Generator().manual_seed(6)
    prompt = torch.randint(0, V, (1, 9), generator=g)
    parents = torch.tensor([[-1, 0, 0, 1, 3, 2], [-1, -1, 1, 0, 2, 4]])
    draft = torch.randint(0, V, (2, 6), generator=g)
    pools = _pools(lm)
    with torch.no_grad():
        first = lm(prompt, caches=[p.batch([p.allocate()]) for p in pools])
        torch.testing.assert_close(first, lm(prompt), rtol=0, atol=1e-12)
        caches = [p.batch([0, p.fork(0)]) for p in pools]
        logits = lm.verify(draft, masks.tree(parents), caches)
        for row in range(2):
            for node in range(6):
                path = masks.tree(parents[row]).path(node)
                whole = lm(torch.cat([prompt[0], draft[row, path]])[None])[0, -1]
                torch.testing.assert_close(logits[row, node], whole, rtol=0, atol=1e-10)
        paths = [masks.tree(parents[0]).path(4), masks.tree(parents[1]).path(5)]  # 4 nodes each
        lm.commit(caches, masks.tree(parents), paths)
        assert [p.lengths([0, 1]).tolist() for p in pools] == [[13, 13]] * 2
        plain = lm.body.new_caches(2, 14)
        lm(torch.cat([prompt.expand(2, -1), torch.stack([draft[r, paths[r]] for r in range(2)])], 1), caches=plain)
        nxt = torch.randint(0, V, (2, 1), generator=g)
        torch.testing.assert_close(lm(nxt, caches=caches), lm(nxt, caches=plain), rtol=0, atol=1e-10)
    table = pools[0].block_table([0, 1])  # the prompt's 2 whole pages stay shared; the third was copied on write
    assert table[0, :2].equal(table[1, :2]) and table[0, 2] != table[1, 2]


def test_generation_over_paged_caches_equals_contiguous_caches_and_ragged_rows_are_refused():
    lm, prefix = _policy_lm(), _tokens(7, seed=7)
    pools = _pools(lm)
    caches = [p.batch([p.allocate(), p.allocate()]) for p in pools]
    plain = lm.body.new_caches(2, 12)
    with torch.no_grad():
        torch.testing.assert_close(lm(prefix, caches=caches), lm(prefix, caches=plain), rtol=0, atol=1e-12)
        for t in range(4):
            nxt = torch.full((2, 1), t)
            torch.testing.assert_close(lm.step(nxt, caches), lm.step(nxt, plain), rtol=0, atol=1e-12)
        pools[0].append(0, torch.zeros(2, 1, 4, dtype=torch.float64), torch.zeros(2, 1, 4, dtype=torch.float64))
        with pytest.raises(ShapeError, match=r"equally many positions; sequences \[0, 1\] hold \[12, 11\]"):
            lm.step(nxt, caches)
        fresh = [p.batch([p.allocate(), p.allocate()]) for p in _pools(lm)]
        with pytest.raises(UnsupportedFeature, match=r"a paged cache decodes causal attention.*no key_keep_mask"):
            lm(prefix, key_keep_mask=torch.ones(2, 7, dtype=torch.bool), caches=fresh)


def test_a_compiled_step_decodes_every_token_in_one_graph_compiled_twice():
    """``lm.step = torch.compile(lm.step, dynamic=True)`` (what the whole-models benchmark compiles): one graph for
    the prefill and one for every decoding step, whatever the cache's length, with no graph break and no
    recompilation as the cache grows or in a later, longer generation; the tokens are eager generation's.
    Counted by a backend that counts what dynamo hands it (no timing)."""
    from torch._dynamo.testing import CompileCounter
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    lm = TransformerLM(V, dim=DIM, num_heads=H, num_layers=2, ff_dim=FF, dropout=0.0, norm_first=True,
                       positional="learned", activation="gelu", max_len=32).eval()
    expected = [lm.generate(_tokens(5), 6), lm.generate(_tokens(7, seed=1), 9)]
    torch._dynamo.reset()
    counters.clear()
    backend = CompileCounter()
    lm.step = torch.compile(lm.step, backend=backend, dynamic=True)
    try:
        assert torch.equal(lm.generate(_tokens(5), 6), expected[0])
        assert backend.frame_count == 2  # the prefill (an empty cache) and the decoding step
        assert torch.equal(lm.generate(_tokens(7, seed=1), 9), expected[1])
        assert backend.frame_count == 2, "a decoding step recompiled"
        assert not counters["graph_break"], dict(counters["graph_break"])
        assert not counters["recompiles"], dict(counters["recompiles"])
    finally:
        torch._dynamo.reset()
