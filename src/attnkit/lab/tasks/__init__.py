"""Generated learning tasks for the quality suite: no downloads, deterministic per seed, cheap.

Every task has ``name``, ``kind`` (``"tokens"``, ``"classify"``, ``"seq2seq"``, ``"pointer"``
or ``"image"``; see :class:`Task` for each kind's batch layout and metric), its sizes as
attributes, ``sample(n, generator) -> dict[str, Tensor]`` (always with ``"inputs"`` and
``"targets"``), ``accuracy(prediction, batch)`` and ``describe()``.

>>> import torch
>>> from attnkit.lab import tasks
>>> task = tasks.get("mqar")
>>> batch = task.sample(64, generator=torch.Generator().manual_seed(0))
>>> batch["inputs"].shape, task.accuracy(batch["targets"], batch)
(torch.Size([64, 24]), 1.0)
>>> "mqar" in tasks.names()
True
"""

from .associative_recall import AssociativeRecall
from .base import IGNORE_INDEX, Task, get, names
from .bigram_backcopy import BigramBackcopy
from .byte_context import ByteContext
from .byte_retrieval import ByteRetrieval
from .byte_text import ByteText
from .convex_hull import ConvexHull
from .dates import Dates
from .deciding_position import DecidingPosition
from .digits import Digits
from .document_questions import DocumentQuestions
from .event_logs import EventLogs
from .han_documents import HANDocuments
from .key_summaries import KeySummaries
from .lag_copy import LagCopy
from .listops import ListOps
from .long_listops import LongListOps
from .mad import Compression, FuzzyRecall, InContextRecall, MADSelectiveCopy, Memorization, NoisyRecall
from .mqar import MQAR
from .pathfinder import Pathfinder
from .pixel_images import PixelImages
from .pixel_legend import PixelLegend
from .repeated_block import RepeatedBlock
from .reversal import Reversal
from .selective_copy import SelectiveCopy
from .seq2seq import CharSeq2Seq
from .shapes import Shapes
from .sorting import Sorting
from .state_tracking import A5WordProblem, ModularCount, Parity, S3WordProblem, WordProblem

__all__ = [
    "Task", "get", "names", "IGNORE_INDEX", "CharSeq2Seq",
    "MQAR", "SelectiveCopy", "ListOps", "Sorting", "ConvexHull", "Dates", "Reversal", "HANDocuments",
    "EventLogs", "Shapes", "Digits", "LongListOps", "ByteText", "ByteRetrieval", "PixelImages", "Pathfinder",
    "DecidingPosition", "RepeatedBlock", "DocumentQuestions", "KeySummaries", "AssociativeRecall", "BigramBackcopy",
    "ByteContext", "PixelLegend", "ModularCount", "Parity", "WordProblem",
    "S3WordProblem", "A5WordProblem", "InContextRecall", "FuzzyRecall", "NoisyRecall", "MADSelectiveCopy",
    "Memorization", "Compression", "LagCopy",
]
