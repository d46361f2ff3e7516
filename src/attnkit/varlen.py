"""``attnkit.varlen_attn``: variable-length (packed) attention with torch's signature, forward and backward on CPU.

Padding-free training packs documents into one row of ``T`` tokens and attends within each;
serving keeps ragged sequences in a paged cache. ``torch.nn.attention.varlen.varlen_attn``
(FlashAttention's varlen kernels; Dao 2023, arXiv:2307.08691) computes both on CUDA only.
Here the same call runs on attnkit's paths:

- packed documents are laid out so that each starts on a block (``block_size`` positions),
  and one :func:`attnkit.attention` call runs on the block-sparse paths with a
  :class:`~attnkit.masks.documents.Documents` mask whose layout is block diagonal:
  ``sum_d Lq_d Lk_d`` scores (up to padding lanes), never a ``T x T`` mask;
- with ``block_table`` the keys and values are a pool of pages: each sequence's queries are
  placed at the end of a ``max_q`` row (bottom-right) and the call reads the pages through
  the page table (path ``paged-split-kv``).

Inside each document, ``window_size`` (torch's convention, aligned bottom-right to the
document's keys), an attnkit ``mask`` and a score modifier ``bias`` are evaluated at the
positions of the document, with its own lengths; ``dropout_p`` drops weights as in
:func:`attnkit.attention`.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from .bias import ScoreModifier, apply_modifier
from .core import attention, explain
from .errors import ArgumentError, DeviceError, DTypeError, ShapeError, check_int
from .masks import causal, sliding_window
from .masks.base import Mask
from .masks.cache import BoundedCache
from .masks.documents import BAND_UNBOUNDED, Documents
from .masks.selected import check_lengths

__all__ = ["varlen_attn", "explain_varlen", "BLOCK_SIZES"]

_WHO = "attnkit.varlen_attn"
BLOCK_SIZES = (32, 64, 128)  # candidate document alignments; the one with the fewest padded scores is taken
LAYOUTS = BoundedCache(max_entries=32)  # document layouts by their boundaries (see _documents)


class _Call(NamedTuple):
    """The attention() call a varlen call becomes, and where its query rows land."""

    q: torch.Tensor  # (B', Hq, L', D)
    k: torch.Tensor
    v: torch.Tensor
    kwargs: dict
    rows: torch.Tensor  # (Tq,): the row of each packed query in the (B' * L') rows of the output


def window_mask(window_size) -> Mask | None:
    """torch's ``window_size`` ``(left, right)`` (``-1``: unbounded) as an attnkit mask, bottom-right aligned."""
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2 or not all(
            isinstance(w, int) and not isinstance(w, bool) and w >= -1 for w in window_size):
        raise ArgumentError(f"{_WHO}: window_size must be two ints >= -1 (left, right; -1 unbounded); "
                            f"got {window_size!r}")
    return _window(*window_size)


@functools.lru_cache(maxsize=64)
def _window(left: int, right: int) -> Mask | None:
    """One mask object per window (masks are immutable): every call with that window reads the same mask."""
    if left == -1 and right == -1:
        return None
    if left == -1 and right == 0:
        return causal()
    return sliding_window(BAND_UNBOUNDED if left == -1 else left, BAND_UNBOUNDED if right == -1 else right)


def _check_cu(name: str, cu, total: int, count: int | None, device) -> torch.Tensor:
    """Cumulative sequence starts ``(N + 1,)``: integers from 0, non-decreasing, ending at ``total``, on ``device``."""
    if not isinstance(cu, torch.Tensor) or cu.dim() != 1 or cu.dtype not in (torch.int32, torch.int64):
        got = f"{cu.dtype} {tuple(cu.shape)}" if isinstance(cu, torch.Tensor) else type(cu).__name__
        raise DTypeError(f"{_WHO}: {name} must be a 1-D int32/int64 tensor (N + 1,); got {got}")
    if cu.device != device:
        raise DeviceError(f"{_WHO}: {name} is on {cu.device} but query is on {device}")
    if count is not None and cu.numel() != count + 1:
        raise ShapeError(f"{_WHO}: {name} must have N + 1 = {count + 1} entries; got {cu.numel()}")
    cu = cu.long()
    if cu.numel() == 0 or int(cu[0]) != 0 or bool((cu[1:] < cu[:-1]).any()) or int(cu[-1]) != total:
        raise ArgumentError(f"{_WHO}: {name} must start at 0, never decrease and end at the number of tokens "
                            f"{total}; got {cu.tolist() if cu.numel() <= 8 else cu[:8].tolist() + ['...']}")
    return cu


