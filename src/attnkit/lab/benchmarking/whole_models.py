"""Whole models, attnkit against plain torch: a training step and a generation loop, as ratios in one run.

The model is GPT-style (:mod:`.plain_gpt`): 4 pre-norm blocks, width 256, 8 heads,
MLP 4x, learned positions, vocabulary 512, float32, 1 thread. A training step is forward,
cross-entropy on the next token, backward and an AdamW step. Rows (each pair interleaved,
the ratio taken per round, median and range over the rounds):

- ``causal``: the model with ``attnkit.attention(q, k, v, mask=masks.causal())`` against the
  same model (same weights) with ``F.scaled_dot_product_attention(is_causal=True)``, B=4,
  L=1024: target <= 1.03x;
- ``window``: the same at L=2048 with a causal window of 128 keys
  (``masks.sliding_window(127, 0)``) against SDPA given the equivalent dense bool mask
  (built once): target <= 0.67x (attnkit 1.5x faster);
- ``lm``: ``attnkit.models.TransformerLM`` (``norm_first=True, positional="learned",
  activation="gelu", dropout=0``) against the plain-torch model with SDPA and its weights,
  B=4, L=1024: target <= 1.05x;
- ``generate``: greedy decoding with the KV cache, 64 tokens after a 256-token prompt, B=1:
  ``TransformerLM.generate`` against the plain model's own cached loop with SDPA; time ratio
  (tokens/s is its inverse): target <= 1.05x (issue 34).

With ``--compiled`` every row runs again with both sides under ``torch.compile`` (the model's
forward compiled; the loss, backward and AdamW step as the eager rows); compile time is
excluded (the first calls, which compile, are the warm-up), and the targets are the eager ones.

Before timing, each row checks that its two sides compute the same thing (loss, or the
generated tokens); the tests check it in float64 for every row.

``attnkit bench --models`` runs the rows and prints :func:`report`; the repository's
``python -m benchmarks.whole_models --write BENCHMARKS.md`` writes it into its section.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ... import masks
from ...core import attention
from ...models import TransformerLM
from .pairs import Pair, measure, table
from .plain_gpt import PlainGPT, sdpa_causal

__all__ = ["ROWS", "GOALS", "Sizes", "rows", "run", "report", "command", "parse_rows", "parse_sizes",
           "estimate_seconds"]

ROWS = ("causal", "window", "lm", "generate")
GOALS = {"causal": 1.03, "window": 0.67, "lm": 1.05, "generate": 1.05}
NOTES = """What bounds the rows. Training: attention is a part of the step (the projections, the MLP, the \
output head and AdamW are the same code on both sides), so the causal and model rows sit near 1 and \
the window row's gain is the attention's gain diluted by the rest of the step. Generation: each token \
runs `TransformerLM.step` (no checks of the tokens the loop chose, one causal mask object, the output \
head on the last position), and its attention calls take the fast lane; a step's attention is one \
query over about 300 cached keys, where the lane's output check (the dispatch-overhead section) is \
still of the kernel's order, once per layer and token; the modules run the plain model's operators per \
layer (one matmul, three views for the heads, two writes into the preallocated cache) and a little more \
Python (the input and cache checks, as attribute comparisons). Compiled: each attention call is one \
`attnkit::attention` custom operator node that runs the eager path (the fast lane's call on the lane, \
torch's kernel over the cache's prefix in place; band windows for the window), so the compiled rows \
compare the same kernels inside graphs that inductor compiles on both sides; compiled generation \
compiles `TransformerLM.step` and the plain model's forward (what each generate calls per token), each \
one graph for the prefill and one for every decoding step."""


@dataclass(frozen=True)
class Sizes:
    """Every size of the rows; ``Sizes.parse("length=64,width=32")`` overrides some."""

    batch: int = 4
    length: int = 1024
    window_length: int = 2048
    window: int = 128
    width: int = 256
    heads: int = 8
    layers: int = 4
    vocab: int = 512
    prompt: int = 256
    new_tokens: int = 64
    gen_batch: int = 1

    @classmethod
    def parse(cls, text: str) -> Sizes:
        """``"name=int,..."`` over the defaults; ValueError naming the fields for an unknown one or a bad value."""
        names = [f.name for f in dataclasses.fields(cls)]
        values = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            name, _, value = part.partition("=")
            if name not in names or not value.strip().isdigit() or int(value) < 1:
                raise ValueError(f"bad size {part!r}: expected name=positive int, names: {', '.join(names)}")
            values[name] = int(value)
        return dataclasses.replace(cls(), **values)

    @property
    def max_len(self) -> int:
        return max(self.length, self.window_length, self.prompt + self.new_tokens)


def attnkit_attend(mask: masks.Mask):
    """``attnkit.attention`` with ``mask``, as the plain model's attention function."""
    return lambda q, k, v: attention(q, k, v, mask=mask)


def sdpa_window(length: int, window: int, device=None):
    """SDPA with the dense bool mask of a causal window of ``window`` keys (``i - window < j <= i``), built once."""
    i = torch.arange(length, device=device)
    allowed = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - window)  # (L, L)
    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)


