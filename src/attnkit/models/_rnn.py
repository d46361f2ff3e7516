"""What the models share: token-id checks (the checks of features, keep masks and lengths are those of
:mod:`attnkit.nn._inputs`), the source mask, and a padding-aware RNN encoder (the recurrent models' helpers,
which used to live in ``seq2seq``).

Used by :class:`~attnkit.models.seq2seq.Seq2Seq`, :class:`~attnkit.models.pointer_network.PointerNetwork`,
:class:`~attnkit.models.pointer_generator.PointerGenerator`,
:class:`~attnkit.models.han.HierarchicalAttentionNetwork`,
:class:`~attnkit.models.log_anomaly.LogAnomalyDetector`, and for the input checks by the Transformer models, ViT and
Perceiver. Nothing here imports another model module, so every model file can import it.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from ..errors import ArgumentError, DTypeError, ShapeError
from ..nn._inputs import check_keep_mask, check_lengths

__all__ = ["IGNORE_INDEX", "INDEX_DTYPES", "check_tokens", "check_index_dtype",
           "loss_targets", "masked_mean", "source_mask", "make_rnn", "encode_padded"]

IGNORE_INDEX = -100
"""A target that is not scored (``torch.nn.CrossEntropyLoss``'s default; the tasks pad targets with it)."""

INDEX_DTYPES = (torch.int64, torch.int32)
"""The dtypes ``nn.Embedding`` and ``gather`` take as indices: token ids and positions must have one of them."""


def _got(t) -> str:
    return f"{t.dtype} tensor of shape {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__


def check_index_dtype(who: str, name: str, ids, what: str = "token ids") -> None:
    """Raise DTypeError unless ``ids`` is an int64 or int32 tensor (what embeddings and ``gather`` index with)."""
    if not isinstance(ids, torch.Tensor) or ids.dtype not in INDEX_DTYPES:
        raise DTypeError(f"{who}: {name} must be an integer tensor of {what} with dtype int64 or int32; "
                         f"got {ids.dtype if isinstance(ids, torch.Tensor) else type(ids).__name__}")


def check_tokens(who: str, name: str, ids, vocab: int, batch: int | None = None, min_len: int = 0) -> None:
    """Raise unless ``ids`` is an int64/int32 ``(batch, n >= min_len)`` tensor with values in ``[0, vocab)``."""
    check_index_dtype(who, name, ids)
    if ids.dim() != 2 or (batch is not None and ids.shape[0] != batch) or ids.shape[1] < min_len:
        raise ShapeError(f"{who}: {name} must have shape (batch{'' if batch is None else '=' + str(batch)}, n"
                         f"{' >= ' + str(min_len) if min_len else ''}); got {tuple(ids.shape)}")
    # The values are data: a graph being compiled leaves them to the embedding, which checks its indices itself.
    if ids.numel() and not torch.compiler.is_compiling() and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
        raise ArgumentError(f"{who}: {name} ids must lie in [0, {vocab}); got [{int(ids.min())}, {int(ids.max())}]")


def loss_targets(who: str, target, mask, shape: tuple[int, int], num_classes: int):
    """``(target (B, T) long with IGNORE_INDEX -> 0, keep (B, T) bool)`` for a per-token loss.

    ``keep`` is ``mask`` (True = scored; None = all) without the ``IGNORE_INDEX`` (-100) positions; every
    other target must lie in ``[0, num_classes)``.
    """
    check_index_dtype(who, "target", target, "class ids")
    if tuple(target.shape) != tuple(shape):
        raise ShapeError(f"{who}: target must have shape (batch, steps) = {tuple(shape)}; got {tuple(target.shape)}")
    scored = target != IGNORE_INDEX
    outside = scored & ((target < 0) | (target >= num_classes))
    if bool(outside.any()):
        raise ArgumentError(f"{who}: target ids must lie in [0, {num_classes}) or be {IGNORE_INDEX} (not scored); "
                            f"got {int(target[outside][0])}")
    keep = scored if mask is None else check_keep_mask(who, "mask", mask, *shape) & scored
    return target.long().masked_fill(~scored, 0), keep


def masked_mean(per_token: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Mean of ``per_token`` over the ``keep`` positions (0 when there is none), NaN/inf elsewhere never leaking."""
    return torch.where(keep, per_token, 0.0).sum() / keep.sum().clamp(min=1)


def source_mask(who: str, shape, device, lengths=None, mask=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(keep (B, S) bool, lengths (B,) long)`` from at most one of ``lengths`` and a left-aligned ``mask``."""
    b, s = shape
    positions = torch.arange(s, device=device)
    if lengths is not None and mask is not None:
        raise ArgumentError(f"{who}: give src_lengths or src_mask, not both")
    if mask is not None:
        check_keep_mask(who, "mask", mask, b, s, dims="(batch, length)")
        lengths = mask.sum(-1)
        if not torch.equal(mask, positions < lengths[:, None]):
            raise ArgumentError(f"{who}: mask must be left-aligned (True then False in each row) for the RNN")
        return mask, lengths
    if lengths is None:
        return torch.ones(b, s, dtype=torch.bool, device=device), torch.full((b,), s, device=device)
    check_lengths(who, "lengths", lengths, b, s)
    return positions < lengths.to(device)[:, None], lengths.to(device)


def make_rnn(who: str, kind: str, input_dim: int, hidden_dim: int, bidirectional: bool) -> nn.RNNBase:
    """One-layer batch-first GRU/LSTM whose output has ``hidden_dim`` features (split over the directions)."""
    if kind not in ("gru", "lstm"):
        raise ArgumentError(f"{who}: rnn must be 'gru' or 'lstm'; got {kind!r}")
    if bidirectional and hidden_dim % 2:
        raise ArgumentError(f"{who}: hidden_dim must be even for a bidirectional encoder; got {hidden_dim}")
    cls = nn.GRU if kind == "gru" else nn.LSTM
    return cls(input_dim, hidden_dim // (1 + bidirectional), batch_first=True, bidirectional=bidirectional)


def encode_padded(rnn: nn.RNNBase, x: torch.Tensor, lengths: torch.Tensor):
    """Run ``rnn`` on the first ``lengths[b]`` steps of each row of ``x (B, S, in)``.

    Returns outputs ``(B, S, H)`` (0 at padding) and the final state as a decoder's start:
    ``(1, B, H)`` with the directions concatenated (a tuple ``(h, c)`` for an LSTM). Rows
    of length 0 give zeros; padding never enters the RNN; an empty batch gives empty tensors.
    """
    b, s = x.shape[:2]
    dirs = 1 + rnn.bidirectional
    out = x.new_zeros(b, s, dirs * rnn.hidden_size)
    finals = [x.new_zeros(dirs, b, rnn.hidden_size) for _ in range(1 + isinstance(rnn, nn.LSTM))]
    rows = (lengths > 0).nonzero().flatten()
    if rows.numel():
        packed = pack_padded_sequence(x[rows], lengths[rows].cpu(), batch_first=True, enforce_sorted=False)
        h, state = rnn(packed)
        out = out.index_copy(0, rows, pad_packed_sequence(h, batch_first=True, total_length=s)[0])
        state = state if isinstance(state, tuple) else (state,)
        finals = [f.index_copy(1, rows, st) for f, st in zip(finals, state, strict=True)]
    # (dirs, B, H/dirs) -> (1, B, dirs * H/dirs) = [fwd; bwd]; sizes spelled out so that B = 0 reshapes too
    finals = [f.transpose(0, 1).reshape(1, b, dirs * rnn.hidden_size) for f in finals]
    return out, (tuple(finals) if isinstance(rnn, nn.LSTM) else finals[0])
