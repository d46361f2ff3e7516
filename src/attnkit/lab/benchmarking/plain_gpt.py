"""A GPT-style language model in plain torch (``torch.nn`` + a given attention function), with its own KV cache.

The comparison model of :mod:`attnkit.lab.benchmarking.whole_models`: the architecture of
``attnkit.models.TransformerLM(norm_first=True, positional="learned", activation="gelu", dropout=0)``
(Radford et al. 2018/2019: pre-norm decoder blocks, learned positions, a final LayerNorm)
written out directly::

    h_0 = E[tokens] sqrt(d) + P[offset : offset + n]
    h   = h + Attn(LN_1(h));   h = h + W_2 GELU(W_1 LN_2(h) + b_1) + b_2        (each block)
    logits = LN_f(h) W_out

``Attn`` projects with one ``(3d, d)`` matrix, splits ``H`` heads of ``d / H`` and calls
``attend(q, k, v)`` on ``(B, H, n, d / H)`` tensors; the attention function is the only thing
the benchmark rows swap. :meth:`PlainGPT.load_from_lm` copies a TransformerLM's weights.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

# TransformerLM state_dict prefix -> this model's (the rest of each key is the same).
LM_NAMES = (("embed.embed.", "tok."), ("embed.pos.weight", "pos"), ("body.layers.", "blocks."),
            ("body.norm.", "norm_f."), (".self_attn.in_proj_", ".qkv."), (".self_attn.out_proj.", ".out."),
            (".norm3.", ".norm2."))


def sdpa_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """torch's fused attention, causal (top-left aligned: the square training case)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class Block(nn.Module):
    """One pre-norm decoder block; ``cache`` = ``[k_buffer, v_buffer, length]`` for decoding."""

    def __init__(self, dim: int, heads: int, ff_dim: int):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.linear1, self.linear2 = nn.Linear(dim, ff_dim), nn.Linear(ff_dim, dim)

    def forward(self, x: torch.Tensor, attend: Attend, cache: list | None = None) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        if cache is None:
            a = attend(q, k, v)
        else:  # prefill from an empty cache (causal) or one new token (sees every stored key)
            kb, vb, start = cache
            kb[:, :, start:start + n], vb[:, :, start:start + n] = k, v
            cache[2] = start + n
            kv = kb[:, :, :start + n], vb[:, :, :start + n]
            # (a Python branch, not is_causal=n > 1: compiled with dynamic sizes, n > 1 is a SymBool, which
            # is_causal does not take, and the call would break the graph)
            a = F.scaled_dot_product_attention(q, *kv, is_causal=True) if n > 1 else (
                F.scaled_dot_product_attention(q, *kv))
        x = x + self.out(a.transpose(1, 2).reshape(b, n, d))
        return x + self.linear2(F.gelu(self.linear1(self.norm2(x))))


class PlainGPT(nn.Module):
    """The GPT-style model above; ``forward(tokens (B, n)) -> logits (B, n, vocab)``."""

    def __init__(self, vocab: int, dim: int, heads: int, layers: int, max_len: int, attend: Attend = sdpa_causal):
        super().__init__()
        self.dim, self.heads, self.attend = dim, heads, attend
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(max_len, dim) * 0.1)
        self.blocks = nn.ModuleList(Block(dim, heads, 4 * dim) for _ in range(layers))
        self.norm_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def load_from_lm(self, lm: nn.Module) -> PlainGPT:
        """Copy the weights of an ``attnkit.models.TransformerLM`` of the same shape (strict)."""
        state = {}
        for key, value in lm.state_dict().items():
            for theirs, ours in LM_NAMES:
                key = key.replace(theirs, ours)
            state[key] = value
        self.load_state_dict(state)
        return self

    def forward(self, tokens: torch.Tensor, caches: list | None = None) -> torch.Tensor:
        offset = 0 if caches is None else caches[0][2]
        x = self.tok(tokens) * math.sqrt(self.dim) + self.pos[offset:offset + tokens.shape[1]]
        for i, block in enumerate(self.blocks):
            x = block(x, self.attend, None if caches is None else caches[i])
        return self.head(self.norm_f(x))

    def new_caches(self, batch: int, capacity: int) -> list:
        shape = (batch, self.heads, capacity, self.dim // self.heads)
        like = self.tok.weight
        return [[like.new_zeros(shape), like.new_zeros(shape), 0] for _ in self.blocks]

    @torch.no_grad()
    def generate(self, prefix: torch.Tensor, new_tokens: int) -> torch.Tensor:
        """Greedy decoding with the KV cache: ``(B, t)`` -> ``(B, t + new_tokens)``."""
        caches = self.new_caches(prefix.shape[0], prefix.shape[1] + new_tokens)
        tokens, step = [prefix], prefix
        for _ in range(new_tokens):
            step = self(step, caches)[:, -1].argmax(-1, keepdim=True)
            tokens.append(step)
        return torch.cat(tokens, 1)
