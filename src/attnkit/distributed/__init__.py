"""Sequence parallelism on ``torch.distributed``: exact attention over a sequence split across processes.

``attention(q, k, v, scheme=..., layout=..., group=...)`` takes this rank's shards
and returns this rank's shard of the output; ``shard`` and ``gather`` move between
the full tensor and the shards; ``count_bytes`` measures what the schemes send.
See docs/DISTRIBUTED.md.
"""

from .api import DECODE_SCHEMES, SCHEMES, attention
from .comm import count_bytes
from .layouts import LAYOUTS, gather, shard

__all__ = ["attention", "shard", "gather", "count_bytes", "SCHEMES", "DECODE_SCHEMES", "LAYOUTS"]
