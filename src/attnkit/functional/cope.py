"""CoPE: contextual position encoding, positions counted by gates the queries open on the keys."""

from __future__ import annotations

import torch

from ..errors import ShapeError

__all__ = ["cope_attention"]


def cope_attention(q, k, v, positions, *, scale=None, **options):
    """Causal self-attention with CoPE's positions: each query counts the keys between itself and a key.

    Golovneva et al. 2024, "Contextual Position Encoding: Learning to Count What's Important",
    arXiv:2405.18719, eq. 3-5 (x-transformers' ``cope``)::

        g_ij = sigmoid(s q_i^T k_j),   p_ij = sum_{t=j}^{i} g_it   (clamped to P - 1)
        e(p) = (p - floor p) e[ceil p] + (1 - p + floor p) e[floor p]      (the P learned embeddings)
        o_i  = sum_{j <= i} softmax_j(s q_i^T (k_j + e(p_ij))) v_j

    with ``s`` the attention's scale on both terms and in the gates. The position term is built
    densely (the gates' suffix sums run over each row) as ``s q_i^T e[m]`` for every embedding,
    interpolated at ``p_ij``, and given to :func:`attnkit.attention` as a bias with a causal mask: the
    attention runs on the fastest exact path for a float bias; gradients reach q, k (through the
    gates and the interpolation) and the embeddings.

    Differences from the paper: the scale ``s`` (default ``D^-1/2``) multiplies the gates' logits
    and the position term as it does the content term.

    Shapes: ``q`` ``(B, H, L, D)``, ``k`` ``(B, Hkv, L, D)``, ``v`` ``(B, Hkv, L, Dv)``, ``positions``
    ``(P, D)`` -> ``(B, H, L, Dv)``; other keywords as :func:`attnkit.attention` (the mask is causal).

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> q, k, v = torch.randn(3, 1, 2, 6, 4).unbind(0)
        >>> out = cope_attention(q, k, v, torch.zeros(8, 4))  # zero embeddings: plain causal attention
        >>> torch.allclose(out, torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True), atol=1e-6)
        True
    """
    from ..core import attention
    from ..masks import causal

    who = "cope_attention"
    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (q, k)) or q.shape[2] != k.shape[2]:
        raise ShapeError(f"{who}: q and k must be 4-D tensors (B, H, L, D) with as many queries as keys; got "
                         f"{[tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__ for t in (q, k)]}")
    h, n, d = q.shape[1:]
    if not isinstance(positions, torch.Tensor) or positions.dim() != 2 or positions.shape[1] != d:
        got = tuple(positions.shape) if isinstance(positions, torch.Tensor) else type(positions).__name__
        raise ShapeError(f"{who}: positions must have shape (P, D) = (P, {d}); got {got}")
    scale = d ** -0.5 if scale is None else scale
    acc = torch.promote_types(q.dtype, torch.float32)
    qa, ka = q.to(acc), k.to(acc).repeat_interleave(h // k.shape[1], 1)
    seen = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
    gates = torch.sigmoid(qa @ ka.transpose(-1, -2) * scale) * seen  # (B, H, L, L): g_ij for j <= i
    counts = gates.flip(-1).cumsum(-1).flip(-1).clamp(max=positions.shape[0] - 1)  # p_ij = sum_{t >= j} g_it
    per_embedding = qa @ positions.to(acc).T * scale  # (B, H, L, P): s q_i^T e[m]
    below = counts.floor()
    frac = counts - below
    low = per_embedding.gather(-1, below.long())
    high = per_embedding.gather(-1, counts.ceil().long())
    return attention(q, k, v, mask=causal(), bias=low + frac * (high - low), scale=scale, **options)
