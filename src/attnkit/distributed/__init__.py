"""Sequence parallelism on ``torch.distributed``: exact attention over a sequence split across processes.

``attention(q, k, v, scheme=..., layout=..., group=...)`` takes this rank's shards
and returns this rank's shard of the output; ``shard`` and ``gather`` move between
the full tensor and the shards; ``count_bytes`` measures what the schemes send.
``recurrence(q, k, v, g, beta, ...)`` runs the linear recurrences of
:mod:`attnkit.functional.recurrences` (decays, gates, the delta rule) on shards, and
``recurrences.sequence_parallel(layer, x)`` the layers built on them (``decay_linear`` is the old name of
``recurrences``, kept for one release). See docs/DISTRIBUTED.md.
"""

from . import recurrences
from .api import DECODE_SCHEMES, SCHEMES, attention
from .comm import count_bytes
from .layouts import LAYOUTS, gather, shard
from .recurrences import recurrence

decay_linear = recurrences  # the module's old name, kept for one release

__all__ = ["attention", "recurrence", "recurrences", "decay_linear", "shard", "gather", "count_bytes", "SCHEMES",
           "DECODE_SCHEMES", "LAYOUTS"]
