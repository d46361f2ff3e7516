"""Log-linear attention: a linear recurrence read through O(log L) Fenwick-tree buckets, each with its own weight.

Guo, Yang, Goel, Xing, Dao & Kim 2025, "Log-Linear Attention", arXiv:2506.04761. A gated linear
recurrence (Mamba-2's scalar decay, or Gated DeltaNet's delta rule) has a lower-triangular
attention matrix ``P`` on the values, ``o_t = sum_{s<=t} P_ts v_s``::

    Mamba-2:         P_ts = q_t^T k_s exp(g_{s+1} + ... + g_t)
    Gated DeltaNet:  P_ts = q_t^T A_t A_{t-1} ... A_{s+1} beta_s k_s,   A_r = exp(g_r) (I - beta_r k_r k_r^T)

Log-linear attention weights it by a hierarchical matrix (the paper's ``M^H``, eq. 5-6)::

    o_t = sum_{s<=t} lambda_t^{l(t,s)} P_ts v_s,      l(t,s) = bit_length(t XOR s)

(positions from 0): level 0 is the token itself, level ``l >= 1`` the Fenwick bucket of ``2^{l-1}``
tokens that shares ``t``'s bits above bit ``l - 1`` (present where that bit of ``t`` is set). The
prefix before ``t`` is the union of at most ``log2 t`` buckets, and ``lambda_t`` ``(G,)`` weighs each;
with every ``lambda = 1`` the recurrence itself comes back. Each bucket keeps a state of its own,
``S^(l) = sum_{s in bucket} A_t ... A_{s+1} beta_s k_s v_s^T`` (every bucket follows the recurrence's
transition), so decoding holds ``O(log L)`` matrices: ``o_t = sum_l lambda_t^l S_t^(l)T q_t``, and
after token ``t`` the buckets below level ``m = bit_length(t XOR (t + 1))`` and the token merge into
level ``m``.

Forms: ``parallel``: the masked matrix ``(P * M^H) V`` over the whole sequence; ``chunk``: blocks of
``c`` tokens, the masked matrix within a block and, across blocks, every bucket state passed from
block to block (each block reads them all); ``recurrent``: token by token on the bucket states. A
state entered at position ``p`` (the buckets of the prefix ``[0, p)``) reaches a query at ``t >= p``
from its bucket ``l`` at level ``max(l, bit_length(t XOR p))``: so blocks need no alignment.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...errors import ArgumentError, ShapeError, UnsupportedFeature
from .forms import check_form, check_qkv, check_tensor, prepare
from .local import local_terms

__all__ = ["log_linear_attention", "levels_for", "fenwick_level"]


def fenwick_level(x: torch.Tensor) -> torch.Tensor:
    """``bit_length`` of non-negative int64 ``x``, elementwise: the Fenwick level of two positions' XOR."""
    return torch.frexp(x.to(torch.float64))[1].to(torch.long)  # x = m 2^e, m in [0.5, 1): e = bit_length


def levels_for(length: int) -> int:
    """The levels ``G`` (level weights per token) that positions ``0 .. length - 1`` need: ``bit_length(length -
    1) + 1`` (1 for one token)."""
    return max(int(length) - 1, 0).bit_length() + 1


