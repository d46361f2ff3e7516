"""attnkit's KV policies against NVIDIA's kvpress "presses" on a tiny random Llama, where the definitions match.

Oracle: ``kvpress`` (tested at 0.5.5) compressing a transformers ``LlamaForCausalLM``'s prefill cache (eager
attention, 2 layers, grouped key/value heads, rotary); attnkit runs the same weights through
``TransformerLM.from_transformers`` with one policy per layer. kvpress needs transformers<5.3, which the dev
environment does not have, so this file skips there; run it in a venv of its own (docs/guide/models.md), or as a
script for the numbers: ``python tests/nn/test_kv_policies_kvpress.py``.

What each press keeps, and where it meets attnkit (the kept positions are read back from kvpress's compressed cache
by matching its values, which kvpress gathers unchanged, against the dense prefill's):

- ``SnapKVPress(ratio, window_size, kernel_size)``: the last ``window`` queries' softmax weights over the earlier
  keys, *averaged* over the window, average-pooled (``kernel``, zero padding counted), then *averaged* over each
  key/value group's heads; the window itself always kept; ``int(L (1 - ratio))`` keys per key/value head.
  :func:`attnkit.nn.kv_policies.snapkv` *sums* over the window and the group: positive multiples, the same
  order, so with ``budget = int(L (1 - ratio))`` the same keys (through the model's :class:`SnapKVCache`, and
  :func:`snapkv` on each layer's queries, keys and values captured from the transformers model), and the next
  token's logits agree.
- ``StreamingLLMPress(ratio, n_sink)``: the first ``n_sink`` keys and the last ``n_kept - n_sink``, the same set as
  :class:`SinkWindowCache`. kvpress leaves the kept keys at their original positions unless wrapped in
  ``KeyRerotationPress``, which rotates them to ``0 .. n_kept - 1`` (the paper's positions within the cache, as
  attnkit's); the next token then sits at ``n_kept`` in both. But kvpress prefills densely and cuts once, while
  attnkit streams the prompt as the paper does (each prompt token already sees only the sinks and its window), so
  the layers after the first see other inputs: the first layer's output for the next token agrees, the logits do
  not and are not compared.
- ``ObservedAttentionPress(ratio)`` ("related to H2O"): one cut after a dense prefill, by each key's attention
  summed over the queries *divided by the number of queries that could attend to it* (``L - j``), averaged over
  the group, with no recent window. H2O's Alg. 1 (:class:`HeavyHitterCache`) accumulates the *unnormalised* sum and
  evicts greedily after every token while keeping ``recent`` tokens. What matches: the accumulated attention itself
  (``HeavyHitterCache.score`` over the prompt with nothing evicted, summed over the group, equals kvpress's score
  times ``(L - j) * group``); the kept sets differ by definition (measured, not asserted).
- Quest: kvpress 0.5.5 has no query-aware page selection (its presses evict); nothing to compare.
"""

from __future__ import annotations

import importlib.metadata

import pytest
import torch

kvpress = pytest.importorskip("kvpress")
transformers = pytest.importorskip("transformers")

from attnkit.models import TransformerLM  # noqa: E402
from attnkit.nn.kv_policies import HeavyHitterCache, SinkWindowCache, SnapKVCache, snapkv  # noqa: E402

L, VOCAB, LAYERS, HEADS, KV_HEADS = 64, 97, 2, 4, 2
GROUP = HEADS // KV_HEADS


def _models(seed: int):
    """A tiny random Llama (eager attention, so kvpress sees the weights) and attnkit's copy of it."""
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                                   max_position_embeddings=256, initializer_range=0.2, attn_implementation="eager")
    hf = transformers.LlamaForCausalLM(cfg).eval()
    return hf, TransformerLM.from_transformers(hf).eval()


def _tokens(seed: int):
    """Distinct tokens: the first layer's values then tell every position apart."""
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(VOCAB, generator=g)[None, :L + 1]


def _n_kept(ratio: float) -> int:
    return int(L * (1 - ratio))


@torch.no_grad()
def _kvpress_run(hf, ids, press, *, position: int | None = L):
    """kvpress's compressed prefill cache: kept positions per layer ``(B, H_kv, n_kept)``, sorted, and the next
    token's logits (at ``position``; None: where transformers puts it, the cache's length)."""
    dense = transformers.DynamicCache()
    hf(ids[:, :L], past_key_values=dense)
    cache = transformers.DynamicCache()
    with press(hf):
        hf(ids[:, :L], past_key_values=cache)
    kept = []
    for i in range(LAYERS):
        full, got = dense.layers[i].values, cache.layers[i].values  # (B, H_kv, L, D), (B, H_kv, n, D)
        same = (got[:, :, :, None] == full[:, :, None]).all(-1)  # (B, H_kv, n, L)
        assert (same.sum(-1) == 1).all(), "a kept value matches no prompt position, or several"
        kept.append(same.float().argmax(-1).sort(-1).values)
    kw = {} if position is None else {"position_ids": torch.tensor([[position]])}
    logits = hf(ids[:, L:], past_key_values=cache, **kw).logits[:, -1]
    return kept, logits


