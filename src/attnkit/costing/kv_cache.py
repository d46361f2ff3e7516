"""Decoding-cache bytes per token of the attention variants side by side: MHA, GQA, MQA and MLA.

Each row is a registry entry's cost at the same layer (``heads`` x ``head_dim``): the bytes its
decoding state grows by per token (``Cost.state_per_token``) for multi-head attention with
``kv_heads`` = ``heads`` (MHA), a quarter of them (GQA, groups of 4 queries; ``kv_heads`` sets
another count) and 1 (MQA), and multi-head latent attention at DeepSeek-V2's ratios
(``d_c = 4 d_h``, ``d_h^R = d_h / 2``; DeepSeek-AI 2024, arXiv:2405.04434, Table 1: MHA
``2 n_h d_h``, GQA ``2 n_g d_h``, MQA ``2 d_h``, MLA ``d_c + d_h^R`` elements per token and layer).

:func:`kv_format_rows` gives the MHA, GQA and MQA caches' bytes per token in each quantized format
(:class:`~attnkit.functional.quantize.KVFormat`: the K and V codes, plus two float32 scales per
head with per-(token, head) scales), as :class:`~attnkit.nn.KVCache` stores them.
"""

from __future__ import annotations

from typing import NamedTuple

from ..errors import ArgumentError, check_int
from .tally import ITEMSIZE
from .vocabulary import LAYER

__all__ = ["KVCacheRow", "FormatRow", "kv_cache_rows", "kv_format_rows", "kv_cache_table"]


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


class FormatRow(NamedTuple):
    """One storage format: its name and the bytes per token and layer of MHA, GQA and MQA, and the ratio to
    the full-precision dtype."""

    format: str
    mha: int
    gqa: int
    mqa: int
    ratio: float


def kv_format_rows(*, heads: int = LAYER["heads"], head_dim: int = LAYER["head_dim"], kv_heads: int | None = None,
                   dtype: str = "float32") -> list[FormatRow]:
    """The full-precision ``dtype`` first, then every :data:`~attnkit.functional.quantize.KINDS` with per (token,
    head) and per tensor scales, at the key/value head counts of :func:`kv_cache_rows`."""
    from ..functional.quantize import KINDS, KVFormat

    counts = [r.values // (2 * head_dim) for r in kv_cache_rows(heads=heads, head_dim=head_dim, kv_heads=kv_heads,
                                                                dtype=dtype)[:3]]
    full = [2 * n * head_dim * ITEMSIZE[dtype] for n in counts]
    rows = [FormatRow(dtype, full[0], full[1], full[2], 1.0)]
    for kind in KINDS:
        for granularity in ("token_head", "tensor"):
            fmt = KVFormat(kind, granularity)
            if head_dim % fmt.per_element:
                continue  # int4 packs pairs of features
            sizes = [fmt.bytes_per_token(n, head_dim) for n in counts]
            rows.append(FormatRow(str(fmt), sizes[0], sizes[1], sizes[2], sizes[0] / full[0]))
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
    formats = kv_format_rows(heads=heads, head_dim=head_dim, kv_heads=kv_heads, dtype=dtype)
    format_head = ("format", f"MHA ({rows[0].setting})", f"GQA ({rows[1].setting})", f"MQA ({rows[2].setting})",
                   f"vs {dtype}")
    format_body = [(f.format, f"{f.mha} B", f"{f.gqa} B", f"{f.mqa} B", f"{f.ratio:.3f}") for f in formats]
    widths = [max(len(line[i]) for line in (format_head, *format_body)) for i in range(len(format_head))]
    table = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
             for line in (format_head, *format_body)]
    return "\n".join([title, *lines, "", "Bytes per token and layer by storage format (attnkit.nn.KVCache kv_format=; "
                      "codes plus float32 scales):", *table])


def _kib(n: int) -> str:
    return f"{n / 1024:.1f} KiB" if n < 1 << 20 else f"{n / 2**20:.2f} MiB"
