"""Soak: thousands of mixed calls, and resident memory stops growing (caches bounded, nothing retained).

Calls mix backends, masks built afresh and masks reused over hundreds of lengths (their cached
block layouts, plans, slab biases and kernel masks must stay bounded), biases, gradients and
modules. Resident memory is read from /proc after each round of calls; after a warm-up round it
must stay on a plateau. Marked slow: ``.venv/bin/python -m pytest -m slow tests/contract/test_soak.py``.
"""

from __future__ import annotations

import gc
import os
import warnings

import pytest
import torch

import attnkit
import attnkit.nn
from attnkit import masks
from attnkit.bias import alibi, softcap

STATM = "/proc/self/statm"
ROUNDS, CALLS_PER_ROUND = 6, 600
PLATEAU_MIB = 48  # allowed wander after the warm-up round (allocator noise); a leak per call grows without end


def _resident_mib() -> float:
    with open(STATM) as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _calls():
    """Call makers ``(i, length) -> None``; the reused masks live as long as the soak."""
    reused = {"band": masks.causal() & masks.sliding_window(32), "global": masks.global_tokens([0, 7]) |
              masks.sliding_window(16, 16), "strided": masks.causal() & masks.strided(24)}
    mha = attnkit.nn.MultiHeadAttention(32, 4, batch_first=True)
    longformer = attnkit.nn.LongformerAttention(16, 2, window=32)

    def qkv(length, seed, grad=False, heads=2):
        g = torch.Generator().manual_seed(seed)
        return tuple(torch.randn(1, heads, length, 16, generator=g).requires_grad_(grad) for _ in range(3))

    def reused_mask(i, n):
        q, k, v = qkv(n, i)
        attnkit.attention(q, k, v, mask=reused[("band", "global", "strided")[i % 3]])

    def fresh_mask(i, n):
        q, k, v = qkv(n, i, grad=True)
        out = attnkit.attention(q, k, v, mask=masks.causal() & masks.sliding_window(8 + i % 50), bias=softcap(20.0))
        out.sum().backward()

    def biased(i, n):
        q, k, v = qkv(n, i, grad=i % 2 == 0)
        out = attnkit.attention(q, k, v, mask=masks.causal(), bias=alibi(2), backend=("chunked", "auto")[i % 2])
        if out.requires_grad:
            out.sum().backward()

    def padded(i, n):
        q, k, v = qkv(n, i)
        attnkit.attention(q, k, v, mask=masks.padding([max(1, n - i % 40)]), return_lse=True)

    def module(i, n):
        x = torch.randn(2, n // 4 + 1, 32, generator=torch.Generator().manual_seed(i))
        pad = (torch.arange(x.shape[1]) >= x.shape[1] - 2).expand(2, -1)
        mha(x, x, x, key_padding_mask=pad)[0].sum().backward()
        with torch.no_grad():
            longformer(torch.randn(1, n, 16, generator=torch.Generator().manual_seed(i)))

    return (reused_mask, fresh_mask, biased, padded, module)


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(STATM), reason="reads resident memory from /proc")
def test_resident_memory_stops_growing_over_thousands_of_mixed_calls():
    calls, resident = _calls(), []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for r in range(ROUNDS):
            for j in range(CALLS_PER_ROUND):
                i = r * CALLS_PER_ROUND + j
                calls[i % len(calls)](i, 96 + (i * 7) % 700)  # ~700 distinct lengths, each seen a few times
            gc.collect()
            resident.append(_resident_mib())
    growth = max(resident[1:]) - resident[0]
    assert growth <= PLATEAU_MIB, f"resident memory per round (MiB): {[round(m) for m in resident]}"
    assert resident[-1] - resident[1] <= PLATEAU_MIB / 2, f"still growing: {[round(m) for m in resident]}"
