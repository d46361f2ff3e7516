"""Decoding-cache bytes per token of the attention variants side by side: MHA, GQA, MQA and MLA.

Each row is a registry entry's cost at the same layer (``heads`` x ``head_dim``): the bytes its
decoding state grows by per token (``Cost.state_per_token``) for multi-head attention with
``kv_heads`` = ``heads`` (MHA), a quarter of them (GQA, groups of 4 queries; ``kv_heads`` sets
another count) and 1 (MQA), and multi-head latent attention at DeepSeek-V2's ratios
(``d_c = 4 d_h``, ``d_h^R = d_h / 2``; DeepSeek-AI 2024, arXiv:2405.04434, Table 1: MHA
``2 n_h d_h``, GQA ``2 n_g d_h``, MQA ``2 d_h``, MLA ``d_c + d_h^R`` elements per token and layer).
"""

from __future__ import annotations

from typing import NamedTuple

from ..errors import ArgumentError, check_int
from .tally import ITEMSIZE
from .vocabulary import LAYER

__all__ = ["KVCacheRow", "kv_cache_rows", "kv_cache_table"]


class KVCacheRow(NamedTuple):
    """One variant: its label, registry entry, the setting that makes it, and its cache per token and layer."""

    label: str
    entry: str
    setting: str
    values: int
    bytes: int


def kv_cache_rows(*, heads: int = LAYER["heads"], head_dim: int = LAYER["head_dim"], kv_heads: int | None = None,
                  dtype: str = "float32") -> list[KVCacheRow]:
    """The four rows at ``heads`` heads of ``head_dim`` features (GQA with ``kv_heads``, default ``heads // 4``)."""
    from .analytic import cost

    check_int("kv_cache_rows", "heads", heads, 1)
    check_int("kv_cache_rows", "head_dim", head_dim, 1)
    if dtype not in ITEMSIZE:
        raise ArgumentError(f"kv_cache_rows: dtype must be one of {', '.join(ITEMSIZE)}; got {dtype!r}")
    groups = max(1, heads // 4) if kv_heads is None else check_int("kv_cache_rows", "kv_heads", kv_heads, 1)
    if heads % groups:
        raise ArgumentError(f"kv_cache_rows: kv_heads must divide heads; got heads={heads}, kv_heads={groups}")
    layer = {"heads": heads, "head_dim": head_dim, "dtype": dtype, "batch": 1, "q_len": 1}
    rows = []
    for label, n in (("MHA", heads), ("GQA", groups), ("MQA", 1)):
        c = cost("multi-head", kv_heads=n, **layer)
        rows.append(KVCacheRow(label, "multi-head", f"kv_heads={n}", c.state_per_token // ITEMSIZE[dtype],
                               c.state_per_token))
    c = cost("multi-head-latent", **layer)
    setting = f"kv_lora_rank={c.sizes['kv_lora_rank']}, qk_rope_head_dim={c.sizes['qk_rope_head_dim']}"
    rows.append(KVCacheRow("MLA", "multi-head-latent", setting, c.state_per_token // ITEMSIZE[dtype],
                           c.state_per_token))
    return rows


def kv_cache_table(*, heads: int = LAYER["heads"], head_dim: int = LAYER["head_dim"], kv_heads: int | None = None,
                   dtype: str = "float32", tokens: int = LAYER["q_len"]) -> str:
    """The rows as a plain-text table (what ``attnkit cost --kv-cache`` prints), with ``tokens`` tokens' total."""
    rows = kv_cache_rows(heads=heads, head_dim=head_dim, kv_heads=kv_heads, dtype=dtype)
    base = rows[0].bytes
    head = ("variant", "registry entry", "setting", "values/token", "bytes/token", f"{tokens} tokens", "vs MHA")
    body = [(r.label, r.entry, r.setting, str(r.values), str(r.bytes), _kib(r.bytes * tokens),
             f"{r.bytes / base:.3f}") for r in rows]
    widths = [max(len(line[i]) for line in (head, *body)) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() for line in (head, *body)]
    title = f"KV-cache per token and layer: {heads} heads of {head_dim} features, {dtype}"
    return "\n".join([title, *lines])


def _kib(n: int) -> str:
    return f"{n / 1024:.1f} KiB" if n < 1 << 20 else f"{n / 2**20:.2f} MiB"
