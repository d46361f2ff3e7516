"""RWKV-4's time mixing: token shift, then a per-channel decayed weighted average of the values (the WKV)."""

from __future__ import annotations

import torch
from torch import nn

from ..errors import DTypeError, check_int
from ..functional.recurrences.forms import linear_recurrence
from ..registry.entry import Entry, register
from ._recurrent import RecurrentLayer, copy_weights, example
from ._recurrent_parts import Mixed
from ._recurrent_spec import recurrent_spec

__all__ = ["RWKV4TimeMixing"]


class RWKV4TimeMixing(RecurrentLayer):
    """RWKV-4's time mixing: each channel a softmax-like average of past values under a fixed decay ``w_c``.

    Peng et al. 2023, "RWKV: Reinventing RNNs for the Transformer Era", arXiv:2305.13048, eq. 11-16::

        x'_t = mu x_t + (1 - mu) x_{t-1}               (token shift, one mu per projection: r, k, v)
        r_t = x'_t W_r,  k_t = x'_t W_k,  v_t = x'_t W_v
        wkv_t = (sum_{j<t} e^{-(t-1-j) w + k_j} v_j + e^{u + k_t} v_t)
              / (sum_{j<t} e^{-(t-1-j) w + k_j}     + e^{u + k_t})          (per channel c; w = exp(time_decay))
        o_t = (sigmoid(r_t) * wkv_t) W_o

    The two sums are one linear recurrence per channel (:func:`attnkit.functional.recurrences.
    linear_recurrence`, a head of ``Dk = 1`` and ``Dv = 2`` per channel: key ``e^{k_t}``, values
    ``[v_t, 1]``, log decay ``-w``, query 1) read one step late, ``P_{t-1}``, plus the bonus term of
    the current token; in the form asked for. Notation: ``W_r, W_k, W_v, W_o`` = ``receptance, key,
    value, output``; ``mu`` = ``time_mix_receptance, time_mix_key, time_mix_value``; ``w, u`` =
    ``exp(time_decay)``, ``time_first``. The decoding cache holds the last input (the token shift)
    and the two sums.

    Differences from the paper: none in the function. The reference code rescales its running sums
    by their running maximum key; here the sums are kept as they are, in float32 (float64 for
    float64 layers), which is exact while ``e^{k}`` stays within the dtype's range (float32: keys
    below about 88 in magnitude).

    Shapes: ``x`` ``(B, n, dim)``, ``key_keep_mask`` ``(B, n)`` bool (True = real token) -> ``(B, n, dim)``;
    :meth:`forward_step`: ``(B, dim) -> (B, dim)``.

    Complexity: O(n C) for the WKV over C = ``attention_dim`` channels (every form; the chunk form's
    blocks are c x c per channel), plus the projections O(n dim C).

    Args:
        dim: model width.
        attention_dim: C, the channels of the WKV (default ``dim``).
        chunk_size: block length of the chunk form.

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> layer = RWKV4TimeMixing(8)
        >>> x = torch.randn(2, 7, 8)
        >>> cache = layer.new_cache()
        >>> steps = torch.stack([layer.forward_step(x[:, t], cache) for t in range(7)], 1)
        >>> torch.allclose(steps, layer(x), atol=1e-5)
        True
    """

    scale = 1.0
    learned_decay = True
    constant_query = True  # the sums are read with a query of 1 (cost spec: no gradient through it)

    def __init__(self, dim: int, *, attention_dim: int | None = None, chunk_size: int = 64):
        super().__init__()
        who = "RWKV4TimeMixing"
        check_int(who, "dim", dim, 1)
        inner = dim if attention_dim is None else check_int(who, "attention_dim", attention_dim, 1)
        self.dim, self.num_heads, self.chunk_size = dim, inner, check_int(who, "chunk_size", chunk_size, 1)
        self.core_sizes = (inner, 1, 2)
        self.token_shift = dim  # the decoding cache keeps the last input (cost spec)
        ratio = torch.arange(dim) / dim  # the reference's initialisation, for a first layer of several
        self.time_decay = nn.Parameter(-5 + 8 * (torch.arange(inner) / max(inner - 1, 1)) ** 0.7)
        self.time_first = nn.Parameter(torch.full((inner,), 0.5 * 2.0 ** 0.5 * 0.3))
        self.time_mix_key, self.time_mix_value = nn.Parameter(ratio.clone()), nn.Parameter(ratio + 0.3 * 0.1)
        self.time_mix_receptance = nn.Parameter(0.5 * ratio)
        self.key, self.value = nn.Linear(dim, inner, bias=False), nn.Linear(dim, inner, bias=False)
        self.receptance, self.output = nn.Linear(dim, inner, bias=False), nn.Linear(inner, dim, bias=False)

    def _mix(self, x, keep, context, offset):
        batch, n, _ = x.shape
        previous = x.new_zeros(batch, 1, self.dim) if context is None else context.transpose(1, 2).to(x.dtype)
        if n == 0:  # nothing read, the cache's last input kept
            return self._mixed(x, x), None if context is None else context
        return self._mixed(x, torch.cat([previous, x[:, :-1]], 1)), x[:, -1:].transpose(1, 2)  # tail (B, dim, 1)

    def _mixed(self, x, shifted) -> Mixed:
        batch, n, _ = x.shape
        mus = (self.time_mix_key, self.time_mix_value, self.time_mix_receptance)
        mixes = [torch.lerp(shifted, x, mu.to(x.dtype)) for mu in mus]
        acc = torch.promote_types(x.dtype, torch.float32)
        k, v = self.key(mixes[0]).to(acc), self.value(mixes[1]).to(acc)
        heads = lambda t: t.transpose(1, 2)[..., None]  # (B, n, C) -> (B, C, n, 1)
        weight = heads(k).exp()
        values = torch.cat([heads(v), torch.ones_like(weight)], -1)  # (B, C, n, 2): [v, 1]
        g = (-self.time_decay.to(acc).exp())[:, None, None].expand(batch, self.num_heads, n, 1)
        rest = (torch.sigmoid(self.receptance(mixes[2])), heads(k + self.time_first.to(acc)).exp() * values)
        return Mixed(torch.ones_like(weight), weight, values, g, None, rest)

    def recurrence(self, mixed: Mixed, keep, form: str, initial_state):
        """The sums up to each token, ``P_t``, shifted one step: ``P_{t-1}`` (the state before the call first)."""
        k, g = mixed.k, mixed.g
        if keep is not None:  # a padded token neither writes nor decays
            k, g = (t.masked_fill(~keep[:, None, :, None], 0.0) for t in (k, g))
        sums, state = linear_recurrence(type(self).__name__, mixed.q, k, mixed.v, g, mixed.beta,
                                        scale=self.scale, normalize_qk=self.normalize_qk, form=form,
                                        chunk_size=self.chunk_size, initial_state=initial_state, cu_seqlens=None)
        if sums.shape[2] == 0:
            return sums, state
        before = sums.new_zeros(sums.shape[0], sums.shape[1], 1, 2) if initial_state is None else \
            initial_state.to(sums.dtype)  # (B, C, 1, 2): the query is 1, so a state is its own output
        return torch.cat([before, sums], 2)[:, :, :sums.shape[2]], state

    def _finish(self, out, mixed, x):
        receptance, bonus = mixed.rest
        total = out + bonus  # (B, C, n, 2): numerator and denominator
        wkv = (total[..., 0] / total[..., 1]).transpose(1, 2)  # (B, n, C)
        return self.output((receptance * wkv).to(x.dtype))

    @classmethod
    def from_transformers(cls, layer) -> RWKV4TimeMixing:
        """The same layer from transformers' ``RwkvSelfAttention`` (RWKV-4; its weights copied).

        ``forward`` then equals ``layer(x)[0]`` and decoding with :meth:`forward_step` equals ``layer`` with
        its state.

        Raises:
            attnkit.errors.DTypeError: ``layer`` is not an ``RwkvSelfAttention``.
        """
        if type(layer).__name__ != "RwkvSelfAttention":
            raise DTypeError(f"RWKV4TimeMixing.from_transformers takes an RwkvSelfAttention; got "
                             f"{type(layer).__name__}")
        new = cls(layer.key.in_features, attention_dim=layer.attention_hidden_size).to(layer.output.weight)
        names = ("time_decay", "time_first", "time_mix_key", "time_mix_value", "time_mix_receptance")
        copy_weights([(getattr(new, n), getattr(layer, n)) for n in names]
                     + [(getattr(new, n).weight, getattr(layer, n).weight)
                        for n in ("key", "value", "receptance", "output")])
        return new


register(Entry("rwkv4", RWKV4TimeMixing, "Peng et al. 2023, arXiv:2305.13048, eq. 11-16 (RWKV-4's time mixing)",
               "O(L c C + L dim C)", "token shift, then per channel a decayed weighted average of the values with "
               "a bonus for the current token (the WKV), gated by a sigmoid receptance", "linear-recurrent",
               example(RWKV4TimeMixing),
               spec=recurrent_spec(RWKV4TimeMixing,
                                   lambda s: RWKV4TimeMixing(s["dim"], attention_dim=s["attention_dim"],
                                                             chunk_size=s["chunk_size"]),
                                   {"attention_dim": None, "chunk_size": 64},
                                   lambda m: {"attention_dim": m.num_heads})))
