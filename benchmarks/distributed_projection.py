"""Alpha-beta projection of the sequence-parallel schemes to large world sizes and lengths (docs/DISTRIBUTED.md).

A model, not a measurement: per rank and per attention layer (forward), with

    compute  F FLOP/s on 4 * B * H * L^2 * D / W flops (half of it under a causal mask;
             the zigzag layout makes every rank's share equal)
    message  alpha + bytes / beta  (alpha: latency, beta: bandwidth per rank and direction)

    ring       W - 1 steps; each step overlaps one K/V block transfer with one block of compute:
               time = compute_step + (W - 1) * max(compute_step, alpha + block / beta)
    ulysses    all-to-alls of q, k, v and the output, each (W - 1) messages of 1/W of the shard,
               no overlap: time = compute + 4 * (W - 1) * alpha + bytes / beta; needs W | H
    allgather  a ring all-gather of K/V ((W - 1) messages of one block), then the compute:
               time = (W - 1) * (alpha + block / beta) + compute

The links: up to 8 ranks on one node's NVLink-class fabric, beyond that an InfiniBand-class
network; the figures are in LINKS. Run: python benchmarks/distributed_projection.py
"""

from __future__ import annotations

import math

# (name, alpha seconds, beta bytes/s per rank and direction)
LINKS = {"intra-node": (5e-6, 150e9), "inter-node": (15e-6, 40e9)}
FLOPS = 300e12  # achieved attention FLOP/s per device (bf16)
BATCH, HEADS, KV_HEADS, HEAD_DIM, ITEMSIZE = 1, 32, 8, 128, 2  # a 7-8B-class model layer, bf16
WORLDS = (8, 32, 128, 1024)
LENGTHS = (32 * 1024, 128 * 1024, 512 * 1024, 1024 * 1024, 4 * 1024 * 1024)


def link(world):
    return LINKS["intra-node" if world <= 8 else "inter-node"]


def compute_seconds(length, world, causal=True):
    return 4 * BATCH * HEADS * length ** 2 * HEAD_DIM / world / FLOPS * (0.5 if causal else 1.0)


def kv_block_bytes(length, world):
    return BATCH * KV_HEADS * (length // world) * 2 * HEAD_DIM * ITEMSIZE


def ring(length, world):
    alpha, beta = link(world)
    step = compute_seconds(length, world) / world
    return step + (world - 1) * max(step, alpha + kv_block_bytes(length, world) / beta)


def ulysses(length, world):
    if HEADS % world:
        return math.nan  # W must divide the query heads
    alpha, beta = link(world)
    kv_heads = KV_HEADS * (world // math.gcd(KV_HEADS, world))
    rows = BATCH * (length // world)
    moved = rows * (2 * HEADS * HEAD_DIM + 2 * kv_heads * HEAD_DIM) * ITEMSIZE * (world - 1) / world
    return compute_seconds(length, world) + 4 * (world - 1) * alpha + moved / beta


def allgather(length, world):
    alpha, beta = link(world)
    return (world - 1) * (alpha + kv_block_bytes(length, world) / beta) + compute_seconds(length, world)


def table() -> list[str]:
    schemes = {"ring": ring, "ulysses": ulysses, "allgather": allgather}
    lines = ["| W | L | compute ms | ring ms | ulysses ms | allgather ms | fastest | ring comm hidden |",
             "|---|---|---|---|---|---|---|---|"]
    for world in WORLDS:
        for length in LENGTHS:
            times = {name: f(length, world) for name, f in schemes.items()}
            best = min((t, n) for n, t in times.items() if not math.isnan(t))[1]
            alpha, beta = link(world)
            hidden = compute_seconds(length, world) / world >= alpha + kv_block_bytes(length, world) / beta
            cells = " | ".join("n/a" if math.isnan(t) else f"{t * 1e3:.3g}" for t in times.values())
            lines.append(f"| {world} | {length // 1024}k | {compute_seconds(length, world) * 1e3:.3g} | {cells} | "
                         f"{best} | {'yes' if hidden else 'no'} |")
    return lines


if __name__ == "__main__":
    print("\n".join(table()))