def _check_max(name: str, value, lengths: torch.Tensor) -> None:
    """``value`` an int at least the longest sequence. A good value passes on the comparison the bound needs
    anyway; a bad one is refused by the shared :func:`~attnkit.errors.check_int` (a non-int, a bool or a negative)
    before the bound."""
    longest = int(lengths.max()) if lengths.numel() else 0
    if isinstance(value, bool) or not isinstance(value, int) or value < longest:
        check_int(_WHO, name, value, 0)
        raise ArgumentError(f"{_WHO}: {name} must be at least the longest sequence, {longest}; got {value}")


def _check_heads(query, key, enable_gqa: bool, paged: bool) -> None:
    for name, t in (("query", query), ("key", key)):
        if not isinstance(t, torch.Tensor):
            raise DTypeError(f"{_WHO}: {name} must be a tensor; got {type(t).__name__}")
    if query.dim() != 3 or key.dim() != (4 if paged else 3):
        want = "(num_pages, page_size, H_kv, D)" if paged else "(T_k, H_kv, D)"
        raise ShapeError(f"{_WHO}: query must be (T_q, H_q, D) and key {want}; got {tuple(query.shape)} and "
                         f"{tuple(key.shape)}")
    hq, hkv = query.shape[1], key.shape[-2]
    if not enable_gqa and hq != hkv:
        raise ShapeError(f"{_WHO}: query and key/value must have the same number of heads unless enable_gqa=True; "
                         f"got Hq={hq} and Hkv={hkv}")
    if enable_gqa and (hkv == 0 or hq % hkv):
        raise ShapeError(f"{_WHO}: with enable_gqa, query heads must be a multiple of key/value heads; got Hq={hq} "
                         f"and Hkv={hkv}")


class _InDocument(ScoreModifier):
    """A score modifier read at positions inside each document, with the document's lengths."""

    def __init__(self, parent, docs: Documents):
        self.parent, self.docs = parent, docs
        self.num_heads = getattr(parent, "num_heads", None)
        grads = getattr(parent, "parameters_needing_grad", None)
        if grads is not None:
            self.parameters_needing_grad = grads

    def modify(self, scores, b, h, q_idx, kv_idx, q_len, kv_len):
        d = self.docs
        dev = q_idx.device
        doc = d.q_doc.to(dev)[q_idx].clamp(min=0)
        return apply_modifier(self.parent, scores, b, h, d.q_pos.to(dev)[q_idx], d.k_pos.to(dev)[kv_idx],
                              d.q_lengths.to(dev)[doc], d.k_lengths.to(dev)[doc])

    def __repr__(self):
        return f"in_document({self.parent!r})"