def log_linear_attention(q, k, v, g, level_weights, beta=None, *, scale=None, normalize_qk: bool = False,
                         form: str = "chunk", chunk_size: int = 64, initial_state=None, offset=0,
                         key_keep_mask=None):
    """Log-linear Mamba-2 (``beta`` None) or log-linear Gated DeltaNet (``beta`` given), in any form.

    Guo et al. 2025, "Log-Linear Attention", arXiv:2506.04761 (Sec. 3; see the module docstring)::

        o_t = sum_{s<=t} lambda_t^{bit_length(t XOR s)} P_ts v_s

    with ``P`` the attention matrix of :func:`attnkit.functional.recurrences.ssd`'s recurrence (decay
    ``exp(g_t)``, ``S_t = exp(g_t) S_{t-1} + k_t v_t^T``) or of :func:`~attnkit.functional.recurrences.
    gated_delta_rule`'s (``S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T``), and
    ``lambda = level_weights``. With every weight 1 it equals that recurrence.

    Differences from the paper: none in the function; how ``lambda`` is made belongs to a layer.

    Shapes: ``q, k`` ``(B, Hk, L, Dk)``, ``v`` ``(B, H, L, Dv)``, ``g`` ``(B, H, L)`` log decays (``<= 0``),
    ``level_weights`` ``(B, H, L, G)`` (``G`` levels: positions up to ``2^(G-1) - 1``), ``beta`` ``(B, H, L)``
    or None; ``initial_state`` ``(B, H, G, Dk, Dv)``, the bucket states of levels ``1 .. G`` of the
    prefix before the first token (None: zeros); ``offset`` (int or ``(B,)``): that prefix's length, the
    first token's position; ``key_keep_mask`` ``(B, L)`` bool: False tokens take no position and
    neither write nor decay (their outputs are not meaningful)
    -> ``(out (B, H, L, Dv), final bucket states (B, H, G, Dk, Dv))``. ``q`` is scaled by ``scale``
    (``Dk^-1/2``), q and k L2-normalised with ``normalize_qk``; computed in float32 (float64 for
    float64 values).

    Complexity: chunk form O(L c (Dk + Dv) + L G Dk Dv) time (``G = O(log L)``), memory linear in L;
    parallel O(L^2 (Dk + Dv)); recurrent O(L G Dk Dv); state ``G Dk Dv`` per head.

    Example:
        >>> import torch
        >>> import torch.nn.functional as F
        >>> _ = torch.manual_seed(0)
        >>> q, k, v = torch.randn(3, 1, 2, 9, 4).unbind(0)
        >>> g, lam = F.logsigmoid(torch.randn(1, 2, 9)), torch.rand(1, 2, 9, levels_for(9))
        >>> out, state = log_linear_attention(q, k, v, g, lam, chunk_size=4)
        >>> state.shape
        torch.Size([1, 2, 5, 4, 4])
        >>> torch.allclose(out, log_linear_attention(q, k, v, g, lam, form="recurrent")[0], atol=1e-5)
        True
    """
    who = "log_linear_attention"
    check_form(who, form, chunk_size)
    b, h, n, dk, dv = check_qkv(who, q, k, v)
    check_tensor(who, "g", g, (b, h, n), "(B, H, L)", q.device)
    if beta is not None:
        check_tensor(who, "beta", beta, (b, h, n), "(B, H, L)", q.device)
    if not (isinstance(level_weights, torch.Tensor) and level_weights.dim() == 4
            and tuple(level_weights.shape[:3]) == (b, h, n) and level_weights.shape[3] >= 1):
        got = tuple(level_weights.shape) if isinstance(level_weights, torch.Tensor) else type(level_weights).__name__
        raise ShapeError(f"{who}: level_weights must have shape (B, H, L, G) = ({b}, {h}, {n}, G); got {got}")
    levels = level_weights.shape[3]
    keep = None
    if key_keep_mask is not None:
        if not (isinstance(key_keep_mask, torch.Tensor) and key_keep_mask.dtype == torch.bool
                and tuple(key_keep_mask.shape) == (b, n)):
            raise ShapeError(f"{who}: key_keep_mask must be a bool tensor of shape (B, L) = ({b}, {n})")
        keep = key_keep_mask.to(q.device)
    start = torch.as_tensor(offset, dtype=torch.long, device=q.device)
    if start.dim() > 1 or (start.dim() == 1 and start.shape[0] != b) or bool((start < 0).any()):
        raise ArgumentError(f"{who}: offset must be a non-negative int or one per batch row ({b},); got {offset!r}")
    start = start.expand(b)
    real = torch.ones(b, n, dtype=torch.long, device=q.device) if keep is None else keep.long()
    counts = real.cumsum(1)
    positions = start[:, None] + counts - real  # a token's position: the real tokens before it
    end = start + (counts[:, -1] if n else 0)  # the prefix after the call
    if bool((end > 2 ** (levels - 1)).any()):
        raise UnsupportedFeature(f"{who}: {levels} levels reach positions below {2 ** (levels - 1)}; the tokens "
                                 f"reach position {int(end.max()) - 1}: give G >= {levels_for(int(end.max()))} "
                                 "level weights")
    if initial_state is not None:
        check_tensor(who, "initial_state", initial_state, (b, h, levels, dk, dv), "(B, H, G, Dk, Dv)", q.device)
    q, k, vv, gg, beta, _ = prepare(q, k, v, g[..., None], beta, scale=scale, normalize_qk=normalize_qk)
    lam = level_weights.to(vv.dtype)
    if keep is not None:  # a dropped token neither writes (zero key) nor decays
        k = k.masked_fill(~keep[:, None, :, None], 0.0)
        gg = gg.masked_fill(~keep[:, None, :, None], 0.0)
    state = vv.new_zeros(b, h, levels, dk, dv) if initial_state is None else initial_state.to(vv.dtype)
    if n == 0:  # no token: the empty output joined to every input by an empty sum (zero gradients, not None)
        return (vv + sum(t.sum() for t in (q, k, gg, lam, beta) if t is not None)).to(v.dtype), state
    if form == "recurrent":
        out, state = _recurrent(q, k, vv, gg, beta, lam, positions, real, state)
    else:
        size = max(n, 1) if form == "parallel" else chunk_size
        out, state = _chunked(q, k, vv, gg, beta, lam, positions, end, state, size)
    return out.to(v.dtype), state


