"""The long-range suite's roster: every long-sequence mechanism of the library, as a self-attention factory.

Each :class:`Mechanism` turns the suite's :class:`Sizes` into a factory ``(dim, num_heads) -> nn.Module``
for :class:`attnkit.models.TransformerEncoder` (one module per layer), built from attnkit's own
modules and masks; the Perceiver instead replaces the whole encoder (``attention is None``, see
:mod:`.model`). Window, block and stride sizes follow the sequence length: a window or block of
``block(L) = max(8, 2^round(log2(sqrt(L))))`` tokens, 32 at L = 1024, so each query computes
``O(sqrt(L))`` keys and the sparse patterns cover ``O(L sqrt(L))`` pairs (Child et al. 2019, Sec. 4).

``linear_time`` marks the mechanisms whose cost grows linearly (or as ``L sqrt(L)``) in the length,
``global_tokens`` those with tokens every query sees (Longformer, BigBird), ``fixed_state`` the
kernel/low-rank ones that compress the keys into a state of fixed size (Linformer, linear,
Performer; Zoology, Arora et al. 2023, arXiv:2312.04927), ``local_only`` those limited to a window,
``chosen_blocks`` those whose queries each attend a few key blocks chosen from the data (NSA, MoBA:
:data:`SELECTED` blocks of ``block(L)`` keys, so ``O(sqrt(L))`` keys per query as above, plus a gate or
compressed keys of ``O(L / block(L))`` per query). The claims in :mod:`.claims` select mechanisms by
these flags.

NSA and MoBA are causal, as their papers' modules are (decoders): inside the suite's encoder each
position sees only the positions up to it. The suite trains them where their claim is read, on the
associative recall, whose facts all come before its queries (:mod:`.suite`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from .... import masks
from ....errors import ArgumentError, did_you_mean
from ....nn.bigbird import BigBirdAttention
from ....nn.blocksparse import BlockSparseAttention
from ....nn.lambda_layer import LambdaLayer
from ....nn.linear import LinearAttention, PerformerAttention
from ....nn.linformer import LinformerAttention
from ....nn.local import LocalAttention
from ....nn.longformer import LongformerAttention
from ....nn.moba import MoBA
from ....nn.nsa import NativeSparseAttention
from ....nn.reformer import ReformerAttention
from ....nn.sparse_transformer import SparseTransformerAttention

__all__ = ["Sizes", "Mechanism", "MECHANISMS", "mechanism", "block", "GlobalTokens", "LINFORMER_K", "SELECTED"]

LINFORMER_K = 8  # Linformer's projected length k: its k x L projection (shared by keys and values) is parameters
SELECTED = 4
"""Key blocks each query of NSA and MoBA attends: NSA's first and two nearest blocks among them (its paper's
setting: 1 initial and 2 local blocks of its 16), MoBA's own block among them; a few of many, as in the papers."""


@dataclass(frozen=True)
class Sizes:
    """What a mechanism may depend on: sequence ``length``, image ``side`` (None off images), width, heads."""

    length: int
    dim: int
    heads: int
    side: int | None = None


def block(length: int) -> int:
    """Window/block/stride size for ``length``: the power of two nearest ``sqrt(length)``, at least 8."""
    return max(8, 2 ** round(math.log2(math.sqrt(length))))


class GlobalTokens(nn.Module):
    """:class:`LongformerAttention` with its global tokens where the task asks (Beltagy et al. 2020, Sec. 3.1).

    The paper chooses the global tokens per task: a question's tokens in question answering, the
    class token in classification. ``questions`` holds the current batch's question tokens, a bool
    ``(B, n)`` tensor the model sets from the task's
    :meth:`~attnkit.lab.tasks.Task.question_positions` before each forward; None (a task that marks
    none) makes the first position the global token, a class token. A global token attends
    everywhere and is attended from everywhere; the others use the sliding window.
    Shapes: ``(B, n, dim) -> (B, n, dim)``.
    """

    def __init__(self, attention: LongformerAttention):
        super().__init__()
        self.attention = attention
        self.questions: torch.Tensor | None = None

    def forward(self, x):
        return self.attention(x, global_tokens=[0] if self.questions is None else self.questions)


Factory = Callable[[int, int], nn.Module]


@dataclass(frozen=True)
class Mechanism:
    """One roster entry: its name, paper, how it is built from :class:`Sizes`, its registry entries and family flags.

    ``uses``: the registry entries (:func:`attnkit.registry.entries`) the mechanism's model exercises
    (:mod:`attnkit.lab.tour.catalogue` checks them).
    """

    name: str
    paper: str
    build: Callable[[Sizes], Factory] | None
    uses: tuple[str, ...] = ()
    linear_time: bool = False
    global_tokens: bool = False
    fixed_state: bool = False
    local_only: bool = False
    images_only: bool = False
    chosen_blocks: bool = False

    def factory(self, sizes: Sizes) -> Factory | None:
        """The self-attention factory for ``sizes`` (None for the Perceiver, which replaces the encoder)."""
        if self.images_only and sizes.side is None:
            raise ArgumentError(f"long suite: mechanism {self.name!r} runs on image tasks only (it needs the side)")
        return None if self.build is None else self.build(sizes)


