"""Linformer: low-rank attention by projecting keys and values along the sequence (Wang et al. 2020)."""

from __future__ import annotations

import torch
from torch import nn

from ..core import attention
from ..costing.attend import ATTENTION_FORMULA, attend, projections
from ..costing.spec import Spec
from ..costing.tally import dropout_of, dtype_of
from ..errors import ArgumentError, ShapeError
from ..registry.entry import Entry, register
from ._inputs import check_keep_mask
from ._projections import ProjectedAttention, sequence_input
from .padding import clear_padding

__all__ = ["LinformerAttention", "SequenceProjection"]

_SHARING = ("none", "headwise", "key-value", "layerwise")


class SequenceProjection(nn.Module):
    """A learned ``(k, max_len)`` matrix E applied along the sequence: ``(b, h, n, d) -> (b, h, k, d)``.

    Only the first ``n`` columns are used for an input of length ``n <= max_len`` (``E[:, :n] X``).
    With ``heads > 1`` every head has its own matrix; with ``heads=1`` one matrix serves all heads.
    Entries start as ``N(0, 1/k)`` (a Johnson-Lindenstrauss projection, the paper's Theorem 1).

    Args:
        max_len: longest sequence the projection accepts.
        k_proj_dim: projected length k.
        heads: number of separate matrices (1 = shared by all heads).

    Example:
        >>> import torch
        >>> E = SequenceProjection(16, 4)
        >>> E(torch.randn(2, 3, 10, 8)).shape
        torch.Size([2, 3, 4, 8])
    """

    def __init__(self, max_len: int, k_proj_dim: int, *, heads: int = 1):
        super().__init__()
        if min(max_len, k_proj_dim, heads) < 1:
            raise ArgumentError(f"max_len, k_proj_dim and heads must be >= 1; got {max_len}, {k_proj_dim}, {heads}")
        self.max_len, self.k_proj_dim = max_len, k_proj_dim
        self.weight = nn.Parameter(torch.randn(heads, k_proj_dim, max_len) * k_proj_dim ** -0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[-2]
        if n > self.max_len:
            raise ShapeError(f"sequence length {n} is longer than max_len={self.max_len} of the Linformer projection")
        if self.weight.shape[0] not in (1, x.shape[1]):
            raise ShapeError(f"projection has {self.weight.shape[0]} heads; input has {x.shape[1]}")
        return self.weight[:, :, :n].to(x.dtype) @ x  # (h|1, k, n) @ (b, h, n, d) -> (b, h, k, d)


class LinformerAttention(ProjectedAttention):
    """Linformer self-attention (Wang et al. 2020, arXiv:2006.04768, eq. 7).

    ``head_i = softmax(Q W_i^Q (E_i K W_i^K)^T / sqrt(d_k)) F_i V W_i^V``: the n keys and values are
    projected along the sequence to k rows by ``E_i, F_i`` (``k x n``), so the score matrix is
    ``n x k``. Notation: ``E_i`` = ``proj_k``, ``F_i`` = ``proj_v``, ``k`` = ``k_proj_dim``,
    ``W^Q, W^K, W^V`` = ``q_proj, k_proj, v_proj``.

    Sharing (Sec. 4): "none" (E_i, F_i per head), "headwise" (E, F shared by the heads; default),
    "key-value" (one E = F for keys and values), "layerwise" (pass the same ``shared_projection``
    :class:`SequenceProjection` to every layer; it serves as E and F).

    Differences from the paper: inputs shorter than ``max_len`` use the first n columns of E and F.
    Padding: ``key_keep_mask`` zeroes padded keys and values *before* projecting, so they contribute
    nothing to ``E K`` and ``F V`` (and NaN there cannot leak); the k projected keys all stay
    attendable, so padding changes the output only through the shorter sum, exactly as if E, F had
    only the kept columns. Not causal (E mixes future positions).

    Shapes: ``x`` ``(b, n, dim)`` with ``n <= max_len``, ``key_keep_mask`` ``(b, n)`` bool (True = real
    token) -> ``(b, n, dim)``.

    Complexity: O(n k d) time and O(n k) memory per head.

    Args:
        dim: model width.
        num_heads: number of heads.
        max_len: longest input.
        k_proj_dim: projected length k.
        sharing: one of "none", "headwise", "key-value", "layerwise".
        shared_projection: the :class:`SequenceProjection` shared across layers (only with "layerwise").
        dropout: dropout on the attention weights while training.

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> layer = LinformerAttention(32, 4, max_len=64, k_proj_dim=16)
        >>> layer(torch.randn(2, 40, 32)).shape
        torch.Size([2, 40, 32])
    """

    def __init__(self, dim: int, num_heads: int, *, max_len: int, k_proj_dim: int = 256, sharing: str = "headwise",
                 shared_projection: SequenceProjection | None = None, dropout: float = 0.0):
        super().__init__(dim, num_heads, dropout=dropout)
        if sharing not in _SHARING:
            raise ArgumentError(f"sharing must be one of {_SHARING}; got {sharing!r}")
        if (sharing == "layerwise") != (shared_projection is not None):
            raise ArgumentError("shared_projection is required with sharing='layerwise' and only allowed with it")
        self.max_len = max_len
        if sharing == "layerwise":
            if shared_projection.max_len < max_len:
                raise ArgumentError(f"shared_projection.max_len ({shared_projection.max_len}) < max_len ({max_len})")
            self.proj_k = self.proj_v = shared_projection
        elif sharing == "key-value":
            self.proj_k = self.proj_v = SequenceProjection(max_len, k_proj_dim)
        else:
            per_head = num_heads if sharing == "none" else 1
            self.proj_k = SequenceProjection(max_len, k_proj_dim, heads=per_head)
            self.proj_v = SequenceProjection(max_len, k_proj_dim, heads=per_head)

    def forward(self, x: torch.Tensor, *, key_keep_mask: torch.Tensor | None = None) -> torch.Tensor:
        self.check_input(x)
        if x.shape[1] > self.max_len:
            raise ShapeError(f"x has length {x.shape[1]} but this Linformer was built for max_len={self.max_len}")
        keep = check_keep_mask(type(self).__name__, "key_keep_mask", key_keep_mask, x.shape[0], x.shape[1])
        q, k, v = self.project(clear_padding(x, keep))  # (b, h, n, d) each
        if keep is not None:  # select, not multiply: NaN in a padded position cannot reach E K
            k = k.masked_fill(~keep[:, None, :, None], 0.0)
            v = v.masked_fill(~keep[:, None, :, None], 0.0)
        k, v = self.proj_k(k), self.proj_v(v)  # (b, h, k, d)
        return self.merge_heads(attention(q, k, v, dropout_p=self.dropout_p))


def _example():
    g = torch.Generator().manual_seed(0)
    return LinformerAttention(32, 4, max_len=16, k_proj_dim=8), (torch.randn(2, 16, 32, generator=g),)


def _count(t, s, module=None):
    b, n, h, kp = s["batch"], s["length"], s["heads"], s["k_proj_dim"]
    d = s["dim"] // h
    projections(t, s)
    t.mm("sequence projections E K, F V", 2 * b * h, kp, n, d)
    t.inter(2 * b * h * kp * d)
    attend(t, "", b, h, n, kp, d, d, dtype=dtype_of(s), dropout_p=dropout_of(module))


register(Entry("linformer", LinformerAttention, "Wang et al. 2020, arXiv:2006.04768, eq. 7", "O(L k D)",
               "keys and values projected along the sequence to k rows: n x k scores", "long-sequence",
               _example,
               spec=Spec({"batch": 2, "length": 16, "dim": 32, "heads": 4, "dtype": "float32", "k_proj_dim": 8,
                          "max_len": None, "sharing": "headwise"}, _count, sequence_input,
                         "projections 8 B n dim^2; E K and F V 2 x 2 B H k n d; " + ATTENTION_FORMULA + " with Lk = k",
                         make=lambda s: LinformerAttention(s["dim"], s["heads"], max_len=s["max_len"] or s["length"],
                                                           k_proj_dim=s["k_proj_dim"],
                                                           sharing=s["sharing"]).to(dtype_of(s)),
                         module_type=LinformerAttention,
                         config=lambda m: {"dim": m.dim, "heads": m.num_heads, "max_len": m.max_len,
                                           "k_proj_dim": m.proj_k.k_proj_dim})))