@torch.no_grad()
def _attnkit_run(lm, ids, policy):
    caches = [policy.fresh() for _ in range(LAYERS)]
    lm.step(ids[:, :L], caches)
    return caches, lm.step(ids[:, L:], caches)


def _agreement(a, b) -> float:
    """Fraction of kept positions in common, over every layer and key/value head."""
    common = sum(len(set(x.tolist()) & set(y.tolist())) for p, q in zip(a, b, strict=True)
                 for x, y in zip(p.flatten(0, 1), q.flatten(0, 1), strict=True))
    return common / sum(p.numel() for p in a)


def snapkv_comparison(seed: int, ratio: float, window: int = 8, kernel: int = 5):
    hf, lm = _models(seed)
    ids = _tokens(seed)
    kept, logits = _kvpress_run(hf, ids, kvpress.SnapKVPress(ratio, window_size=window, kernel_size=kernel))
    caches, ours = _attnkit_run(lm, ids, SnapKVCache(_n_kept(ratio), window=window, kernel=kernel))
    return _agreement(kept, [c.positions for c in caches]), (logits - ours).abs().max().item()


@torch.no_grad()
def _layer_qkv(hf, ids):
    """Each layer's queries, keys and values in the dense prefill, rotated: ``(B, H, L, D)``, ``(B, H_kv, L, D)``."""
    pre, angles = {}, {}
    hooks = []
    for i, layer in enumerate(hf.model.layers):
        attn = layer.self_attn
        hooks.append(attn.q_proj.register_forward_hook(lambda m, a, out, i=i: pre.__setitem__(i, out)))
        hooks.append(attn.register_forward_pre_hook(
            lambda m, a, kw, i=i: angles.__setitem__(i, kw["position_embeddings"]), with_kwargs=True))
    cache = transformers.DynamicCache()
    try:
        hf(ids[:, :L], past_key_values=cache)
    finally:
        for h in hooks:
            h.remove()
    out = []
    for i in range(LAYERS):
        q = pre[i].unflatten(-1, (HEADS, -1)).transpose(1, 2)
        cos, sin = (t[:, None] for t in angles[i])
        half = q.shape[-1] // 2
        q = q * cos + torch.cat([-q[..., half:], q[..., :half]], -1) * sin  # rotary in halves
        out.append((q, cache.layers[i].keys, cache.layers[i].values))
    return out


def snapkv_layer_comparison(seed: int, ratio: float, window: int = 8, kernel: int = 5):
    """:func:`snapkv` itself on each layer's captured queries, keys and values, per layer and key/value head."""
    hf, _ = _models(seed)
    ids = _tokens(seed)
    kept, _ = _kvpress_run(hf, ids, kvpress.SnapKVPress(ratio, window_size=window, kernel_size=kernel))
    ours = [snapkv(q, k, v, _n_kept(ratio), window=window, kernel=kernel)[2] for q, k, v in _layer_qkv(hf, ids)]
    return _agreement(kept, ours)


@pytest.mark.parametrize("ratio", [0.25, 0.5, 0.75])
def test_snapkv_on_each_layers_captured_inputs_keeps_what_kvpress_keeps(ratio):
    assert snapkv_layer_comparison(3, ratio) == 1.0


@pytest.mark.parametrize("ratio", [0.25, 0.5, 0.75])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_snapkv_keeps_the_keys_kvpress_keeps_and_gives_its_next_token_logits(seed, ratio):
    agreement, diff = snapkv_comparison(seed, ratio)
    assert agreement == 1.0
    assert diff < 1e-4


