"""The pieces the linear-recurrent layers build their inputs and outputs from, below the layers and their base.

A layer's ``_mix`` and ``_finish`` (:mod:`._recurrent`) call these, so a forward goes down
from the base (:class:`._recurrent.RecurrentLayer`) through the layer's file to here and never back into a
file it came from: the recurrence's inputs (:class:`Mixed`),
the short convolution (:class:`ShortConvolution`, read by a draft tree's nodes along their ancestors,
:class:`DraftTree`), the layers' use of it (:class:`ConvolvedInputs`), the gated RMS norm, Mamba-2's
discretised decay (:func:`log_decay`, :func:`decay_parameters`, also Gated DeltaNet's and Kimi's), the
delta rule's write strength (:func:`write_strength`) and the input side Gated DeltaNet and Comba share
(:class:`GatedDeltaInputs`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ShapeError, check_int

__all__ = ["Mixed", "DraftTree", "ShortConvolution", "ConvolvedInputs", "GatedRMSNorm", "decay_parameters",
           "log_decay", "write_strength", "GatedDeltaInputs"]


class DraftTree(NamedTuple):
    """What a layer's ``_mix`` is given instead of a convolution context when it verifies a draft tree: the
    context before the tree (``(B, C, K - 1)`` or None) and the nodes' ``parents`` ``(B, T)``."""

    context: torch.Tensor | None
    parents: torch.Tensor


class Mixed(NamedTuple):
    """A layer's recurrence inputs (see :func:`attnkit.functional.recurrences.forms.linear_recurrence`) and what its
    output side needs (``rest``)."""

    q: torch.Tensor  # (B, Hk, L, Dk)
    k: torch.Tensor  # (B, Hk, L, Dk)
    v: torch.Tensor  # (B, H, L, Dv)
    g: torch.Tensor  # (B, H, L, 1 or Dk) log decays
    beta: torch.Tensor | None  # (B, H, L) or None: no delta rule
    rest: tuple = ()


class ShortConvolution(nn.Module):
    """A depthwise causal convolution over the sequence (kernel ``size``), then SiLU: ``y_t = silu(sum_i w_i x_{t-i})``.

    The short convolution of H3/Mamba (Fu et al. 2023, arXiv:2212.14052) that Mamba-2 and the
    DeltaNets put before their recurrences. ``weight`` is ``(channels, 1, size)``, as a
    ``torch.nn.Conv1d`` with ``groups=channels``. Shapes: ``x`` ``(B, L, C)``, ``context`` the
    ``size - 1`` inputs before it ``(B, C, size - 1)`` (zeros if None) -> ``(y (B, L, C), the last
    size - 1 inputs)``.
    """

    def __init__(self, channels: int, size: int, *, bias: bool = False):
        super().__init__()
        check_int("ShortConvolution", "size", size, 1)
        self.weight = nn.Parameter(torch.empty(channels, 1, size))
        self.bias = nn.Parameter(torch.zeros(channels)) if bias else None
        nn.init.kaiming_uniform_(self.weight, a=5 ** 0.5)

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None):
        size = self.weight.shape[-1]
        if context is None:
            context = x.new_zeros(x.shape[0], x.shape[-1], size - 1)
        seen = torch.cat([context.to(x.dtype), x.transpose(1, 2)], -1)  # (B, C, size - 1 + L)
        if x.shape[1] == 0:  # no output to compute (conv1d refuses an input shorter than its kernel)
            return x, seen
        y = F.conv1d(seen, self.weight, self.bias, groups=x.shape[-1])
        return F.silu(y).transpose(1, 2), seen[..., seen.shape[-1] - (size - 1):]

    def along(self, x: torch.Tensor, context: torch.Tensor | None, parents: torch.Tensor):
        """The convolution over a draft tree: node ``i`` reads its own input and its ``size - 1`` nearest
        ancestors' (above a root, the context's last inputs), as its root-to-node path run alone would.

        ``x`` ``(B, T, C)``, ``parents`` ``(B, T)`` -> ``(y (B, T, C), each node's last size - 1 inputs
        (B, C, T, size - 1))``."""
        b, t, c = x.shape
        size = self.weight.shape[-1]
        if context is None:
            context = x.new_zeros(b, c, size - 1)
        seen = torch.cat([context.to(x.dtype), x.transpose(1, 2)], -1)  # (B, C, size - 1 + T)
        before = torch.cat([(torch.arange(size - 1) - 1).clamp(min=0).expand(b, -1),  # the context's rows
                            torch.where(parents < 0, size - 2, parents + size - 1)], 1)  # (B, size - 1 + T)
        rows = [torch.arange(size - 1, size - 1 + t).expand(b, -1)]
        for _ in range(size - 1):
            rows.insert(0, before.gather(1, rows[0]))
        window = torch.stack(rows, -1).to(x.device)  # (B, T, size): oldest first, as conv1d's weight
        read = seen.gather(2, window.flatten(1)[:, None].expand(b, c, -1)).unflatten(2, (t, size))  # (B, C, T, K)
        y = (read * self.weight[:, 0, None, :]).sum(-1)
        if self.bias is not None:
            y = y + self.bias[:, None]
        return F.silu(y).transpose(1, 2), read[..., 1:]


