"""Token models' shared parts: embedding + positions, input checks, and the decoding loop of ``generate``."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ArgumentError, DTypeError, ShapeError, check_int
from ..nn._recurrent import RecurrentCache
from ..nn.kv_cache import KVCache
from ..nn.kv_policies import KVPolicy
from ..nn.paged_kv_cache import PagedBatch
from ..nn.positional import LearnedPositionalEmbedding, SinusoidalPositionalEncoding
from . import _rnn
from .blocks import check_dropout

__all__ = ["TokenEmbedding", "check_tokens", "cache_offset", "cache_positions", "decode"]

POSITIONAL = ("sinusoidal", "learned", "rotary", None)


def check_tokens(who: str, name: str, tokens, vocab_size: int) -> torch.Tensor:
    """``tokens`` must be an int64/int32 ``(batch, n)`` tensor with values in ``[0, vocab_size)``; returns it."""
    _rnn.check_tokens(who, name, tokens, vocab_size)
    return tokens


def cache_positions(cache) -> int:
    """The positions a layer's cache has seen: its length, or a KV policy's ``seen`` (it may have evicted some)."""
    return cache.seen if isinstance(cache, KVPolicy) else len(cache)


def cache_offset(who: str, caches, num_layers: int) -> int:
    """Positions already in ``caches`` (one :class:`KVCache` or :class:`RecurrentCache` per layer, or None: 0),
    checked before any use."""
    if caches is None:
        return 0
    if not isinstance(caches, (list, tuple)) or len(caches) != num_layers or not all(
            isinstance(c, (KVCache, RecurrentCache, KVPolicy, PagedBatch)) for c in caches):
        got = f"{type(caches).__name__} of {len(caches)}" if isinstance(caches, (list, tuple)) else type(
            caches).__name__
        raise ArgumentError(f"{who}: caches must be a list of {num_layers} KVCache (see new_caches); got {got}")
    lengths = {cache_positions(c) for c in caches}
    if len(lengths) != 1:
        raise ArgumentError(f"{who}: caches hold different lengths {sorted(lengths)}; use the list from one "
                            "new_caches call, fed the same tokens")
    return lengths.pop()


class TokenEmbedding(nn.Module):
    """Token embeddings scaled by ``sqrt(dim)`` plus positional encodings: the input layer of the Transformer models.

    Vaswani et al. 2017, "Attention Is All You Need", arXiv:1706.03762, Sec. 3.4-3.5::

        x = dropout(E[tokens] * sqrt(dim) + PE[offset : offset + n])      (``embed_scale`` in place of sqrt(dim))

    Notation: ``E`` = ``embed.weight``; ``PE`` per ``positional``: "sinusoidal"
    (:class:`~attnkit.nn.SinusoidalPositionalEncoding`, eq. 3.5), "learned"
    (:class:`~attnkit.nn.LearnedPositionalEmbedding`, needs ``max_len``), or "rotary"/None
    (nothing added: rotary positions act inside the attention). ``offset`` = positions already
    decoded (KV-cached generation).

    Differences from the paper: ``E`` starts as ``N(0, 1 / dim)`` so that the scaled embedding
    has unit variance; learned and absent positions are options.

    Shapes: ``tokens`` ``(B, n)`` int64/int32 ids (checked by the models) -> ``(B, n, dim)``.

    Complexity: ``O(B n dim)``.

    Args:
        who: the owning model's name, for error messages.
        vocab_size, dim: table size and width.
        positional: see above.
        max_len: longest sequence (learned positions).
        dropout: training only.
        embed_scale: the factor of ``E[tokens]`` (default ``sqrt(dim)``; 1: Llama, Qwen and Mistral, which
            do not scale).

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> emb = TokenEmbedding("demo", 11, 12, positional="sinusoidal", max_len=None, dropout=0.0)
        >>> tokens = torch.tensor([[3, 1, 4, 1, 5]])
        >>> torch.allclose(emb(tokens)[:, 3:], emb(tokens[:, 3:], offset=3))  # positions continue at offset
        True
    """

    def __init__(self, who: str, vocab_size: int, dim: int, *, positional: str | None, max_len: int | None,
                 dropout: float, embed_scale: float | None = None):
        super().__init__()
        self.vocab_size, self.dim = check_int(who, "vocab_size", vocab_size, 1), check_int(who, "dim", dim, 1)
        if positional not in POSITIONAL:
            raise ArgumentError(f"{who}: positional must be one of {POSITIONAL}; got {positional!r}")
        if max_len is not None:
            check_int(who, "max_len", max_len, 1)
        if positional == "learned" and max_len is None:
            raise ArgumentError(f"{who}: positional='learned' needs max_len; got None")
        self.positional, self.max_len, self.dropout = positional, max_len, check_dropout(who, dropout)
        if embed_scale is not None and (isinstance(embed_scale, bool) or not isinstance(embed_scale, (int, float))
                                        or not math.isfinite(embed_scale)):
            raise ArgumentError(f"{who}: embed_scale must be None or a finite number; got {embed_scale!r}")
        self.scale = math.sqrt(dim) if embed_scale is None else float(embed_scale)
        self.embed = nn.Embedding(vocab_size, dim)
        nn.init.normal_(self.embed.weight, std=dim ** -0.5)
        self.pos = (SinusoidalPositionalEncoding(dim) if positional == "sinusoidal"
                    else LearnedPositionalEmbedding(max_len, dim) if positional == "learned" else None)

    def forward(self, tokens: torch.Tensor, *, offset: int = 0) -> torch.Tensor:
        x = self.embed(tokens) * self.scale  # (B, n) -> (B, n, dim)
        pos = self.pos  # (a submodule: one lookup through nn.Module.__getattr__, once per token)
        if pos is not None:
            x = pos(x, offset=offset)
        return F.dropout(x, self.dropout, training=self.training) if self.dropout else x


def output_head(embedding: TokenEmbedding, vocab_size: int, tie: bool) -> nn.Linear:
    """The ``dim -> vocab`` projection, sharing the embedding matrix when ``tie`` (Press & Wolf 2017)."""
    head = nn.Linear(embedding.dim, vocab_size, bias=False)
    if tie:
        head.weight = embedding.embed.weight
    return head


def check_generate(who: str, prefix, max_new_tokens, vocab_size: int, *, eos, temperature, generator,
                   max_len: int | None) -> None:
    check_tokens(who, "prefix", prefix, vocab_size)
    if prefix.shape[1] < 1:
        raise ShapeError(f"{who}: prefix must hold at least one token per row (e.g. a BOS token); "
                         f"got shape {tuple(prefix.shape)}")
    check_int(who, "max_new_tokens", max_new_tokens, 0)
    if eos is not None and (isinstance(eos, bool) or not isinstance(eos, int) or not 0 <= eos < vocab_size):
        raise ArgumentError(f"{who}: eos must be None or a token id in [0, {vocab_size}); got {eos!r}")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not (
            math.isfinite(temperature) and temperature >= 0):
        raise ArgumentError(f"{who}: temperature must be a finite number >= 0 (0 = greedy); got {temperature!r}")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise DTypeError(f"{who}: generator must be a torch.Generator or None; got {type(generator).__name__}")
    total = prefix.shape[1] + max_new_tokens
    if max_len is not None and total > max_len:
        raise ShapeError(f"{who}: prefix length {prefix.shape[1]} + max_new_tokens {max_new_tokens} = {total} "
                         f"exceeds max_len={max_len}")


def _pick(logits: torch.Tensor, temperature: float, generator) -> torch.Tensor:
    """The next token of each row, ``(B, V) -> (B, 1)``: the argmax, or a draw from ``softmax(logits / T)``."""
    if temperature == 0:
        return logits.argmax(-1, keepdim=True)
    probs = torch.softmax(logits.float() / temperature, dim=-1)  # (B, V)
    return torch.multinomial(probs, 1, generator=generator)


def decode(step: Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor], prefix: torch.Tensor,
           max_new_tokens: int, *, vocab_size: int, eos: int | None, temperature: float, generator,
           history: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Append up to ``max_new_tokens`` tokens; ``step(new_tokens, all_tokens)`` gives the next-token logits ``(B, V)``.

    ``history=False``: ``step`` reads the new tokens alone (a cached decoder) and gets None for ``all_tokens``;
    the sequence is then joined once at the end, not copied on every step. Returns ``(tokens (B, t + s),
    logits (B, s, V))``; rows that emitted ``eos`` are padded with ``eos`` and the loop stops early once every row has.
    """
    tokens, new = prefix, prefix
    chosen = [prefix]
    finished = torch.zeros(prefix.shape[0], 1, dtype=torch.bool, device=prefix.device)
    logits = []
    for _ in range(max_new_tokens):
        last = step(new, tokens if history else None)  # (B, V)
        new = _pick(last, temperature, generator)  # (B, 1)
        if new.dtype != prefix.dtype:
            new = new.to(prefix.dtype)
        if eos is not None:
            new = torch.where(finished, torch.full_like(new, eos), new)
            finished = finished | (new == eos)
        logits.append(last)
        chosen.append(new)
        if history:
            tokens = torch.cat([tokens, new], dim=1)
        if eos is not None and bool(finished.all()):
            break
    if not history:
        tokens = torch.cat(chosen, dim=1)
    if not logits:
        return tokens, torch.zeros(prefix.shape[0], 0, vocab_size, device=prefix.device)
    return tokens, torch.stack(logits, dim=1)