def streaming_comparison(seed: int, ratio: float, sinks: int = 4):
    """Kept positions after the prompt (first layer: the only one whose inputs agree) and the first layer's output
    for the next token, kvpress's keys re-rotated into the cache's positions."""
    hf, lm = _models(seed)
    ids = _tokens(seed)
    n = _n_kept(ratio)
    press = kvpress.KeyRerotationPress(kvpress.StreamingLLMPress(ratio, n_sink=sinks))
    outs = {}
    hooks = [m.register_forward_hook(lambda mod, inp, out, key=key: outs.__setitem__(key, out))
             for key, m in (("hf", hf.model.layers[0].self_attn), ("attnkit", lm.body.layers[0].self_attn))]
    try:
        kept, _ = _kvpress_run(hf, ids, press, position=None)
        theirs = outs["hf"][0][:, -1]
        ours = SinkWindowCache(n, sinks)
        with torch.no_grad():
            lm.step(ids[:, :L], [ours, SinkWindowCache(n, sinks)])
            dense = transformers.DynamicCache()
            hf(ids[:, :L], past_key_values=dense)
        assert ours.v is not None
        values = dense.layers[0].values  # the first layer's inputs are the embeddings in both
        ours_kept = (ours.v[:, :, :, None] == values[:, :, None]).all(-1).float().argmax(-1)
        with torch.no_grad():
            lm.step(ids[:, :L + 1], [SinkWindowCache(n + 1, sinks), SinkWindowCache(n + 1, sinks)])
    finally:
        for h in hooks:
            h.remove()
    first = (theirs - outs["attnkit"][:, -1]).abs().max().item()
    return _agreement(kept[:1], [ours_kept]), first


@pytest.mark.parametrize("ratio", [0.25, 0.5, 0.75])
def test_streaming_llm_keeps_the_sinks_and_window_kvpress_keeps_and_matches_its_rerotated_first_layer(ratio):
    agreement, first = streaming_comparison(0, ratio)
    assert agreement == 1.0
    assert first < 1e-5


def h2o_comparison(seed: int, ratio: float, recent: int = 8):
    """The accumulated attention with nothing evicted (H2O's score against kvpress's normalised one), and the
    first layer's kept sets at ``int(L (1 - ratio))`` keys (different definitions: the overlap only)."""
    hf, lm = _models(seed)
    ids = _tokens(seed)
    press = kvpress.ObservedAttentionPress(ratio)
    scores = []
    score = press.score

    def recorded(*args, **kwargs):
        scores.append(score(*args, **kwargs))
        return scores[-1]

    press.score = recorded
    kept, _ = _kvpress_run(hf, ids, press)
    full = [HeavyHitterCache(L, recent) for _ in range(LAYERS)]  # nothing evicted: the dense prefill
    with torch.no_grad():
        lm.step(ids[:, :L], full)
    count = torch.arange(L, 0, -1, dtype=torch.float32)  # queries that can attend to key j
    rel = max(((c.score - s * count * GROUP).abs().max() / c.score.abs().max()).item()
              for c, s in zip(full, scores, strict=True))
    evicting = HeavyHitterCache(_n_kept(ratio), recent)
    with torch.no_grad():
        lm.step(ids[:, :L], [evicting, evicting.fresh()])
    assert evicting.positions is not None
    return rel, _agreement(kept[:1], [evicting.positions.sort(-1).values])


@pytest.mark.parametrize("seed", [0, 1])
def test_h2o_accumulates_the_attention_kvpress_observes_before_its_normalisation(seed):
    rel, _ = h2o_comparison(seed, 0.5)
    assert rel < 1e-5


def report() -> None:
    print(f"kvpress {importlib.metadata.version('kvpress')}, transformers "
          f"{transformers.__version__}, torch {torch.__version__}; Llama {LAYERS} layers, {HEADS} heads, "
          f"{KV_HEADS} kv heads, prompt {L}")
    for ratio in (0.25, 0.5, 0.75):
        for seed in (0, 1, 2):
            a, d = snapkv_comparison(seed, ratio)
            print(f"SnapKV        ratio {ratio:.2f} seed {seed}: kept agree {a:7.2%}, next-token logits max diff "
                  f"{d:.2e}")
    for ratio in (0.25, 0.5, 0.75):
        print(f"snapkv()      ratio {ratio:.2f} seed 3: kept agree {snapkv_layer_comparison(3, ratio):7.2%} "
              f"(captured rotated q/k/v of each layer)")
    for ratio in (0.25, 0.5, 0.75):
        a, d = streaming_comparison(0, ratio)
        print(f"StreamingLLM  ratio {ratio:.2f} seed 0: kept agree {a:7.2%} (layer 0), layer-0 next-token output "
              f"max diff {d:.2e}")
    for ratio in (0.25, 0.5, 0.75):
        for seed in (0, 1):
            r, a = h2o_comparison(seed, ratio)
            print(f"H2O/observed  ratio {ratio:.2f} seed {seed}: accumulated score rel diff {r:.1e}; kept overlap "
                  f"{a:7.2%} (layer 0, different definitions)")


if __name__ == "__main__":
    report()