def tokens(sizes: Sizes, batch: int, length: int, seed: int = 1, device="cpu") -> torch.Tensor:
    """Random token ids, the same on every device (drawn on the CPU)."""
    ids = torch.randint(0, sizes.vocab, (batch, length), generator=torch.Generator().manual_seed(seed))
    return ids.to(device)


def transformer_lm(sizes: Sizes, dtype=torch.float32, device="cpu") -> TransformerLM:
    torch.manual_seed(0)
    return TransformerLM(sizes.vocab, dim=sizes.width, num_heads=sizes.heads, num_layers=sizes.layers,
                         norm_first=True, positional="learned", activation="gelu", dropout=0.0,
                         max_len=sizes.max_len).to(device, dtype)


def plain_gpt(sizes: Sizes, attend=sdpa_causal, dtype=torch.float32, device="cpu") -> PlainGPT:
    """The plain model with ``attend``, holding the weights of :func:`transformer_lm` (so every model is equal)."""
    model = PlainGPT(sizes.vocab, sizes.width, sizes.heads, sizes.layers, sizes.max_len, attend).to(device, dtype)
    return model.load_from_lm(transformer_lm(sizes, dtype, device))


def training_step(model: torch.nn.Module, ids: torch.Tensor):
    """A function running one training step of ``model`` on ``ids`` (its own AdamW); it returns the loss before it."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    run = model

    def step():
        logits = run(ids[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.detach()
    step.model = model
    return step


def _compile(step):
    """The same step with the model's forward compiled (its parameters, so its optimizer, unchanged)."""
    step.model.forward = torch.compile(step.model.forward)
    return step


def _generation(model, prompt: torch.Tensor, new_tokens: int, compiled: bool):
    if compiled:  # what generate calls per token: TransformerLM.step, the plain model's forward
        name = "step" if hasattr(model, "step") else "forward"
        setattr(model, name, torch.compile(getattr(model, name), dynamic=True))
    return lambda: model.generate(prompt, new_tokens)


def rows(sizes: Sizes = Sizes(), names=ROWS, *, compiled: bool = False, dtype=torch.float32,
         device="cpu") -> list[Pair]:
    """The rows named (in :data:`ROWS` order); each side a zero-argument callable returning what is compared."""
    shape = f"GPT-style {sizes.layers}x{sizes.width}, {sizes.heads} heads"
    tag = ", compiled" if compiled else ""
    wrap = _compile if compiled else (lambda step: step)
    gpt = lambda attend: plain_gpt(sizes, attend, dtype, device)
    out = []
    if "causal" in names:
        ids = tokens(sizes, sizes.batch, sizes.length + 1, device=device)
        out.append(Pair(f"{shape}, B={sizes.batch} L={sizes.length}: training step, causal{tag}", GOALS["causal"],
                        wrap(training_step(gpt(attnkit_attend(masks.causal())), ids)),
                        wrap(training_step(gpt(sdpa_causal), ids)), "same model, SDPA is_causal"))
    if "window" in names:
        ids = tokens(sizes, sizes.batch, sizes.window_length + 1, device=device)
        mask = masks.sliding_window(sizes.window - 1, 0)
        out.append(Pair(f"{shape}, B={sizes.batch} L={sizes.window_length}: training step, causal window "
                        f"{sizes.window}{tag}", GOALS["window"], wrap(training_step(gpt(attnkit_attend(mask)), ids)),
                        wrap(training_step(gpt(sdpa_window(sizes.window_length, sizes.window, device)), ids)),
                        "same model, SDPA dense bool mask"))
    if "lm" in names:
        ids = tokens(sizes, sizes.batch, sizes.length + 1, device=device)
        out.append(Pair(f"TransformerLM ({shape}), B={sizes.batch} L={sizes.length}: training step{tag}",
                        GOALS["lm"], wrap(training_step(transformer_lm(sizes, dtype, device), ids)),
                        wrap(training_step(gpt(sdpa_causal), ids)), "plain torch model, SDPA is_causal"))
    if "generate" in names:
        prompt = tokens(sizes, sizes.gen_batch, sizes.prompt, device=device)
        out.append(Pair(f"TransformerLM ({shape}): greedy generation, {sizes.new_tokens} tokens after "
                        f"{sizes.prompt}, B={sizes.gen_batch}{tag}", GOALS["generate"],
                        _generation(transformer_lm(sizes, dtype, device).eval(), prompt, sizes.new_tokens, compiled),
                        _generation(gpt(sdpa_causal).eval(), prompt, sizes.new_tokens, compiled),
                        "plain torch model, SDPA, own KV cache (time; tokens/s is its inverse)"))
    return out