def _weights(lam: torch.Tensor, level: torch.Tensor) -> torch.Tensor:
    """``lam[..., i, level[..., i, j]]`` ``(B, H, ..., c, X)`` for ``lam`` ``(B, H, ..., c, G)`` and ``level``
    ``(B, ..., c, X)`` (a level of ``G`` or more weighs 0: an empty bucket, or no pair)."""
    g = lam.shape[-1]
    level = level[:, None].expand(*lam.shape[:-1], level.shape[-1])
    return torch.gather(lam, -1, level.clamp(max=g - 1)) * (level < g)


def _merge(moved: torch.Tensor, joined: int | torch.Tensor, written: torch.Tensor | None = None) -> torch.Tensor:
    """The buckets after a span: ``moved`` ``(B, H, G, Dk, Dv)`` (levels ``1 .. G``, already carried through the
    span's transition) go to level ``max(l, joined)`` (``joined`` ``(B,)``: ``bit_length(end XOR start)``);
    ``written`` ``(B, H, G, Dk, Dv)``, what the span's tokens wrote, by their new level, is added."""
    b, h, g = moved.shape[:3]
    own = torch.arange(1, g + 1, device=moved.device)
    to = torch.maximum(own[None], torch.as_tensor(joined, device=moved.device).reshape(-1, 1)) - 1  # (B, G)
    index = to[:, None, :, None, None].expand(b, h, g, *moved.shape[3:])
    out = torch.zeros_like(moved).scatter_add(2, index, moved)
    return out if written is None else out + written


def _recurrent(q, k, v, g, beta, lam, positions, real, state):
    """Token by token on the bucket states (see the module docstring)."""
    n, levels = q.shape[2], lam.shape[-1]
    outs = []
    for t in range(n):
        qt, kt, vt = q[:, :, t], k[:, :, t], v[:, :, t]  # (B, H, D)
        decay = g[:, :, t].exp()[..., None, None]  # (B, H, 1, 1, 1)
        if beta is None:
            moved, d = decay * state, vt
        else:
            bt = beta[:, :, t, None]
            read = (kt[:, :, None, None, :] @ state)[..., 0, :]  # (B, H, G, Dv): k^T S per bucket
            moved = decay * (state - bt[..., None, None] * kt[:, :, None, :, None] * read[..., None, :])
            d = bt * vt
        own = kt[..., :, None] * d[..., None, :]  # (B, H, Dk, Dv): the token's bucket, level 0
        reads = torch.cat([own[:, :, None], moved[:, :, :levels - 1]], 2)  # levels 0 .. G - 1
        weights = lam[:, :, t]  # (B, H, G)
        outs.append((weights[..., None] * (qt[:, :, None, None, :] @ reads)[..., 0, :]).sum(2))
        joined = fenwick_level(positions[:, t] ^ (positions[:, t] + real[:, t]))  # 0 for a dropped token
        state = _merge(moved, joined, _place(own, joined, levels))
    out = torch.stack(outs, 2) if outs else v.new_zeros(v.shape)
    return out, state


