"""Random attention calls for the differential fuzzer: hypothesis strategies and the :class:`Case` they build.

A case is drawn in three steps so every part fits the others: the sizes (batch and lengths
including 0 and 1, odd head dims, grouped-query ratios, ``Dv != D``, rank 2, 3 or 4), then a
mask expression over every constructor of :mod:`attnkit.masks` combined with ``&``, ``|`` and
``~`` (both causal alignments; per-sample masks sized to the batch), then the bias (tensors with
``-inf`` entries, a ``finfo.min`` row, ``finfo.min`` keys a mask may leave a row alone with),
score, scale, normaliser, attention sinks (with softmax: per head or per sample, ``-inf`` or
dominating entries, learned or not), dtype and what is asked for (lse, weights, gradients,
second derivatives through a gradient penalty), and infinite queries or keys (softmax of dot
products: an infinity in feature 0 that makes one, some or every score of a query or key ``-inf``,
docs/RELIABILITY.md row 21 and finding 39). The tensors are
made from the case's seed, so a failing case prints everything needed to replay it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from hypothesis import strategies as st

import attnkit
from attnkit import masks

LENGTHS = st.one_of(st.sampled_from([0, 1, 2, 3, 5, 16, 31, 32, 33, 63, 64, 65, 127, 129]), st.integers(0, 150))
DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)
ALIGNS = ("bottom_right", "top_left")


@dataclass
class Case:
    """One attention call: sizes, options and a seed for the tensors (``repr`` replays it)."""

    rank: int
    batch: int
    heads: int  # query heads (1 below rank 4)
    kv_heads: int
    lq: int
    lk: int
    d: int
    dv: int
    dtype: torch.dtype
    seed: int
    mask: object = None
    bias: object = None  # a tensor description ("tensor", shape, kind, learned) or a modifier
    score: str = "scaled_dot"
    scale: float | None = None
    normalize: str = "softmax"
    return_lse: bool = False
    return_weights: bool = False
    grad: bool = False
    second_order: bool = False  # also a gradient penalty: the gradients of |dq|, with create_graph=True
    sinks: tuple | None = None  # ("sinks", shape, kind, learned): attention sinks, softmax only
    infinite: tuple | None = None  # ("keys" | "queries", "one" | "some" | "every"): see _with_infinities
    extra: dict = field(default_factory=dict)

    def shapes(self):
        lead = {2: (), 3: (self.batch,), 4: (self.batch,)}[self.rank]
        hq, hkv = ((self.heads,), (self.kv_heads,)) if self.rank == 4 else ((), ())
        return (*lead, *hq, self.lq, self.d), (*lead, *hkv, self.lk, self.d), (*lead, *hkv, self.lk, self.dv)

    def tensors(self):
        """q, k, v (and the bias tensor, if any) drawn from the seed; leaves that need gradients when asked."""
        g = torch.Generator().manual_seed(self.seed)
        q, k, v = (0.8 * torch.randn(s, generator=g, dtype=torch.float64) for s in self.shapes())
        if self.infinite is not None:
            q, k = self._with_infinities(q, k)
        q, k, v = (t.to(self.dtype).requires_grad_(self.grad) for t in (q, k, v))
        bias = self.bias
        if isinstance(bias, tuple):
            _, shape, kind, learned = bias
            bias = 2.0 * torch.randn(shape, generator=g, dtype=torch.float64)
            if kind == "-inf entries":
                bias = bias.masked_fill(torch.rand(shape, generator=g) < 0.3, float("-inf"))
            elif kind == "finfo.min row" and len(shape) >= 2 and shape[-2] > 0:
                bias[..., 0, :] = torch.finfo(torch.float32).min
            elif kind == "finfo.min keys":  # "masking" as a bias on some keys: a mask may leave a row only those
                bias[..., torch.rand(shape[-1], generator=g) < 0.5] = torch.finfo(torch.float32).min
            bias = bias.to(self.dtype).requires_grad_(learned and self.grad)
        return q, k, v, bias

    def _with_infinities(self, q, k):
        """``q, k`` where the chosen keys (or queries) score ``-inf`` against every query (key): feature 0 of the
        other side made positive, theirs ``-inf`` times the sign of the scale (the products are never NaN: the
        scale is not 0 and the score is a dot product). Key or query ``j`` is chosen by the case's seed."""
        side, which = self.infinite
        length = self.lk if side == "keys" else self.lq
        g = torch.Generator().manual_seed(self.seed + 3)
        chosen = {"one": torch.arange(length) == torch.randint(max(length, 1), (), generator=g),
                  "some": torch.rand(length, generator=g) < 0.5, "every": torch.ones(length, dtype=torch.bool)}[which]
        sign = -1.0 if self.scale is not None and self.scale < 0 else 1.0
        other, poisoned = (q, k) if side == "keys" else (k, q)
        other[..., 0] = other[..., 0].abs() + 0.5
        poisoned[..., chosen, 0] = -sign * float("inf")
        return q, k

    def sink_tensor(self):
        """The sinks (None without), from the seed; a leaf that needs a gradient when asked and learned."""
        if self.sinks is None:
            return None
        _, shape, kind, learned = self.sinks
        g = torch.Generator().manual_seed(self.seed + 2)
        sinks = 2.0 * torch.randn(shape, generator=g, dtype=torch.float64)
        if kind == "-inf entries":
            sinks = sinks.masked_fill(torch.rand(shape, generator=g) < 0.5, float("-inf"))
        elif kind == "large":  # the sink dominates the row: outputs near 0, lse near s
            sinks = 15.0 * sinks.abs()
        return sinks.to(self.dtype).requires_grad_(learned and self.grad)

    def kwargs(self, bias, sinks=None):
        return dict(mask=self.mask, bias=bias, score=self.score, scale=self.scale, normalize=self.normalize,
                    return_lse=self.return_lse, return_weights=self.return_weights, sinks=sinks)


