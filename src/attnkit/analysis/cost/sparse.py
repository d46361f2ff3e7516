"""Cost specs of the sparse-pattern self-attention modules: local, Longformer, BigBird, block-sparse,
Sparse Transformer, Reformer.

Sizes: ``batch, length, dim, heads``, the pattern's own sizes, ``dtype``. Each module's
attention calls are counted on the kernel the dispatcher picks for the module's own mask
(built by the module, so block layouts are the ones it uses): computed blocks, not pairs.
Reformer's bucket masks depend on the data; its chunks are counted as dense, which is
what the dispatcher picks for them unless a whole key block of every chunk is empty.
"""

from __future__ import annotations

import math

import torch

from ... import masks
from ...nn.bigbird import BigBirdAttention
from ...nn.blocksparse import BlockPattern, BlockSparseAttention
from ...nn.local import LocalAttention
from ...nn.longformer import GlobalKeys, LongformerAttention
from ...nn.reformer import ReformerAttention
from ...nn.sparse_transformer import SparseTransformerAttention
from .attention import attend
from .core import ATTENTION_FORMULA, dtype_of
from .tally import Spec, randn, zeros

__all__ = ["SPECS", "projections"]

_SIZES = {"batch": 2, "length": 12, "dim": 16, "heads": 2, "dtype": "float32"}
_PROJ = "projections 2 B n dim^2 each (q, k, v, out); "


def projections(t, s, count: int = 4, label: str = "projections (q, k, v, out)") -> None:
    """``count`` ``dim x dim`` linear maps of the ``(B, n, dim)`` input."""
    b, n, dim = s["batch"], s["length"], s["dim"]
    t.mm(label, count, b * n, dim, dim)
    t.inter(count * b * n * dim)
    t.io(b * n * dim, count * dim * (dim + 1), b * n * dim)


def _self(t, label, s, module, mask, **kwargs):
    b, n, h = s["batch"], s["length"], s["heads"]
    attend(t, label, b, h, n, n, s["dim"] // h, s["dim"] // h, dtype=dtype_of(s), mask=mask,
           dropout_p=module.dropout_p, **kwargs)


def _inputs(s, module):
    return module, (randn(s["batch"], s["length"], s["dim"], dtype=dtype_of(s)),)


def _local_count(t, s, module):
    projections(t, s)
    _self(t, "", s, module, module.pattern(s["length"]))