class GatedRMSNorm(nn.Module):
    """RMS norm with an optional multiplicative gate: ``weight * x / rms(x) * act(gate)``, or Mamba-2's gate first.

    ``rms`` is taken over groups of ``width / groups`` features; ``gate_first`` normalises
    ``x * act(gate)`` instead (Mamba-2's ``norm_before_gate=False``). Computed in float32 or better,
    returned in x's dtype. ``weight`` is ``(width,)``.
    """

    def __init__(self, width: int, *, eps: float, activation: str | None = "silu", gate_first: bool = False,
                 groups: int = 1):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps, self.groups, self.gate_first = eps, groups, gate_first
        self.activation = {"silu": F.silu, "sigmoid": torch.sigmoid, None: None}[activation]

    def forward(self, x: torch.Tensor, gate: torch.Tensor | None = None) -> torch.Tensor:
        acc = torch.promote_types(x.dtype, torch.float32)
        y = x.to(acc)
        if gate is not None and self.gate_first:
            y = y * self.activation(gate.to(acc))  # type: ignore[misc]  # a gate needs an activation
        y = y.unflatten(-1, (self.groups, -1))
        y = F.rms_norm(y, (y.shape[-1],), eps=self.eps).flatten(-2) * self.weight.to(acc)
        if gate is not None and not self.gate_first:
            y = y * self.activation(gate.to(acc))  # type: ignore[misc]  # a gate needs an activation
        return y.to(x.dtype)


def decay_parameters(heads: int, steps: int) -> tuple[nn.Parameter, nn.Parameter]:
    """Mamba-2's ``A_log`` ``(heads,)`` (``A`` uniform in [1, 16]) and ``dt_bias`` ``(steps,)`` (``softplus^-1`` of
    step sizes log-uniform in [0.001, 0.1], floor 1e-4), as initialised by the reference code; Gated DeltaNet and
    Kimi Linear reuse them for their decays."""
    dt = torch.exp(torch.rand(steps) * (math.log(0.1) - math.log(0.001)) + math.log(0.001)).clamp(min=1e-4)
    return nn.Parameter(torch.empty(heads).uniform_(1, 16).log()), nn.Parameter(dt + torch.log(-torch.expm1(-dt)))


def log_decay(raw: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor) -> torch.Tensor:
    """``log alpha = -exp(A_log) softplus(raw + dt_bias)`` (Mamba-2's discretised decay), in float32 or better:
    ``raw`` ``(B, n, H c)`` -> ``(B, H, n, c)`` (c decays per head: 1, or one per key channel)."""
    acc = torch.promote_types(raw.dtype, torch.float32)
    rates = F.softplus(raw.to(acc) + dt_bias.to(acc)).unflatten(-1, (A_log.shape[0], -1)).transpose(1, 2)
    return -A_log.to(acc).exp()[:, None, None] * rates


