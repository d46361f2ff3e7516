"""Statistics of attention maps: entropy, attention distance, sparsity, top keys, head agreement, a summary table.

Every function takes maps ``(..., Lq, Lk)`` of non-negative weights. A row is a
query's weights over the keys; rows are normalised to sum 1 first (so sigmoid
maps work too) and a row summing to 0 (a query with no allowed key) is left out
of every average. A row holding NaN or inf is not left out: it makes its head's
statistic NaN, so a broken map is never summarised as a healthy one. Computed in
float64, returned in the input's floating dtype (float32 at least). A head whose
rows are all zero gets NaN.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import torch

from ...errors import ArgumentError, DTypeError, ShapeError, check_int
from .model_maps import is_attention_output, maps_and_tokens

__all__ = ["SummaryRow", "Summary", "TopPositions", "attention_distance", "entropy", "head_agreement", "sparsity",
           "summary", "top_positions"]


def _check(who: str, weights, min_dim: int = 2) -> torch.Tensor:
    if not isinstance(weights, torch.Tensor) or not weights.is_floating_point():
        got = weights.dtype if isinstance(weights, torch.Tensor) else type(weights).__name__
        raise DTypeError(f"{who}: weights must be a floating-point tensor; got {got}")
    if weights.dim() < min_dim:
        raise ShapeError(f"{who}: weights must have at least {min_dim} dims (..., Lq, Lk); got {tuple(weights.shape)}")
    if bool((weights < 0).any()):
        raise ArgumentError(f"{who}: attention weights must be non-negative; got a minimum of {weights.min().item()}")
    return weights


def _rows(who: str, weights) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows normalised to sum 1 in float64 ``(..., Lq, Lk)`` and which rows are live ``(..., Lq)``.

    A row with NaN/inf is live and entirely NaN, so every statistic of its head is NaN.
    """
    w = _check(who, weights).detach().to(torch.float64)
    broken = ~torch.isfinite(w).all(-1)  # (..., Lq)
    total = w.sum(-1)
    live = (total > 0) | broken
    p = w / torch.where(live, total, torch.ones_like(total))[..., None]
    return torch.where(broken[..., None], torch.full_like(p, float("nan")), p), live


