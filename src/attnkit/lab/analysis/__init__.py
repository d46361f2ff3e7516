"""See and measure attention: record maps from any model, summarise them, count costs, time and scale.

``AttentionRecorder`` records the weights of every attnkit attention call inside a
block; :func:`recording_from_outputs` turns a transformers model's ``output_attentions``
tuples into one and :func:`record_transformers` runs such a model on texts (transformers is
imported only then); :mod:`.stats` summarises maps; :func:`cost` counts FLOPs, bytes and peak memory
analytically (the :mod:`.cost` subpackage); :func:`kv_quant_error` measures each layer's attention
error under a quantized KV cache format; :func:`scaling` measures time and memory
against length; :mod:`.timing` (the one timing loop of every measurement) and :mod:`.memory`
time and measure side by side with PyTorch (``attnkit bench``; :mod:`attnkit.lab.benchmarking`
builds the benchmark suite's rows on them).
"""

from ...costing.analytic import Cost, cost, sizes
from .kv_quant import KVQuantReport, kv_quant_error
from .model_maps import layer_maps, recording_from_outputs
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
from .transformers_run import load_transformers, record_transformers

__all__ = [
    "AttentionRecorder", "Cost", "KVQuantReport", "RecordedMap", "ScalingTable", "Summary", "SummaryRow",
    "TopPositions", "attention_distance", "cost", "entropy", "fit_exponent", "head_agreement", "kv_quant_error",
    "layer_maps", "load_transformers", "record_transformers",
    "recording_from_outputs", "scaling", "sizes", "sparsity", "summary", "top_positions",
]
