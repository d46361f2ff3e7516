"""The GPU rows of BENCHMARKS.md: attnkit against torch's own GPU engines, as ratios in one run.

Three groups (bfloat16/float16, B x L = 16k tokens, H = 16, D = 128):

- attnkit against SDPA as a user calls it: no mask, ``is_causal``, GQA (4 K/V heads) with
  ``is_causal``, L = 1k .. 32k (target: within 1.05x);
- attnkit against compiled FlexAttention given the same BlockMask and score_mod (attnkit's
  own: the ratio is what attnkit adds around the kernel): window ±128, Sparse Transformer
  strided, documents, BigBird, ALiBi, soft-cap, L = 8k (target: within 1.10x);
- window ±128 at L = 16k against SDPA with the dense bool mask (target: 10x faster), and
  flash-attn's ``flash_attn_func`` where it is installed (no mask, causal).

Every time is :func:`attnkit.lab.analysis.timing.time_interleaved` on the device (synchronised
around each sample); peak memory is the CUDA allocator's, per side, in this process
(:mod:`attnkit.lab.analysis.memory`); outputs (and gradients) are compared with the suite's
tolerance. Compilation happens before timing and is reported as a note.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import attnkit
from attnkit.lab.analysis import memory
from attnkit.lab.analysis.patterns import make_bias, make_mask
from attnkit.lab.analysis.timing import time_interleaved, time_once
from attnkit.lab.benchmarking.check import max_diff, tolerance, verdict

__all__ = ["GpuRow", "rows", "measure", "TOKENS"]

TOKENS = 16384  # B x L: the batch shrinks as the sequence grows
LENGTHS = (1024, 2048, 4096, 8192, 16384, 32768)
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
STRUCTURED = {  # label: mask text, bias name
    "window ±128": ("sliding_window(128, 128)", None),
    "Sparse Transformer strided": ("causal() & strided(128)", None),
    "documents": ("documents(12)", None),
    "BigBird": ("bigbird(128, 3, 2, 2)", None),
    "ALiBi": ("causal()", "alibi"),
    "soft-cap": ("causal()", "softcap"),
}


@dataclass(frozen=True)
class GpuRow:
    """One compared pair: attnkit's call and ``against`` ("sdpa", "sdpa-mask", "flex", "flash-attn")."""

    label: str
    against: str
    length: int
    dtype: str = "bfloat16"
    mask: str | None = None
    bias: str | None = None
    kv_heads: int | None = None
    backward: bool = False
    goal: float | None = None
    heads: int = 16
    head_dim: int = 128
    tokens: int = TOKENS

    @property
    def batch(self) -> int:
        return max(1, self.tokens // self.length)

    def sizes(self) -> str:
        kv = "" if self.kv_heads is None else f" Hkv={self.kv_heads}"
        return f"B={self.batch} H={self.heads}{kv} L={self.length} D={self.head_dim} {self.dtype}"


def rows(quick: bool = False) -> list[GpuRow]:
    """Every GPU row, the most telling first (a run cut short by its budget keeps them); ``quick``: tiny sizes."""
    lengths, structured, window = ((256, 512), 512, 512) if quick else (LENGTHS, 8192, 16384)
    size = dict(tokens=1024, heads=2, head_dim=16) if quick else {}
    simple = {"no mask": (None, None), "causal": ("causal()", None), "GQA, causal": ("causal()", 1 if quick else 4)}
    sdpa = lambda dtype, backward: [GpuRow(label, "sdpa", length, dtype, mask, kv_heads=kv, backward=backward,
                                           goal=1.05, **size)
                                    for length in lengths for label, (mask, kv) in simple.items()]
    flex = lambda backward: [GpuRow(label, "flex", structured, mask=mask, bias=bias, backward=backward, goal=1.10,
                                    **size) for label, (mask, bias) in STRUCTURED.items()]
    window_row = GpuRow("window ±128", "sdpa-mask", window, mask=STRUCTURED["window ±128"][0], backward=True,
                        goal=0.1, **size)
    flash = [GpuRow(label, "flash-attn", length, mask=mask, goal=1.05, **size) for length in lengths[::2]
             for label, (mask, kv) in simple.items() if kv is None]
    # No compile first (quick rows), then the compiled FlexAttention rows, then the rest.
    return [window_row, *sdpa("bfloat16", False), *flex(False), *flex(True), *sdpa("bfloat16", True),
            *sdpa("float16", False), *flash]


def _inputs(row: GpuRow, device):
    g = torch.Generator().manual_seed(0)
    kv = row.kv_heads or row.heads
    shapes = [(row.batch, row.heads, row.length, row.head_dim)] + [(row.batch, kv, row.length, row.head_dim)] * 2
    return [torch.randn(s, generator=g).to(device, DTYPES[row.dtype]).requires_grad_(row.backward) for s in shapes]


def _theirs(row: GpuRow, q, k, v, mask, modifier):
    """``(name, forward callable)`` of the comparison, or raises LookupError with why it cannot run here."""
    gqa = q.shape[1] != k.shape[1]
    if row.against == "sdpa":
        causal = mask is not None
        return ("torch sdpa" + (" (is_causal)" if causal else ""),
                lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa))
    if row.against == "sdpa-mask":
        dense = mask.materialize(row.length, row.length, device=q.device)[0, 0]
        return "torch sdpa (dense bool mask)", lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=dense)
    if row.against == "flex":
        from attnkit.core import _prepare
        from attnkit.kernels import flex
        p = _prepare(q, k, v, mask=mask, bias=modifier)
        block_mask, score_mod, kernel = flex.block_mask(p), flex.score_mod(p), flex.kernel()
        return ("compiled flex_attention (the same BlockMask)",
                lambda: kernel(q, k, v, score_mod=score_mod, block_mask=block_mask, enable_gqa=gqa))
    try:
        from flash_attn import flash_attn_func
    except ImportError as err:
        raise LookupError("flash-attn is not installed") from err
    causal = mask is not None
    return ("flash_attn_func" + (" (causal)" if causal else ""),
            lambda: flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                    causal=causal).transpose(1, 2))


