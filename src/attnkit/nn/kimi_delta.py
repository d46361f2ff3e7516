"""Kimi Delta Attention: the gated delta rule with one decay per key channel (Kimi Linear's linear layers)."""

from __future__ import annotations

from torch import nn

from ..errors import check_int
from ..functional.recurrences.kda import kimi_delta_attention
from ..registry.entry import Entry, register
from ._inputs import merge_heads, split_heads
from ._recurrent import DeltaRuleLayer, copy_weights, example, transformers_layer
from ._recurrent_parts import GatedRMSNorm, Mixed, ShortConvolution, decay_parameters, log_decay, write_strength
from ._recurrent_spec import recurrent_spec

__all__ = ["KimiDeltaAttention"]


class KimiDeltaAttention(DeltaRuleLayer):
    """The KDA layer: Gated DeltaNet with a low-rank, per-channel forget gate and a low-rank sigmoid output gate.

    Kimi Team 2025, "Kimi Linear: An Expressive, Efficient Attention Architecture",
    arXiv:2510.26692 (KDA and the layer around it)::

        q, k, v = silu(conv1d(x W_Q)), silu(conv1d(x W_K)), silu(conv1d(x W_V));  q, k <- q / |q|, k / |k|
        log alpha_t = -exp(A_log) softplus(x_t W_fa W_fb + dt_bias)        (one per key channel)
        beta_t = sigmoid(x_t W_b)          (2 sigmoid(x_t W_b) with allow_neg_eigval)
        S_t = (I - beta_t k_t k_t^T) Diag(alpha_t) S_{t-1} + beta_t k_t v_t^T,   o_t = S_t^T q_t
        y = (RMSNorm(o) * sigmoid(x W_ga W_gb)) W_O          (per head)

    the recurrence :func:`attnkit.functional.recurrences.kimi_delta_attention`, in the form asked for.
    Notation: ``W_Q, W_K, W_V, W_fa, W_fb, W_b, W_ga, W_gb, W_O`` = ``q_proj, k_proj, v_proj, f_a_proj,
    f_b_proj, b_proj, g_a_proj, g_b_proj, out_proj`` (the low ranks are the head width); ``A_log`` one
    per head, ``dt_bias`` one per channel; the norm = ``norm``.

    Differences from the paper: q is scaled by ``d^-1/2`` after the normalisation (as transformers').
    Projections have no bias.

    Shapes: ``x`` ``(B, n, dim)``, ``key_keep_mask`` ``(B, n)`` bool (True = real token) -> ``(B, n, dim)``;
    :meth:`forward_step`: ``(B, dim) -> (B, dim)``.

    Complexity: chunk form O(n c H d + n H d^2) per layer (d = head width; the block decays are
    ``c x c x d``); state ``H d^2`` numbers plus the convolution's ``3 H d (conv_size - 1)``.

    Args:
        dim: model width.
        num_heads: heads H.
        head_dim: d (default ``dim // num_heads``).
        conv_size: the short convolutions' kernel.
        chunk_size: block length of the chunk form.
        eps: the norm's epsilon.
        allow_neg_eigval: ``beta = 2 sigmoid(x W_b)`` in ``[0, 2]``, so the transition may reflect the state
            (negative eigenvalues, Grazzi et al. 2025, arXiv:2411.12537; see :class:`._recurrent.DeltaRuleLayer`).

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> layer = KimiDeltaAttention(16, 2)
        >>> x = torch.randn(2, 9, 16)
        >>> torch.allclose(layer(x), layer(x, form="parallel"), atol=1e-5)
        True
    """

    per_channel_decay = True

    def __init__(self, dim: int, num_heads: int, *, head_dim: int | None = None, conv_size: int = 4,
                 chunk_size: int = 16, eps: float = 1e-5, allow_neg_eigval: bool = False):
        super().__init__()
        self.allow_neg_eigval = bool(allow_neg_eigval)
        who = "KimiDeltaAttention"
        heads = check_int(who, "num_heads", num_heads, 1)
        d = check_int(who, "head_dim", head_dim or check_int(who, "dim", dim, 1) // heads, 1)
        self.dim, self.num_heads, self.chunk_size = dim, heads, check_int(who, "chunk_size", chunk_size, 1)
        width, self.core_sizes = heads * d, (heads, d, d)
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(dim, width, bias=False) for _ in range(3))
        self.conv1d = ShortConvolution(3 * width, check_int(who, "conv_size", conv_size, 1))
        self.f_a_proj, self.f_b_proj = nn.Linear(dim, d, bias=False), nn.Linear(d, width, bias=False)
        self.A_log, self.dt_bias = decay_parameters(heads, width)
        self.b_proj = nn.Linear(dim, heads, bias=False)
        self.g_a_proj, self.g_b_proj = nn.Linear(dim, d, bias=False), nn.Linear(d, width, bias=False)
        self.norm = GatedRMSNorm(d, eps=eps, activation="sigmoid")
        self.out_proj = nn.Linear(width, dim, bias=False)

    def _mix(self, x, keep, context, offset):
        q, k, v, tail = self.convolved_qkv(x, keep, context)
        g = log_decay(self.f_b_proj(self.f_a_proj(x)), self.A_log, self.dt_bias)  # (B, H, n, d): one per channel
        beta = write_strength(self.b_proj(x), self.allow_neg_eigval)
        return Mixed(*(split_heads(t, self.num_heads) for t in (q, k, v)), g, beta), tail

    def family(self, mixed, **options):
        return kimi_delta_attention(mixed.q, mixed.k, mixed.v, mixed.g, mixed.beta,
                                    normalize_qk=self.normalize_qk, **options)

    def _finish(self, out, mixed, x):
        gate = split_heads(self.g_b_proj(self.g_a_proj(x)), self.num_heads)
        return self.out_proj(merge_heads(self.norm(out, gate)))

    @classmethod
    def from_transformers(cls, layer) -> KimiDeltaAttention:
        """The same layer from transformers' ``KimiLinearDeltaAttention`` (its weights copied).

        ``forward`` then equals ``layer(x)`` and decoding with :meth:`forward_step` equals ``layer``
        with transformers' cache.
        """
        transformers_layer("KimiDeltaAttention", layer, "KimiLinearDeltaAttention")
        new = cls(layer.hidden_size, layer.num_heads, head_dim=layer.head_dim, conv_size=layer.conv_kernel_size,
                  eps=layer.layer_norm_epsilon).to(layer.o_proj.weight)
        gate = layer.forget_gate
        pairs = [(new.q_proj, layer.q_proj), (new.k_proj, layer.k_proj), (new.v_proj, layer.v_proj),
                 (new.conv1d, layer.conv1d), (new.f_a_proj, gate.f_a_proj), (new.f_b_proj, gate.f_b_proj),
                 (new.b_proj, layer.b_proj), (new.g_a_proj, layer.g_a_proj), (new.g_b_proj, layer.g_b_proj),
                 (new.norm, layer.o_norm), (new.out_proj, layer.o_proj)]
        copy_weights([*((mine.weight, theirs.weight) for mine, theirs in pairs), (new.A_log, gate.A_log),
                      (new.dt_bias, gate.dt_bias)])
        return new


register(Entry("kimi-delta-attention", KimiDeltaAttention, "Kimi Team 2025, arXiv:2510.26692 (Kimi Delta Attention)",
               "O(L c D + L D^2 / H)", "the delta rule with a data-dependent decay per key channel and low-rank "
               "gates (Kimi Linear's linear layers)", "linear-recurrent", example(KimiDeltaAttention, 4),
               spec=recurrent_spec(KimiDeltaAttention,
                                   lambda s: KimiDeltaAttention(s["dim"], s["heads"], head_dim=s["head_dim"],
                                                                conv_size=s["conv_size"], chunk_size=s["chunk_size"],
                                                                allow_neg_eigval=s["allow_neg_eigval"]),
                                   {"heads": 4, "head_dim": None, "conv_size": 4, "chunk_size": 16,
                                    "allow_neg_eigval": False},
                                   lambda m: {"head_dim": m.core_sizes[1], "allow_neg_eigval": m.allow_neg_eigval})))
