"""The encoder-decoder Transformer (Vaswani et al. 2017) over token ids, with KV-cached generation."""

from __future__ import annotations

import torch
from torch import nn

from ..errors import ArgumentError
from ..nn._inputs import check_keep_mask
from .stacks import TransformerDecoder, TransformerEncoder
from .tokens import TokenEmbedding, cache_offset, check_generate, check_tokens, decode, output_head

__all__ = ["Transformer"]


class Transformer(nn.Module):
    """Encoder-decoder Transformer for sequence-to-sequence token tasks, with any attnkit self-attention.

    Vaswani et al. 2017, "Attention Is All You Need", arXiv:1706.03762, Sec. 3 and Fig. 1::

        memory = Encoder(E_src[src] sqrt(d) + PE)
        logits = Decoder(E_tgt[tgt] sqrt(d) + PE, memory) W_out      (W_out = E_tgt^T when tied, Sec. 3.4)

    The decoder is causal, so ``logits[:, i]`` predicts ``tgt[:, i + 1]`` (teacher forcing: feed
    ``tgt[:, :-1]``, compare with ``tgt[:, 1:]``). :meth:`generate` decodes with a KV cache.

    Notation: ``d`` = ``dim``; ``E_src, E_tgt`` = ``src_embed.embed``, ``tgt_embed.embed`` (one module
    when ``tgt_vocab`` is None: a shared vocabulary); ``W_out`` = ``head``; PE per ``positional``.

    Differences from the paper: positions may be "learned", "rotary" (inside the self-attentions) or
    None; the self-attention of encoder and decoder is selectable (``attention``, ``decoder_attention``;
    see :class:`TransformerEncoder`); pre-norm is an option; small defaults.

    Shapes: ``src`` ``(B, s)`` and ``tgt`` ``(B, t)`` int ids, ``src_keep_mask`` ``(B, s)``,
    ``tgt_keep_mask`` ``(B, t)`` bool (True = real token) -> logits ``(B, t, tgt_vocab)``.

    Complexity: softmax attention ``O(L B (s^2 + t^2 + s t) dim + L B (s + t) dim ff_dim)``, ``L`` layers.

    Args:
        src_vocab: source vocabulary.
        tgt_vocab: target vocabulary (None: shared with the source).
        dim, num_heads: width and heads.
        num_encoder_layers, num_decoder_layers: depths.
        ff_dim, dropout, activation, norm_first: as :class:`TransformerEncoder`.
        positional: "sinusoidal", "learned", "rotary" or None.
        attention: encoder self-attention (a registry name or a factory).
        decoder_attention: decoder self-attention (default: ``attention``).
        attention_mask: attnkit mask for softmax self-attention (ANDed with causal in the decoder).
        max_len: longest sequence (learned positions, linformer, lambda-layer).
        tie_embeddings: share ``W_out`` with the target embedding.

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> model = Transformer(11, 13, dim=12, num_heads=3).eval()
        >>> src, tgt = torch.randint(0, 11, (2, 7)), torch.randint(0, 13, (2, 5))
        >>> model(src, tgt).shape
        torch.Size([2, 5, 13])
        >>> model.generate(src, tgt[:, :1], 4).shape
        torch.Size([2, 5])
    """

    def __init__(self, src_vocab: int, tgt_vocab: int | None = None, *, dim: int = 64, num_heads: int = 4,
                 num_encoder_layers: int = 2, num_decoder_layers: int = 2, ff_dim: int | None = None,
                 dropout: float = 0.1, activation: str = "relu", norm_first: bool = False,
                 positional: str | None = "sinusoidal", attention="softmax", decoder_attention=None,
                 attention_mask=None, max_len: int | None = 256, tie_embeddings: bool = False):
        super().__init__()
        rotary = positional == "rotary"
        emb = {"dim": dim, "positional": positional, "max_len": max_len, "dropout": dropout}
        self.src_embed = TokenEmbedding("Transformer", src_vocab, **emb)
        self.tgt_embed = self.src_embed if tgt_vocab is None else TokenEmbedding("Transformer", tgt_vocab, **emb)
        self.src_vocab, self.tgt_vocab, self.max_len = src_vocab, self.tgt_embed.vocab_size, max_len
        common = {"ff_dim": ff_dim, "dropout": dropout, "activation": activation, "norm_first": norm_first,
                  "attention_mask": attention_mask, "rotary": rotary, "max_len": max_len}
        self.encoder = TransformerEncoder(dim, num_heads, num_encoder_layers, attention=attention, **common)
        self.decoder = TransformerDecoder(dim, num_heads, num_decoder_layers, attention=(
            attention if decoder_attention is None else decoder_attention), **common)
        self.head = output_head(self.tgt_embed, self.tgt_vocab, tie_embeddings)

    def encode(self, src: torch.Tensor, *, src_keep_mask: torch.Tensor | None = None) -> torch.Tensor:
        """The encoder output ``memory`` ``(B, s, dim)``."""
        check_tokens("Transformer", "src", src, self.src_vocab)
        keep = check_keep_mask("Transformer", "src_keep_mask", src_keep_mask, *src.shape)
        return self.encoder(self.src_embed(src), key_keep_mask=keep)

    def decode(self, tgt: torch.Tensor, memory: torch.Tensor, *, src_keep_mask: torch.Tensor | None = None,
               tgt_keep_mask: torch.Tensor | None = None, caches=None) -> torch.Tensor:
        """Logits ``(B, t, tgt_vocab)`` of the targets given ``memory``; ``caches`` continue earlier calls."""
        check_tokens("Transformer", "tgt", tgt, self.tgt_vocab)
        offset = cache_offset("Transformer", caches, len(self.decoder.layers))
        x = self.tgt_embed(tgt, offset=offset)
        x = self.decoder(x, memory, memory_keep_mask=src_keep_mask, key_keep_mask=tgt_keep_mask, caches=caches)
        return self.head(x)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor, *, src_keep_mask: torch.Tensor | None = None,
                tgt_keep_mask: torch.Tensor | None = None) -> torch.Tensor:
        memory = self.encode(src, src_keep_mask=src_keep_mask)
        return self.decode(tgt, memory, src_keep_mask=src_keep_mask, tgt_keep_mask=tgt_keep_mask)

    @torch.no_grad()
    def generate(self, src: torch.Tensor, prefix: torch.Tensor, max_new_tokens: int, *,
                 src_keep_mask: torch.Tensor | None = None, eos: int | None = None, temperature: float = 0.0,
                 generator: torch.Generator | None = None, use_cache: bool | None = None,
                 return_logits: bool = False):
        """Continue ``prefix`` ``(B, t)`` by up to ``max_new_tokens`` target tokens given ``src``.

        Greedy (``temperature=0``) or sampled from ``softmax(logits / temperature)`` with ``generator``.
        Rows that emit ``eos`` are padded with it; decoding stops once all have. ``use_cache`` (default:
        whenever the decoder's attention is softmax) feeds one token per step against a KV cache instead
        of recomputing the whole prefix: the same tokens and logits. Returns tokens ``(B, t + k)``, and
        the logits ``(B, k, tgt_vocab)`` of each chosen position with ``return_logits``. Uses the
        module's mode: call ``eval()`` first to turn dropout off.
        """
        check_generate("Transformer.generate", prefix, max_new_tokens, self.tgt_vocab, eos=eos,
                       temperature=temperature, generator=generator,
                       max_len=self.max_len if self.tgt_embed.positional == "learned" else None)
        memory = self.encode(src, src_keep_mask=src_keep_mask)
        if memory.shape[0] != prefix.shape[0]:
            raise ArgumentError(f"Transformer.generate: src batch {memory.shape[0]} != prefix batch {prefix.shape[0]}")
        cached = self.decoder.cacheable if use_cache is None else bool(use_cache)
        caches = self.decoder.new_caches(prefix.shape[0], prefix.shape[1] + max_new_tokens) if cached else None

        def step(new, tokens):
            feed = new if cached else tokens
            return self.decode(feed, memory, src_keep_mask=src_keep_mask, caches=caches)[:, -1]

        tokens, logits = decode(step, prefix, max_new_tokens, vocab_size=self.tgt_vocab, eos=eos,
                                temperature=temperature, generator=generator, history=not cached)
        return (tokens, logits) if return_logits else tokens