def _mean_rows(values: torch.Tensor, p: torch.Tensor, live: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Mean of per-row ``values (..., Lq)`` over live rows ``(...)``; NaN where no row is live or a row of
    ``p`` is NaN."""
    values = torch.where(p.isnan().any(-1), torch.full_like(values, float("nan")), values)
    count = live.sum(-1)
    mean = torch.where(live, values, torch.zeros_like(values)).sum(-1) / count.clamp(min=1)
    mean = torch.where(count > 0, mean, torch.full_like(mean, float("nan")))
    return mean.to(torch.promote_types(like.dtype, torch.float32))


def entropy(weights: torch.Tensor) -> torch.Tensor:
    """Mean row entropy ``-sum_j p_ij log p_ij`` in nats ``(...)``: 0 for one-hot rows, ``log Lk`` for uniform.

    The per-head average entropy of Clark et al. 2019, "What Does BERT Look At?" (BlackboxNLP,
    arXiv:1906.04341): low for focused heads, near ``log Lk`` for broad ones.

    Example:
        >>> import torch
        >>> entropy(torch.tensor([[1.0, 0.0], [0.5, 0.5]])).item() == torch.tensor(2.0).log().item() / 2
        True
    """
    p, live = _rows("entropy", weights)
    h = -torch.where(p > 0, p * torch.log(torch.where(p > 0, p, torch.ones_like(p))), torch.zeros_like(p)).sum(-1)
    return _mean_rows(h, p, live, weights)


def attention_distance(weights: torch.Tensor, *, q_positions: torch.Tensor | None = None,
                       k_positions: torch.Tensor | None = None) -> torch.Tensor:
    """Mean attended distance ``sum_j p_ij |pos_i - pos_j|`` averaged over rows ``(...)``.

    Positions default to the indices ``0..Lq-1`` and ``0..Lk-1``; pass token positions
    (broadcastable to ``(..., Lq)`` and ``(..., Lk)``) for cross-attention or packed inputs.
    The "mean attention distance" of Dosovitskiy et al. 2021 (ViT, ICLR, arXiv:2010.11929,
    Fig. 7 and App. D.7), in token positions instead of pixels.

    Example:
        >>> import torch
        >>> attention_distance(torch.tensor([[0.0, 1.0], [1.0, 0.0]])).item()  # each query looks one away
        1.0
    """
    p, live = _rows("attention_distance", weights)
    lq, lk = p.shape[-2:]
    qp = torch.arange(lq, device=p.device) if q_positions is None else torch.as_tensor(q_positions, device=p.device)
    kp = torch.arange(lk, device=p.device) if k_positions is None else torch.as_tensor(k_positions, device=p.device)
    if qp.dim() < 1 or qp.shape[-1] != lq or kp.dim() < 1 or kp.shape[-1] != lk:
        raise ShapeError(f"attention_distance: q_positions must end in Lq={lq} and k_positions in Lk={lk}; got "
                         f"{tuple(qp.shape)} and {tuple(kp.shape)}")
    dist = (qp.to(torch.float64)[..., :, None] - kp.to(torch.float64)[..., None, :]).abs()  # (..., Lq, Lk)
    return _mean_rows((p * dist).sum(-1), p, live, weights)


def sparsity(weights: torch.Tensor, *, eps: float = 1e-3) -> torch.Tensor:
    """Fraction of the weights of live rows that are at most ``eps`` ``(...)``, after row normalisation.

    Masked keys count (they are exactly 0): a causal map is about half sparse. ``eps=0``
    counts exact zeros only (sparsemax). Keep ``eps`` below ``1 / Lk`` for long rows.

    Example:
        >>> import torch
        >>> sparsity(torch.tensor([[1.0, 0.0, 0.0, 0.0]])).item()
        0.75
    """
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps >= 0:
        raise ArgumentError(f"sparsity: eps must be a number >= 0; got {eps!r}")
    p, live = _rows("sparsity", weights)
    return _mean_rows((p <= eps).to(torch.float64).mean(-1), p, live, weights)  # Lk = 0: no live row, NaN


class TopPositions(NamedTuple):
    """indices ``(..., Lq, k)`` of the most attended keys, best first, and their weights ``(..., Lq, k)``."""

    indices: torch.Tensor
    weights: torch.Tensor


def top_positions(weights: torch.Tensor, k: int) -> TopPositions:
    """The ``k`` keys with the largest weight for every query (ties in an unspecified order).

    Example:
        >>> import torch
        >>> top_positions(torch.tensor([[0.1, 0.6, 0.3]]), 2).indices.tolist()
        [[1, 2]]
    """
    _check("top_positions", weights)
    check_int("top_positions", "k", k, 1)
    if k > weights.shape[-1]:
        raise ArgumentError(f"top_positions: k={k} is larger than the number of keys Lk={weights.shape[-1]}")
    values, indices = torch.topk(weights, k, dim=-1)
    return TopPositions(indices, values)


def head_agreement(weights: torch.Tensor) -> torch.Tensor:
    """Cosine similarity of the heads' flattened maps: ``(..., H, Lq, Lk)`` -> ``(..., H, H)``.

    ``<A_g, A_h> / (|A_g| |A_h|)`` over all ``(i, j)``: 1 for proportional maps, 0 for maps
    with no common (query, key) pair. The diagonal is 1; an all-zero map has 0 with any other.
    Differences from Clark et al. 2019 (arXiv:1906.04341), who compare heads by the Jensen-Shannon
    distance of their row distributions: cosine of whole maps, one number per pair, no sampling.

    Example:
        >>> import torch
        >>> eye = torch.eye(3)
        >>> head_agreement(torch.stack([eye, 2 * eye, eye.roll(1, 1)])).tolist()[0]
        [1.0, 1.0, 0.0]
    """
    w = _check("head_agreement", weights, 3).detach().to(torch.float64).flatten(-2)  # (..., H, Lq*Lk)
    norm = w.norm(dim=-1)
    sim = (w @ w.transpose(-1, -2)) / (norm[..., :, None] * norm[..., None, :]).clamp(min=torch.finfo(w.dtype).tiny)
    eye = torch.eye(w.shape[-2], dtype=torch.bool, device=w.device)
    return torch.where(eye, torch.ones_like(sim), sim).to(torch.promote_types(weights.dtype, torch.float32))


class SummaryRow(NamedTuple):
    """One head of one map: its entropy (nats), mean attention distance and sparsity."""

    name: str
    head: int
    entropy: float
    distance: float
    sparsity: float


class Summary(list):
    """A list of :class:`SummaryRow` that prints as a Markdown table."""

    eps: float = 1e-3

    def to_markdown(self) -> str:
        lines = [f"| map | head | entropy (nats) | mean distance | sparsity (w <= {self.eps:g}) |",
                 "|---|---:|---:|---:|---:|"]
        lines += [f"| {r.name} | {r.head} | {r.entropy:.4f} | {r.distance:.4f} | {r.sparsity:.4f} |" for r in self]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.to_markdown()


def summary(maps, *, sample: int = 0, eps: float = 1e-3) -> Summary:
    """One row per head of every map of an :class:`~attnkit.lab.analysis.recorder.AttentionRecorder` or a dict.

    A dict holds ``{name: (H, Lq, Lk) or (Lq, Lk)}``; a recorder gives ``as_dict(sample)``; a
    transformers model's ``outputs.attentions`` (or output) gives its layers of ``sample``
    (:func:`~attnkit.lab.analysis.model_maps.layer_maps`, named ``layers.0``, ...).

    Example:
        >>> import torch
        >>> from attnkit.lab.analysis.stats import summary
        >>> print(summary({"layer": torch.eye(3)[None]}))
        | map | head | entropy (nats) | mean distance | sparsity (w <= 0.001) |
        |---|---:|---:|---:|---:|
        | layer | 0 | 0.0000 | 0.0000 | 0.6667 |
    """
    if hasattr(maps, "as_dict") or is_attention_output(maps):
        maps, _ = maps_and_tokens(maps, "summary", sample)
    if not isinstance(maps, Mapping):
        raise DTypeError(f"summary: maps must be an AttentionRecorder, a mapping name -> tensor or a transformers "
                         f"model's attentions (a tuple of (B, H, Lq, Lk) tensors); got {type(maps).__name__}")
    rows = Summary()
    rows.eps = eps
    for name, w in maps.items():
        w = _check(f"summary: map {name!r}", w)
        if w.dim() not in (2, 3):
            raise ShapeError(f"summary: map {name!r} must be (H, Lq, Lk) or (Lq, Lk); got {tuple(w.shape)}")
        w = w if w.dim() == 3 else w[None]
        stats = zip(entropy(w).tolist(), attention_distance(w).tolist(), sparsity(w, eps=eps).tolist(), strict=True)
        rows.extend(SummaryRow(str(name), h, *values) for h, values in enumerate(stats))
    return rows
