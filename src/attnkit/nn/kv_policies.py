"""Which keys a long generation keeps or reads: StreamingLLM, H2O, SnapKV and Quest over a KV cache.

Four policies from the literature, each exact (equal to dense attention) when its budget covers
the whole sequence:

- :class:`SinkWindowCache` (Xiao et al. 2024, StreamingLLM, arXiv:2309.17453): the first ``sinks``
  tokens and the last ``budget - sinks``; evicted tokens are forgotten.
- :class:`HeavyHitterCache` (Zhang et al. 2023, H2O, arXiv:2306.14048, Alg. 1): the ``recent`` last
  tokens and the ``budget - recent`` earlier ones that have received the most attention so far
  (accumulated over every query that attended to them), chosen per key/value head.
- :func:`snapkv` (Li et al. 2024, SnapKV, arXiv:2404.14469, Sec. 4): at prefill, the last ``window``
  queries (the observation window) vote with their attention weights for the earlier keys; the votes
  are smoothed by a pooling of ``kernel`` positions (average by default, as the authors' code; max on
  request) and the ``budget - window`` best earlier keys per head are kept with the window's.
- :func:`quest_pages` (Tang et al. 2024, Quest, arXiv:2406.10774, Sec. 3): nothing is evicted; per page
  of keys the elementwise min and max bound each query's score, ``u = sum_d max(q_d min_d, q_d max_d)``,
  and each query reads its ``budget`` pages of highest bound through the selected-keys path
  (:func:`attnkit.masks.selected_blocks`).

Positions under RoPE. StreamingLLM assigns positions *within the cache* (Sec. 3.2: "we focus on
positions within the cache rather than those in the original text"): the cache keeps keys before
rotation and rotates them at their slots ``0 .. n - 1`` at every call, the query at its slot, so
relative distances stay inside the range the model was trained on however long the stream grows.
H2O and SnapKV keep each key at its original position (rotated once, when written), as their papers
do; Quest evicts nothing.

Inside a model. Each cache is a :class:`KVPolicy`: ``step(q, k, v, rotary=, scale=)`` takes a softmax layer's
new tokens (queries, keys and values before rotation) and returns their attention outputs, rotating as the
policy says; ``seen`` is where the next token sits; ``fresh()`` an empty copy. :class:`SnapKVCache` and
:class:`QuestCache` wrap :func:`snapkv` and :func:`quest_attention` so: their first chunk is the prompt, attended
densely (the papers compress, or select, from the first generated token on). ``TransformerLM.generate(...,
kv_policy=SinkWindowCache(64, 4))`` decodes through one fresh copy per layer.

Shapes: keys and values ``(B, H_kv, L, D)``, queries ``(B, H, Lq, D)`` with ``H % H_kv == 0``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..core import AttentionOutput, attention
from ..errors import ArgumentError, ShapeError, check_int
from ..masks import causal, selected_blocks

__all__ = ["KVPolicy", "SinkWindowCache", "HeavyHitterCache", "SnapKVCache", "QuestCache", "snapkv", "quest_pages",
           "quest_attention"]


def _budget(who: str, budget: int, floor: int, floor_name: str) -> int:
    budget = check_int(who, "budget", budget, 1)
    if budget <= floor:
        raise ArgumentError(f"{who}: budget must exceed {floor_name} ({floor}): it keeps them and at least one more "
                            f"key; got budget={budget}")
    return budget


def _kv(who: str, k, v):
    if not isinstance(k, torch.Tensor) or not isinstance(v, torch.Tensor) or k.dim() != 4 or v.dim() != 4 \
            or k.shape[:3] != v.shape[:3]:
        raise ShapeError(f"{who}: k and v must have shapes (B, H_kv, L, D) and (B, H_kv, L, Dv); got "
                         f"{tuple(getattr(k, 'shape', ()))} and {tuple(getattr(v, 'shape', ()))}")


def _chunk(who: str, q, k, v) -> None:
    _kv(who, k, v)
    if not isinstance(q, torch.Tensor) or q.dim() != 4 or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2] \
            or q.shape[1] % k.shape[1] or q.shape[3] != k.shape[3]:
        raise ShapeError(f"{who}: q must be (B, H, t, D) over k (B, H_kv, t, D) with H % H_kv == 0; got "
                         f"{tuple(getattr(q, 'shape', ()))} and {tuple(k.shape)}")


class KVPolicy:
    """A selection or eviction policy as a model's KV cache (one per softmax layer).

    ``step(q, k, v, *, rotary=None, scale=None)``: the ``t`` new tokens' queries ``(B, H, t, D)``, keys and values
    ``(B, H_kv, t, .)``, before any rotary rotation (``rotary``: the layer's
    :class:`~attnkit.nn.RotaryEmbedding`), appended and attended causally -> ``(B, H, t, Dv)``. ``seen``: the
    tokens appended in all (the position of the next one, whatever was evicted). ``fresh()``: an empty policy
    with the same settings.
    """

    seen: int

    def fresh(self) -> KVPolicy:
        raise NotImplementedError

    def step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, rotary=None,
             scale: float | None = None) -> torch.Tensor:
        raise NotImplementedError


def _at_original_positions(policy: KVPolicy, q, k, rotary):
    """Queries and keys rotated at the positions ``seen ..`` (H2O, SnapKV, Quest: a key keeps its position)."""
    if rotary is None:
        return q, k
    return rotary.rotate(q, offset=policy.seen), rotary.rotate(k, offset=policy.seen)


class SinkWindowCache(KVPolicy):
    """StreamingLLM's rolling cache: the first ``sinks`` tokens and the most recent ``budget - sinks``.

    Keys are stored unrotated and, with a ``rotary`` (:class:`~attnkit.nn.RotaryEmbedding`), rotated at
    their slots in the cache at each :meth:`attend` (positions within the cache; see the module).
    ``append(k, v)`` ``(B, H_kv, t, D)``; ``attend(q)`` ``(B, H, Lq, D)``: the queries of the last ``Lq``
    appended tokens (unrotated), causal -> ``(B, H, Lq, Dv)``. While nothing was evicted (``budget`` at
    least the tokens seen) it is ordinary causal attention at the original positions.
    """

    def __init__(self, budget: int, sinks: int = 4, *, rotary=None):
        who = "SinkWindowCache"
        self.sinks = check_int(who, "sinks", sinks, 0)
        self.budget = _budget(who, budget, self.sinks, "the sink count")
        self.rotary = rotary
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.seen = 0  # tokens appended in all
        self.evicted = 0

    def __len__(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        _kv("SinkWindowCache.append", k, v)
        self.k = k if self.k is None else torch.cat([self.k, k], 2)
        self.v = v if self.v is None else torch.cat([self.v, v], 2)
        self.seen += k.shape[2]

    def fresh(self) -> SinkWindowCache:
        return SinkWindowCache(self.budget, self.sinks, rotary=self.rotary)

    def step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, rotary=None,
             scale: float | None = None) -> torch.Tensor:
        """:class:`KVPolicy`'s step: a token at a time, :meth:`append` then :meth:`attend` (StreamingLLM streams
        the prompt too); ``rotary`` (the layer's) in place of the cache's own."""
        _chunk("SinkWindowCache.step", q, k, v)
        outs = []
        for i in range(q.shape[2]):
            self.append(k[:, :, i:i + 1], v[:, :, i:i + 1])
            outs.append(self.attend(q[:, :, i:i + 1], scale=scale, rotary=rotary))
        return torch.cat(outs, 2)

    def attend(self, q: torch.Tensor, *, scale: float | None = None, rotary=None) -> torch.Tensor:
        """Eviction down to the budget (the sinks and the newest tokens stay), then attention of the last appended
        tokens' queries over the cache (rotated by ``rotary``, else the cache's own, at their slots)."""
        rotary = self.rotary if rotary is None else rotary
        self._evict()
        n = len(self)
        most = min(n, self.budget - self.sinks)
        if q.dim() != 4 or not 1 <= q.shape[2] <= most:
            raise ShapeError(f"SinkWindowCache.attend: q must be (B, H, Lq, D) with 1 <= Lq <= {most} (the appended "
                             f"tokens the window holds); got {tuple(q.shape)}")
        assert self.k is not None and self.v is not None  # n >= 1: something was appended
        k = self.k
        if rotary is not None:  # positions within the cache: slots 0 .. n - 1, queries at the last Lq
            k = rotary.rotate(k)
            q = rotary.rotate(q, offset=n - q.shape[2])
        return attention(q, k, self.v, mask=causal(), scale=scale)

    def _evict(self) -> None:
        n = len(self)
        if n > self.budget:
            assert self.k is not None and self.v is not None  # n > budget >= 1: something was appended
            keep = torch.cat([torch.arange(self.sinks), torch.arange(n - (self.budget - self.sinks), n)])
            self.k, self.v = self.k[:, :, keep], self.v[:, :, keep]
            self.evicted += n - self.budget


class HeavyHitterCache(KVPolicy):
    """H2O: the ``recent`` last keys and the ``budget - recent`` earlier keys of most accumulated attention.

    ``append(k, v)`` ``(B, H_kv, t, D)`` (keys rotated at their original positions, if at all); ``attend(q)``
    ``(B, H, Lq, D)``, the last ``Lq <= recent`` appended tokens' queries, causal: attention over the kept keys,
    whose weights (summed over the queries and the heads of each key/value group) add to each key's score;
    then, per key/value head, the cache keeps the recent keys and the highest-scoring others, in order.
    """

    def __init__(self, budget: int, recent: int):
        who = "HeavyHitterCache"
        self.recent = check_int(who, "recent", recent, 1)
        self.budget = _budget(who, budget, self.recent, "recent")
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.score: torch.Tensor | None = None  # (B, H_kv, n) accumulated attention of the kept keys
        self.positions: torch.Tensor | None = None  # (B, H_kv, n) original positions of the kept keys
        self.seen = 0

    def __len__(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        _kv("HeavyHitterCache.append", k, v)
        b, h, t = k.shape[:3]
        pos = torch.arange(self.seen, self.seen + t).expand(b, h, t)
        zero = k.new_zeros(b, h, t, dtype=torch.promote_types(k.dtype, torch.float32))
        if self.k is None:
            self.k, self.v, self.score, self.positions = k, v, zero, pos
        else:
            assert self.v is not None and self.score is not None and self.positions is not None  # set with k
            self.k, self.v = torch.cat([self.k, k], 2), torch.cat([self.v, v], 2)
            self.score, self.positions = torch.cat([self.score, zero], 2), torch.cat([self.positions, pos], 2)
        self.seen += t

    def fresh(self) -> HeavyHitterCache:
        return HeavyHitterCache(self.budget, self.recent)

    def step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, rotary=None,
             scale: float | None = None) -> torch.Tensor:
        """:class:`KVPolicy`'s step: rotated at the original positions, then a token at a time, :meth:`append`
        and :meth:`attend` (Alg. 1: an eviction after every token, the prompt's included)."""
        _chunk("HeavyHitterCache.step", q, k, v)
        q, k = _at_original_positions(self, q, k, rotary)
        outs = []
        for i in range(q.shape[2]):
            self.append(k[:, :, i:i + 1], v[:, :, i:i + 1])
            outs.append(self.attend(q[:, :, i:i + 1], scale=scale))
        return torch.cat(outs, 2)

    def attend(self, q: torch.Tensor, *, scale: float | None = None) -> torch.Tensor:
        n = len(self)
        if q.dim() != 4 or not 1 <= q.shape[2] <= min(n, self.recent):
            raise ShapeError(f"HeavyHitterCache.attend: q must be (B, H, Lq, D) with 1 <= Lq <= {min(n, self.recent)}"
                             f" (the appended tokens the recent window holds); got {tuple(q.shape)}")
        assert self.k is not None and self.v is not None and self.score is not None and self.positions is not None
        got = attention(q, self.k, self.v, mask=causal(), scale=scale, return_weights=True)
        assert isinstance(got, AttentionOutput) and got.weights is not None  # return_weights=True
        hkv = self.k.shape[1]
        self.score = self.score + got.weights.unflatten(1, (hkv, -1)).sum((2, 3)).to(self.score.dtype)
        if n > self.budget:
            older = self.score[..., :n - self.recent]
            top = older.topk(self.budget - self.recent, -1).indices.sort(-1).values
            keep = torch.cat([top, torch.arange(n - self.recent, n).expand(*top.shape[:2], -1)], -1)  # (B, H_kv, m)
            self.k, self.v = (t.gather(2, keep[..., None].expand(-1, -1, -1, t.shape[-1])) for t in (self.k, self.v))
            self.score, self.positions = self.score.gather(2, keep), self.positions.gather(2, keep)
        return got.output


def snapkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, budget: int, *, window: int = 32, kernel: int = 5,
           pool: str = "avg", scale: float | None = None):
    """SnapKV's prefill compression: the keys ``(B, H_kv, budget, D)`` and values the observation window selects.

    ``q`` ``(B, H, L, D)`` the prompt's queries, ``k``/``v`` its keys and values ``(B, H_kv, L, .)``. The last
    ``window`` queries' causal attention weights over the ``L - window`` earlier keys, summed over the window's
    queries and each key/value group's heads and pooled (``pool`` "avg" or "max") over ``kernel`` positions, pick the
    ``budget - window`` earlier keys each key/value head keeps; the window's own keys are kept too, all in
    order. Returns ``(k, v, kept positions (B, H_kv, m))``, ``m = min(budget, L)``: with ``budget >= L``
    everything, unchanged.
    """
    who = "snapkv"
    _kv(who, k, v)
    window = check_int(who, "window", window, 1)
    budget = _budget(who, budget, window, "the observation window")
    kernel = check_int(who, "kernel", kernel, 1)
    if pool not in ("avg", "max"):
        raise ArgumentError(f"{who}: pool must be 'avg' or 'max'; got {pool!r}")
    b, hkv, n = k.shape[:3]
    if n <= budget:
        return k, v, torch.arange(n).expand(b, hkv, n)
    obs = q[:, :, n - window:]
    got = attention(obs, k, v, mask=causal(), scale=scale, return_weights=True)
    assert isinstance(got, AttentionOutput) and got.weights is not None  # return_weights=True
    weights = got.weights  # (B, H, w, L)
    votes = weights[..., :n - window].unflatten(1, (hkv, -1)).sum((2, 3))  # (B, H_kv, L - w)
    if kernel > 1:
        smooth = F.avg_pool1d if pool == "avg" else F.max_pool1d
        votes = smooth(votes, kernel, stride=1, padding=kernel // 2)
    top = votes[..., :n - window].topk(budget - window, -1).indices.sort(-1).values
    keep = torch.cat([top, torch.arange(n - window, n).expand(b, hkv, -1)], -1)
    return (*(t.gather(2, keep[..., None].expand(-1, -1, -1, t.shape[-1])) for t in (k, v)), keep)


class SnapKVCache(KVPolicy):
    """:func:`snapkv` as a model's cache: the first chunk (the prompt) is attended densely and compressed to
    ``budget`` keys per key/value head; later tokens are appended and attend to everything kept (nothing is
    evicted after the prompt, as the paper). Keys rotated at their original positions.
    """

    def __init__(self, budget: int, *, window: int = 32, kernel: int = 5, pool: str = "avg"):
        who = "SnapKVCache"
        self.window = check_int(who, "window", window, 1)
        self.budget = _budget(who, budget, self.window, "the observation window")
        self.kernel = check_int(who, "kernel", kernel, 1)
        if pool not in ("avg", "max"):
            raise ArgumentError(f"{who}: pool must be 'avg' or 'max'; got {pool!r}")
        self.pool = pool
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.positions: torch.Tensor | None = None  # (B, H_kv, n) original positions of the kept keys
        self.seen = 0

    def __len__(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def fresh(self) -> SnapKVCache:
        return SnapKVCache(self.budget, window=self.window, kernel=self.kernel, pool=self.pool)

    def step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, rotary=None,
             scale: float | None = None) -> torch.Tensor:
        _chunk("SnapKVCache.step", q, k, v)
        q, k = _at_original_positions(self, q, k, rotary)
        b, hkv, t = k.shape[:3]
        pos = torch.arange(self.seen, self.seen + t).expand(b, hkv, t)
        if self.k is None:  # the prompt: dense, then compressed by the observation window's votes
            out = attention(q, k, v, mask=causal(), scale=scale)
            self.k, self.v, kept = snapkv(q, k, v, self.budget, window=self.window, kernel=self.kernel,
                                          pool=self.pool, scale=scale)
            self.positions = pos.gather(2, kept)
        else:
            assert self.v is not None and self.positions is not None  # set with k
            self.k, self.v = torch.cat([self.k, k], 2), torch.cat([self.v, v], 2)
            self.positions = torch.cat([self.positions, pos], 2)
            out = attention(q, self.k, self.v, mask=causal(), scale=scale)
        self.seen += t
        return out


class QuestCache(KVPolicy):
    """:func:`quest_attention` as a model's cache: every key is kept (at its original position); after the first
    chunk (the prompt, attended densely) each query reads its ``budget // page_size`` pages of highest bound.
    With those pages covering the sequence, dense attention.
    """

    def __init__(self, budget: int, page_size: int = 16):
        who = "QuestCache"
        self.page_size = check_int(who, "page_size", page_size, 1)
        self.budget = check_int(who, "budget", budget, self.page_size, " (a page of keys at least)")
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.seen = 0

    def __len__(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def fresh(self) -> QuestCache:
        return QuestCache(self.budget, self.page_size)

    def step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, rotary=None,
             scale: float | None = None) -> torch.Tensor:
        _chunk("QuestCache.step", q, k, v)
        q, k = _at_original_positions(self, q, k, rotary)
        self.seen += k.shape[2]
        if self.k is None:  # the prompt
            self.k, self.v = k, v
            return attention(q, k, v, mask=causal(), scale=scale)
        assert self.v is not None  # set with k
        self.k, self.v = torch.cat([self.k, k], 2), torch.cat([self.v, v], 2)
        return quest_attention(q, self.k, self.v, self.page_size, self.budget // self.page_size, scale=scale)


def quest_pages(q: torch.Tensor, k: torch.Tensor, page_size: int, budget: int) -> torch.Tensor:
    """Quest's selection: per query head and query, the ``budget`` pages of ``page_size`` keys whose bound
    ``sum_d max(q_d min_d, q_d max_d)`` (min and max over the page's keys) is highest ``(B, H, Lq, budget)``
    (page indices, ``-1`` unused when there are fewer pages), for :func:`attnkit.masks.selected_blocks`."""
    who = "quest_pages"
    page_size = check_int(who, "page_size", page_size, 1)
    budget = check_int(who, "budget", budget, 1, " (pages per query)")
    if q.dim() != 4 or k.dim() != 4 or q.shape[-1] != k.shape[-1] or q.shape[1] % k.shape[1]:
        raise ShapeError(f"{who}: q (B, H, Lq, D) and k (B, H_kv, L, D) with H % H_kv == 0; got {tuple(q.shape)} "
                         f"and {tuple(k.shape)}")
    n = k.shape[2]
    pages = -(-n // page_size)
    padded = F.pad(k, (0, 0, 0, pages * page_size - n)).unflatten(2, (pages, page_size))  # (B, H_kv, P, ps, D)
    real = (torch.arange(pages * page_size) < n).view(pages, page_size)[..., None]
    lo = padded.masked_fill(~real, float("inf")).amin(3).repeat_interleave(q.shape[1] // k.shape[1], 1)
    hi = padded.masked_fill(~real, float("-inf")).amax(3).repeat_interleave(q.shape[1] // k.shape[1], 1)
    qq = q[..., None, :]  # (B, H, Lq, 1, D)
    bound = torch.maximum(qq * lo[:, :, None], qq * hi[:, :, None]).sum(-1)  # (B, H, Lq, P)
    top = bound.topk(min(budget, pages), -1).indices
    return F.pad(top, (0, budget - top.shape[-1]), value=-1)


def quest_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, page_size: int, budget: int, *,
                    scale: float | None = None) -> torch.Tensor:
    """Causal attention of ``q`` (the last ``Lq`` positions) reading only each query's :func:`quest_pages`;
    with ``budget`` pages covering the sequence, ordinary causal attention."""
    pages = quest_pages(q, k, page_size, budget)
    return attention(q, k, v, mask=causal() & selected_blocks(pages, page_size), scale=scale)
