"""MultiHeadAttention's x-transformers options against x-transformers' own ``Attention``, as a time ratio per round.

Rows (B=1, E=512, H=8, D=64, causal self-attention, float32, 1 thread, forward without gradients), one
per option: attnkit's module with the option (its function in ``attnkit.functional`` on the path
it takes) against ``x_transformers.Attention`` with the same option and the same weights (both
results checked equal before timing; x-transformers' LASER soft-clamp set out of reach, its
talking heads and CoPE mapped as tests/nn/test_multihead_xtransformers.py does). Target: at most
1.0x (no slower than the library users reach for). Needs ``x-transformers`` (2.31.10, with einops,
einx, frozendict, loguru, torch-einops-utils) importable; measured by
:func:`attnkit.lab.benchmarking.pairs.measure`.

Usage: ``python benchmarks/xoptions.py [--length 1024] [--rounds 9] [--write BENCHMARKS.md]``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from attnkit.lab.benchmarking.pairs import Pair, measure, table
from attnkit.lab.benchmarking.sections import emit
from attnkit.nn.multihead import MultiHeadAttention

NAME, TITLE = "xoptions", "x-transformers options of MultiHeadAttention against x-transformers' Attention"
GOAL = 1.0
E, H = 512, 8
D = E // H
# row: (attnkit's options, x-transformers' options)
OPTIONS = {
    "plain": ({}, {}),
    "talking heads (both)": ({"talking_heads": "both"}, {"pre_talking_heads": True, "post_talking_heads": True}),
    "talking heads (pre)": ({"talking_heads": "pre"}, {"pre_talking_heads": True}),
    "memory key-values (4)": ({"num_memory_kv": 4}, {"num_mem_kv": 4}),
    "selective": ({"selective": True}, {"selective": True}),
    "CoPE (64 positions)": ({"cope": 64}, {"use_cope": True, "cope_max_pos": 64}),
    "top-k (64)": ({"topk": 64}, {"sparse_topk": 64}),
    "L2-distance scores": ({"scores": "l2"}, {"l2_distance": True}),
    "LASER": ({"laser": True}, {"laser": True, "laser_softclamp_value": 1e4}),
}


def _copy(ref, m) -> None:
    """x-transformers' weights into attnkit's module (its talking heads add their mix: P = I + W; CoPE unscaled)."""
    with torch.no_grad():
        m.in_proj_weight.copy_(torch.cat([ref.to_q.weight, ref.to_k.weight, ref.to_v.weight]))
        m.out_proj.weight.copy_(ref.to_out.weight)
        attend = ref.attend
        if m.pre_talking_heads is not None:
            m.pre_talking_heads.copy_(torch.eye(H) + attend.pre_softmax_talking_heads.weight[:, :, 0, 0])
        if m.post_talking_heads is not None:
            m.post_talking_heads.copy_(attend.post_softmax_talking_heads.weight[:, :, 0, 0])
        if m.memory_k is not None:
            m.memory_k.copy_(ref.mem_k)
            m.memory_v.copy_(ref.mem_v)
        if m.cope_positions is not None:
            m.cope_positions.copy_(attend.cope.pos_emb * D ** 0.5)


def pairs(length: int) -> list[Pair]:
    """One pair per option: attnkit's module (ours) and x-transformers' Attention (theirs), on the same input."""
    from x_transformers.x_transformers import Attention

    x = torch.randn(1, length, E, generator=torch.Generator().manual_seed(0))
    rows = []
    for name, (ours, theirs) in OPTIONS.items():
        torch.manual_seed(0)
        ref = Attention(E, dim_head=D, heads=H, causal=True, **theirs).eval()
        with torch.no_grad():
            for p in ref.parameters():
                p.normal_(0, 0.05)
        m = MultiHeadAttention(E, H, bias=False, batch_first=True, **ours).eval()
        _copy(ref, m)

        def mine(m=m):
            with torch.no_grad():
                return m(x, x, x, is_causal=True, need_weights=False)[0]

        def other(ref=ref):
            with torch.no_grad():
                return ref(x)
        rows.append(Pair(f"{name}, L={length}", GOAL, mine, other, "x-transformers 2.31 Attention"))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--length", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--write", type=Path, help="replace the xoptions section in this Markdown file")
    args = ap.parse_args(argv)
    try:
        import x_transformers  # noqa: F401
    except ImportError:
        print("benchmarks/xoptions.py needs x-transformers (pip install x-transformers==2.31.10)", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    results = []
    for row in pairs(args.length):
        results.append(measure(row, args.rounds, budget_s=0.0, min_calls=1))
        print(f"{row.name}: {results[-1]['ratio']:.3f}x", file=sys.stderr)
    command = f"python benchmarks/xoptions.py --length {args.length} --rounds {args.rounds}"
    text = (f"`{command}` (torch {torch.__version__}, 1 thread; ratio = attnkit's time / x-transformers', per "
            "interleaved round)\n\n" + table(results, "ms"))
    return emit(text, args.write, NAME, TITLE)


if __name__ == "__main__":
    sys.exit(main())