# Seconds of one call of both sides of each row at the default Sizes, one thread of the 2-core CPU the 'Whole models'
# table of BENCHMARKS.md was measured on (attnkit ms + torch ms, rounded); and an assumed compilation time for both
# sides of one compiled row there (inductor on a CPU: not measured by the table, which excludes it).
CALL_SECONDS = {"causal": 3.8, "window": 9.9, "lm": 3.5, "generate": 0.4}
COMPILE_SECONDS = 60.0


def estimate_seconds(names=ROWS, *, rounds: int, compiled: bool = False, sizes: Sizes | None = None) -> float:
    """About how long :func:`run` takes on a 2-core CPU: a warm-up and ``rounds`` calls of both sides per row.

    Scaled by ``batch * length`` against the default sizes when others are given (the training rows' work grows
    at least so); with ``compiled``, every row again plus :data:`COMPILE_SECONDS` each.

    Example:
        >>> round(estimate_seconds(("causal",), rounds=3)), round(estimate_seconds(rounds=3, compiled=True) / 60)
        (15, 6)
    """
    sizes, base = sizes or Sizes(), Sizes()
    scale = (sizes.batch * sizes.length) / (base.batch * base.length)
    once = sum(CALL_SECONDS[name] for name in names) * (rounds + 1) * scale
    return once * 2 + COMPILE_SECONDS * len(tuple(names)) if compiled else once


def run(sizes: Sizes, names=ROWS, *, rounds: int, compiled: bool = False, log=None, device="cpu") -> list[dict]:
    """Measure the rows (eager, then compiled when asked): one call per side per round, order alternating."""
    results = []
    for flag in (False, True) if compiled else (False,):
        for row in rows(sizes, names, compiled=flag, device=device):
            results.append(measure(row, rounds, budget_s=0.0, min_calls=1, warmup=1, device=device))
            if log:
                log(f"{row.name}: {results[-1]['ratio']:.3f}x ({results[-1]['lo']:.3f}-{results[-1]['hi']:.3f})")
    return results


def command(args) -> str:
    """The command line reproducing a run."""
    parts = ["python -m benchmarks.whole_models", f"--rounds {args.rounds}"]
    if tuple(args.rows) != ROWS:
        parts.append("--rows " + ",".join(args.rows))
    if args.sizes != Sizes():
        changed = [f"{f.name}={getattr(args.sizes, f.name)}" for f in dataclasses.fields(Sizes)
                   if getattr(args.sizes, f.name) != getattr(Sizes(), f.name)]
        parts.append("--sizes " + ",".join(changed))
    return " ".join(parts + (["--compiled"] if args.compiled else []))


def report(args, results: list[dict]) -> str:
    return (f"`{command(args)}` (torch {torch.__version__}, 1 thread; ratio = attnkit time / torch time per "
            "interleaved round, one call each; `attnkit bench --models` runs the same rows)\n\n"
            + table(results, "ms") + "\n\n" + NOTES)


def parse_sizes(text: str) -> Sizes:
    """:meth:`Sizes.parse` (ValueError for a bad size)."""
    return Sizes.parse(text)


def parse_rows(text: str) -> tuple[str, ...]:
    """``"all"`` or comma-separated names of :data:`ROWS` -> those names in table order; ValueError otherwise."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if text == "all":
        return ROWS
    bad = [n for n in names if n not in ROWS]
    if not names or bad:
        raise ValueError(f"unknown row {', '.join(map(repr, bad)) or repr(text)}: rows are all, {', '.join(ROWS)}")
    return tuple(n for n in ROWS if n in names)
