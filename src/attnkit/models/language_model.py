"""A decoder-only Transformer language model (or, with causal=False, a bidirectional token model)."""

from __future__ import annotations

import os

import torch
from torch import nn

from ..errors import ArgumentError, DTypeError, UnsupportedFeature
from ..masks.tree import TreeMask
from ..nn._recurrent import RecurrentCache, tree_parents
from ..nn.kv_policies import KVPolicy
from . import checkpoint
from .hybrid import RECURRENT, hybrid_attention
from .self_attention import SoftmaxSelfAttention
from .stacks import TransformerDecoder, TransformerEncoder
from .tokens import TokenEmbedding, cache_offset, cache_positions, check_generate, check_tokens, decode, output_head

__all__ = ["TransformerLM"]


class TransformerLM(nn.Module):
    """Decoder-only Transformer over token ids: next-token logits, KV-cached generation, any attention.

    Radford et al. 2018 ("Improving Language Understanding by Generative Pre-Training", OpenAI) on
    the decoder of Vaswani et al. 2017, arXiv:1706.03762, Sec. 3.1 without cross-attention::

        h_0 = E[tokens] sqrt(d) + PE;   h_l = DecoderLayer(h_{l-1}) (causal);   logits = h_L W_out

    so ``logits[:, i]`` depends on ``tokens[:, :i + 1]`` only and predicts ``tokens[:, i + 1]``.
    ``causal=False`` builds a :class:`TransformerEncoder` instead: a bidirectional per-token model
    (tagging, masked-token prediction; Devlin et al. 2019) with no :meth:`generate`.

    Notation: ``E`` = ``embed.embed``, ``W_out`` = ``head`` (``E^T`` when tied), ``d`` = ``dim``.

    Differences from the paper: positional encodings and attention are selectable (see
    :class:`TransformerEncoder`); post-norm by default (GPT-2 uses pre-norm: ``norm_first=True``).
    The blocks of recent models are options: RMSNorm (``norm="rms"``), SwiGLU
    (``activation="swiglu"``), rotary positions in the half-split pairing, partially and with
    context scaling (``positional="rotary", rotary={...}``), an output gate and QK-norm
    (``gate=True, qk_norm=True``); ``norm="rms", activation="swiglu", norm_first=True,
    positional="rotary", rotary={"pairing": "half"}`` is Llama's block.

    :meth:`save` writes the constructor's arguments with the weights; :meth:`load` rebuilds the model.

    Shapes: ``tokens`` ``(B, n)`` int ids, ``key_keep_mask`` ``(B, n)`` bool (True = real token)
    -> logits ``(B, n, vocab_size)``.

    Complexity: softmax attention ``O(L B n^2 dim + L B n dim ff_dim)`` for ``L`` layers; each cached
    generation step ``O(L B n dim)`` plus the projections.

    Args:
        vocab_size: vocabulary.
        dim, num_heads, num_layers: width, heads, depth.
        causal: decoder-only (True) or bidirectional.
        ff_dim, dropout, activation, norm_first: as :class:`TransformerEncoder`.
        positional: "sinusoidal", "learned", "rotary" or None.
        attention, attention_mask: see :class:`TransformerEncoder`; also a linear-recurrent layer's name
            ("retnet", "gla", "mamba2", "deltanet", "gated-deltanet", "kimi-delta-attention"; causal only).
        softmax_every: with a linear-recurrent ``attention``, every ``softmax_every``-th layer is softmax
            attention instead (4: three linear layers to one softmax layer, as Qwen3-Next); see
            :func:`attnkit.models.hybrid.hybrid_attention`.
        max_len: longest sequence (learned positions, linformer, lambda-layer).
        tie_embeddings: ``W_out = E^T`` (Press & Wolf 2017).
        norm: "layer" (LayerNorm) or "rms" (RMSNorm) in every block and the final norm.
        gate, qk_norm: the softmax attention's output gate and QK-norm (:class:`~attnkit.nn.MultiHeadAttention`).
        rotary: with ``positional="rotary"``, :class:`~attnkit.nn.RotaryEmbedding` options (``pairing``,
            ``fraction``, ``base``, ``scaling``); None: the plain interleaved rotation of every feature.
        head_dim, num_kv_heads, attention_bias: the softmax attention's head width (default ``dim / num_heads``),
            grouped-query key/value heads and projection biases (True, False or "qkv"); see
            :class:`~attnkit.nn.MultiHeadAttention`. Not with linear-recurrent layers.
        eps: the norms' epsilon.
        embed_scale: the factor of the token embeddings (default ``sqrt(dim)``; 1.0 for Llama-style models).

    :meth:`from_transformers` converts a Llama, Mistral, Qwen2, Qwen3 or Gemma causal language model of
    transformers (Gemma's ``1 + w`` norms are stored as their effective scale ``1 + w``);
    :meth:`to_transformers` gives a Llama, Qwen3, Mistral or Gemma model back.

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> lm = TransformerLM(17, dim=12, num_heads=3, positional="rotary").eval()
        >>> tokens = torch.randint(0, 17, (2, 5))
        >>> lm(tokens).shape
        torch.Size([2, 5, 17])
        >>> a, la = lm.generate(tokens, 6, return_logits=True)
        >>> b, lb = lm.generate(tokens, 6, use_cache=False, return_logits=True)
        >>> a.shape, bool(torch.equal(a, b)), torch.allclose(la, lb, atol=1e-5)
        (torch.Size([2, 11]), True, True)
        >>> llama = TransformerLM(17, dim=12, num_heads=3, norm="rms", activation="swiglu", norm_first=True,
        ...                       positional="rotary", rotary={"pairing": "half"}, qk_norm=True, gate=True)
        >>> llama(tokens).shape
        torch.Size([2, 5, 17])
    """

    def __init__(self, vocab_size: int, *, dim: int = 64, num_heads: int = 4, num_layers: int = 2,
                 causal: bool = True, ff_dim: int | None = None, dropout: float = 0.1, activation: str = "relu",
                 norm_first: bool = False, positional: str | None = "sinusoidal", attention="softmax",
                 attention_mask=None, max_len: int | None = 256, tie_embeddings: bool = False, norm: str = "layer",
                 gate: bool = False, qk_norm: bool = False, rotary: dict | None = None,
                 softmax_every: int | None = None, head_dim: int | None = None, num_kv_heads: int | None = None,
                 attention_bias: bool | str = True, eps: float = 1e-5, embed_scale: float | None = None):
        config = checkpoint.arguments(TransformerLM.__init__, locals())
        super().__init__()
        self.config = config
        if rotary is not None and positional != "rotary":
            raise ArgumentError(f"TransformerLM: rotary options need positional='rotary'; got "
                                f"positional={positional!r}")
        softmax_options = {"rotary": (rotary or True) if positional == "rotary" else False, "gate": gate,
                           "qk_norm": qk_norm}
        layout = {"head_dim": head_dim, "num_kv_heads": num_kv_heads, "attention_bias": attention_bias}
        if attention in RECURRENT or softmax_every is not None:
            if not causal:
                raise ArgumentError("TransformerLM: linear-recurrent layers are causal; got causal=False")
            if layout != {"head_dim": None, "num_kv_heads": None, "attention_bias": True}:
                raise ArgumentError(f"TransformerLM: head_dim, num_kv_heads and attention_bias apply to softmax-only "
                                    f"models; got {layout} with attention={attention!r}")
            layout = {}
            attention = hybrid_attention(attention, softmax_every, dropout=dropout, mask=attention_mask,
                                         **softmax_options)
            attention_mask, softmax_options = None, {}  # the factory gives them to its softmax layers
        self.embed = TokenEmbedding("TransformerLM", vocab_size, dim, positional=positional, max_len=max_len,
                                    dropout=dropout, embed_scale=embed_scale)
        self.vocab_size, self.max_len, self.causal = vocab_size, max_len, bool(causal)
        common = {"ff_dim": ff_dim, "dropout": dropout, "activation": activation, "norm_first": norm_first,
                  "attention": attention, "attention_mask": attention_mask, "max_len": max_len, "norm": norm,
                  "eps": eps, **softmax_options, **layout}
        self.body = (TransformerDecoder(dim, num_heads, num_layers, cross=False, **common) if causal
                     else TransformerEncoder(dim, num_heads, num_layers, **common))
        self.head = output_head(self.embed, vocab_size, tie_embeddings)

    def forward(self, tokens: torch.Tensor, *, key_keep_mask: torch.Tensor | None = None, caches=None) -> torch.Tensor:
        """Logits ``(B, n, vocab_size)``; ``caches`` (from ``body.new_caches``) continue earlier calls."""
        check_tokens("TransformerLM", "tokens", tokens, self.vocab_size)
        if caches is not None and not self.causal:
            raise ArgumentError("TransformerLM: caches need causal=True")
        x = self.embed(tokens, offset=cache_offset("TransformerLM", caches, len(self.body.layers)))
        if self.causal:
            return self.head(self.body(x, key_keep_mask=key_keep_mask, caches=caches))
        return self.head(self.body(x, key_keep_mask=key_keep_mask))

    @torch.no_grad()
    def generate(self, prefix: torch.Tensor, max_new_tokens: int, *, eos: int | None = None,
                 temperature: float = 0.0, generator: torch.Generator | None = None, use_cache: bool | None = None,
                 return_logits: bool = False, kv_format=None, kv_policy: KVPolicy | None = None):
        """Continue ``prefix`` ``(B, t)`` (unpadded) by up to ``max_new_tokens`` tokens.

        As :meth:`Transformer.generate`: greedy or sampled with ``generator``, ``eos`` padding and early
        stop, a KV cache by default with softmax attention (``use_cache=False`` recomputes the whole
        sequence each step, the same tokens and logits; ``kv_format``: the cache stores quantized keys
        and values, :class:`~attnkit.functional.quantize.KVFormat`, e.g. ``"float8_e4m3"``; ``kv_policy``: each
        softmax layer's cache is a fresh copy of this selection or eviction policy,
        :mod:`attnkit.nn.kv_policies`, e.g. ``SinkWindowCache(64, sinks=4)``: the same tokens as without it
        while its budget covers the sequence). Returns tokens ``(B, t + k)`` and, with
        ``return_logits``, the logits ``(B, k, vocab_size)`` each token was chosen from.
        """
        who = "TransformerLM.generate"
        if not self.causal:
            raise ArgumentError(f"{who}: generation needs a causal model; this one was built with causal=False")
        check_generate(who, prefix, max_new_tokens, self.vocab_size, eos=eos, temperature=temperature,
                       generator=generator, max_len=self.max_len if self.embed.positional == "learned" else None)
        cached = self.body.cacheable if use_cache is None else bool(use_cache)
        if kv_format is not None and not cached:
            raise ArgumentError(f"{who}: kv_format quantizes the KV cache: it needs use_cache (softmax attention); "
                                f"got use_cache={use_cache!r}")
        caches: list | None
        if kv_policy is not None:
            caches = self._policy_caches(who, kv_policy, use_cache, kv_format)
            cached = True
        else:
            caches = (self.body.new_caches(prefix.shape[0], prefix.shape[1] + max_new_tokens, kv_format=kv_format)
                      if cached else None)

        def step(new, tokens):
            return self.step(new if cached else tokens, caches)

        tokens, logits = decode(step, prefix, max_new_tokens, vocab_size=self.vocab_size, eos=eos,
                                temperature=temperature, generator=generator, history=not cached)
        return (tokens, logits) if return_logits else tokens

    def _policy_caches(self, who: str, kv_policy, use_cache, kv_format) -> list[KVPolicy]:
        """One fresh copy of ``kv_policy`` per layer, after checking the model decodes through it."""
        if not isinstance(kv_policy, KVPolicy):
            raise DTypeError(f"{who}: kv_policy must be a KV policy of attnkit.nn.kv_policies (SinkWindowCache, "
                             f"HeavyHitterCache, SnapKVCache, QuestCache); got {type(kv_policy).__name__}")
        if use_cache is False or kv_format is not None:
            raise ArgumentError(f"{who}: kv_policy is the KV cache: it takes neither use_cache=False nor a kv_format; "
                                f"got use_cache={use_cache!r}, kv_format={kv_format!r}")
        kinds = {type(layer.self_attn).__name__ for layer in self.body.layers
                 if not isinstance(layer.self_attn, SoftmaxSelfAttention)}
        if kinds:
            raise UnsupportedFeature(f"{who}: kv_policy selects the keys of softmax attention; this model also has "
                                     f"{sorted(kinds)} layers")
        return [kv_policy.fresh() for _ in self.body.layers]

    def step(self, tokens: torch.Tensor, caches=None) -> torch.Tensor:
        """One decoding step: the logits ``(B, vocab_size)`` of the last of ``tokens`` ``(B, n)``, after the
        positions ``caches`` hold (from ``body.new_caches``; None: ``tokens`` is the whole sequence).

        What :meth:`generate` calls for each token, on tokens it chose itself: nothing is checked again (the
        prompt was), and only the last position goes through the output head. To compile generation, compile this method
        (``lm.step = torch.compile(lm.step)``); hooks on the model's ``forward`` do not see these steps.
        """
        offset = cache_positions(caches[0]) if caches else 0
        return self.head(self.body.run_layers(self.embed(tokens, offset=offset), caches=caches)[:, -1])

    def verify(self, tokens: torch.Tensor, tree, caches) -> torch.Tensor:
        """Speculative decoding's check of a draft tree in one forward: the logits ``(B, T, vocab_size)`` of the
        ``T`` draft ``tokens`` ``(B, T)`` after the positions ``caches`` hold, node ``i``'s equal to those of its
        root-to-node path decoded alone.

        ``tree``: :func:`attnkit.masks.tree` (or its parents ``(T,)`` / ``(B, T)``); each node sits at the position
        of its depth and sees the cache and its ancestors: through a mask in the softmax layers, through each
        node's parent's state in the linear-recurrent ones (:mod:`attnkit.functional.recurrences.tree`). Afterwards
        the KV caches hold all ``T`` nodes and the recurrent states none: :meth:`commit` keeps the accepted path.
        Needs ``caches`` from ``body.new_caches`` and rotary or no positional encoding (the added encodings are
        indexed by sequence position, not by depth).
        """
        who = "TransformerLM.verify"
        if not self.causal or self.embed.positional not in ("rotary", None):
            raise UnsupportedFeature(f"{who}: a draft tree needs a causal model with positional='rotary' or None; "
                                     f"got causal={self.causal}, positional={self.embed.positional!r}")
        check_tokens(who, "tokens", tokens, self.vocab_size)
        offset = cache_offset(who, caches, len(self.body.layers))
        if caches is None:
            raise ArgumentError(f"{who}: caches (from body.new_caches) are required; got None")
        tree = tree_parents(who, tree, tokens.shape[0], tokens.shape[1])
        return self.head(self.body.run_layers(self.embed(tokens, offset=offset), caches=caches, tree=tree))

    @staticmethod
    def commit(caches, tree, nodes) -> None:
        """Keep the accepted root-to-node path ``nodes`` (one list, or one per batch row) of the draft tree last
        given to :meth:`verify` in every cache (:meth:`KVCache.commit`, :meth:`RecurrentCache.commit`): they then
        equal the caches of a plain decode of the path."""
        tree = tree if isinstance(tree, TreeMask) else TreeMask(tree)
        for cache in caches:
            if isinstance(cache, RecurrentCache):
                cache.commit(nodes)
            else:
                cache.commit(tree, nodes)

    def save(self, path: str | os.PathLike) -> None:
        """Write the constructor's arguments and the weights to one file (:mod:`attnkit.models.checkpoint`)."""
        checkpoint.save(self, path)

    @classmethod
    def load(cls, path: str | os.PathLike, *, map_location=None) -> TransformerLM:
        """The model :meth:`save` wrote, in eval mode (read with ``torch.load(weights_only=True)``)."""
        return checkpoint.load(cls, path, map_location=map_location)

    @classmethod
    def from_transformers(cls, model) -> TransformerLM:
        """The equivalent model of a transformers causal language model, weights copied, in its training mode.

        Llama, Mistral, Qwen2, Qwen3 and Gemma (``...ForCausalLM``, or the bare ``...Model`` without a head
        when its embeddings are tied): pre-norm RMSNorm blocks, SwiGLU (GEGLU with GELU's tanh
        approximation for Gemma), rotary positions in halves with the config's base and scaling, grouped
        key/value heads of any width, QK-norm, biases, tied embeddings, Gemma's embedding scale and
        ``1 + w`` norms, and a sliding window on every layer (Mistral). The logits then equal the model's
        (to float32 rounding). What the model has and TransformerLM cannot represent (windows on some layers
        only, Gemma 2's and 3's extra norms and score caps, MLP biases, another activation) raises ArgumentError.
        """
        from .transformers_lm import lm_from_transformers

        return lm_from_transformers(cls, model)

    def to_transformers(self):
        """The equivalent transformers causal LM, weights copied, in this model's training mode.

        The pre-norm RMSNorm block with rotary positions in halves on every feature, softmax attention
        without a gate and ``attention_bias`` True or False, maps onto ``LlamaForCausalLM`` (SwiGLU,
        ``embed_scale=1``), ``Qwen3ForCausalLM`` (with QK-norm), ``MistralForCausalLM`` (a causal
        ``masks.sliding_window(w - 1, 0)`` as ``attention_mask``, no biases) or ``GemmaForCausalLM``
        ("geglu-tanh", ``embed_scale=sqrt(dim)``); anything else raises ArgumentError naming it.
        """
        from .transformers_lm import lm_to_transformers

        return lm_to_transformers(self)
