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
  what each layer's call adds around torch's kernel shows: target <= 1.05x. Its two sides
  decode with their steps interleaved (a step of one, then a step of the other), and each
  round's ratio is that of the summed step times: whole decodes timed in turn (the other
  rows' way) read 0.95-1.38x in one quiet window, the load's changes over a second or more,
  not attnkit's work.

Usage: ``python -m benchmarks.transformers_models [--rounds 5] [--small] [--write BENCHMARKS.md]``
(``--small``: the Llama-style row alone).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
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
Llama-style row: the same per call, four times per token, against a step of about 3.5 ms over a 256-token \
prompt (no window: the causal mask of the model's cache, which the fast lane takes); the two models' steps \
alternate, and a round's ratio is that of their summed step times. Per layer call attnkit runs torch's kernel \
with the query heads of a key/value head as rows of one product (faster than the grouped-head call "sdpa" makes) \
and adds the lane's attribute checks and the check of the kernel's output and log-sum-exp (attnkit's contract: \
torch's kernel zeroes a head whose every score is -inf and overflows near the largest float); per step the mask \
function builds a structured mask object where "sdpa" returns None."""


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


def _decode_in_step(models: dict, ids, caches: dict, steps: int) -> dict[str, float]:
    """Both models decode ``steps`` greedy tokens from copies of their caches, one step of each in turn (which goes
    first alternates); each side's seconds summed over its steps. Both must choose the same tokens."""
    cache = {name: copy.deepcopy(caches[name]) for name in models}
    token = dict.fromkeys(models, ids[:, -1:])
    spent = dict.fromkeys(models, 0.0)
    names = list(models)
    with torch.no_grad():
        for step in range(steps):
            for name in names if step % 2 else names[::-1]:
                start = time.perf_counter()
                logits = models[name](token[name], cache=cache[name], use_cache=True).logits
                token[name] = logits[:, -1:].argmax(-1)
                spent[name] += time.perf_counter() - start
            if not torch.equal(*token.values()):
                raise AssertionError(f"step {step}: attnkit and sdpa chose different tokens")
    return spent


def small_decode_row(rounds: int) -> dict:
    """The Llama-style greedy decode row (see the module docstring), measured step by step: a round is one decode
    of ``SMALL_NEW_TOKENS`` tokens on each side with their steps interleaved, so a change of load within the round
    (a step is about 3 ms) hits both sides; the ratio of the two sums is taken per round (one untimed round first)."""
    config = LlamaConfig(vocab_size=1000, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                         num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=1024)
    models = _models(config)
    ids = torch.randint(0, 1000, (1, SMALL_PROMPT), generator=torch.Generator().manual_seed(1))
    caches = _prefilled(models, ids)
    _decode_in_step(models, ids, caches, SMALL_NEW_TOKENS)
    times = [_decode_in_step(models, ids, caches, SMALL_NEW_TOKENS) for _ in range(rounds)]
    ratios = [t["attnkit"] / t["sdpa"] for t in times]
    return {"name": f"Llama-style, 4 layers, width 256, 8/2 heads: greedy decode, {SMALL_NEW_TOKENS} tokens after "
                    f"{SMALL_PROMPT}", "against": f'"sdpa" (time of the {SMALL_NEW_TOKENS} steps, interleaved by step)',
            "goal": 1.05, "ratio": statistics.median(ratios), "lo": min(ratios), "hi": max(ratios),
            "ours_us": statistics.median(t["attnkit"] for t in times) * 1e6,
            "theirs_us": statistics.median(t["sdpa"] for t in times) * 1e6}


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
    ]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--write", type=Path, help="replace the transformers table in this Markdown file")
    ap.add_argument("--small", action="store_true", help="the Llama-style decode row alone")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    results = []
    for row in [] if args.small else rows():
        results.append(measure(row, args.rounds, budget_s=0.5))
        print(f"{row.name}: {results[-1]['ratio']:.2f}x", file=sys.stderr)
    results.append(small_decode_row(args.rounds))
    print(f"{results[-1]['name']}: {results[-1]['ratio']:.2f}x", file=sys.stderr)
    small = " --small" if args.small else ""
    text = (f"`python -m benchmarks.transformers_models --rounds {args.rounds}{small}` (torch {torch.__version__}, "
            f"transformers {transformers.__version__}, 1 thread; ratio = time with "
            '`attn_implementation="attnkit"` / time with `"sdpa"`, per interleaved round)\n\n' + table(results)
            + "\n\n" + NOTES)
    return emit(text, args.write, NAME, TITLE)


if __name__ == "__main__":
    sys.exit(main())
