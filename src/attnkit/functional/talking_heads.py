"""Talking-heads attention: the heads' logits mixed before the softmax and their weights mixed after it."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..errors import ShapeError

__all__ = ["talking_heads_attention"]


def talking_heads_attention(q, k, v, *, pre=None, post=None, scale=None, **options):
    """Shazeer et al. 2020, "Talking-Heads Attention", arXiv:2003.02436, Alg. 1 (x-transformers' ``pre_talking_heads``
    and ``post_talking_heads``)::

        L_h = sum_g P_hg scale q_g K_g^T          (logits mixed across heads, P = pre)
        W_g = softmax(L_g + bias, mask)
        O_h = sum_g Q_hg W_g V_h                  (weights mixed across heads, Q = post)

    Both mixes are folded into one call of :func:`attnkit.attention`, so it runs on whichever exact
    path serves it (torch's fused kernels, the O(L)-memory chunked paths): ``L_g`` is the dot
    product of ``[P_g1 q_1, ..., P_gH q_H]`` with the keys of every head side by side (one key head of
    ``H D`` features), and each head's weights take the values of every head side by side (``H Dv``
    features), which ``post`` then combines. Where the queries and the values differ in width (one
    mix only), the narrower side gets zero features (the scores and outputs unchanged) so that
    torch's fused kernel, which takes ``Dv == D`` only, runs it. Cost: ``H`` times one head's
    attention, as the paper's.

    Differences from the paper: none; ``pre`` or ``post`` None is the identity (no mixing there).

    Shapes: ``q, k`` ``(B, H, Lq|Lk, D)``, ``v`` ``(B, H, Lk, Dv)`` (as many key heads as query heads:
    the mixes read every head), ``pre, post`` ``(H, H)`` -> ``(B, H, Lq, Dv)``; ``scale`` (default
    ``D^-1/2``) and the other keywords (mask, bias, backend, ...) as :func:`attnkit.attention`.

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> q, k, v = torch.randn(3, 1, 2, 5, 4).unbind(0)
        >>> out = talking_heads_attention(q, k, v, pre=torch.eye(2), post=torch.eye(2))  # no mixing
        >>> torch.allclose(out, torch.nn.functional.scaled_dot_product_attention(q, k, v), atol=1e-6)
        True
    """
    from ..core import attention

    who = "talking_heads_attention"
    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (q, k, v)):
        raise ShapeError(f"{who}: q, k and v must be 4-D tensors (B, H, L, D); got "
                         f"{[tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__ for t in (q, k, v)]}")
    b, h, _, d = q.shape
    if k.shape[1] != h or v.shape[1] != h:
        raise ShapeError(f"{who}: k and v must have the query heads H = {h} (the mixes read every head); got "
                         f"{k.shape[1]} and {v.shape[1]}")
    for name, m in (("pre", pre), ("post", post)):
        if m is not None and (not isinstance(m, torch.Tensor) or tuple(m.shape) != (h, h)):
            raise ShapeError(f"{who}: {name} must be a tensor of shape (H, H) = ({h}, {h}); got "
                             f"{tuple(m.shape) if isinstance(m, torch.Tensor) else type(m).__name__}")
    scale = d ** -0.5 if scale is None else scale

    def side_by_side(t):  # (B, H, L, D) -> (B, 1, L, H D): one head holding every head's features
        return t.permute(0, 2, 1, 3).flatten(2)[:, None]
    if pre is None:
        queries, keys = q, k
    else:  # query head h reads [P_h1 q_1, ..., P_hH q_H] against [k_1, ..., k_H]
        queries = torch.einsum("hg,bgid->bhigd", pre.to(q.dtype), q).flatten(3)
        keys = side_by_side(k)
    values = v if post is None else side_by_side(v)
    if keys.shape[1] != values.shape[1]:  # one of them shared by every head, the other per head
        keys, values = (t.expand(b, h, *t.shape[2:]) for t in (keys, values))
    width, dv = queries.shape[-1], values.shape[-1]
    if width < dv:  # zero features add nothing to the scores; torch's fused kernel takes Dv == D only
        queries, keys = F.pad(queries, (0, dv - width)), F.pad(keys, (0, dv - width))
    elif dv < width:  # zero value columns, dropped after
        values = F.pad(values, (0, width - dv))
    out = attention(queries, keys, values, scale=scale, **options)
    if dv < width:
        out = out[..., :dv] if isinstance(out, torch.Tensor) else out._replace(output=out.output[..., :dv])
    if post is None:
        return out
    every = out.unflatten(-1, (h, v.shape[-1]))  # (B, g, Lq, h, Dv): head g's weights on head h's values
    return torch.einsum("hg,bgqhd->bhqd", post.to(every.dtype), every)
