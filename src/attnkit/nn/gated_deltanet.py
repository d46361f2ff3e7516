"""Gated DeltaNet: the delta rule with Mamba-2's decay per head and an output gate (Qwen3-Next's linear layers)."""

from __future__ import annotations

from torch import nn

from ..functional.recurrences.gated_delta import gated_delta_rule
from ..registry.entry import Entry, register
from ._inputs import merge_heads, split_heads
from ._recurrent import DeltaRuleLayer, copy_weights, example, transformers_layer
from ._recurrent_parts import GatedDeltaInputs, GatedRMSNorm, Mixed, log_decay, write_strength
from ._recurrent_spec import recurrent_spec

__all__ = ["GatedDeltaNet"]


class GatedDeltaNet(DeltaRuleLayer, GatedDeltaInputs):
    """The Gated DeltaNet layer: short convolutions, L2-normalised q and k, the gated delta rule, a gated RMS norm.

    Yang et al. 2024, "Gated Delta Networks: Improving Mamba2 with Delta Rule", arXiv:2412.06464
    (the gated delta rule; the block of their Fig. 1)::

        q, k, v = silu(conv1d(x W_Q)), silu(conv1d(x W_K)), silu(conv1d(x W_V));  q, k <- q / |q|, k / |k|
        alpha_t = exp(-exp(A_log) softplus(x_t W_a + dt_bias)),   beta_t = sigmoid(x_t W_b)
        S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,   o_t = S_t^T q_t
        y = (RMSNorm(o) * silu(x W_G)) W_O          (per head)

    (``beta_t = 2 sigmoid(x_t W_b)`` with ``allow_neg_eigval``) the recurrence
    :func:`attnkit.functional.recurrences.gated_delta_rule`, in the form asked for. Value
    heads may outnumber key heads (``num_key_heads``): each q/k head serves ``num_heads /
    num_key_heads`` consecutive value heads, as Qwen3-Next. Notation: ``W_Q, W_K, W_V, W_a, W_b, W_G,
    W_O`` = ``q_proj, k_proj, v_proj, a_proj, b_proj, g_proj, out_proj``; ``conv1d`` one depthwise
    convolution over the q, k, v channels; the norm = ``norm``.

    Differences from the paper: q is scaled by ``Dk^-1/2`` after the normalisation (as their code
    and transformers'). Projections have no bias.

    Shapes: ``x`` ``(B, n, dim)``, ``key_keep_mask`` ``(B, n)`` bool (True = real token) -> ``(B, n, dim)``;
    :meth:`forward_step`: ``(B, dim) -> (B, dim)``.

    Complexity: chunk form O(n c H (Dk + Dv) + n H Dk Dv) per layer; state ``H Dk Dv`` numbers plus
    the convolution's ``(2 Hk Dk + H Dv)(conv_size - 1)``.

    Args:
        dim: model width.
        num_heads: value heads H.
        num_key_heads: q/k heads Hk (H a multiple; default H).
        key_head_dim, value_head_dim: Dk and Dv (default ``dim // num_heads``).
        conv_size: the short convolutions' kernel.
        chunk_size: block length of the chunk form.
        eps: the norm's epsilon.
        allow_neg_eigval: ``beta = 2 sigmoid(x W_b)`` in ``[0, 2]``, so the transition may reflect the state
            (negative eigenvalues, Grazzi et al. 2025, arXiv:2411.12537; see :class:`._recurrent.DeltaRuleLayer`).

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> layer = GatedDeltaNet(16, 4, num_key_heads=2)
        >>> x = torch.randn(2, 9, 16)
        >>> cache = layer.new_cache()
        >>> steps = torch.stack([layer.forward_step(x[:, t], cache) for t in range(9)], 1)
        >>> torch.allclose(steps, layer(x), atol=1e-5)
        True
    """

    def __init__(self, dim: int, num_heads: int, *, num_key_heads: int | None = None, key_head_dim: int | None = None,
                 value_head_dim: int | None = None, conv_size: int = 4, chunk_size: int = 64, eps: float = 1e-6,
                 allow_neg_eigval: bool = False):
        super().__init__()
        self.allow_neg_eigval = bool(allow_neg_eigval)
        dv = self.gated_delta_inputs("GatedDeltaNet", dim, num_heads, num_key_heads, key_head_dim, value_head_dim,
                                     conv_size, chunk_size)
        self.norm = GatedRMSNorm(dv, eps=eps)
        self.out_proj = nn.Linear(self.num_heads * dv, dim, bias=False)

    def _mix(self, x, keep, context, offset):
        q, k, v, tail = self.convolved_qkv(x, keep, context)
        g = log_decay(self.a_proj(x), self.A_log, self.dt_bias)  # (B, H, n, 1)
        beta = write_strength(self.b_proj(x), self.allow_neg_eigval)
        q, k = (split_heads(t, self.num_key_heads) for t in (q, k))
        return Mixed(q, k, split_heads(v, self.num_heads), g, beta), tail

    def family(self, mixed, **options):
        return gated_delta_rule(mixed.q, mixed.k, mixed.v, mixed.g[..., 0], mixed.beta,
                                normalize_qk=self.normalize_qk, **options)

    def _finish(self, out, mixed, x):
        gate = split_heads(self.g_proj(x), self.num_heads)
        return self.out_proj(merge_heads(self.norm(out, gate)))

    @classmethod
    def from_transformers(cls, layer) -> GatedDeltaNet:
        """The same layer from transformers' ``Qwen3NextGatedDeltaNet`` (its weights copied, regrouped).

        Qwen3-Next projects ``[q, k, v, z]`` and ``[b, a]`` in one matrix each, interleaved per key
        head group; they are split into this layer's projections. ``forward`` then equals
        ``layer(x)`` and decoding with :meth:`forward_step` equals ``layer`` with transformers' cache.
        """
        transformers_layer("GatedDeltaNet", layer, "Qwen3NextGatedDeltaNet")
        hk, h, dk, dv = layer.num_k_heads, layer.num_v_heads, layer.head_k_dim, layer.head_v_dim
        new = cls(layer.hidden_size, h, num_key_heads=hk, key_head_dim=dk, value_head_dim=dv,
                  conv_size=layer.conv_kernel_size, eps=layer.layer_norm_epsilon).to(layer.out_proj.weight)
        r = h // hk
        qkvz = layer.in_proj_qkvz.weight.unflatten(0, (hk, -1)).split([dk, dk, r * dv, r * dv], 1)
        b, a = layer.in_proj_ba.weight.unflatten(0, (hk, -1)).split([r, r], 1)
        projections = (new.q_proj, new.k_proj, new.v_proj, new.g_proj, new.b_proj, new.a_proj)
        copy_weights([*((p.weight, w) for p, w in zip(projections, (*qkvz, b, a), strict=True)),
                      (new.conv1d.weight, layer.conv1d.weight), (new.A_log, layer.A_log), (new.dt_bias, layer.dt_bias),
                      (new.norm.weight, layer.norm.weight), (new.out_proj.weight, layer.out_proj.weight)])
        return new


register(Entry("gated-deltanet", GatedDeltaNet, "Yang et al. 2024, arXiv:2412.06464 (Gated DeltaNet)",
               "O(L c D + L D^2 / H)", "the delta rule with a data-dependent decay per head and an output gate "
               "(Qwen3-Next's linear layers)", "linear-recurrent", example(GatedDeltaNet, 4),
               spec=recurrent_spec(GatedDeltaNet,
                                   lambda s: GatedDeltaNet(s["dim"], s["heads"], num_key_heads=s["key_heads"],
                                                           key_head_dim=s["key_head_dim"],
                                                           value_head_dim=s["value_head_dim"],
                                                           conv_size=s["conv_size"], chunk_size=s["chunk_size"],
                                                           allow_neg_eigval=s["allow_neg_eigval"]),
                                   {"heads": 4, "key_heads": None, "key_head_dim": None, "value_head_dim": None,
                                    "conv_size": 4, "chunk_size": 64, "allow_neg_eigval": False},
                                   lambda m: {"key_heads": m.num_key_heads, "key_head_dim": m.core_sizes[1],
                                              "value_head_dim": m.core_sizes[2],
                                              "allow_neg_eigval": m.allow_neg_eigval})))
