"""Dispatch overhead on the calls users make most often, as ratios against torch in one run.

Rows (B=1, H=8, D=64 unless named; 1 thread; each row's two sides interleaved, the
ratio taken per round and summarised by its median and range over the rounds):

- decode: one query over a KV cache of 128 / 1024 / 4096 keys, no mask, causal, and
  grouped-query heads (8 query heads over 2 key/value heads), against torch's SDPA on
  the same inputs (``enable_gqa`` for the grouped rows; one bottom-right causal query
  sees every key, so torch is given no mask);
- chunked prefill: 16 queries over 1024 keys, causal (bottom-right), against SDPA given
  the equivalent bool mask;
- short causal batches: B=4, L=32 and 128, against SDPA with ``is_causal``;
- ``attnkit.nn.MultiHeadAttention`` against ``torch.nn.MultiheadAttention`` with the
  same weights (E=256, 8 heads, B=4, L=128, eval, no_grad, self-attention).

Targets (issue 12): <= 1.15x for the attention rows, <= 1.10x for the module row.

Usage: ``python benchmarks/overhead.py [--rounds 15] [--write BENCHMARKS.md]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

import attnkit
import attnkit.nn
from attnkit import masks

START, END = "<!-- overhead:start -->", "<!-- overhead:end -->"
NOTES = """What limits the misses: on this CPU every torch operator call on a small tensor costs \
3-6 µs of dispatch before any arithmetic, so a decode step whose kernel takes 40-60 µs has no \
room for the ~1.15x target: the output check alone is three small reductions and two syncs, \
and validating the arguments into a `Problem` and choosing the path is Python of the same order. \
The work attnkit adds per call is constant (no pass over K or V, no layout, no mask picture: \
the O(1) decision of `kernels/dispatch.py`), so the ratio falls towards 1 as the kernel's own \
time grows with the KV cache, the batch or the prefill length. Calling the fused kernel \
directly, as attnkit does for its log-sum-exp, also costs more than torch's SDPA entry point \
at the smallest size (compare the first and third rows of the breakdown)."""


@dataclass
class Row:
    name: str
    goal: float
    ours: Callable[[], object]
    theirs: Callable[[], object]
    against: str


def _qkv(b, hq, hkv, lq, lk, d=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, hq, lq, d, generator=g), torch.randn(b, hkv, lk, d, generator=g),
            torch.randn(b, hkv, lk, d, generator=g))


def attention_rows() -> list[Row]:
    rows = []
    causal = masks.causal()
    for lk in (128, 1024, 4096):
        q, k, v = _qkv(1, 8, 8, 1, lk)
        rows.append(Row(f"decode q=1 kv={lk}, no mask", 1.15, lambda q=q, k=k, v=v: attnkit.attention(q, k, v),
                        lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v), "SDPA"))
        rows.append(Row(f"decode q=1 kv={lk}, causal", 1.15,
                        lambda q=q, k=k, v=v: attnkit.attention(q, k, v, mask=causal),
                        lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v), "SDPA (no mask: same function)"))
        q, k, v = _qkv(1, 8, 2, 1, lk)
        rows.append(Row(f"decode q=1 kv={lk}, causal, GQA 8/2", 1.15,
                        lambda q=q, k=k, v=v: attnkit.attention(q, k, v, mask=causal),
                        lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
                        "SDPA enable_gqa"))
    q, k, v = _qkv(1, 8, 8, 16, 1024)
    bool_mask = torch.ones(16, 1024, dtype=torch.bool).tril(1024 - 16)
    rows.append(Row("chunked prefill q=16 kv=1024, causal", 1.15,
                    lambda q=q, k=k, v=v: attnkit.attention(q, k, v, mask=causal),
                    lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v, attn_mask=bool_mask),
                    "SDPA bool mask"))
    for length in (32, 128):
        q, k, v = _qkv(4, 8, 8, length, length)
        rows.append(Row(f"B=4 L={length}, causal", 1.15, lambda q=q, k=k, v=v: attnkit.attention(q, k, v, mask=causal),
                        lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                        "SDPA is_causal"))
    return rows


def module_row() -> Row:
    torch.manual_seed(0)
    theirs = torch.nn.MultiheadAttention(256, 8, batch_first=True).eval()
    ours = attnkit.nn.MultiHeadAttention(256, 8, batch_first=True).eval()
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(4, 128, 256)

    def run_ours():
        with torch.no_grad():
            return ours(x, x, x)[0]

    def run_theirs():
        with torch.no_grad():
            return theirs(x, x, x, need_weights=False)[0]
    return Row("nn.MultiHeadAttention E=256 H=8 B=4 L=128, eval", 1.10, run_ours, run_theirs,
               "torch.nn.MultiheadAttention")


def _time(fn: Callable[[], object], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def measure(row: Row, rounds: int, budget_s: float = 0.05, min_calls: int = 5, warmup: int = 0) -> dict:
    """Per round: both sides for about ``budget_s`` each (at least ``min_calls``; order alternating), the ratio.

    Before timing: one call of each side (their results must agree), then ``warmup`` more calls each.
    """
    torch.testing.assert_close(row.ours(), row.theirs(), rtol=1e-4, atol=1e-5)  # same function, first
    for _ in range(warmup):
        row.ours(), row.theirs()
    calls = min_calls if budget_s <= 0 else max(min_calls, int(budget_s / max(_time(row.theirs, 3), 1e-7)))
    ratios, ours_t, theirs_t = [], [], []
    for r in range(rounds):
        if r % 2:
            t_theirs, t_ours = _time(row.theirs, calls), _time(row.ours, calls)
        else:
            t_ours, t_theirs = _time(row.ours, calls), _time(row.theirs, calls)
        ratios.append(t_ours / t_theirs)
        ours_t.append(t_ours)
        theirs_t.append(t_theirs)
    return {"name": row.name, "against": row.against, "goal": row.goal, "ratio": statistics.median(ratios),
            "lo": min(ratios), "hi": max(ratios), "ours_us": statistics.median(ours_t) * 1e6,
            "theirs_us": statistics.median(theirs_t) * 1e6}


def breakdown(lk: int = 128, calls: int = 3000) -> str:
    """Where one decode call's time goes (B=1, H=8, q=1 over ``lk`` keys, causal): medians of 5 timings each."""
    from attnkit.core import _prepare
    from attnkit.kernels import dispatch, rules, sdpa

    q, k, v = _qkv(1, 8, 8, 1, lk)
    causal = masks.causal()
    p = _prepare(q, k, v, mask=causal)
    out, lse = rules.FLASH.default(q, k, v, 0.0, False, attn_mask=None, scale=p.scale)
    parts = {
        "torch SDPA (F.scaled_dot_product_attention)": lambda: F.scaled_dot_product_attention(q, k, v),
        "attnkit.attention(q, k, v, mask=causal())": lambda: attnkit.attention(q, k, v, mask=causal),
        "  the fused kernel, called directly (with its lse)": lambda: rules.FLASH.default(
            q, k, v, 0.0, False, attn_mask=None, scale=p.scale),
        "  validation (autocast, argument checks, Problem)": lambda: _prepare(q, k, v, mask=causal),
        "  the decision (dispatch.choose)": lambda: dispatch.choose(p),
        "  the output check (sdpa.trustworthy: 3 reductions, 2 syncs)": lambda: sdpa.trustworthy(out, lse, None),
    }
    lines = [f"| decode q=1 kv={lk}, causal: part | µs per call |", "|---|---|"]
    for name, fn in parts.items():
        fn()
        lines.append(f"| {name} | {statistics.median(_time(fn, calls) for _ in range(5)) * 1e6:.1f} |")
    return "\n".join(lines)


