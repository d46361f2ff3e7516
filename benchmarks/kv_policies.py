"""Recall under a KV budget: a Transformer that solves associative recall, decoded through each KV policy.

The model: ``models.TransformerLM`` (2 pre-norm layers, width 64, 2 heads, rotary positions, no dropout)
trained on MQAR (Arora et al. 2023, arXiv:2312.04927; :class:`attnkit.lab.tasks.MQAR`): 4 key-value pairs,
88 filler tokens, 4 queries, L = 100. It is trained first without the filler (the recall circuit forms
there in a few hundred steps), then with it; fixed seeds, under a minute at one thread on a quiet machine.

The measurement (float64): each test example's prompt (the pairs and the filler) goes through the model
with a fresh policy per layer as its cache (:mod:`attnkit.nn.kv_policies`, ``TransformerLM.step``), then
each query one token at a time; the query's logits pick the value. Budgets are 5, 10, 25 and 100 % of L
(``b`` keys per key/value head):

- StreamingLLM (``SinkWindowCache(b, sinks=min(4, b // 4))``): streams the prompt a token at a time (its
  sinks, the first tokens, are the first pairs here: what it recalls beyond its window);
- H2O (``HeavyHitterCache(b, recent=b // 2)``, the paper's even split): evicts after every token;
- SnapKV (``SnapKVCache(b, window=b // 4)``, pooling 5): compresses the prompt once (the queries then add
  their own keys: the cache ends at ``b + 4``);
- Quest (``QuestCache``, pages of ``L / 20`` keys, ``b`` rounded up to whole pages): keeps every key, each
  query reads its ``b`` keys of highest page bound.

At 100 % every policy's logits equal the dense forward's to 1e-9 (asserted before anything is printed).
``--rounds`` test batches of 256 examples (seeds 0 ..); each cell is the accuracy over all of them, with the
rounds' range.

Usage: ``python benchmarks/kv_policies.py [--rounds 3] [--model PATH] [--write BENCHMARKS.md]``
(``--model``: load the trained model from PATH if it exists, else train and save it there).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from attnkit.lab import tasks
from attnkit.lab.benchmarking.sections import emit
from attnkit.models import TransformerLM
from attnkit.nn.kv_policies import HeavyHitterCache, KVPolicy, QuestCache, SinkWindowCache, SnapKVCache

NAME, TITLE = "kv-policies", "KV selection and eviction: associative recall against the budget"
PAIRS, GAP, VOCAB = 4, 88, 16
FRACTIONS = (0.05, 0.10, 0.25, 1.0)
TEST = 256


def task(gap: int | None = None) -> tasks.MQAR:
    """MQAR with the benchmark's pairs and vocabulary; ``gap`` filler tokens (default :data:`GAP`)."""
    return tasks.get("mqar", num_pairs=PAIRS, num_keys=VOCAB, num_values=VOCAB, gap=GAP if gap is None else gap)


def train(seed: int = 0, *, max_steps: int = 2000) -> tuple[TransformerLM, float]:
    """The model, trained until 99 % of 512 held-out queries are right (without the filler, then with it)."""
    torch.manual_seed(seed)
    lm = TransformerLM(task().vocab_size, dim=64, num_heads=2, num_layers=2, dropout=0.0, norm_first=True,
                       positional="rotary", max_len=None)
    opt = torch.optim.AdamW(lm.parameters(), lr=1e-2, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 50))
    g = torch.Generator().manual_seed(seed + 1)
    start = time.perf_counter()
    for stage in (task(0), task()):
        held = stage.sample(512, generator=torch.Generator().manual_seed(seed + 99))
        for step in range(max_steps):
            batch = stage.sample(64, generator=g)
            loss = F.cross_entropy(lm(batch["inputs"]).transpose(1, 2), batch["targets"],
                                   ignore_index=tasks.IGNORE_INDEX)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(lm.parameters(), 1.0)
            opt.step()
            sched.step()
            if step % 25 == 24:
                with torch.no_grad():
                    acc = stage.accuracy(lm(held["inputs"]).argmax(-1), held)
                print(f"train L={stage.seq_len} step {step + 1}: loss {loss.item():.3f}, held-out accuracy "
                      f"{acc:.3f}", file=sys.stderr)
                if acc >= 0.99:
                    break
    return lm.eval(), time.perf_counter() - start