@st.composite
def _bools(draw, shape):
    """A bool tensor of ``shape``: True with a drawn probability (0 and 1 included), from a drawn seed."""
    density = draw(st.sampled_from([0.0, 0.2, 0.6, 0.9, 1.0]))
    return torch.rand(shape, generator=torch.Generator().manual_seed(draw(st.integers(0, 999)))) < density


@st.composite
def _leaf_mask(draw, batch, lq, lk):
    kind = draw(st.sampled_from(["full", "causal", "sliding_window", "dilated", "strided", "fixed",
                                 "global_tokens", "segments", "padding", "keys", "prefix_lm", "from_function",
                                 "block_layout", "flex_block_mask", "selected_keys", "selected_blocks"]))
    align = draw(st.sampled_from(ALIGNS))
    small = st.integers(0, 40)
    if kind == "full":
        return masks.full()
    if kind == "causal":
        return masks.causal(align)
    if kind == "sliding_window":
        return masks.sliding_window(draw(small), draw(small), align=align)
    if kind == "dilated":
        return masks.dilated(draw(st.integers(0, 8)), draw(st.integers(1, 4)), align=align)
    if kind == "strided":
        return masks.strided(draw(st.integers(1, 40)))
    if kind == "fixed":
        block = draw(st.integers(1, 40))
        return masks.fixed(block, draw(st.integers(1, min(block, 4))))
    if kind == "global_tokens":
        return masks.global_tokens(draw(st.lists(st.integers(0, max(lq, lk, 1) + 3), max_size=4)))
    if kind == "segments":
        cuts = sorted(draw(st.lists(st.integers(0, max(lq, lk)), max_size=3)))
        ids = lambda n: torch.tensor([sum(i >= c for c in cuts) for i in range(n)], dtype=torch.long)
        return masks.segments(ids(lq), ids(lk))
    if kind == "padding":
        return masks.padding(draw(st.lists(st.integers(0, lk + 2), min_size=batch, max_size=batch)))
    if kind == "keys":
        return masks.keys(draw(_bools((batch, lk))))
    if kind == "prefix_lm":
        return masks.prefix_lm(draw(small), align=align)
    if kind == "from_function":
        period = draw(st.integers(2, 5))
        return masks.from_function(lambda b, h, i, j: (i + j) % period != 0, name=f"i + j not divisible by {period}")
    if kind in ("selected_keys", "selected_blocks"):  # keys chosen per query (repeats and -1 included)
        block = 1 if kind == "selected_keys" else draw(st.sampled_from([2, 3, 16]))
        leading = batch if batch > 0 and draw(st.booleans()) else 1
        count = draw(st.integers(1, 5))
        seed = torch.Generator().manual_seed(draw(st.integers(0, 999)))
        indices = torch.randint(-1, -(-lk // block), (leading, lq, count), generator=seed)  # none past the keys
        return masks.selected_keys(indices) if block == 1 else masks.selected_blocks(indices, block)
    block = draw(st.sampled_from([1, 3, 16, 64]))
    nq, nk = -(-lq // block), -(-lk // block)
    if kind == "block_layout" or not (lq and lk):
        return masks.block_layout(draw(_bools((nq, nk))), block)
    return masks.from_block_mask(draw(_flex_block_mask(lq, lk, block)))


@st.composite
def _flex_block_mask(draw, lq, lk, block):
    """A FlexAttention BlockMask with random partial and full tiles and a mask_mod for the partial ones."""
    from torch.nn.attention.flex_attention import BlockMask

    from attnkit.masks.block_masks import ordered

    nq, nk = -(-lq // block), -(-lk // block)
    active, full = draw(_bools((1, 1, nq, nk))), draw(_bools((1, 1, nq, nk)))
    partial, full = active & ~full, active & full
    period = draw(st.integers(2, 5))
    return BlockMask.from_kv_blocks(*ordered(partial), *ordered(full), BLOCK_SIZE=block, seq_lengths=(lq, lk),
                                    mask_mod=lambda b, h, i, j: (i + 2 * j) % period != 0)


@st.composite
def mask_expression(draw, batch, lq, lk, depth=2):
    """A leaf, or ``a & b``, ``a | b``, ``~a`` over smaller expressions."""
    if depth == 0 or draw(st.integers(0, 2)) == 0:
        return draw(_leaf_mask(batch, lq, lk))
    op = draw(st.sampled_from(["and", "or", "not"]))
    a = draw(mask_expression(batch, lq, lk, depth - 1))
    if op == "not":
        return ~a
    b = draw(mask_expression(batch, lq, lk, depth - 1))
    return a & b if op == "and" else a | b


@st.composite
def _bias(draw, case_scores, heads):
    kind = draw(st.sampled_from(["none", "none", "tensor", "alibi", "softcap", "relpos"]))
    if kind == "none":
        return None
    if kind == "relpos":  # a learned table over clipped relative positions, random entries
        rp = attnkit.bias.RelativePositionBias(heads, mode="clip", max_distance=draw(st.integers(1, 8)),
                                               align=draw(st.sampled_from(ALIGNS)))
        with torch.no_grad():
            rp.table.copy_(2 * torch.randn(rp.table.shape, generator=torch.Generator().manual_seed(draw(
                st.integers(0, 999)))))
        return rp
    if kind == "alibi":
        return attnkit.bias.alibi(heads, align=draw(st.sampled_from(ALIGNS)))
    if kind == "softcap":
        return attnkit.bias.softcap(draw(st.floats(0.5, 30.0)))
    rank = draw(st.integers(1, len(case_scores)))
    shape = tuple(s if draw(st.booleans()) else 1 for s in case_scores[-rank:-1]) + (case_scores[-1],)
    values = draw(st.sampled_from(["plain", "plain", "-inf entries", "finfo.min row", "finfo.min keys"]))
    return ("tensor", shape, values, values == "plain" and draw(st.booleans()))


@st.composite
def _sinks(draw, batch, heads):
    """None mostly; else a sink description: shape ``(H,)``, ``(B, H)`` or a broadcast of it, and its values."""
    if draw(st.integers(0, 2)):
        return None
    shape = draw(st.sampled_from([(heads,), (batch, heads), (1, heads), (batch, 1), ()]))
    kind = draw(st.sampled_from(["plain", "plain", "-inf entries", "large"]))
    return ("sinks", shape, kind, kind != "-inf entries" and draw(st.booleans()))


@st.composite
def cases(draw) -> Case:
    """A whole :class:`Case`."""
    rank = draw(st.sampled_from([4, 4, 3, 2]))
    batch = draw(st.sampled_from([1, 2, 3, 0])) if rank > 2 else 1
    kv_heads, groups = (draw(st.integers(1, 3)), draw(st.integers(1, 3))) if rank == 4 else (1, 1)
    heads = kv_heads * groups
    lq, lk = draw(LENGTHS), draw(LENGTHS)
    d = draw(st.sampled_from([1, 3, 8, 11, 16, 20]))
    dv = d if draw(st.booleans()) else draw(st.sampled_from([1, 5, 16]))
    user_scores = {2: (lq, lk), 3: (batch, lq, lk), 4: (batch, heads, lq, lk)}[rank]
    use_mask = draw(st.sampled_from(["expression", "expression", "none", "bool tensor"]))
    if use_mask == "expression":
        mask = draw(mask_expression(batch, lq, lk))
    elif use_mask == "bool tensor":
        mask = draw(_bools(user_scores))
    else:
        mask = None
    normalize = draw(st.sampled_from(["softmax"] * 5 + ["sigmoid", "sparsemax", "hard", "sigmoid_log_n", "softpick",
                                                         "stick_breaking"]))
    differentiable = normalize not in ("sparsemax", "hard")  # the masked-softmax oracle's (float64, autograd)
    case = Case(
        rank=rank, batch=batch, heads=heads, kv_heads=kv_heads, lq=lq, lk=lk, d=d, dv=dv,
        dtype=draw(st.sampled_from(DTYPES)), seed=draw(st.integers(0, 2**31 - 1)), mask=mask,
        bias=draw(_bias(user_scores, heads)),
        score=draw(st.sampled_from(["scaled_dot", "scaled_dot", "dot", "cosine"])),
        scale=draw(st.sampled_from([None, None, 0.0, -0.7, 0.3, 2.0])), normalize=normalize,
        return_lse=normalize == "softmax" and draw(st.booleans()),
        return_weights=normalize in ("softmax", "sigmoid", "sparsemax", "hard") and draw(st.integers(0, 5)) == 0,
        grad=(grad := differentiable and draw(st.booleans())),
        second_order=grad and draw(st.integers(0, 2)) == 0,
        sinks=draw(_sinks(batch, heads)) if normalize == "softmax" else None)
    if normalize == "softmax" and case.score != "cosine" and case.scale != 0.0 and draw(st.integers(0, 3)) == 0:
        case.infinite = (draw(st.sampled_from(["keys", "queries"])), draw(st.sampled_from(["one", "some", "every"])))
        case.return_weights = case.second_order = False  # the weights' and second derivatives' oracles are finite
    return case