def _place(own: torch.Tensor, joined: torch.Tensor, levels: int) -> torch.Tensor:
    """``own`` ``(B, H, Dk, Dv)`` at level ``joined`` ``(B,)`` of a ``(B, H, G, Dk, Dv)`` zero state (nowhere where
    ``joined`` is 0)."""
    where = F.one_hot(joined, levels + 1)[:, 1:].to(own.dtype)  # (B, G): level joined in slot joined - 1
    return where[:, None, :, None, None] * own[:, :, None]


def _chunked(q, k, v, g, beta, lam, positions, end, state, size: int):
    """Blocks of ``size`` tokens: the masked matrix within each, every bucket state read by each block and carried
    to the next (see the module docstring)."""
    b, n = q.shape[0], q.shape[2]
    levels = lam.shape[-1]
    pad = (-n) % size

    def blocked(t):  # (B, H, L, D) -> (B, H, C, c, D), padded with inert tokens
        return F.pad(t, (0, 0, 0, pad)).unflatten(2, (-1, size))
    qb, kb, vb, gb, lb = (blocked(t) for t in (q, k, v, g, lam))
    betab = None if beta is None else F.pad(beta, (0, pad)).unflatten(2, (-1, size))
    pos = torch.cat([positions, end[:, None].expand(b, pad)], 1).unflatten(1, (-1, size))  # (B, C, c)
    eye = torch.eye(size, dtype=q.dtype, device=q.device).expand(*qb.shape[:-1], size)
    terms = local_terms(qb, kb, eye, gb, betab)  # u: (I + T)^-1 diag(beta) (the delta rule) or I
    delta = terms.w is not None
    matrix = terms.scores @ terms.u if delta else terms.scores  # P within each block (B, H, C, c, c)
    within = _weights(lb, fenwick_level(pos[..., :, None] ^ pos[..., None, :]))  # M^H within each block
    inner = (matrix * within) @ vb  # (B, H, C, c, Dv)
    reads = terms.q_from_start if terms.w is None else terms.q_from_start - terms.scores @ terms.w
    writes = terms.k_to_end.transpose(-1, -2)  # (B, H, C, Dk, c): what each token leaves at the end
    writes = writes @ terms.u if delta else writes
    ends = torch.cat([pos[:, 1:, 0], end[:, None]], 1)  # (B, C): the prefix after each block
    own = torch.arange(1, levels + 1, device=q.device)
    outs = []
    for c in range(pos.shape[1]):
        here = pos[:, c]  # (B, c)
        seen = torch.maximum(own[None, None], fenwick_level(here ^ here[:, :1])[..., None])  # (B, c, G) levels read
        weights = _weights(lb[:, :, c], seen)  # bucket l (slot l - 1) read at level max(l, ...)
        entering = reads[:, :, c, None] @ state  # (B, H, G, c, Dv)
        outs.append(inner[:, :, c] + (weights.transpose(-1, -2)[..., None] * entering).sum(2))
        moved = terms.decay[:, :, c, None] * state  # (B, H, G, Dk, Dv)
        if terms.w is not None:
            moved = moved - terms.k_to_end[:, :, c, None].transpose(-1, -2) @ (terms.w[:, :, c, None] @ state)
        joined = fenwick_level(ends[:, c] ^ here[:, 0])
        lands = F.one_hot(fenwick_level(ends[:, c, None] ^ here), levels + 1)[..., 1:]  # (B, c, G) by new level
        written = (writes[:, :, c, None] * lands.transpose(1, 2)[:, None, :, None, :].to(q.dtype)) @ vb[:, :, c, None]
        state = _merge(moved, joined, written)
    out = torch.stack(outs, 2).flatten(2, 3)[:, :, :n] if outs else v.new_zeros(v.shape)
    return out, state