def policies(budget: int, length: int) -> dict[str, KVPolicy]:
    """Each policy at ``budget`` keys per key/value head (see the module)."""
    page = max(1, round(0.05 * length))
    return {"StreamingLLM": SinkWindowCache(budget, min(4, budget // 4)),
            "H2O": HeavyHitterCache(budget, max(1, budget // 2)),
            "SnapKV": SnapKVCache(budget, window=max(1, budget // 4)),
            "Quest": QuestCache(math.ceil(budget / page) * page, page)}


def decode(lm: TransformerLM, inputs: torch.Tensor, prompt: int, policy: KVPolicy) -> torch.Tensor:
    """The logits ``(B, Q, V)`` at the query positions: the prompt in one step, each query after it in one."""
    caches = [policy.fresh() for _ in lm.body.layers]
    lm.step(inputs[:, :prompt], caches)
    return torch.stack([lm.step(inputs[:, t:t + 1], caches) for t in range(prompt, inputs.shape[1])], 1)


def measure(lm: TransformerLM, rounds: int) -> tuple[float, dict[tuple[str, float], list[float]], list[float]]:
    """Accuracies per (policy, fraction) and dense, per round; the 100 % budgets checked against dense."""
    mqar = task()
    prompt, length = 2 * PAIRS + GAP, mqar.seq_len
    lm = lm.double()
    cells: dict[tuple[str, float], list[float]] = {}
    dense_acc = []
    worst = 0.0
    with torch.no_grad():
        for r in range(rounds):
            batch = mqar.sample(TEST, generator=torch.Generator().manual_seed(r))
            inputs, answers = batch["inputs"], batch["targets"][:, prompt:]
            dense = lm(inputs)[:, prompt:]
            dense_acc.append((dense.argmax(-1) == answers).double().mean().item())
            for fraction in FRACTIONS:
                budget = max(2, round(fraction * length))
                for name, policy in policies(budget, length).items():
                    logits = decode(lm, inputs, prompt, policy)
                    if fraction == 1.0:
                        worst = max(worst, (logits - dense).abs().max().item())
                        assert worst < 1e-9 and torch.equal(logits.argmax(-1), dense.argmax(-1)), (name, worst)
                    cells.setdefault((name, fraction), []).append(
                        (logits.argmax(-1) == answers).double().mean().item())
    return worst, cells, dense_acc


def _cell(values: list[float]) -> str:
    mean = 100 * sum(values) / len(values)
    if len(values) == 1:
        return f"{mean:.1f}"
    return f"{mean:.1f} ({100 * min(values):.1f}-{100 * max(values):.1f})"


def table(cells, dense_acc: list[float], length: int) -> str:
    heads = [f"{round(100 * f)} % ({max(2, round(f * length))})" for f in FRACTIONS]
    lines = ["| policy | " + " | ".join(heads) + " |", "|---|" + "---:|" * len(FRACTIONS)]
    for name in policies(length, length):
        lines.append(f"| {name} | " + " | ".join(_cell(cells[name, f]) for f in FRACTIONS) + " |")
    lines.append("| dense (no policy) | " + " | ".join(_cell(dense_acc) for _ in FRACTIONS) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--model", type=Path, help="load the trained model from here if it exists, else save it here")
    ap.add_argument("--write", type=Path, help="replace the kv-policies section in this Markdown file")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.model is not None and args.model.exists():
        lm, trained = TransformerLM.load(args.model), f"loaded from {args.model}"
    else:
        lm, seconds = train()
        trained = f"trained in {seconds:.0f} s at {args.threads} thread(s)"
        if args.model is not None:
            lm.save(args.model)
    start = time.perf_counter()
    worst, cells, dense_acc = measure(lm, args.rounds)
    print(f"measured in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    length = task().seq_len
    text = (f"`python benchmarks/kv_policies.py --rounds {args.rounds}` (torch {torch.__version__}; model "
            f"{trained}). MQAR accuracy % of the {PAIRS} queries per example ({args.rounds} x {TEST} examples, "
            f"L = {length}, chance {100 / VOCAB:.1f} %) when each layer's attention reads what the policy keeps, "
            f"at a budget of 5, 10, 25 and 100 % of L (keys per key/value head in brackets); the rounds' range "
            f"in parentheses. At 100 % every policy equals dense attention (largest logit difference "
            f"{worst:.1e}, float64).\n\n" + table(cells, dense_acc, length))
    return emit(text, args.write, NAME, TITLE)


if __name__ == "__main__":
    sys.exit(main())