def _step(fn, leaves, backward: bool):
    def run():
        for t in leaves:
            t.grad = None
        out = fn()
        if backward:
            out.float().sum().backward()
        return out
    return run


def _outputs(fn, leaves, backward: bool) -> list[torch.Tensor]:
    out = _step(fn, leaves, backward)().detach().float()
    return [out] + ([t.grad.float() for t in leaves] if backward else [])


def _peak(fn, device) -> int | None:
    if torch.device(device).type != "cuda":
        return None
    base = memory.reset_peak(device)
    fn()
    return memory.peak_bytes(device) - base


def measure(row: GpuRow, *, device="cuda", repeats: int = 5) -> dict:
    """One row: both sides timed interleaved, their outputs compared, their peaks read; plain JSON types."""
    q, k, v = _inputs(row, device)
    mask, modifier = make_mask(row.mask, row.length), make_bias(row.bias, row.heads)
    result = {**dataclasses.asdict(row), "sizes": row.sizes(), "pass": "fwd+bwd" if row.backward else "fwd",
              "device": torch.cuda.get_device_name(device) if torch.device(device).type == "cuda" else str(device),
              "torch": torch.__version__, "notes": {}}
    try:
        name, theirs = _theirs(row, q, k, v, mask, modifier)
    except LookupError as err:
        return {**result, "verdict": "n/a", "notes": {"n/a": str(err)}}
    ours = lambda: attnkit.attention(q, k, v, mask=mask, bias=modifier)
    result["ours"] = f"attnkit -> {attnkit.explain(q, k, v, mask=mask, bias=modifier).path}"
    result["theirs"] = name
    sides = {"ours": _step(ours, (q, k, v), row.backward), "theirs": _step(theirs, (q, k, v), row.backward)}
    with torch.set_grad_enabled(row.backward):
        for side, fn in sides.items():  # compiles and caches before any timing
            result["notes"][f"{side} first call s"] = round(time_once(fn, device)[0], 2)
        stats = time_interleaved(sides, repeats, device=device)
        peaks = {side: _peak(fn, device) for side, fn in sides.items()}
    diff, scale = max_diff(_outputs(ours, (q, k, v), row.backward), _outputs(theirs, (q, k, v), row.backward))
    ratio = stats["ours"][0] / stats["theirs"][0]
    diff_ok = diff <= tolerance(row.dtype) * max(1.0, scale)
    milliseconds = {f"{side}_ms": [1e3 * t for t in stats[side][:3]] for side in sides}
    return {**result, **milliseconds,
            "runs": stats["ours"][3], "ratio": ratio, "max_diff": diff if math.isfinite(diff) else None,
            "diff_ok": diff_ok, "ours_mib": None if peaks["ours"] is None else peaks["ours"] / 2**20,
            "theirs_mib": None if peaks["theirs"] is None else peaks["theirs"] / 2**20,
            "verdict": verdict(ratio, row.goal, diff_ok)}
