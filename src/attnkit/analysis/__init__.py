"""See and measure attention: record maps from any model, summarise them, count costs, time and scale.

``AttentionRecorder`` records the weights of every attnkit attention call inside a
block; :mod:`.stats` summarises maps; :func:`cost` counts FLOPs, bytes and peak memory
analytically (the :mod:`.cost` subpackage); :func:`scaling` measures time and memory
against length; :mod:`.timing` and :mod:`.memory` time and measure side by side with
PyTorch (``attnkit bench``; the benchmark suite's harness builds on them in
``benchmarks/harness/`` of the source tree).
"""

from .cost import Cost, cost, sizes
from .recorder import AttentionRecorder, RecordedMap
from .scaling import ScalingTable, fit_exponent, scaling
from .stats import (
                    Summary,
                    SummaryRow,
                    TopPositions,
                    attention_distance,
                    entropy,
                    head_agreement,
                    sparsity,
                    summary,
                    top_positions,
)

__all__ = [
    "AttentionRecorder", "Cost", "RecordedMap", "ScalingTable", "Summary", "SummaryRow", "TopPositions",
    "attention_distance", "cost", "entropy", "fit_exponent", "head_agreement", "scaling", "sizes", "sparsity",
    "summary", "top_positions",
]