def table(results: list[dict], unit: str = "µs") -> str:
    """The results as a Markdown table, times in ``unit`` ("µs" or "ms")."""
    per = {"µs": 1.0, "ms": 1e3}[unit]
    lines = [f"| row | against | attnkit {unit} | torch {unit} | ratio (median, range) | target | met |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        met = "yes" if r["ratio"] <= r["goal"] else "no"
        lines.append(f"| {r['name']} | {r['against']} | {r['ours_us'] / per:.1f} | {r['theirs_us'] / per:.1f} | "
                     f"{r['ratio']:.2f}x ({r['lo']:.2f}-{r['hi']:.2f}) | <= {r['goal']:.2f}x | {met} |")
    return "\n".join(lines)


def write(path: Path, text: str, start: str = START, end: str = END,
          title: str = "Dispatch overhead on common calls") -> None:
    """Replace the section between ``start`` and ``end`` of a Markdown file (appended under ``title`` if absent)."""
    doc = path.read_text()
    block = f"{start}\n{text}\n{end}"
    if start in doc:
        head, rest = doc.split(start, 1)
        doc = head + block + rest.split(end, 1)[1]
    else:
        doc = doc.rstrip() + f"\n\n## {title}\n\n" + block + "\n"
    path.write_text(doc)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--write", type=Path, help="replace the overhead table in this Markdown file")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    results = []
    for row in [*attention_rows(), module_row()]:
        results.append(measure(row, args.rounds))
        print(f"{row.name}: {results[-1]['ratio']:.2f}x", file=sys.stderr)
    text = (f"`python benchmarks/overhead.py --rounds {args.rounds}` (torch {torch.__version__}, 1 thread; "
            f"ratio = attnkit time / torch time per interleaved round)\n\n" + table(results)
            + "\n\nWhere the time of the smallest call goes, measured in the same run (each part alone; a part "
              "costs more inside the whole call, which runs more Python between the kernels):\n\n" + breakdown()
            + "\n\n" + NOTES)
    print(text)
    if args.write:
        write(args.write, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