def _longformer_count(t, s, module):
    b, n, h, dim = s["batch"], s["length"], s["heads"], s["dim"]
    projections(t, s)
    flags = module.global_flags(list(s["global_tokens"]), b, n, None)
    _self(t, "window rows: ", s, module, module._window if flags is None else module._window | GlobalKeys(flags))
    if flags is not None and b:
        g = int(flags.expand(b, n).sum(1).max())
        t.mm("global projections (Q_g, K_g, V_g)", 1, b * g, dim, dim)
        t.mm("global projections (Q_g, K_g, V_g)", 2, b * n, dim, dim)
        t.inter(b * g * dim, 2 * b * n * dim)
        attend(t, "global rows: ", b, h, g, n, dim // h, dim // h, dtype=dtype_of(s), dropout_p=module.dropout_p)


def _longformer_inputs(s, module):
    return (lambda x: module(x, global_tokens=list(s["global_tokens"]))), _inputs(s, module)[1]


def _bigbird_count(t, s, module):
    n, bs = s["length"], module.block_size
    projections(t, s)
    lay = module.layout(n)
    g = min(module.global_blocks, lay.shape[0])
    split = min(g * bs, n)
    b, h, hd = s["batch"], s["heads"], s["dim"] // s["heads"]
    if split:
        attend(t, "global rows: ", b, h, split, n, hd, hd, dtype=dtype_of(s), dropout_p=module.dropout_p)
    if split < n:
        attend(t, "other rows: ", b, h, n - split, n, hd, hd, dtype=dtype_of(s), mask=BlockPattern(lay[g:], bs),
               dropout_p=module.dropout_p)


def _blocksparse_make(s):
    nb = -(-s["length"] // s["block_size"])
    if s["layout"] == "random":
        layout = torch.rand(nb, nb, generator=torch.Generator().manual_seed(s["seed"])) < s["density"]
        layout |= torch.eye(nb, dtype=torch.bool)
    else:  # a band of `band` blocks on each side and the first `columns` block columns
        idx = torch.arange(nb)
        layout = (idx[:, None] - idx[None, :]).abs() <= s["band"]
        layout[:, :s["columns"]] = True
    return BlockSparseAttention(s["dim"], s["heads"], layout, block_size=s["block_size"]).to(dtype_of(s))


def _sparse_count(t, s, module):
    b, n, h = s["batch"], s["length"], s["heads"]
    hd = s["dim"] // h
    projections(t, s)
    if module.pattern == "strided":
        _self(t, "band: ", s, module, module._band, return_lse=True)
        l, m = module.stride, -(-n // module.stride)
        if m >= 2:
            mask = module._column
            if not module.causal and m * l != n:
                mask = mask & masks.padding(((n - torch.arange(l) + l - 1) // l).repeat(b))
            attend(t, "strided keys: ", b * l, h, m, m, hd, hd, dtype=dtype_of(s), mask=mask, return_lse=True,
                   dropout_p=module.dropout_p)
    else:
        own = masks.segments(torch.arange(n) // module.stride)
        _self(t, "own block: ", s, module, own & masks.causal() if module.causal else own, return_lse=True)
        summary = sum(1 for p in range(n) if p % module.stride >= module.stride - module.summary)
        if summary and n > module.stride:
            attend(t, "summary keys: ", b, h, n, summary, hd, hd, dtype=dtype_of(s), mask=module._summary,
                   return_lse=True, dropout_p=module.dropout_p)
    t.ew("merge of the two softmaxes", b * h * n * (hd + 4), 3)


def _sparse_derive(s):
    s["stride"] = math.isqrt(max(s["length"], 1)) if s["stride"] is None else s["stride"]
    s["summary"] = max(1, s["stride"] // 4) if s["summary"] is None else s["summary"]
    return s


def _reformer_count(t, s, module):
    b, n, h, dim = s["batch"], s["length"], s["heads"], s["dim"]
    lsh = module.lsh
    d, rounds = dim // h, lsh.n_hashes
    projections(t, s, 3, "projections (qk, v, out)")
    if n == 0 or b == 0:
        return
    if lsh.n_buckets > 1:
        t.mm("hashing: x R (no gradient)", 1, b * h * n, d, rounds * lsh.n_buckets // 2, grads=0)
    c = max(1, min(lsh.chunk_size, n))
    heads = h * rounds * -(-n // c)
    bias = zeros(dtype_of(s), b, heads, c, 2 * c) if rounds > 1 else None
    attend(t, "chunks: ", b, heads, c, 2 * c, d, d, dtype=dtype_of(s), bias=bias, return_lse=True,
           mask=torch.ones((), dtype=torch.bool).expand(b, heads, c, 2 * c), dropout_p=lsh.dropout * module.training)
    t.ew("sort, gather and round combination", b * h * rounds * n * (2 * d + 8))


def _reformer_derive(s):
    if s["n_buckets"] is None:
        s["n_buckets"] = max(2, 2 * (s["length"] // (2 * s["chunk_size"])))
    return s


def _dims(m):
    return {"dim": m.dim, "heads": m.num_heads}


SPECS = [
    Spec("local", {**_SIZES, "size": 3, "mode": "window", "causal": False}, _local_count, _inputs,
         _PROJ + ATTENTION_FORMULA,
         make=lambda s: LocalAttention(s["dim"], s["heads"], s["size"], mode=s["mode"],
                                       causal=s["causal"]).to(dtype_of(s)),
         module_type=LocalAttention, config=lambda m: {**_dims(m), "size": m.size, "mode": m.mode, "causal": m.causal}),
    Spec("longformer", {**_SIZES, "length": 14, "window": 4, "dilation": 2, "global_tokens": (0, 5)},
         _longformer_count, _longformer_inputs,
         _PROJ + "global projections 2 B (g + 2 n) dim^2; window rows as the mask's blocks; global rows 2 B H g n 2D",
         make=lambda s: LongformerAttention(s["dim"], s["heads"], window=s["window"],
                                            dilation=s["dilation"]).to(dtype_of(s)),
         module_type=LongformerAttention,
         config=lambda m: {**_dims(m), "window": m.window, "dilation": m.dilation}),
    Spec("bigbird", {**_SIZES, "length": 15, "block_size": 2, "window_blocks": 3, "global_blocks": 1,
                     "random_blocks": 2, "seed": 0},
         _bigbird_count, _inputs, _PROJ + "global rows 2 B H g b n 2D; other rows over their layout's blocks",
         make=lambda s: BigBirdAttention(s["dim"], s["heads"], block_size=s["block_size"],
                                         window_blocks=s["window_blocks"], global_blocks=s["global_blocks"],
                                         random_blocks=s["random_blocks"], seed=s["seed"]).to(dtype_of(s)),
         module_type=BigBirdAttention,
         config=lambda m: {**_dims(m), "block_size": m.block_size, "window_blocks": m.window_blocks,
                           "global_blocks": m.global_blocks, "random_blocks": m.random_blocks, "seed": m.seed}),
    Spec("block-sparse", {**_SIZES, "length": 14, "block_size": 4, "layout": "random", "density": 0.5, "seed": 0,
                          "band": 1, "columns": 1},
         lambda t, s, m: (projections(t, s), _self(t, "", s, m, m.pattern)), _inputs, _PROJ + ATTENTION_FORMULA,
         make=_blocksparse_make, module_type=BlockSparseAttention, config=_dims),
    Spec("sparse-transformer", {**_SIZES, "length": 18, "pattern": "strided", "stride": None, "summary": None,
                                "causal": True},
         _sparse_count, _inputs,
         _PROJ + "local set (band or own block) + strided set (folded to (l, n/l)) or summary keys, each as "
                 "the dispatcher runs it",
         make=lambda s: SparseTransformerAttention(s["dim"], s["heads"], s["pattern"], stride=s["stride"],
                                                   summary=s["summary"], causal=s["causal"]).to(dtype_of(s)),
         derive=_sparse_derive, module_type=SparseTransformerAttention,
         config=lambda m: {**_dims(m), "pattern": m.pattern, "stride": m.stride, "summary": m.summary,
                           "causal": m.causal}),
    Spec("reformer", {**_SIZES, "length": 16, "dim": 32, "heads": 4, "n_buckets": None, "n_hashes": 2,
                      "chunk_size": 4, "causal": True, "seed": 0},
         _reformer_count, _inputs,
         "projections 2 B n dim^2 (qk, v, out); hashing 2 B H n d R n_buckets/2; "
         "chunks 2 B H R ceil(n/c) c (2c) 2d",
         make=lambda s: ReformerAttention(s["dim"], s["heads"], n_buckets=s["n_buckets"], n_hashes=s["n_hashes"],
                                          chunk_size=s["chunk_size"], causal=s["causal"],
                                          seed=s["seed"]).to(dtype_of(s)),
         derive=_reformer_derive, module_type=ReformerAttention,
         config=lambda m: {**_dims(m), "n_buckets": m.lsh.n_buckets, "n_hashes": m.lsh.n_hashes,
                           "chunk_size": m.lsh.chunk_size, "causal": m.lsh.causal}),
]
