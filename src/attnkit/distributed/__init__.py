"""Sequence parallelism on ``torch.distributed``: exact attention over a sequence split across processes.

``attention(q, k, v, scheme=..., layout=..., group=...)`` takes this rank's shards
and returns this rank's shard of the output; ``shard`` and ``gather`` move between
the full tensor and the shards; ``count_bytes`` measures what the schemes send.
``recurrence(q, k, v, g, beta, ...)`` runs the linear recurrences of
:mod:`attnkit.functional.linear` (decays, gates, the delta rule) on shards, and
``decay_linear.sequence_parallel(layer, x)`` the layers built on them. See docs/DISTRIBUTED.md.
"""

from . import decay_linear
from .api import DECODE_SCHEMES, SCHEMES, attention
from .comm import count_bytes
from .decay_linear import recurrence
from .layouts import LAYOUTS, gather, shard

__all__ = ["attention", "recurrence", "decay_linear", "shard", "gather", "count_bytes", "SCHEMES", "DECODE_SCHEMES",
           "LAYOUTS"]
