"""Gated DeltaProduct: Gated DeltaNet with several delta-rule steps (Householder products) per token."""

from __future__ import annotations

from torch import nn

from ..errors import ShapeError, check_int
from ..functional.recurrences import delta_product
from ..registry.entry import Entry, register
from ._inputs import merge_heads, split_heads
from ._recurrent import DeltaRuleLayer, example
from ._recurrent_parts import GatedRMSNorm, Mixed, ShortConvolution, decay_parameters, log_decay, write_strength
from ._recurrent_spec import recurrent_spec

__all__ = ["DeltaProduct"]


class DeltaProduct(DeltaRuleLayer):
    """The (Gated) DeltaProduct layer: Gated DeltaNet's block with ``n_h`` keys, values and betas per token.

    Siems et al. 2025, "DeltaProduct: Improving State-Tracking in Linear RNNs via Householder
    Products", arXiv:2502.10297, Sec. 3::

        q = silu(conv1d(x W_Q));  k_i, v_i = silu(conv1d(x W_K))_i, silu(conv1d(x W_V))_i   (i = 1 .. n_h)
        q, k_i <- q / |q|, k_i / |k_i|;   beta_i = sigmoid(x W_b)_i  (2 sigmoid with allow_neg_eigval)
        alpha = exp(-exp(A_log) softplus(x W_a + dt_bias))   (with forget_gate; else 1)
        S_{t,0} = alpha_t S_{t-1};  S_{t,i} = (I - beta_i k_i k_i^T) S_{t,i-1} + beta_i k_i v_i^T;  S_t = S_{t,n_h}
        o_t = S_t^T q_t
        y = (RMSNorm(o) * silu(x W_G)) W_O          (per head)

    the recurrence :func:`attnkit.functional.recurrences.delta_product`, in the form asked for: the
    transition is ``alpha_t`` times a product of ``n_h`` Householder-like matrices.
    ``num_householder = 1`` is Gated DeltaNet (DeltaNet with an output gate without ``forget_gate``).
    Notation: ``W_Q, W_K, W_V, W_b, W_a, W_G, W_O`` = ``q_proj, k_proj, v_proj, b_proj, a_proj, g_proj,
    out_proj``; ``W_K`` gives the ``n_h`` keys of a head side by side (``(H, n_h, Dk)`` features),
    likewise ``W_V`` and ``W_b``.

    Differences from the paper: q is scaled by ``Dk^-1/2`` after the normalisation. Projections have
    no bias.

    Shapes: ``x`` ``(B, n, dim)``, ``key_keep_mask`` ``(B, n)`` bool (True = real token) -> ``(B, n, dim)``;
    :meth:`forward_step`: ``(B, dim) -> (B, dim)``.

    Complexity: chunk form O(n n_h c H (Dk + Dv) + n n_h H Dk Dv) per layer; state ``H Dk Dv`` numbers
    plus the convolution's ``H (Dk + n_h (Dk + Dv)) (conv_size - 1)``.

    Args:
        dim: model width.
        num_heads: heads H (``dim % H == 0``; ``Dk = Dv = dim / H``).
        num_householder: ``n_h``, delta-rule steps per token.
        forget_gate: Gated DeltaNet's decay ``alpha_t`` (Gated DeltaProduct).
        allow_neg_eigval: ``beta`` in ``[0, 2]`` (see :class:`._recurrent.DeltaRuleLayer`).
        conv_size: the short convolutions' kernel.
        chunk_size: block length of the chunk form, in steps (``n n_h`` of them).
        eps: the norm's epsilon.

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> layer = DeltaProduct(16, 2, num_householder=3, allow_neg_eigval=True)
        >>> x = torch.randn(2, 9, 16)
        >>> cache = layer.new_cache()
        >>> steps = torch.stack([layer.forward_step(x[:, t], cache) for t in range(9)], 1)
        >>> torch.allclose(steps, layer(x), atol=1e-5)
        True
    """

    def __init__(self, dim: int, num_heads: int, *, num_householder: int = 2, forget_gate: bool = True,
                 allow_neg_eigval: bool = False, conv_size: int = 4, chunk_size: int = 64, eps: float = 1e-6):
        super().__init__()
        who = "DeltaProduct"
        heads, n_h = check_int(who, "num_heads", num_heads, 1), check_int(who, "num_householder", num_householder, 1)
        if check_int(who, "dim", dim, 1) % heads:
            raise ShapeError(f"{who}: dim must be a multiple of num_heads; got dim={dim}, num_heads={heads}")
        d = dim // heads
        self.dim, self.num_heads, self.num_householder, self.core_sizes = dim, heads, n_h, (heads, d, d)
        self.steps_per_token = n_h
        self.chunk_size = check_int(who, "chunk_size", chunk_size, 1)
        self.allow_neg_eigval, self.learned_decay = bool(allow_neg_eigval), bool(forget_gate)
        self.q_proj = nn.Linear(dim, dim, bias=False)
        self.k_proj, self.v_proj = (nn.Linear(dim, n_h * dim, bias=False) for _ in range(2))
        self.b_proj = nn.Linear(dim, heads * n_h, bias=False)
        self.conv1d = ShortConvolution((1 + 2 * n_h) * dim, check_int(who, "conv_size", conv_size, 1))
        if forget_gate:
            self.a_proj = nn.Linear(dim, heads, bias=False)
            self.A_log, self.dt_bias = decay_parameters(heads, heads)
        self.g_proj = nn.Linear(dim, dim, bias=False)
        self.norm = GatedRMSNorm(d, eps=eps)
        self.out_proj = nn.Linear(dim, dim, bias=False)

    def _mix(self, x, keep, context, offset):
        q, k, v, tail = self.convolved_qkv(x, keep, context)
        h, n_h = self.num_heads, self.num_householder
        steps = [split_heads(t, h * n_h).unflatten(1, (h, n_h)).transpose(2, 3).flatten(2, 3) for t in (k, v)]
        beta = write_strength(self.b_proj(x), self.allow_neg_eigval)
        beta = beta.unflatten(1, (h, n_h)).transpose(2, 3).flatten(2, 3)  # (B, H, n n_h)
        if self.learned_decay:
            g = log_decay(self.a_proj(x), self.A_log, self.dt_bias)  # (B, H, n, 1)
        else:
            g = beta.new_zeros(x.shape[0], h, x.shape[1], 1)
        return Mixed(split_heads(q, h), *steps, g, beta), tail

    def recurrence(self, mixed: Mixed, keep, form: str, initial_state):
        """:func:`~attnkit.functional.recurrences.delta_product` of ``mixed``; a padded token's steps write nothing and
        it does not decay."""
        k, g = mixed.k, mixed.g
        if keep is not None:
            pad = ~keep[:, None, :, None]
            k = k.masked_fill(pad.repeat_interleave(self.num_householder, 2), 0.0)
            g = g.masked_fill(pad, 0.0)
        return delta_product(mixed.q, k, mixed.v, mixed.beta, num_householder=self.num_householder, g=g[..., 0],
                             scale=self.scale, normalize_qk=True, form=form, chunk_size=self.chunk_size,
                             initial_state=initial_state)

    def _finish(self, out, mixed, x):
        gate = split_heads(self.g_proj(x), self.num_heads)
        return self.out_proj(merge_heads(self.norm(out, gate)))


register(Entry("delta-product", DeltaProduct, "Siems et al. 2025, arXiv:2502.10297 (Gated DeltaProduct)",
               "O(L n_h c D + L n_h D^2 / H)", "n_h delta-rule steps per token: each transition a product of "
               "Householder-like matrices, with Gated DeltaNet's decay", "linear-recurrent",
               example(DeltaProduct, 4, num_householder=2),
               spec=recurrent_spec(DeltaProduct,
                                   lambda s: DeltaProduct(s["dim"], s["heads"], num_householder=s["num_householder"],
                                                          forget_gate=s["forget_gate"],
                                                          allow_neg_eigval=s["allow_neg_eigval"],
                                                          conv_size=s["conv_size"], chunk_size=s["chunk_size"]),
                                   {"heads": 4, "num_householder": 2, "forget_gate": True, "allow_neg_eigval": False,
                                    "conv_size": 4, "chunk_size": 64},
                                   lambda m: {"num_householder": m.num_householder, "forget_gate": m.learned_decay,
                                              "allow_neg_eigval": m.allow_neg_eigval})))