def _lambda(s: Sizes) -> Factory:
    # The local lambda convolution over the flattened image, its scope one image row either side (2 side + 1
    # positions: the pixel's row and the rows above and below), Bello 2021, Sec. 4.3.
    return lambda d, h: LambdaLayer(d, key_dim=max(1, d // h), num_heads=h, local_context=2 * s.side + 1)


def _nsa(s: Sizes) -> Factory:
    # Compressed blocks of half a selection block every quarter block (the paper's l = 32, d = 16 for l' = 64),
    # selection blocks and the window of block(L) keys.
    b = block(s.length)
    return lambda d, h: NativeSparseAttention(d, h, compress_block=b // 2, compress_stride=b // 4, select_block=b,
                                              num_selected=SELECTED, window=b)


_ENTRIES = [
    Mechanism("softmax", "Vaswani et al. 2017, arXiv:1706.03762", lambda s: "softmax",
              ("scaled-dot-product", "multi-head")),
    Mechanism("local", "Luong et al. 2015, arXiv:1508.04025 (local attention, blocks)",
              lambda s: lambda d, h: LocalAttention(d, h, block(s.length), mode="blocks"), ("local",),
              linear_time=True, local_only=True),
    Mechanism("sliding-window", "Beltagy et al. 2020, arXiv:2004.05150 (window alone)",
              lambda s: lambda d, h: _masked(d, h, masks.sliding_window(block(s.length) // 2, block(s.length) // 2)),
              ("sliding-window", "multi-head"), linear_time=True, local_only=True),
    Mechanism("sparse-strided", "Child et al. 2019, arXiv:1904.10509, Sec. 4.2 (strided)",
              lambda s: lambda d, h: SparseTransformerAttention(d, h, "strided", stride=block(s.length), causal=False),
              ("sparse-transformer", "sparse-strided"), linear_time=True),
    Mechanism("sparse-fixed", "Child et al. 2019, arXiv:1904.10509, Sec. 4.2 (fixed)",
              lambda s: lambda d, h: SparseTransformerAttention(d, h, "fixed", stride=block(s.length),
                                                                summary=max(1, block(s.length) // 8), causal=False),
              ("sparse-transformer", "sparse-fixed"), linear_time=True),
    Mechanism("longformer", "Beltagy et al. 2020, arXiv:2004.05150",
              lambda s: lambda d, h: GlobalTokens(LongformerAttention(d, h, window=block(s.length))),
              ("longformer",), linear_time=True, global_tokens=True),
    Mechanism("bigbird", "Zaheer et al. 2020, arXiv:2007.14062",
              lambda s: lambda d, h: BigBirdAttention(d, h, block_size=block(s.length) // 2, window_blocks=3,
                                                      global_blocks=1, random_blocks=2), ("bigbird",),
              linear_time=True, global_tokens=True),
    Mechanism("block-sparse", "Child et al. 2019, arXiv:1904.10509, Sec. 5.5",
              lambda s: lambda d, h: BlockSparseAttention(d, h, masks.fixed(block(s.length), 1)),
              ("block-sparse", "sparse-fixed"), linear_time=True),
    Mechanism("reformer", "Kitaev et al. 2020, arXiv:2001.04451",
              lambda s: lambda d, h: ReformerAttention(d, h, n_buckets=max(2, 2 * (s.length // 128)), n_hashes=2,
                                                       chunk_size=block(s.length) * 2), ("reformer",),
              linear_time=True),
    Mechanism("linformer", "Wang et al. 2020, arXiv:2006.04768",
              lambda s: lambda d, h: LinformerAttention(d, h, max_len=s.length, k_proj_dim=LINFORMER_K,
                                                        sharing="key-value"), ("linformer",),
              linear_time=True, fixed_state=True),
    Mechanism("linear", "Katharopoulos et al. 2020, arXiv:2006.16236",
              lambda s: lambda d, h: LinearAttention(d, h), ("linear-attention",), linear_time=True, fixed_state=True),
    Mechanism("performer", "Choromanski et al. 2021, arXiv:2009.14794",
              lambda s: lambda d, h: PerformerAttention(d, h, num_features=2 * (d // h)), ("performer",),
              linear_time=True, fixed_state=True),
    Mechanism("perceiver", "Jaegle et al. 2021, arXiv:2103.03206", None, ("perceiver-encoder", "perceiver-attention"),
              linear_time=True),
    Mechanism("lambda", "Bello 2021, arXiv:2102.08602", _lambda, ("lambda-layer-local",), linear_time=True,
              images_only=True),
    Mechanism("nsa", "Yuan et al. 2025, arXiv:2502.11089 (Native Sparse Attention)", _nsa,
              ("native-sparse-attention",), chosen_blocks=True),
    Mechanism("moba", "Lu et al. 2025, arXiv:2502.13189 (Mixture of Block Attention)",
              lambda s: lambda d, h: MoBA(d, h, block_size=block(s.length), top_k=SELECTED), ("moba",),
              chosen_blocks=True),
]


def _masked(dim: int, heads: int, mask) -> nn.Module:
    from ....models.self_attention import SoftmaxSelfAttention

    return SoftmaxSelfAttention(dim, heads, mask=mask)


MECHANISMS: dict[str, Mechanism] = {m.name: m for m in _ENTRIES}


def mechanism(name: str) -> Mechanism:
    """The roster entry called ``name``; an unknown name is an ArgumentError with a suggestion."""
    if name not in MECHANISMS:
        raise ArgumentError(f"long suite: unknown mechanism {name!r}; {did_you_mean(name, MECHANISMS)}"
                            f"known: {', '.join(MECHANISMS)}")
    return MECHANISMS[name]
