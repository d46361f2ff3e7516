"""Comba: Gated DeltaNet's block with a correction read at a key of its own and an output correction."""

from __future__ import annotations

import torch
from torch import nn

from ..functional.recurrences import comba, l2_normalize
from ..registry.entry import Entry, register
from ._inputs import merge_heads, split_heads
from ._recurrent import DeltaRuleLayer, example
from ._recurrent_parts import GatedDeltaInputs, GatedRMSNorm, Mixed, log_decay, write_strength
from ._recurrent_spec import recurrent_spec

__all__ = ["Comba"]


class Comba(DeltaRuleLayer, GatedDeltaInputs):
    """The Comba layer: short convolutions, L2-normalised q and k, the Comba recurrence, a sigmoid-gated RMS norm.

    Hu et al. 2025, "Comba: Improving Bilinear RNNs with Closed-loop Control", arXiv:2506.02475
    (the block of flash-linear-attention's ``Comba`` layer)::

        q, k, v = silu(conv1d(x W_Q)), silu(conv1d(x W_K)), silu(conv1d(x W_V));  q, k <- q / |q|, k / |k|
        p_t = sigmoid(d) k_t                          (the correction's key, d one per key head: ``decay``)
        q'_t = q_t - D p_t                            (the output correction, D one per key head)
        alpha_t = exp(-exp(A_log) softplus(x_t W_a + dt_bias)),   beta_t = sigmoid(x_t W_b)
        S_t = (alpha_t I - beta_t k_t p_t^T) S_{t-1} + beta_t k_t v_t^T,   o_t = S_t^T q'_t Dk^-1/2
        y = (RMSNorm(o) * sigmoid(x W_G)) W_O          (per head)

    the recurrence :func:`attnkit.functional.recurrences.comba`, in the form asked for (``beta_t = 2
    sigmoid(x_t W_b)`` with ``allow_neg_eigval``), the correction read before the decay as fla's kernels read
    it (``read_before_decay=False``: ``S_t = alpha_t (I - beta_t k_t p_t^T) S_{t-1} + ...``, as its
    ``naive_recurrent_comba``). With ``d -> inf``, ``D = 0`` and ``read_before_decay=False`` it is Gated
    DeltaNet with a sigmoid output gate. Value heads may outnumber key heads (``num_key_heads``), as in
    :class:`~attnkit.nn.GatedDeltaNet`. Notation: ``W_Q, W_K, W_V, W_a, W_b, W_G, W_O`` = ``q_proj,
    k_proj, v_proj, a_proj, b_proj, g_proj, out_proj``; ``d, D`` = ``decay, D``; ``conv1d`` one depthwise
    convolution over the q, k, v channels.

    Differences from flash-linear-attention's layer: q and k are normalised before ``p`` and the output
    correction are formed (fla subtracts ``D p`` from the raw q and normalises in its kernel, and its fused
    kernel normalises ``p`` too). ``A`` is initialised uniform in [1, 16] (fla: [0, 16]). Projections have
    no bias.

    Shapes: ``x`` ``(B, n, dim)``, ``key_keep_mask`` ``(B, n)`` bool (True = real token) -> ``(B, n, dim)``;
    :meth:`forward_step`: ``(B, dim) -> (B, dim)``.

    Complexity: that of :class:`~attnkit.nn.GatedDeltaNet`: chunk form O(n c H (Dk + Dv) + n H Dk Dv); state
    ``H Dk Dv`` numbers plus the convolution's ``(2 Hk Dk + H Dv)(conv_size - 1)``.

    Args:
        dim: model width.
        num_heads: value heads H.
        num_key_heads: q/k heads Hk (H a multiple; default H).
        key_head_dim, value_head_dim: Dk and Dv (default ``dim // num_heads``).
        conv_size: the short convolutions' kernel.
        chunk_size: block length of the chunk form.
        eps: the norm's epsilon.
        correction_factor: the initial ``D`` (fla's default 1; the paper finds 0.02 better for small models).
        allow_neg_eigval: ``beta`` in ``[0, 2]`` (see :class:`._recurrent.DeltaRuleLayer`).
        read_before_decay: the correction reads ``S_{t-1}`` before the decay (fla's chunk and fused kernels);
            False: after it.

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> layer = Comba(16, 4, num_key_heads=2)
        >>> x = torch.randn(2, 9, 16)
        >>> cache = layer.new_cache()
        >>> steps = torch.stack([layer.forward_step(x[:, t], cache) for t in range(9)], 1)
        >>> torch.allclose(steps, layer(x), atol=1e-5)
        True
    """

    own_recurrence = "its correction reads the state at a key of its own (p), which the tree form does not take"

    def __init__(self, dim: int, num_heads: int, *, num_key_heads: int | None = None, key_head_dim: int | None = None,
                 value_head_dim: int | None = None, conv_size: int = 4, chunk_size: int = 64, eps: float = 1e-5,
                 correction_factor: float = 1.0, allow_neg_eigval: bool = False, read_before_decay: bool = True):
        super().__init__()
        who = "Comba"
        self.allow_neg_eigval = bool(allow_neg_eigval)
        self.reads_before_decay = bool(read_before_decay)  # (cost spec: the first read is of the undecayed state)
        dv = self.gated_delta_inputs(who, dim, num_heads, num_key_heads, key_head_dim, value_head_dim, conv_size,
                                     chunk_size)
        self.decay = nn.Parameter(torch.ones(self.num_key_heads))
        self.D = nn.Parameter(torch.full((self.num_key_heads,), float(correction_factor)))
        self.norm = GatedRMSNorm(dv, eps=eps, activation="sigmoid")
        self.out_proj = nn.Linear(self.num_heads * dv, dim, bias=False)

    def _mix(self, x, keep, context, offset):
        q, k, v, tail = self.convolved_qkv(x, keep, context)
        acc = torch.promote_types(x.dtype, torch.float32)
        q, k = (l2_normalize(split_heads(t, self.num_key_heads).to(acc)) for t in (q, k))
        p = torch.sigmoid(self.decay.to(acc))[:, None, None] * k
        q = q - self.D.to(acc)[:, None, None] * p
        g = log_decay(self.a_proj(x), self.A_log, self.dt_bias)  # (B, H, n, 1)
        beta = write_strength(self.b_proj(x), self.allow_neg_eigval)
        return Mixed(q, k, split_heads(v, self.num_heads), g, beta, (p,)), tail

    def recurrence(self, mixed: Mixed, keep, form: str, initial_state):
        """:func:`~attnkit.functional.recurrences.comba` of ``mixed``; a padded token writes nothing (zero key) and
        does not decay."""
        k, g = mixed.k, mixed.g
        if keep is not None:
            k, g = (t.masked_fill(~keep[:, None, :, None], 0.0) for t in (k, g))
        return comba(mixed.q, k, mixed.v, mixed.rest[0], g[..., 0], mixed.beta, form=form,
                     chunk_size=self.chunk_size, initial_state=initial_state,
                     read_before_decay=self.reads_before_decay)

    def _finish(self, out, mixed, x):
        gate = split_heads(self.g_proj(x), self.num_heads)
        return self.out_proj(merge_heads(self.norm(out, gate)))