class ConvolvedInputs(nn.Module):
    """What a layer with a short convolution (``conv1d``, :class:`ShortConvolution`) does with it; a base of
    :class:`._recurrent.RecurrentLayer`. ``channels`` reads ``q_proj, k_proj, v_proj`` unless a layer says
    otherwise (Mamba-2: ``[x, B, C]``)."""

    conv1d: ShortConvolution  # where the layer has one
    q_proj: nn.Linear  # what the default channels read
    k_proj: nn.Linear
    v_proj: nn.Linear

    def convolve(self, channels: torch.Tensor, keep, context):
        """The short convolution of ``(B, L, C)`` pre-convolution channels, zeros read at padded positions."""
        if isinstance(context, DraftTree):
            return self.conv1d.along(channels, context.context, context.parents)
        if keep is not None:
            channels = channels.masked_fill(~keep[..., None], 0.0)
        return self.conv1d(channels, context)

    def channels(self, x: torch.Tensor) -> torch.Tensor:
        """The short convolution's input channels of ``x``: ``q_proj, k_proj, v_proj`` side by side (as Mamba-2's
        ``[x, B, C]``)."""
        return torch.cat([p(x) for p in (self.q_proj, self.k_proj, self.v_proj)], -1)

    def conv_context(self, x: torch.Tensor, keep) -> torch.Tensor:
        """The convolution's context ``(B, C, K - 1)`` after the tokens ``x`` ``(B, K - 1, dim)`` (zeros if padded)."""
        channels = self.channels(x)
        return (channels if keep is None else channels.masked_fill(~keep[..., None], 0.0)).transpose(1, 2)

    def convolved_qkv(self, x, keep, context):
        """:meth:`channels` through the short convolution: ``(q, k, v, conv tail)``, each ``(B, n, width)``."""
        mixed, tail = self.convolve(self.channels(x), keep, context)
        widths = [p.out_features for p in (self.q_proj, self.k_proj, self.v_proj)]
        return (*mixed.split(widths, -1), tail)


def write_strength(logits: torch.Tensor, allow_neg_eigval: bool) -> torch.Tensor:
    """The delta rule's ``beta`` ``(B, H, n)`` from ``(B, n, H)`` logits: ``sigmoid``, times 2 with ``allow_neg_eigval``
    (:class:`._recurrent.DeltaRuleLayer`)."""
    beta = torch.sigmoid(logits).transpose(1, 2)
    return 2 * beta if allow_neg_eigval else beta


class GatedDeltaInputs(ConvolvedInputs):
    """The input side of Gated DeltaNet's block, which Comba shares: ``q_proj, k_proj`` ``(dim -> Hk Dk)``,
    ``v_proj, g_proj`` ``(dim -> H Dv)``, ``a_proj, b_proj`` ``(dim -> H)`` (no bias), one short convolution over
    the q, k, v channels (``conv1d``) and Mamba-2's decay parameters ``A_log, dt_bias`` ``(H,)``.

    A layer calls :meth:`gated_delta_inputs` in its ``__init__`` (the parameters are created in that order, so
    a seed gives each layer the same values and ``state_dict`` keys) and adds its own norm and output side.
    """

    dim: int
    num_heads: int
    num_key_heads: int
    core_sizes: tuple[int, int, int]
    chunk_size: int
    g_proj: nn.Linear
    a_proj: nn.Linear
    b_proj: nn.Linear
    A_log: nn.Parameter
    dt_bias: nn.Parameter

    def gated_delta_inputs(self, who: str, dim: int, num_heads: int, num_key_heads: int | None,
                           key_head_dim: int | None, value_head_dim: int | None, conv_size: int,
                           chunk_size: int) -> int:
        """Check the sizes (errors name ``who``), set them and create the input side; returns ``Dv``."""
        heads, key_heads = check_int(who, "num_heads", num_heads, 1), num_key_heads or num_heads
        if heads % check_int(who, "num_key_heads", key_heads, 1):
            raise ShapeError(f"{who}: num_heads must be a multiple of num_key_heads; got {heads} and {key_heads}")
        dk = key_head_dim or check_int(who, "dim", dim, 1) // heads
        dv = value_head_dim or dim // heads
        self.dim, self.num_heads, self.num_key_heads, self.core_sizes = dim, heads, key_heads, (heads, dk, dv)
        self.chunk_size = check_int(who, "chunk_size", chunk_size, 1)
        self.q_proj, self.k_proj = (nn.Linear(dim, key_heads * check_int(who, "key_head_dim", dk, 1), bias=False)
                                    for _ in range(2))
        self.v_proj, self.g_proj = (nn.Linear(dim, heads * check_int(who, "value_head_dim", dv, 1), bias=False)
                                    for _ in range(2))
        self.a_proj, self.b_proj = nn.Linear(dim, heads, bias=False), nn.Linear(dim, heads, bias=False)
        self.conv1d = ShortConvolution(2 * key_heads * dk + heads * dv, check_int(who, "conv_size", conv_size, 1))
        self.A_log, self.dt_bias = decay_parameters(heads, heads)
        return dv
