"""Train a small language model with its sequence split over the ranks, and the same model on one process.

    torchrun --nproc-per-node 4 -m attnkit.lab.sequence_parallel_lm [--scheme ring] [--layout zigzag] [--steps 20]

(from an installed attnkit, wheel or clone; in a clone ``examples/sequence_parallel_lm.py`` runs the same.)

Task: multi-query associative recall (``attnkit.lab.tasks``, 32 tokens per example). Every rank
holds the same model (DDP keeps the parameters equal) and its shard of each batch's tokens;
its attention layers are :class:`attnkit.distributed.modules.SequenceParallelSelfAttention`.
Rank 0 also trains the one-process model from the same initial parameters on the full batch
and prints both losses each step and their largest difference (float64).
"""

from __future__ import annotations

import argparse
import functools
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from attnkit import distributed as sp
from attnkit.distributed.modules import SequenceParallelSelfAttention
from attnkit.lab import tasks
from attnkit.models import TransformerLM


def loss_sum(model, inputs, targets):
    logits = model(inputs)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum", ignore_index=-100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scheme", default="ring", choices=sp.SCHEMES)
    parser.add_argument("--layout", default="zigzag", choices=sp.LAYOUTS)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    torch.set_num_threads(1)
    task = tasks.get("mqar", num_pairs=8, num_keys=16, num_values=16, gap=8)
    kwargs: dict[str, Any] = {"dim": 32, "num_heads": 4, "num_layers": 2, "positional": None, "dropout": 0.0}
    torch.manual_seed(0)
    one = TransformerLM(task.vocab_size, **kwargs).double()
    factory = functools.partial(SequenceParallelSelfAttention, scheme=args.scheme, layout=args.layout)
    many = TransformerLM(task.vocab_size, attention=factory, **kwargs).double()
    many.load_state_dict(one.state_dict())
    ddp = DistributedDataParallel(many)
    opt_one, opt_many = (torch.optim.Adam(m.parameters(), lr=3e-3) for m in (one, many))
    g = torch.Generator().manual_seed(1)
    worst = 0.0
    for step in range(args.steps):
        batch = task.sample(16, generator=g)  # the same batch on every rank
        count = (batch["targets"] != -100).sum()
        cut = functools.partial(sp.shard, dim=1, layout=args.layout)
        local = loss_sum(ddp, cut(batch["inputs"]), cut(batch["targets"])) / count
        opt_many.zero_grad()
        (local * world).backward()  # DDP averages the ranks' gradients: their sum is the full loss's gradient
        opt_many.step()
        total = local.detach().clone()
        dist.all_reduce(total)
        if rank == 0:
            reference = loss_sum(one, batch["inputs"], batch["targets"]) / count
            opt_one.zero_grad()
            reference.backward()
            opt_one.step()
            worst = max(worst, abs(total.item() - reference.item()))
            print(f"step {step:3d}  loss on {world} ranks {total.item():.12f}  on one process "
                  f"{reference.item():.12f}")
    if rank == 0:
        print(f"{args.scheme}/{args.layout}: largest loss difference {worst:.1e}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