register(Entry("comba", Comba, "Hu et al. 2025, arXiv:2506.02475 (Comba)", "O(L c D + L D^2 / H)",
               "Gated DeltaNet's block whose delta-rule correction reads the state at a key of its own, scaled per "
               "head (closed-loop control), with an output correction", "linear-recurrent", example(Comba, 4),
               spec=recurrent_spec(Comba,
                                   lambda s: Comba(s["dim"], s["heads"], num_key_heads=s["key_heads"],
                                                   key_head_dim=s["key_head_dim"], value_head_dim=s["value_head_dim"],
                                                   conv_size=s["conv_size"], chunk_size=s["chunk_size"],
                                                   allow_neg_eigval=s["allow_neg_eigval"],
                                                   read_before_decay=s["read_before_decay"]),
                                   {"heads": 4, "key_heads": None, "key_head_dim": None, "value_head_dim": None,
                                    "conv_size": 4, "chunk_size": 64, "allow_neg_eigval": False,
                                    "read_before_decay": True},
                                   lambda m: {"key_heads": m.num_key_heads, "key_head_dim": m.core_sizes[1],
                                              "value_head_dim": m.core_sizes[2], "allow_neg_eigval": m.allow_neg_eigval,
                                              "read_before_decay": m.reads_before_decay})))
