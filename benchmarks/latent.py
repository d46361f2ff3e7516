"""Multi-head latent attention decoding: the absorbed form against the naive one, and the cache each keeps.

DeepSeek-V2 (DeepSeek-AI 2024, arXiv:2405.04434, Sec. 2.1.2) caches a latent ``c^KV`` of ``d_c`` values
and one rotary key of ``d_h^R`` per token for all heads. Decoding one token after ``L``:

- ``naive``: the cached latents are decompressed into ``h`` heads of keys and values (``2 L d_c h (d_h +
  d_v)`` FLOPs per step), then attention;
- ``absorbed``: the up-projections are folded into the query and the output, and the query attends over
  the latent itself (one key head of ``d_c + d_h^R`` features, ``Dv = d_c``).

Rows: one decoding step of :class:`attnkit.nn.MultiHeadLatentAttention` at DeepSeek-V2's ratios
(``d_c = 4 d_h``, ``d_h^R = d_h / 2``; 8 heads of 64, width 512, float32, B = 1, 1 thread), absorbed
(ours) against naive (theirs), both after the same prefill of ``L`` tokens; the ratio per interleaved
round (:func:`attnkit.lab.benchmarking.pairs.measure`). Target: the absorbed step at most as long as the
naive one at ``L >= 1024``. The cache bytes per token are read from the registry's cost
(:mod:`attnkit.costing.kv_cache`), MLA beside MHA, GQA and MQA at the same layer.

Usage: ``python benchmarks/latent.py [--lengths 1024 4096] [--rounds 9] [--write BENCHMARKS.md]``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from attnkit.costing.kv_cache import kv_cache_table
from attnkit.lab.benchmarking.pairs import Pair, measure, table
from attnkit.lab.benchmarking.sections import emit
from attnkit.nn import MultiHeadLatentAttention

NAME, TITLE = "latent", "Latent attention: absorbed against naive decoding, cache bytes per token"
HEADS, HEAD_DIM = 8, 64


def _step(mla, cache, x, length: int, form: str):
    def run():
        cache._length = length  # roll the cache back to the prefill: every call decodes the same token
        with torch.no_grad():
            return mla(x, cache=cache, form=form)
    return run


def pair(length: int) -> Pair:
    """Absorbed (ours) against naive (theirs): one token after a prefill of ``length``."""
    torch.manual_seed(0)
    dim = HEADS * HEAD_DIM
    mla = MultiHeadLatentAttention(dim, HEADS, kv_lora_rank=4 * HEAD_DIM, q_lora_rank=None,
                                   qk_nope_head_dim=HEAD_DIM, qk_rope_head_dim=HEAD_DIM // 2,
                                   v_head_dim=HEAD_DIM).eval()
    prefix, x = torch.randn(1, length, dim), torch.randn(1, 1, dim)
    caches = []
    for _ in range(2):
        cache = mla.new_cache(1, length + 1)
        with torch.no_grad():
            mla(prefix, cache=cache)
        caches.append(cache)
    return Pair(f"decode 1 token after L={length}", 1.0, _step(mla, caches[0], x, length, "absorbed"),
                _step(mla, caches[1], x, length, "naive"), "naive form (decompressed keys and values)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--write", type=Path, help="replace the latent section in this Markdown file")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    results = []
    for length in args.lengths:
        results.append(measure(pair(length), args.rounds, budget_s=0.05, min_calls=3))
        print(f"L={length}: {results[-1]['ratio']:.3f}x", file=sys.stderr)
    lengths = " ".join(map(str, args.lengths))
    text = (f"`python benchmarks/latent.py --lengths {lengths} --rounds {args.rounds}` (torch {torch.__version__}, "
            f"1 thread; {HEADS} heads of {HEAD_DIM}, d_c = {4 * HEAD_DIM}, d_h^R = {HEAD_DIM // 2}; ratio = absorbed "
            "time / naive time per interleaved round)\n\n" + table(results, "µs") + "\n\n```\n"
            + kv_cache_table(heads=HEADS, head_dim=HEAD_DIM, tokens=max(args.lengths)) + "\n```")
    return emit(text, args.write, NAME, TITLE)


if __name__ == "__main__":
    sys.exit(main())
