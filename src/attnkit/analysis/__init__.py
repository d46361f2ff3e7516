"""See and measure attention: record maps from any model, summarise them, count costs, time and scale.

``AttentionRecorder`` records the weights of every attnkit attention call inside a
block; :mod:`.stats` summarises maps; :mod:`.bench` and :mod:`.memory` measure.
"""

from .recorder import AttentionRecorder, RecordedMap
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

__all__ = ["AttentionRecorder", "RecordedMap", "Summary", "SummaryRow", "TopPositions", "attention_distance",
           "entropy", "head_agreement", "sparsity", "summary", "top_positions"]
