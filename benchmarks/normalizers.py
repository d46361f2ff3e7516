"""Peak memory of sigmoid attention, softpick and stick-breaking at long lengths: chunked path vs dense reference.

Each normaliser (``attnkit.functional.blockwise``) runs causal self-attention at ``L`` (B=1,
H=1, D=64, float32) on the ``chunked`` backend (the online path: key blocks, a state per
row; under autograd, checkpointed slabs of rows) and on the dense ``reference``. Every
number is the peak a call adds, measured in a fresh child process (resident memory, reset
just before the call: :mod:`attnkit.lab.analysis.memory`). The dense path is measured forward
only (its backward holds several more ``L x L`` tensors); the target is the chunked path's
forward and its forward+backward under 10% of the dense forward.

Usage: ``python benchmarks/normalizers.py [--length 16384] [--write BENCHMARKS.md]``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

NAME, TITLE = "normalizers", "Normalisers beyond softmax at long lengths (peak memory)"
NORMALIZERS = ("sigmoid_log_n", "softpick", "stick_breaking")
TARGET = 0.10  # the chunked path's peak over the dense path's
MODULE = "benchmarks.normalizers"


def child(payload: dict) -> int:
    """Bytes one call adds to the peak (run in a fresh process)."""
    import attnkit
    from attnkit.lab.analysis.memory import peak_bytes, reset_peak

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, payload["length"], 64, generator=g).requires_grad_(payload["backward"])
               for _ in range(3))
    with torch.set_grad_enabled(payload["backward"]):
        base = reset_peak()
        out = attnkit.attention(q, k, v, mask=attnkit.masks.causal(), normalize=payload["normalize"],
                                backend=payload["backend"])
        if payload["backward"]:
            out.sum().backward()
        return peak_bytes() - base


def peak(length: int, normalize: str, backend: str, backward: bool, timeout: float = 1800.0) -> int:
    """The peak of one call, from a fresh child process."""
    from attnkit.lab.benchmarking.child import child_output

    payload = {"length": length, "normalize": normalize, "backend": backend, "backward": backward}
    return int(child_output(MODULE, payload, timeout))


def rows(length: int, log=lambda line: None) -> list[dict]:
    """One row per normaliser: the chunked forward, forward+backward and the dense forward peaks, in bytes."""
    found = []
    for normalize in NORMALIZERS:
        row = {"normalize": normalize, "chunked": peak(length, normalize, "chunked", False),
               "chunked_backward": peak(length, normalize, "chunked", True),
               "dense": peak(length, normalize, "reference", False)}
        log(f"{normalize}: {row}")
        found.append(row)
    return found


def table(found: list[dict]) -> str:
    mib = 2.0 ** 20
    lines = ["| normalize | chunked forward MiB | chunked forward+backward MiB | dense forward MiB | "
             "ratio (fwd+bwd / dense fwd) | target | met |", "|---|---|---|---|---|---|---|"]
    for r in found:
        ratio = max(r["chunked"], r["chunked_backward"]) / max(r["dense"], 1)
        lines.append(f"| {r['normalize']} | {r['chunked'] / mib:.0f} | {r['chunked_backward'] / mib:.0f} | "
                     f"{r['dense'] / mib:.0f} | {ratio:.3f} | < {TARGET:.2f} | {'yes' if ratio < TARGET else 'no'} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    from attnkit.lab.benchmarking.child import run_as_child

    if run_as_child(child, argv):  # a fresh child process: one measurement
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--length", type=int, default=16384)
    ap.add_argument("--write", type=Path, help="replace the normalizers section in this Markdown file")
    args = ap.parse_args(argv)
    found = rows(args.length, log=lambda line: print(line, file=sys.stderr))
    text = (f"`python benchmarks/normalizers.py --length {args.length}` (torch {torch.__version__}, causal, B=1, "
            "H=1, D=64, float32; the peak one call adds, each in a fresh process)\n\n" + table(found))
    from attnkit.lab.benchmarking.sections import emit

    return emit(text, args.write, NAME, TITLE)


if __name__ == "__main__":
    sys.exit(main())
