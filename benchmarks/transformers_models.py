"""attnkit inside a transformers model, against the same model on torch's SDPA, as ratios in one run.

The model is a Mistral-style decoder with a sliding window (seeded random weights, no
download): 2 layers, width 512, 8 query heads over 2 key/value heads (head_dim 64),
window 512, batch 1, float32, 1 thread. Rows (each pair interleaved, the ratio taken per
round, median and range over the rounds):

- attention time at a 4096-token prompt: one layer's attention function, called with
  the inputs and the mask the model builds for it (``"attnkit"``: a band mask, served by
  the band path; ``"sdpa"``: transformers' dense bool mask of the window): target
  <= 0.33x (3x faster);
- the whole prefill forward pass at 4096 tokens (mask building included);
- greedy decoding: 32 tokens after a 4096-token prompt with the model's cache (the
  sliding cache keeps the last window), tokens/s: target >= 1.0x (time <= 1.0x);
- a Llama-style decoder (4 layers, width 256, 8 query heads over 2 key/value heads, no
  window) greedy-decoding 64 tokens after a 256-token prompt, where a step is small and
  what each layer's call adds around torch's kernel shows: target <= 1.05x.

Usage: ``python -m benchmarks.transformers_models [--rounds 5] [--small] [--write BENCHMARKS.md]``
(``--small``: the Llama-style row alone).
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch
import transformers
from transformers import AttentionInterface, LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

import attnkit.integrations.transformers  # noqa: F401  (registers "attnkit")
from attnkit.lab.benchmarking.pairs import Pair, measure, table
from attnkit.lab.benchmarking.sections import emit

NAME, TITLE = "transformers", "Inside a transformers model"
PROMPT, WINDOW, NEW_TOKENS = 4096, 512, 32
SMALL_PROMPT, SMALL_NEW_TOKENS = 256, 64  # the Llama-style row
NOTES = """The decode row: a step's attention is one query over the last window of keys (at most 512), \
where attnkit's band mask reduces to no mask and the call takes torch's fused kernel, as "sdpa" does; \
what is left is attnkit's constant work per call (validating, deciding, checking the kernel's output: \
the dispatch-overhead section), twice per token here (2 layers), against a step of about 8 ms. The \
Llama-style row: the same per call, four times per token, against a step of about 2 ms over a 256-token \
prompt (no window: the causal mask of the model's cache, which the fast lane takes)."""


def _models(config=None) -> dict:
    """Both sides of a row: one model per attention implementation, the same seeded weights (Mistral by default)."""
    config = config or MistralConfig(vocab_size=1000, hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                                     num_attention_heads=8, num_key_value_heads=2, sliding_window=WINDOW,
                                     max_position_embeddings=2 * PROMPT)
    kind = LlamaForCausalLM if isinstance(config, LlamaConfig) else MistralForCausalLM
    torch.manual_seed(0)
    models = {}
    for name in ("attnkit", "sdpa"):
        model = kind(copy.deepcopy(config)).eval()
        if models:
            model.load_state_dict(next(iter(models.values())).state_dict())
        model.set_attn_implementation(name)
        models[name] = model
    return models


def _captured_attention_call(model, ids) -> tuple:
    """The first layer's attention call during a forward pass: (function, args, kwargs)."""
    name = model.config._attn_implementation
    real = AttentionInterface._global_mapping[name]
    captured = []

    def spy(*args, **kwargs):
        captured.append((args, kwargs))
        return real(*args, **kwargs)
    AttentionInterface._global_mapping[name] = spy
    try:
        with torch.no_grad():
            model(ids)
    finally:
        AttentionInterface._global_mapping[name] = real
    args, kwargs = captured[0]
    return real, args, kwargs


def _decode(model, ids, cache, steps: int = NEW_TOKENS):
    """``steps`` greedy steps from a prefilled cache (a copy: every round starts from the same state)."""
    cache = copy.deepcopy(cache)
    token, out = ids[:, -1:], []
    with torch.no_grad():
        for _ in range(steps):
            logits = model(token, cache=cache, use_cache=True).logits
            token = logits[:, -1:].argmax(-1)
            out.append(token)
    return torch.cat(out, 1)


def _prefilled(models: dict, ids) -> dict:
    """Each model's cache after all of ``ids`` but the last token (which the first decoding step feeds)."""
    caches = {}
    for name, model in models.items():
        with torch.no_grad():
            caches[name] = model(ids[:, :-1], use_cache=True).past_key_values
    return caches


def small_decode_row() -> Pair:
    """The Llama-style greedy decode row (see the module docstring); both sides must choose the same tokens."""
    config = LlamaConfig(vocab_size=1000, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                         num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=1024)
    models = _models(config)
    ids = torch.randint(0, 1000, (1, SMALL_PROMPT), generator=torch.Generator().manual_seed(1))
    caches = _prefilled(models, ids)
    ours, theirs = (lambda name=name: _decode(models[name], ids, caches[name], SMALL_NEW_TOKENS)
                    for name in ("attnkit", "sdpa"))
    if not torch.equal(ours(), theirs()):
        raise AssertionError("the Llama-style row: attnkit and sdpa chose different tokens")
    return Pair(f"Llama-style, 4 layers, width 256, 8/2 heads: greedy decode, {SMALL_NEW_TOKENS} tokens after "
                f"{SMALL_PROMPT}", 1.05, ours, theirs, f'"sdpa" (time of the {SMALL_NEW_TOKENS} steps)')


def rows() -> list[Pair]:
    models = _models()
    ids = torch.randint(0, 1000, (1, PROMPT), generator=torch.Generator().manual_seed(1))
    calls = {name: _captured_attention_call(model, ids) for name, model in models.items()}

    def attention_of(name):
        fn, args, kwargs = calls[name]
        return lambda: fn(*args, **kwargs)[0]

    def forward_of(name):
        def run():
            with torch.no_grad():
                return models[name](ids).logits
        return run

    caches = _prefilled(models, ids)
    label = f"Mistral-style, 2 layers, width 512, 8/2 heads, window {WINDOW}"
    return [
        Pair(f"{label}: one layer's attention, prompt {PROMPT}", 0.33, attention_of("attnkit"), attention_of("sdpa"),
            '"sdpa" (dense bool window mask)'),
        Pair(f"{label}: prefill forward, prompt {PROMPT}", 1.0, forward_of("attnkit"), forward_of("sdpa"), '"sdpa"'),
        Pair(f"{label}: greedy decode, {NEW_TOKENS} tokens after {PROMPT}", 1.0,
            lambda: _decode(models["attnkit"], ids, caches["attnkit"]),
            lambda: _decode(models["sdpa"], ids, caches["sdpa"]),
            '"sdpa" (time of the 32 steps; tokens/s is its inverse)'),
        small_decode_row(),
    ]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--write", type=Path, help="replace the transformers table in this Markdown file")
    ap.add_argument("--small", action="store_true", help="the Llama-style decode row alone")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    results = []
    for row in [small_decode_row()] if args.small else rows():
        results.append(measure(row, args.rounds, budget_s=0.5))
        print(f"{row.name}: {results[-1]['ratio']:.2f}x", file=sys.stderr)
    small = " --small" if args.small else ""
    text = (f"`python -m benchmarks.transformers_models --rounds {args.rounds}{small}` (torch {torch.__version__}, "
            f"transformers {transformers.__version__}, 1 thread; ratio = time with "
            '`attn_implementation="attnkit"` / time with `"sdpa"`, per interleaved round)\n\n' + table(results)
            + "\n\n" + NOTES)
    return emit(text, args.write, NAME, TITLE)


if __name__ == "__main__":
    sys.exit(main())
