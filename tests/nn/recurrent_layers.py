"""The eight linear-recurrent layers, DeltaProduct, Comba and RWKV-7 at small, distinct sizes (dim 12), for the
tests that run all of them; the delta-rule layers also with negative eigenvalues (``allow_neg_eigval``: beta in
[0, 2])."""

from __future__ import annotations

import torch

from attnkit.nn import (
    Comba,
    DeltaNet,
    DeltaProduct,
    GatedDeltaNet,
    GatedLinearAttention,
    KimiDeltaAttention,
    LightningAttention,
    LogLinearGatedDeltaNet,
    LogLinearMamba2,
    Mamba2Mixer,
    RetNetRetention,
    RWKV4TimeMixing,
    RWKV7TimeMixing,
)

DIM = 12
LAYERS = {
    "retnet": lambda chunk: RetNetRetention(DIM, 3, chunk_size=chunk),
    "gla": lambda chunk: GatedLinearAttention(DIM, 2, chunk_size=chunk),
    "mamba2": lambda chunk: Mamba2Mixer(DIM, head_dim=4, state_dim=5, num_groups=2, chunk_size=chunk),
    "deltanet": lambda chunk: DeltaNet(DIM, 3, chunk_size=chunk),
    "gated_deltanet": lambda chunk: GatedDeltaNet(DIM, 4, num_key_heads=2, key_head_dim=5, value_head_dim=3,
                                                  chunk_size=chunk),
    "kda": lambda chunk: KimiDeltaAttention(DIM, 3, head_dim=5, chunk_size=chunk),
    "lightning": lambda chunk: LightningAttention(DIM, 3, head_dim=5, layer_index=1, num_layers=3, chunk_size=chunk),
    "rwkv4": lambda chunk: RWKV4TimeMixing(DIM, attention_dim=7, chunk_size=chunk),
    "deltanet_neg": lambda chunk: DeltaNet(DIM, 3, chunk_size=chunk, allow_neg_eigval=True),
    "gated_deltanet_neg": lambda chunk: GatedDeltaNet(DIM, 4, num_key_heads=2, key_head_dim=5, value_head_dim=3,
                                                      chunk_size=chunk, allow_neg_eigval=True),
    "delta_product": lambda chunk: DeltaProduct(DIM, 3, num_householder=3, chunk_size=chunk),
    "delta_product_neg": lambda chunk: DeltaProduct(DIM, 2, num_householder=2, forget_gate=False, chunk_size=chunk,
                                                    allow_neg_eigval=True),
    "kda_neg": lambda chunk: KimiDeltaAttention(DIM, 3, head_dim=5, chunk_size=chunk, allow_neg_eigval=True),
    "comba": lambda chunk: Comba(DIM, 4, num_key_heads=2, key_head_dim=5, value_head_dim=3, chunk_size=chunk),
    "comba_after_decay": lambda chunk: Comba(DIM, 3, chunk_size=chunk, read_before_decay=False),
    "rwkv7": lambda chunk: RWKV7TimeMixing(DIM, 3, decay_rank=4, a_rank=3, gate_rank=5, chunk_size=chunk),
    "log_linear_mamba2": lambda chunk: LogLinearMamba2(DIM, head_dim=4, state_dim=5, num_groups=2, chunk_size=chunk,
                                                       max_length=64),
    "log_linear_gdn": lambda chunk: LogLinearGatedDeltaNet(DIM, 4, num_key_heads=2, key_head_dim=5, value_head_dim=3,
                                                           chunk_size=chunk, max_length=64),
}
# layers whose recurrence is their own (a correction key of its own, two steps a token, Fenwick buckets that follow
# the positions): no draft tree, no pieces across ranks
OWN_RECURRENCE = ("comba", "comba_after_decay", "rwkv7", "log_linear_mamba2", "log_linear_gdn")


def layer(name: str, chunk: int = 4):
    """A float64 layer whose parameters are moved off their initial values (ones, zeros), so every one matters."""
    torch.manual_seed(0)
    built = LAYERS[name](chunk).double()
    with torch.no_grad():
        for p in built.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return built