def _block_size(q_lengths: torch.Tensor, k_lengths: torch.Tensor) -> int:
    """The alignment with the fewest padded scores, small blocks paying a per-block overhead (as the plans do)."""
    def padded(bs):
        return int(((-(-q_lengths // bs)) * (-(-k_lengths // bs))).sum()) * bs * bs * (1 + 16 / bs)
    return min(BLOCK_SIZES, key=padded)


def _spread(t: torch.Tensor, src: torch.Tensor, batch: int) -> torch.Tensor:
    """Tokens ``(T, H, E)`` placed at rows ``src`` (``T``: an empty row) of ``(batch, H, L, E)``."""
    rows = torch.cat([t, t.new_zeros(1, *t.shape[1:])]).index_select(0, src)  # (batch * L, H, E)
    return rows.view(batch, -1, *t.shape[1:]).transpose(1, 2)


def _aligned(lengths: torch.Tensor, bs: int) -> tuple[torch.Tensor, int]:
    """Each document's first row when every one starts on a block of ``bs``; the padded total."""
    padded = -(-lengths // bs) * bs
    return torch.cumsum(padded, 0) - padded, int(padded.sum())


def _placement(first: torch.Tensor, lengths: torch.Tensor, token_starts: torch.Tensor, total: int, tokens: int):
    """Documents' tokens (``lengths`` from ``token_starts``) placed from rows ``first``: for each of the ``total``
    rows its token (``tokens``: none), and each placed token with its row."""
    owner = torch.repeat_interleave(torch.arange(len(lengths), device=lengths.device), lengths)
    local = torch.arange(owner.numel(), device=lengths.device) - torch.repeat_interleave(
        torch.cumsum(lengths, 0) - lengths, lengths)
    token, row = token_starts[owner] + local, first[owner] + local
    src = torch.full((total,), tokens, dtype=torch.long, device=lengths.device)
    src[row] = token
    return src, token, row


def _layout(cu_q, cu_k, k_lengths, tokens_q: int, tokens_k: int, within, bs: int):
    """The Documents mask of these boundaries, each token's row (``q_src``, ``k_src``) and each query's row."""
    q_lengths = cu_q[1:] - cu_q[:-1]
    (q_first, q_total), (k_first, k_total) = _aligned(q_lengths, bs), _aligned(k_lengths, bs)
    q_src, q_tokens, q_rows = _placement(q_first, q_lengths, cu_q[:-1], q_total, tokens_q)
    k_src, _, _ = _placement(k_first, k_lengths, cu_k[:-1], k_total, tokens_k)
    rows = torch.empty_like(q_rows)
    rows[q_tokens] = q_rows
    return Documents(q_first, q_lengths, k_first, k_lengths, q_total, k_total, bs, within), q_src, k_src, rows


def _documents(query, key, value, cu_q, cu_k, seqused_k, within, bias, block_size) -> _Call:
    """Packed documents laid out on blocks, with the Documents mask (no page table).

    The layout is kept in :data:`LAYOUTS` under the documents' boundaries (and the mask inside them, by its text
    when it has one), so a second call with the same boundaries reuses the Documents mask and with it the
    block plan cached on it."""
    q_lengths, k_room = cu_q[1:] - cu_q[:-1], cu_k[1:] - cu_k[:-1]
    k_lengths = k_room if seqused_k is None else seqused_k.to(k_room.device).long()
    if seqused_k is not None and bool((k_lengths > k_room).any()):
        raise ArgumentError(f"{_WHO}: seqused_k must be at most each sequence's keys in cu_seq_k; got "
                            f"{k_lengths.tolist()} for {k_room.tolist()}")
    bs = block_size or _block_size(q_lengths, k_lengths)
    def build():
        return _layout(cu_q, cu_k, k_lengths, query.shape[0], key.shape[0], within, bs)

    if torch.compiler.is_compiling():
        docs, q_src, k_src, rows = build()
    else:
        inside = None if within is None else within.text if within.text is not None else within
        boundaries = (str(query.device), tuple(cu_q.tolist()), tuple(cu_k.tolist()), tuple(k_lengths.tolist()),
                      query.shape[0], key.shape[0], bs, inside)
        docs, q_src, k_src, rows = LAYOUTS.get_or_build(boundaries, build)
    modifier = None if bias is None else _InDocument(bias, docs)
    return _Call(_spread(query, q_src, 1), _spread(key, k_src, 1), _spread(value, k_src, 1),
                 {"mask": docs, "bias": modifier}, rows)


def _pages(query, key, value, cu_q, max_q, seqused_k, block_table, within, bias) -> _Call:
    """Sequences on a paged cache: each one's queries at the end of a ``max_q`` row (bottom-right)."""
    if bias is not None:
        raise ArgumentError(f"{_WHO}: bias is not supported with block_table; got {type(bias).__name__}")
    q_lengths = cu_q[1:] - cu_q[:-1]
    n = len(q_lengths)
    first = torch.arange(n, device=cu_q.device) * max_q + max_q - q_lengths  # left padding: the last rows are real
    q_src, q_tokens, q_rows = _placement(first, q_lengths, cu_q[:-1], n * max_q, query.shape[0])
    rows = torch.empty_like(q_rows)
    rows[q_tokens] = q_rows
    return _Call(_spread(query, q_src, n), key, value,
                 {"mask": within, "block_table": block_table, "seqused_k": seqused_k}, rows)


def _prepare(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, scale, window_size, enable_gqa, seqused_k,
             block_table, dropout_p, mask, bias, block_size) -> _Call:
    paged = block_table is not None
    _check_heads(query, key, enable_gqa, paged)
    within = window_mask(window_size)
    if mask is not None:
        if not isinstance(mask, Mask):
            raise DTypeError(f"{_WHO}: mask must be an attnkit mask (read inside each document); got "
                             f"{type(mask).__name__}")
        within = mask if within is None else within & mask
    if block_size is not None:
        check_int(_WHO, "block_size", block_size, 1)
    cu_q = _check_cu("cu_seq_q", cu_seq_q, query.shape[0], None, query.device)
    n = cu_q.numel() - 1
    _check_max("max_q", max_q, cu_q[1:] - cu_q[:-1])
    if paged:
        if seqused_k is None:
            raise ArgumentError(f"{_WHO}: block_table needs seqused_k (the keys each sequence holds); got None")
        check_int(_WHO, "max_k", max_k, 0)
        call = _pages(query, key, value, cu_q, max_q, seqused_k, block_table, within, bias)
    else:
        if cu_seq_k is None:
            raise ArgumentError(f"{_WHO}: cu_seq_k is required without block_table; got None")
        cu_k = _check_cu("cu_seq_k", cu_seq_k, key.shape[0], n, query.device)
        if seqused_k is not None:  # the check attention(..., seqused_k=) makes; each document's own bound below
            room = cu_k[1:] - cu_k[:-1]
            seqused_k = check_lengths(_WHO, seqused_k, n, query.device, int(room.max()) if n else 0,
                                      "the longest document's keys in cu_seq_k")
        _check_max("max_k", max_k, (cu_k[1:] - cu_k[:-1]) if seqused_k is None else seqused_k)
        call = _documents(query, key, value, cu_q, cu_k, seqused_k, within, bias, block_size)
    tracing = torch.compiler.is_compiling() or query.is_meta
    backend = "auto" if tracing or paged else "blocksparse"  # documents: the block paths, never a dense T x T mask
    return call._replace(kwargs={**call.kwargs, "scale": scale, "dropout_p": dropout_p, "backend": backend})


def varlen_attn(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_seq_q: torch.Tensor,
                cu_seq_k: torch.Tensor | None, max_q: int, max_k: int, *, return_aux=None, scale: float | None = None,
                window_size: tuple[int, int] = (-1, -1), enable_gqa: bool = False,
                seqused_k: torch.Tensor | None = None, block_table: torch.Tensor | None = None,
                dropout_p: float = 0.0, mask: Mask | None = None, bias=None, block_size: int | None = None):
    """Attention within each of ``N`` packed sequences, ``torch.nn.attention.varlen.varlen_attn``'s call on CPU.

    Sequence ``n`` has the queries ``query[cu_seq_q[n]:cu_seq_q[n + 1]]`` and the keys
    ``key[cu_seq_k[n]:cu_seq_k[n + 1]]`` (the first ``seqused_k[n]`` of them when given);
    with ``block_table`` the keys and values are pools of pages and sequence ``n`` holds
    ``seqused_k[n]`` keys on the pages ``block_table[n]`` (``cu_seq_k`` unused)::

        out_i = softmax(q_i K_n^T * scale + bias, window & mask) V_n     for query i of sequence n

    ``window_size = (left, right)`` lets query ``i`` see keys ``j`` with
    ``i' - left <= j <= i' + right``, ``i' = i + Lk_n - Lq_n`` (bottom-right, as FlashAttention),
    ``-1`` unbounded: ``(-1, -1)`` every key, ``(-1, 0)`` causal, ``(W, 0)`` a causal window of
    ``W + 1`` keys. A query with no key gets output 0 (lse ``-inf``; torch's kernels give
    ``+inf`` there).

    Differences from torch: runs on any device attnkit runs on, with autograd everywhere
    (``seqused_k`` and ``block_table`` included); ``num_splits`` does not apply (the split of
    a paged cache is fixed, so results do not depend on the batch); ``dropout_p``, ``mask``
    (any attnkit mask, read at positions inside each sequence with its lengths), ``bias`` (a
    score modifier, read the same way) and ``block_size`` (the documents' alignment) are
    attnkit's. The lse is ``(H_q, T_q)``, the layout torch's kernels return (its docstring
    says ``(T_q, H_q)``).

    Shapes:
        query ``(T_q, H_q, D)``; key/value ``(T_k, H_kv, D|Dv)`` or pools ``(num_pages, page_size,
        H_kv, D|Dv)``; cu_seq_q/cu_seq_k ``(N + 1,)``; seqused_k ``(N,)``; block_table ``(N, max_pages)``.
        Output ``(T_q, H_q, Dv)`` (and lse ``(H_q, T_q)`` float32).

    Complexity:
        ``O(sum_n Lq_n Lk_n D)`` time; memory linear in ``T`` (block-sparse paths, no ``T x T`` mask).

    Args:
        query: packed queries.
        key: packed keys, or a pool of pages with ``block_table``.
        value: packed values, or a pool of pages.
        cu_seq_q: cumulative query lengths, from 0 to ``T_q``.
        cu_seq_k: cumulative key lengths, from 0 to ``T_k`` (None with ``block_table``).
        max_q: at least the longest query sequence.
        max_k: at least the longest key sequence.
        return_aux: ``torch.nn.attention.varlen.AuxRequest(lse=True)`` also returns the lse.
        scale: the score scale (default ``1 / sqrt(D)``).
        window_size: ``(left, right)`` as above.
        enable_gqa: allow ``H_q`` a multiple of ``H_kv``.
        seqused_k: keys used per sequence.
        block_table: pages of each sequence in the pool (integers).
        dropout_p: dropout on the weights (pass 0 in evaluation).
        mask: an attnkit mask inside each sequence.
        bias: an attnkit score modifier inside each sequence (ALiBi, soft-capping).
        block_size: align documents to this block (default: the size with the fewest padded scores).

    Example:
        >>> import torch, attnkit
        >>> q, k, v = (torch.randn(7, 3, 11) for _ in range(3))
        >>> cu = torch.tensor([0, 2, 7], dtype=torch.int32)
        >>> out = attnkit.varlen_attn(q, k, v, cu, cu, 5, 5, window_size=(-1, 0))
        >>> torch.allclose(out[:2], attnkit.attention(q[:2].transpose(0, 1), k[:2].transpose(0, 1),
        ...     v[:2].transpose(0, 1), mask=attnkit.masks.causal()).transpose(0, 1), atol=1e-6)
        True
    """
    call = _prepare(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, scale=scale, window_size=window_size,
                    enable_gqa=enable_gqa, seqused_k=seqused_k, block_table=block_table, dropout_p=dropout_p,
                    mask=mask, bias=bias, block_size=block_size)
    want_lse = bool(getattr(return_aux, "lse", False))
    result = attention(call.q, call.k, call.v, return_lse=want_lse, **call.kwargs)
    out, lse = (result.output, result.lse) if want_lse else (result, None)
    out = out.transpose(1, 2).flatten(0, 1).index_select(0, call.rows)  # (T_q, H_q, Dv)
    if not want_lse:
        return out
    return out, lse.transpose(1, 2).flatten(0, 1).index_select(0, call.rows).transpose(0, 1)


def explain_varlen(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_seq_q: torch.Tensor,
                   cu_seq_k: torch.Tensor | None, max_q: int, max_k: int, *, scale: float | None = None,
                   window_size: tuple[int, int] = (-1, -1), enable_gqa: bool = False,
                   seqused_k: torch.Tensor | None = None, block_table: torch.Tensor | None = None,
                   dropout_p: float = 0.0, mask: Mask | None = None, bias=None, block_size: int | None = None):
    """:func:`attnkit.explain` of the attention call :func:`varlen_attn` makes: its path, the other paths' reasons
    and its cost (the sum of the documents' own costs on the block path; no ``T x T`` term).

    Example:
        >>> import torch, attnkit
        >>> q = torch.randn(300, 2, 8)
        >>> cu = torch.tensor([0, 100, 300], dtype=torch.int32)
        >>> attnkit.explain_varlen(q, q, q, cu, cu, 200, 200, window_size=(-1, 0)).backend
        'blocksparse'
    """
    call = _prepare(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, scale=scale, window_size=window_size,
                    enable_gqa=enable_gqa, seqused_k=seqused_k, block_table=block_table, dropout_p=dropout_p,
                    mask=mask, bias=bias, block_size=block_size)
    decision = explain(call.q, call.k, call.v, **call.kwargs)
    if call.kwargs["backend"] != "auto":  # varlen_attn asks for the block paths itself: the user forced nothing
        why = "varlen_attn runs packed documents on the block-sparse paths only, never with a dense T x T mask"
        decision.reasons = {name: text.replace(f"not asked: backend={call.kwargs['backend']!r} was forced", why)
                            for name, text in decision.reasons.items()}
    return decision
