"""Absolute positional encodings added to token embeddings, and the registry entries of every positional family.

Rotary embeddings live in :mod:`attnkit.nn.rotary`; ALiBi and relative position
bias are score modifiers in :mod:`attnkit.bias`, passed to :func:`attnkit.attention`
as ``bias=``.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from .. import bias as bias_mod
from ..core import attention
from ..costing.attend import attention_spec
from ..costing.spec import Spec
from ..costing.tally import dtype_of, randn
from ..errors import ArgumentError, ShapeError
from ..registry.entry import Entry, register
from ._inputs import check_sequence
from .rotary import RotaryEmbedding, angle_dtype, check_base, check_dim, check_offset

__all__ = ["SinusoidalPositionalEncoding", "LearnedPositionalEmbedding", "RotaryEmbedding"]


def _check_length(who: str, max_len: int | None, length: int, offset: int) -> None:
    if max_len is not None and offset + length > max_len:
        raise ShapeError(f"{who}: positions {offset}..{offset + length - 1} (offset={offset}, length={length}) "
                         f"exceed max_len={max_len}; expected offset + length <= {max_len}")


class SinusoidalPositionalEncoding(nn.Module):
    """Fixed sinusoidal positional encoding added to the input (the Transformer's).

    Vaswani et al. 2017, "Attention Is All You Need", arXiv:1706.03762, Sec. 3.5::

        PE(pos, 2i)     = sin(pos / base^(2i / d))
        PE(pos, 2i + 1) = cos(pos / base^(2i / d))
        out = dropout(x + PE[offset : offset + n])

    Notation: paper ``d_model`` = ``dim``, ``10000`` = ``base``, ``pos`` = ``offset + t``
    for row ``t`` of ``x``. Computed on the fly for any length (angles in float64),
    so there is no table and no maximum unless ``max_len`` is given.

    Differences from the paper: for odd ``dim`` the last column ``d - 1 = 2i`` is a
    sine with exponent ``2i / d`` (the same formula; the paper only uses even ``d``).
    ``offset`` shifts the positions for incremental decoding.

    Shapes:
        x: ``(batch, n, dim)`` -> ``(batch, n, dim)``, same dtype.

    Complexity:
        ``O(n * dim)`` time and memory; no parameters.

    Args:
        dim: feature size of ``x``.
        max_len: optional bound on ``offset + n`` (a ShapeError past it); None = unbounded.
        base: frequency base (10000 in the paper); > 1.
        dropout: dropout probability on the sum (Sec. 5.4), applied only in training.

    Example:
        >>> import torch
        >>> from attnkit.nn.positional import SinusoidalPositionalEncoding
        >>> pe = SinusoidalPositionalEncoding(6)
        >>> out = pe(torch.zeros(2, 5, 6))
        >>> out.shape
        torch.Size([2, 5, 6])
        >>> [round(v, 4) for v in out[0, 1, :2].tolist()]  # sin(1), cos(1)
        [0.8415, 0.5403]
        >>> bool(torch.equal(pe(torch.zeros(1, 1, 6), offset=4)[0, 0], out[0, 4]))  # decoding step 4
        True
    """

    def __init__(self, dim: int, *, max_len: int | None = None, base: float = 10000.0, dropout: float = 0.0):
        super().__init__()
        who = "SinusoidalPositionalEncoding"
        self.dim = check_dim(who, "dim", dim)
        self.max_len = None if max_len is None else check_dim(who, "max_len", max_len)
        self.base = check_base(who, base)
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
            raise ArgumentError(f"{who}: dropout must be a number in [0, 1); got {dropout!r}")
        self.dropout = float(dropout)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, max_len={self.max_len}, base={self.base:g}, dropout={self.dropout}"

    def encoding(self, length: int, *, offset: int = 0, device=None, dtype=torch.float32) -> torch.Tensor:
        """The table ``PE[offset : offset + length]``: ``(length, dim)``."""
        who = "SinusoidalPositionalEncoding"
        offset = check_offset(who, "offset", offset)
        _check_length(who, self.max_len, length, offset)
        device = torch.device("cpu") if device is None else torch.device(device)
        dt = angle_dtype(device)
        col = torch.arange(self.dim, device=device)
        freq = self.base ** (-(2 * (col // 2)).to(dt) / self.dim)  # (dim,), pairs share a frequency
        ang = torch.arange(offset, offset + length, device=device, dtype=dt)[:, None] * freq  # (length, dim)
        return torch.where(col % 2 == 0, ang.sin(), ang.cos()).to(dtype)

    def forward(self, x: torch.Tensor, *, offset: int = 0) -> torch.Tensor:
        """``dropout(x + PE[offset : offset + n])`` for ``x`` of shape ``(batch, n, dim)``."""
        check_sequence("SinusoidalPositionalEncoding", "x", x, self.dim, named=True)
        out = x + self.encoding(x.shape[1], offset=offset, device=x.device, dtype=x.dtype)
        return F.dropout(out, self.dropout, training=self.training) if self.dropout > 0 else out


class LearnedPositionalEmbedding(nn.Module):
    """A learned vector per absolute position, added to the input (ConvS2S).

    Gehring et al. 2017, "Convolutional Sequence to Sequence Learning",
    arXiv:1705.03122, Sec. 3.1::

        e = (w_1 + p_1, ..., w_n + p_n),  p_t = P[offset + t] in R^dim

    Notation: paper ``w_t`` = ``x[:, t]``, ``p`` = ``weight`` ``(max_len, dim)``.

    Differences from the paper: none in the function; ``offset`` selects the positions
    for incremental decoding. Initialised N(0, 0.1^2) as the paper's embeddings.
    Positions past ``max_len`` have no vector: a ShapeError naming ``max_len``.

    Shapes:
        x: ``(batch, n, dim)`` -> ``(batch, n, dim)``, same dtype; ``offset + n <= max_len``.

    Complexity:
        ``O(n * dim)`` time; ``max_len * dim`` parameters.

    Args:
        max_len: number of learned positions.
        dim: feature size of ``x``.

    Example:
        >>> import torch
        >>> from attnkit.nn.positional import LearnedPositionalEmbedding
        >>> _ = torch.manual_seed(0)
        >>> emb = LearnedPositionalEmbedding(8, 4)
        >>> emb(torch.zeros(2, 5, 4)).shape
        torch.Size([2, 5, 4])
        >>> bool(torch.equal(emb(torch.zeros(1, 1, 4), offset=3)[0, 0], emb.weight[3]))
        True
    """

    def __init__(self, max_len: int, dim: int):
        super().__init__()
        who = "LearnedPositionalEmbedding"
        self.max_len = check_dim(who, "max_len", max_len)
        self.dim = check_dim(who, "dim", dim)
        self.weight = nn.Parameter(torch.empty(self.max_len, self.dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight, mean=0.0, std=0.1)

    def extra_repr(self) -> str:
        return f"max_len={self.max_len}, dim={self.dim}"

    def forward(self, x: torch.Tensor, *, offset: int = 0) -> torch.Tensor:
        """``x + weight[offset : offset + n]`` for ``x`` of shape ``(batch, n, dim)``."""
        who = "LearnedPositionalEmbedding"
        check_sequence(who, "x", x, self.dim, named=True)
        offset = check_offset(who, "offset", offset)
        _check_length(who, self.max_len, x.shape[1], offset)
        pos = self.weight[offset: offset + x.shape[1]]  # (n, dim) broadcasts over batch
        return x + (pos if pos.dtype == x.dtype else pos.to(x.dtype))


# Registry entries of the positional family (ALiBi is the core entry "alibi").

def _sinusoidal_example():
    return SinusoidalPositionalEncoding(16), (randn(2, 10, 16),)


def _learned_example():
    return LearnedPositionalEmbedding(32, 16), (randn(2, 10, 16),)


def _rotary_example():
    return RotaryEmbedding(8), (randn(2, 3, 10, 8), randn(2, 3, 12, 8, seed=1))


def _relative_bias_example():
    rpb = bias_mod.RelativePositionBias(3, num_buckets=16, max_distance=32)
    with torch.no_grad():
        rpb.table.copy_(randn(3, 16, seed=2))
    return functools.partial(attention, bias=rpb), (randn(2, 3, 10, 8), randn(2, 3, 10, 8, seed=1),
                                                    randn(2, 3, 10, 8, seed=2))


def _count(t, s, module=None):  # elementwise only: no matmul FLOPs, only other_flops
    t.ew("x + position (elementwise; no matmul)", s["batch"] * s["length"] * s["dim"], 1)
    t.io(2 * s["batch"] * s["length"] * s["dim"])


def _rotary_count(t, s, module=None):
    numel = s["batch"] * s["heads"] * (s["q_len"] + s["kv_len"]) * s["dim"]
    t.ew("rotation of feature pairs (elementwise; no matmul)", numel, 3)
    t.io(2 * numel)


def _x(s, module):
    return module, (randn(s["batch"], s["length"], s["dim"], dtype=dtype_of(s)),)


def _rotary_inputs(s, module):
    return module, (randn(s["batch"], s["heads"], s["q_len"], s["dim"], dtype=dtype_of(s)),
                    randn(s["batch"], s["heads"], s["kv_len"], s["dim"], seed=1, dtype=dtype_of(s)))


register(Entry("sinusoidal-positional-encoding", SinusoidalPositionalEncoding,
               "Vaswani et al. 2017, arXiv:1706.03762, Sec. 3.5", "O(L D)",
               "fixed sin/cos of position at geometric frequencies, added to x", "positional", _sinusoidal_example,
               spec=Spec({"batch": 2, "length": 10, "dim": 16, "dtype": "float32"}, _count, _x,
                         "elementwise only: B n dim adds (and n dim sin/cos)",
                         make=lambda s: SinusoidalPositionalEncoding(s["dim"]),
                         module_type=SinusoidalPositionalEncoding,
                         config=lambda m: {"dim": m.dim})))
register(Entry("learned-positional-embedding", LearnedPositionalEmbedding,
               "Gehring et al. 2017, arXiv:1705.03122, Sec. 3.1", "O(L D)",
               "a learned vector per absolute position, added to x", "positional", _learned_example,
               spec=Spec({"batch": 2, "length": 10, "dim": 16, "max_len": 32, "dtype": "float32"}, _count, _x,
                         "elementwise only: B n dim adds",
                         make=lambda s: LearnedPositionalEmbedding(s["max_len"], s["dim"]).to(dtype_of(s)),
                         module_type=LearnedPositionalEmbedding,
                         config=lambda m: {"dim": m.dim, "max_len": m.max_len})))
register(Entry("rotary-embedding", RotaryEmbedding,
               "Su et al. 2021, arXiv:2104.09864, eq. 34", "O(L D)",
               "rotate q/k feature pairs by position so q.k sees relative position (interleaved or half-split "
               "pairs, partial; linear, dynamic NTK, YaRN, Llama 3 and LongRoPE scaling)", "positional",
               _rotary_example,
               spec=Spec({"batch": 2, "heads": 3, "q_len": 10, "kv_len": 12, "dim": 8, "dtype": "float32"},
                         _rotary_count, _rotary_inputs, "elementwise only: 6 operations per rotated pair of q and k",
                         make=lambda s: RotaryEmbedding(s["dim"]), length=("q_len", "kv_len"),
                         aliases={"head_dim": "dim"}, module_type=RotaryEmbedding, config=lambda m: {"dim": m.dim})))
register(Entry("relative-position-bias", bias_mod.RelativePositionBias,
               "Shaw et al. 2018, arXiv:1803.02155; Raffel et al. 2020, arXiv:1910.10683 (T5 buckets)",
               "O(Lq Lk D)", "learned per-head scalar bias on bucketed j - i, a score modifier", "positional",
               _relative_bias_example,
               spec=attention_spec(lambda s: {"bias": bias_mod.RelativePositionBias(
                   s["heads"], num_buckets=s["num_buckets"], max_distance=s["max_distance"])},
                   num_buckets=16, max_distance=32, q_len=10)))
