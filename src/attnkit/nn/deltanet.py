"""DeltaNet: linear attention whose fast-weight state is corrected by the delta rule."""

from __future__ import annotations

from torch import nn

from ..errors import ShapeError, check_int
from ..functional.recurrences.delta import delta_rule
from ..registry.entry import Entry, register
from ._inputs import merge_heads, split_heads
from ._recurrent import DeltaRuleLayer, example
from ._recurrent_parts import GatedRMSNorm, Mixed, ShortConvolution, write_strength
from ._recurrent_spec import recurrent_spec

__all__ = ["DeltaNet"]


class DeltaNet(DeltaRuleLayer):
    """The DeltaNet layer: short convolutions, L2-normalised q and k, the delta rule, a per-head RMS norm.

    Schlag et al. 2021, arXiv:2102.11174 (the delta rule); the layer of Yang et al. 2024,
    "Parallelizing Linear Transformers with the Delta Rule over Sequence Length",
    arXiv:2406.06484, Sec. 4 (architecture)::

        q, k, v = silu(conv1d(x W_Q)), silu(conv1d(x W_K)), silu(conv1d(x W_V));  q, k <- q / |q|, k / |k|
        beta_t = sigmoid(x_t W_beta)          (2 sigmoid(x_t W_beta) with allow_neg_eigval)
        S_t = (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,   o_t = S_t^T q_t
        y = RMSNorm(o) W_O          (per head)

    the recurrence :func:`attnkit.functional.recurrences.delta_rule`, in the form asked for. Notation:
    ``W_Q, W_K, W_V, W_beta, W_O`` = ``q_proj, k_proj, v_proj, b_proj, out_proj``; ``conv1d`` one
    depthwise convolution over the ``3 dim`` channels; the norm = ``norm``.

    Differences from the paper: q is scaled by ``d^-1/2`` after the normalisation (as their code);
    no output gate. Projections have no bias.

    Shapes: ``x`` ``(B, n, dim)``, ``key_keep_mask`` ``(B, n)`` bool (True = real token) -> ``(B, n, dim)``;
    :meth:`forward_step`: ``(B, dim) -> (B, dim)``.

    Complexity: chunk form O(n c dim + n dim^2 / H) per layer; state ``dim^2 / H`` numbers plus the
    convolution's ``3 dim (conv_size - 1)``.

    Args:
        dim: model width.
        num_heads: heads (``dim % num_heads == 0``).
        conv_size: the short convolutions' kernel.
        chunk_size: block length of the chunk form.
        eps: the norm's epsilon.
        allow_neg_eigval: ``beta = 2 sigmoid(x W_beta)`` in ``[0, 2]``, so the transition may reflect the state
            (negative eigenvalues, Grazzi et al. 2025, arXiv:2411.12537; see :class:`._recurrent.DeltaRuleLayer`).

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> layer = DeltaNet(16, 2)
        >>> x = torch.randn(1, 9, 16)
        >>> keep = torch.tensor([[False] * 3 + [True] * 6])  # left padding: inert
        >>> torch.allclose(layer(x, key_keep_mask=keep)[:, 3:], layer(x[:, 3:]), atol=1e-5)
        True
    """

    def __init__(self, dim: int, num_heads: int, *, conv_size: int = 4, chunk_size: int = 64, eps: float = 1e-5,
                 allow_neg_eigval: bool = False):
        super().__init__()
        self.allow_neg_eigval = bool(allow_neg_eigval)
        if check_int("DeltaNet", "dim", dim, 1) % check_int("DeltaNet", "num_heads", num_heads, 1):
            raise ShapeError(f"DeltaNet: dim must be a multiple of num_heads; got dim={dim}, num_heads={num_heads}")
        self.dim, self.num_heads, self.chunk_size = dim, num_heads, check_int("DeltaNet", "chunk_size", chunk_size, 1)
        self.learned_decay = False  # no decay at all
        self.core_sizes = (num_heads, dim // num_heads, dim // num_heads)
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(dim, dim, bias=False) for _ in range(3))
        self.conv1d = ShortConvolution(3 * dim, check_int("DeltaNet", "conv_size", conv_size, 1))
        self.b_proj = nn.Linear(dim, num_heads, bias=False)
        self.norm = GatedRMSNorm(dim // num_heads, eps=eps)
        self.out_proj = nn.Linear(dim, dim, bias=False)

    def _mix(self, x, keep, context, offset):
        q, k, v, tail = self.convolved_qkv(x, keep, context)
        beta = write_strength(self.b_proj(x), self.allow_neg_eigval)  # (B, H, n)
        g = beta.new_zeros(*beta.shape, 1)
        return Mixed(*(split_heads(t, self.num_heads) for t in (q, k, v)), g, beta), tail

    def family(self, mixed, **options):
        return delta_rule(mixed.q, mixed.k, mixed.v, mixed.beta, normalize_qk=self.normalize_qk, **options)

    def _finish(self, out, mixed, x):
        return self.out_proj(merge_heads(self.norm(out)))


register(Entry("deltanet", DeltaNet, "Yang et al. 2024, arXiv:2406.06484 (DeltaNet; the delta rule of Schlag et al. "
               "2021, arXiv:2102.11174)", "O(L c D + L D^2 / H)",
               "linear attention whose state is corrected by the delta rule, short convolutions", "linear-recurrent",
               example(DeltaNet, 4),
               spec=recurrent_spec(DeltaNet,
                                   lambda s: DeltaNet(s["dim"], s["heads"], conv_size=s["conv_size"],
                                                      chunk_size=s["chunk_size"],
                                                      allow_neg_eigval=s["allow_neg_eigval"]),
                                   {"heads": 4, "conv_size": 4, "chunk_size": 64, "allow_neg_eigval": False},
                                   lambda m: {"allow_neg_eigval": m.allow_neg_eigval})))
