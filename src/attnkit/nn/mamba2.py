"""The Mamba-2 mixer: projections, short convolution and gated norm around the SSD core."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ArgumentError, ShapeError, check_int
from ..functional.recurrences.ssd import ssd, ssd_inputs
from ..registry.entry import Entry, register
from ._inputs import merge_heads, split_heads
from ._recurrent import RecurrentLayer, example
from ._recurrent_parts import GatedRMSNorm, Mixed, ShortConvolution, decay_parameters
from ._recurrent_spec import recurrent_spec

__all__ = ["Mamba2Mixer"]


class Mamba2Mixer(RecurrentLayer):
    """The Mamba-2 block's mixer: a selective SSM with a scalar decay per head (SSD), in parallel projections.

    Dao & Gu 2024, "Transformers are SSMs", arXiv:2405.21060, Sec. 7 (the Mamba-2 block, Fig. 6)::

        [z, x, B, C, dt] = u W_in                      (one projection, in parallel)
        [x, B, C] = silu(conv1d([x, B, C]))            (depthwise causal, kernel 4)
        dt = softplus(dt + dt_bias),  A = -exp(A_log)
        y = SSD(x, dt, A, B, C) + D x                  (:func:`attnkit.functional.recurrences.ssd`)
        out = RMSNorm(y * silu(z)) W_out               (the norm over groups of d_inner / G features)

    Notation: ``W_in`` = ``in_proj`` (outputs in the order z, x, B, C, dt, as Mamba's code and
    transformers' ``Mamba2Mixer``), ``conv1d``, ``dt_bias``, ``A_log``, ``D``, ``norm``, ``W_out`` =
    ``out_proj``; d_inner = ``expand * dim``, ``H = d_inner / head_dim`` heads of width P = ``head_dim``,
    ``state_dim`` = N, ``num_groups`` = G (heads ``h`` read ``B, C`` of group ``h // (H / G)``).

    Differences from the paper: none in the computation (``dt`` is clamped to ``dt_limit``, the
    reference's default (0, inf) a no-op). Initialisation as the reference code: ``A`` uniform in
    [1, 16], ``dt`` log-uniform in [0.001, 0.1] (floor 1e-4), ``D = 1``.

    The variants the Mamba-2 families ship (:meth:`from_transformers`): a width ``inner_dim`` that
    is not ``expand * dim`` (Nemotron-H's heads x head_dim, Falcon-H1's ``mamba_d_ssm``), biases on
    the projections and none on the convolution, ``dt_limit`` (Nemotron-H, Zamba2: ``dt >=
    time_step_min``), the norm after the gate or before it (``norm_before_gate``), or no norm at all
    (``gated_norm=False``: ``y * silu(z)``, Falcon-H1 without ``mamba_rms_norm``).

    Shapes: ``x`` ``(B, n, dim)``, ``key_keep_mask`` ``(B, n)`` bool (True = real token) -> ``(B, n, dim)``;
    :meth:`forward_step`: ``(B, dim) -> (B, dim)``.

    Complexity: chunk form O(n c (N + P) H + n N P H) plus the projections O(n dim d_inner); state
    ``H N P`` numbers plus the convolution's ``3 (d_inner + 2 G N)``.

    Args:
        dim: model width.
        num_heads: H, as the other layers take it (``head_dim`` is then ``expand * dim / H``); or give
            ``head_dim`` (default 64) and H follows.
        head_dim: P.
        state_dim: N.
        expand: d_inner / dim.
        num_groups: G.
        conv_size: the short convolution's kernel.
        chunk_size: block length of the chunk form.
        eps: the norm's epsilon.
        inner_dim: d_inner, when not ``expand * dim`` (then ``expand`` is not read).
        in_bias: a bias on ``in_proj``.
        out_bias: a bias on ``out_proj``.
        conv_bias: a bias on the short convolution.
        dt_limit: ``(low, high)``: ``dt`` clamped to it after the softplus.
        gated_norm: the gated RMS norm; False: ``y * silu(z)`` with no norm (and no ``norm`` module).
        norm_before_gate: normalise ``y``, then gate it (False: Mamba-2's gate first).

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> layer = Mamba2Mixer(16, head_dim=8, state_dim=4)
        >>> x = torch.randn(2, 9, 16)
        >>> cache = layer.new_cache()
        >>> prefix = layer(x[:, :5], cache=cache)
        >>> rest = torch.stack([layer.forward_step(x[:, t], cache) for t in range(5, 9)], 1)
        >>> torch.allclose(torch.cat([prefix, rest], 1), layer(x), atol=1e-5)
        True
    """

    scale = 1.0

    def __init__(self, dim: int, num_heads: int | None = None, *, head_dim: int | None = None, state_dim: int = 128,
                 expand: int = 2, num_groups: int = 1, conv_size: int = 4, chunk_size: int = 64, eps: float = 1e-5,
                 inner_dim: int | None = None, in_bias: bool = False, out_bias: bool = False, conv_bias: bool = True,
                 dt_limit: tuple[float, float] = (0.0, math.inf), gated_norm: bool = True,
                 norm_before_gate: bool = False):
        super().__init__()
        who = "Mamba2Mixer"
        check_int(who, "dim", dim, 1)
        inner = check_int(who, "expand", expand, 1) * dim if inner_dim is None else check_int(who, "inner_dim",
                                                                                             inner_dim, 1)
        if num_heads is not None:  # (dim, heads) as the other layers: the head width follows
            check_int(who, "num_heads", num_heads, 1)
            if head_dim is None:
                if inner % num_heads:
                    raise ShapeError(f"{who}: d_inner = {inner} must be a multiple of num_heads; "
                                     f"got num_heads={num_heads}")
                head_dim = inner // num_heads
            elif num_heads * head_dim != inner:
                raise ShapeError(f"{who}: num_heads * head_dim must equal d_inner = {inner}; got num_heads="
                                 f"{num_heads}, head_dim={head_dim}")
        head_dim = 64 if head_dim is None else head_dim
        heads = inner // check_int(who, "head_dim", head_dim, 1)
        if inner % head_dim or heads % check_int(who, "num_groups", num_groups, 1):
            raise ShapeError(f"{who}: d_inner = {inner} must be a multiple of head_dim = {head_dim}, and the "
                             f"heads ({inner / head_dim:g}) a multiple of num_groups = {num_groups}")
        self.dim, self.num_heads, self.chunk_size = dim, heads, check_int(who, "chunk_size", chunk_size, 1)
        self.sizes = (inner, num_groups * check_int(who, "state_dim", state_dim, 1), num_groups)
        self.core_sizes = (heads, state_dim, head_dim)
        conv_channels = inner + 2 * num_groups * state_dim
        self.in_proj = nn.Linear(dim, inner + conv_channels + heads, bias=in_bias)
        self.conv1d = ShortConvolution(conv_channels, check_int(who, "conv_size", conv_size, 1), bias=conv_bias)
        self.A_log, self.dt_bias = decay_parameters(heads, heads)
        self.D = nn.Parameter(torch.ones(heads))
        self.norm = GatedRMSNorm(inner, eps=eps, gate_first=not norm_before_gate, groups=num_groups) \
            if gated_norm else None
        self.out_proj = nn.Linear(inner, dim, bias=out_bias)
        low, high = dt_limit
        if not 0 <= low <= high:
            raise ArgumentError(f"{who}: dt_limit must be (low, high) with 0 <= low <= high; got {dt_limit!r}")
        self.dt_limit = (float(low), float(high))

    def _split(self, projected):
        """``(z, [x, B, C], dt)`` of ``in_proj``'s output."""
        inner, bc, _ = self.sizes
        return projected.split([inner, inner + 2 * bc, self.num_heads], -1)

    def channels(self, x):
        return self._split(self.in_proj(x))[1]

    def _mix(self, x, keep, context, offset):
        inner, bc, groups = self.sizes
        z, xbc, dt = self._split(self.in_proj(x))
        xbc, tail = self.convolve(xbc, keep, context)
        xs, b, c = xbc.split([inner, bc, bc], -1)
        xs = split_heads(xs, self.num_heads)  # (B, H, n, P)
        dt = F.softplus(dt.to(torch.promote_types(x.dtype, torch.float32)) + self.dt_bias).transpose(1, 2)  # (B, H, n)
        if self.dt_limit != (0.0, math.inf):
            dt = dt.clamp(*self.dt_limit)
        b, c = split_heads(b, groups), split_heads(c, groups)
        if keep is not None:  # a padded token neither writes (B = 0) nor decays (dt = 0)
            b, dt = b.masked_fill(~keep[:, None, :, None], 0.0), dt.masked_fill(~keep[:, None, :], 0.0)
        q, k, v, g = ssd_inputs(xs, dt, -self.A_log.exp(), b, c)
        return Mixed(q, k, v, g, None, (xs, z, dt, b, c)), tail

    def family(self, mixed, *, scale, **options):
        """:func:`~attnkit.functional.recurrences.ssd` (``scale`` is its 1) of ``mixed``'s inputs, the output kept
        in the computation's dtype (``D x`` is added by :meth:`_finish`, as for a draft tree)."""
        xs, _, dt, b, c = mixed.rest
        return ssd(xs, dt, -self.A_log.exp(), b, c, out_dtype=mixed.v.dtype, **options)

    def _finish(self, out, mixed, x):
        xs, z = mixed.rest[:2]
        y = merge_heads(out + xs.to(out.dtype) * self.D.to(out.dtype)[:, None, None]).to(x.dtype)  # (B, n, d_inner)
        return self.out_proj(y * F.silu(z) if self.norm is None else self.norm(y, z))

    @classmethod
    def from_transformers(cls, layer) -> Mamba2Mixer:
        """The same mixer from a transformers Mamba-2 layer (its weights copied): ``Mamba2Mixer`` (mamba2),
        ``BambaMixer``, ``NemotronHMamba2Mixer``, ``FalconH1Mixer``, ``GraniteMoeHybridMambaLayer`` or
        ``Zamba2MambaMixer``.

        ``forward`` then equals ``layer(x)`` and decoding with :meth:`forward_step` equals ``layer`` with
        transformers' cache. Falcon-H1's multipliers (``ssm_in_multiplier`` on the input, ``mup_vector`` on
        ``in_proj``'s outputs) are folded into ``in_proj``. Where ``dt_limit`` clamps (``time_step_min``),
        transformers' one-token step does not clamp while its prefill does; this module clamps in every form.

        Raises:
            attnkit.errors.DTypeError: ``layer`` is not one of those classes.
            attnkit.errors.UnsupportedFeature: its convolution's activation is not SiLU.
        """
        from ..integrations.transformers_layers import mamba2_from_transformers

        return mamba2_from_transformers(cls, layer)


_OPTIONS = ("head_dim", "state_dim", "expand", "num_groups", "conv_size", "chunk_size")
register(Entry("mamba2", Mamba2Mixer, "Dao & Gu 2024, arXiv:2405.21060, Sec. 7 (the Mamba-2 block's mixer)",
               "O(L c (N + P) H + L N P H)", "selective SSM with a scalar decay per head (SSD), short convolution "
               "and gated norm", "linear-recurrent", example(Mamba2Mixer, head_dim=16, state_dim=16),
               spec=recurrent_spec(Mamba2Mixer,
                                   lambda s: Mamba2Mixer(s["dim"], **{k: s[k] for k in _OPTIONS}),
                                   {"head_dim": 16, "state_dim": 16, "expand": 2, "num_groups": 1, "conv_size": 4,
                                    "chunk_size": 64},
                                   lambda m: {"head_dim": m.core_sizes[2], "state_dim": m.core_sizes[1],
                                              "expand": m.sizes[0] // m.dim, "num_groups": m.sizes[2]})))
