"""Token models' shared parts: embedding + positions, input checks, and the decoding loop of ``generate``."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ArgumentError, DTypeError, ShapeError, check_int
from ..nn.positional import LearnedPositionalEmbedding, SinusoidalPositionalEncoding
from .blocks import check_dropout

__all__ = ["TokenEmbedding", "check_tokens", "check_keep", "decode"]

POSITIONAL = ("sinusoidal", "learned", "rotary", None)


def check_tokens(who: str, name: str, tokens, vocab_size: int) -> torch.Tensor:
    """``tokens`` must be an integer ``(batch, n)`` tensor with values in ``[0, vocab_size)``."""
    if not isinstance(tokens, torch.Tensor) or tokens.dtype.is_floating_point or tokens.dtype in (
            torch.bool, torch.complex64, torch.complex128):
        got = tokens.dtype if isinstance(tokens, torch.Tensor) else type(tokens).__name__
        raise DTypeError(f"{who}: {name} must be an integer tensor of token ids; got {got}")
    if tokens.dim() != 2:
        raise ShapeError(f"{who}: {name} must have shape (batch, n); got {tuple(tokens.shape)}")
    if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size):
        raise ArgumentError(f"{who}: {name} ids must be in [0, {vocab_size}); got min {int(tokens.min())}, "
                            f"max {int(tokens.max())}")
    return tokens


def check_keep(who: str, name: str, keep, shape: tuple[int, int]) -> torch.Tensor | None:
    """A ``(batch, n)`` bool mask, True = real token (None passes)."""
    if keep is None:
        return None
    if not isinstance(keep, torch.Tensor) or keep.dtype != torch.bool:
        got = keep.dtype if isinstance(keep, torch.Tensor) else type(keep).__name__
        raise DTypeError(f"{who}: {name} must be a bool tensor (True = real token); got {got}")
    if tuple(keep.shape) != tuple(shape):
        raise ShapeError(f"{who}: {name} must have shape (batch, n) = {tuple(shape)}; got {tuple(keep.shape)}")
    return keep


class TokenEmbedding(nn.Module):
    """Token embeddings scaled by ``sqrt(dim)`` plus positional encodings (Vaswani et al. 2017, Sec. 3.4-3.5).

    ``x = dropout(E[tokens] * sqrt(dim) + PE[offset : offset + n])``; ``positional`` is "sinusoidal"
    (:class:`SinusoidalPositionalEncoding`), "learned" (:class:`LearnedPositionalEmbedding`, needs
    ``max_len``), or "rotary"/None (nothing added: rotary positions act inside the attention).
    ``E`` starts as ``N(0, 1 / dim)`` so that the scaled embedding has unit variance.
    """

    def __init__(self, who: str, vocab_size: int, dim: int, *, positional: str | None, max_len: int | None,
                 dropout: float):
        super().__init__()
        self.vocab_size, self.dim = check_int(who, "vocab_size", vocab_size, 1), check_int(who, "dim", dim, 1)
        if positional not in POSITIONAL:
            raise ArgumentError(f"{who}: positional must be one of {POSITIONAL}; got {positional!r}")
        if max_len is not None:
            check_int(who, "max_len", max_len, 1)
        if positional == "learned" and max_len is None:
            raise ArgumentError(f"{who}: positional='learned' needs max_len; got None")
        self.positional, self.max_len, self.dropout = positional, max_len, check_dropout(who, dropout)
        self.embed = nn.Embedding(vocab_size, dim)
        nn.init.normal_(self.embed.weight, std=dim ** -0.5)
        self.pos = (SinusoidalPositionalEncoding(dim) if positional == "sinusoidal"
                    else LearnedPositionalEmbedding(max_len, dim) if positional == "learned" else None)

    def forward(self, tokens: torch.Tensor, *, offset: int = 0) -> torch.Tensor:
        x = self.embed(tokens) * math.sqrt(self.dim)  # (B, n) -> (B, n, dim)
        if self.pos is not None:
            x = self.pos(x, offset=offset)
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
    if temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)  # (B, V)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


def decode(step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], prefix: torch.Tensor, max_new_tokens: int,
           *, vocab_size: int, eos: int | None, temperature: float, generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Append up to ``max_new_tokens`` tokens; ``step(new_tokens, all_tokens)`` gives the next-token logits ``(B, V)``.

    Returns ``(tokens (B, t + s), logits (B, s, V))``; rows that emitted ``eos`` are padded with ``eos``
    and the loop stops early once every row has.
    """
    tokens, new = prefix, prefix
    finished = torch.zeros(prefix.shape[0], dtype=torch.bool, device=prefix.device)
    logits = []
    for _ in range(max_new_tokens):
        last = step(new, tokens)  # (B, V)
        nxt = _pick(last, temperature, generator).to(prefix.dtype)
        if eos is not None:
            nxt = torch.where(finished, torch.full_like(nxt, eos), nxt)
            finished = finished | (nxt == eos)
        logits.append(last)
        new = nxt[:, None]  # (B, 1)
        tokens = torch.cat([tokens, new], dim=1)
        if eos is not None and bool(finished.all()):
            break
    if not logits:
        return tokens, torch.zeros(prefix.shape[0], 0, vocab_size, device=prefix.device)
    return tokens, torch.stack(logits, dim=1)
