"""Sequence-parallel attention under torchrun, checked against one process.

    torchrun --nproc-per-node 4 examples/distributed_attention.py [--scheme ring] [--layout zigzag]

Every rank builds the same float64 inputs, keeps its shard of the sequence, runs
``attnkit.distributed.attention`` forward and backward, and compares its shard of the
output and of the gradients with ``attnkit.attention`` on the full tensors. Rank 0 prints
the largest differences over all ranks and the bytes each scheme sent. Uses gloo (CPU);
with GPUs, pass ``--backend nccl`` (untested here) and the tensors go to ``cuda:LOCAL_RANK``.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist

import attnkit
from attnkit import distributed as sp
from attnkit import masks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scheme", default="ring", choices=sp.SCHEMES)
    parser.add_argument("--layout", default="zigzag", choices=sp.LAYOUTS)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--backend", default="gloo")
    args = parser.parse_args()
    dist.init_process_group(args.backend)
    device = torch.device(f"cuda:{os.environ.get('LOCAL_RANK', 0)}") if args.backend == "nccl" else torch.device("cpu")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 8, args.length, 16, dtype=torch.float64, generator=g).to(device) for _ in range(3))
    mask = masks.causal() & masks.sliding_window(args.length // 8)

    full = [t.clone().requires_grad_() for t in (q, k, v)]
    attnkit.attention(*full, mask=mask).sum().backward()

    local = [sp.shard(t, layout=args.layout).requires_grad_() for t in (q, k, v)]
    with sp.count_bytes() as tally:
        out = sp.attention(*local, mask=mask, scheme=args.scheme, layout=args.layout)
        out.sum().backward()
    cut = lambda t: sp.shard(t, layout=args.layout)
    want_out = cut(attnkit.attention(q, k, v, mask=mask))
    errors = torch.tensor([(out - want_out).abs().max().item()]
                          + [(a.grad - cut(b.grad)).abs().max().item() for a, b in zip(local, full, strict=True)],
                          dtype=torch.float64, device=device)
    dist.all_reduce(errors, op=dist.ReduceOp.MAX)
    sent = torch.tensor([tally.total], dtype=torch.int64, device=device)
    dist.all_reduce(sent, op=dist.ReduceOp.MAX)
    if dist.get_rank() == 0:
        print(f"{args.scheme}/{args.layout} on {dist.get_world_size()} ranks: max |diff| output {errors[0]:.1e}, "
              f"dq {errors[1]:.1e}, dk {errors[2]:.1e}, dv {errors[3]:.1e}; most bytes sent by a rank: {int(sent)}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
