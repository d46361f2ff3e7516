"""Linear-time attention through feature maps: Katharopoulos et al. 2020 and the Performer (FAVOR+).

Both compute ``out_i = phi(q_i)^T S / (phi(q_i)^T z + eps)`` with ``S = sum_j phi(k_j) v_j^T`` and
``z = sum_j phi(k_j)`` (over ``j <= i`` when causal), accumulated in float32 (float64 for float64 input)
whatever the input dtype, so fp16/bf16 sums over the sequence cannot overflow (RELIABILITY row 40).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..costing.attend import projections
from ..costing.spec import Spec
from ..costing.tally import dtype_of
from ..errors import ArgumentError, check_int
from ..registry.entry import Entry, register
from ._inputs import check_keep_mask
from ._projections import ProjectedAttention, sequence_input
from .padding import clear_padding

__all__ = ["LinearAttention", "PerformerAttention", "orthogonal_random_features"]


def accumulate_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def causal_sums(phi_q, phi_k, v, chunk):
    """Numerator and normaliser over ``j <= i``: exact within chunks, prefix sums of chunk states across."""
    n = phi_q.shape[2]
    pad = (-n) % chunk
    qc, kc, vc = (F.pad(t, (0, 0, 0, pad)).unflatten(2, (-1, chunk)) for t in (phi_q, phi_k, v))  # (b,h,C,c,.)
    kv = kc.transpose(-1, -2) @ vc  # (b, h, C, f, dv)
    ks = kc.sum(3)  # (b, h, C, f)
    # exclusive prefix over chunks: chunk C sees only the chunks strictly before it
    state = torch.cat([torch.zeros_like(kv[:, :, :1]), kv[:, :, :-1].cumsum(2)], 2)
    zstate = torch.cat([torch.zeros_like(ks[:, :, :1]), ks[:, :, :-1].cumsum(2)], 2)
    scores = (qc @ kc.transpose(-1, -2)).tril()  # (b, h, C, c, c): keys after the query selected away
    num = qc @ state + scores @ vc
    den = qc @ zstate.unsqueeze(-1) + scores.sum(-1, keepdim=True)
    return num.flatten(2, 3)[:, :, :n], den.flatten(2, 3)[:, :, :n]


def feature_map_attention(phi_q, phi_k, v, *, causal: bool, chunk_size: int = 64, eps: float = 0.0):
    """``phi(Q) (phi(K)^T V) / (phi(Q) phi(K)^T 1 + eps)``; ``(b,h,n,f)``, ``(b,h,m,f)``, ``(b,h,m,dv)``.

    Sums run in float32 (float64 for float64 input); a row whose normaliser is 0 (all keys zeroed by a
    mask) outputs 0. Returns ``(b, h, n, dv)`` in ``v``'s dtype.
    """
    acc = accumulate_dtype(v.dtype)
    phi_q, phi_k, vv = phi_q.to(acc), phi_k.to(acc), v.to(acc)
    if causal:
        num, den = causal_sums(phi_q, phi_k, vv, chunk_size)
    else:
        num = phi_q @ (phi_k.transpose(-1, -2) @ vv)  # (b, h, n, dv) through an (f, dv) state
        den = phi_q @ phi_k.sum(2).unsqueeze(-1)  # (b, h, n, 1)
    den = den + eps
    return (num / torch.where(den > 0, den, torch.ones_like(den))).to(v.dtype)


class _FeatureMapAttention(ProjectedAttention):
    """Projections and masking shared by the feature-map attentions; subclasses define ``attend(q, k, v, keep)``."""

    def __init__(self, dim, num_heads, causal, chunk_size, eps):
        super().__init__(dim, num_heads)
        check_int(type(self).__name__, "chunk_size", chunk_size, 1)
        if not eps >= 0:
            raise ArgumentError(f"{type(self).__name__}: eps must be >= 0; got {eps!r}")
        self.causal, self.chunk_size, self.eps = causal, chunk_size, eps

    def forward(self, x: torch.Tensor, *, key_keep_mask: torch.Tensor | None = None) -> torch.Tensor:
        self.check_input(x)
        keep = check_keep_mask(type(self).__name__, "key_keep_mask", key_keep_mask, x.shape[0], x.shape[1])
        q, k, v = self.project(clear_padding(x, keep))  # (b, h, n, d) each
        if x.shape[1] == 0:
            return self.merge_heads(v)  # empty sequence: empty output
        keep = None if keep is None else keep[:, None, :, None]  # (b, 1, n, 1)
        if keep is not None:  # masked keys leave the sums; select, so NaN there cannot leak
            v = v.masked_fill(~keep, 0.0)
        acc = accumulate_dtype(x.dtype)  # features in float32 at least: exp/elu of fp16 would overflow
        return self.merge_heads(self.attend(q.to(acc), k.to(acc), v, keep))


class LinearAttention(_FeatureMapAttention):
    """Linear attention with the ``elu + 1`` feature map (Katharopoulos et al. 2020, arXiv:2006.16236, eq. 4-6).

    ``V'_i = phi(Q_i)^T (sum_j phi(K_j) V_j^T) / (phi(Q_i)^T sum_j phi(K_j) + eps)`` with the feature
    map ``phi(x) = elu(x) + 1`` (eq. 7); causal: sums over ``j <= i`` only (Sec. 3.3). Notation: Q, K, V
    = ``q, k, v`` per head.

    Differences from the paper: ``eps`` (default 1e-6) is added to the normaliser (positive by
    construction, so it only guards rows whose keys are all masked: they output 0). The causal prefix
    sums run per chunk of ``chunk_size`` keys (exact within a chunk, cumulative states across), so no
    ``(n, d, dv)`` tensor is stored. Masked keys are zeroed in ``phi(K)`` and ``V``.

    Shapes: ``x`` ``(b, n, dim)``, ``key_keep_mask`` ``(b, n)`` bool (True = real token) -> ``(b, n, dim)``.

    Complexity: O(n d dv) time and O(d dv) state per head (causal: O(n (c + dv) d) time, c = chunk).

    Args:
        dim: model width.
        num_heads: number of heads (head width ``dim // num_heads``).
        causal: sum over ``j <= i`` only.
        eps: added to the normaliser.
        chunk_size: causal chunk length.

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> layer = LinearAttention(32, 4, causal=True)
        >>> layer(torch.randn(2, 10, 32)).shape
        torch.Size([2, 10, 32])
    """

    def __init__(self, dim: int, num_heads: int, *, causal: bool = False, eps: float = 1e-6, chunk_size: int = 64):
        super().__init__(dim, num_heads, causal, chunk_size, eps)

    def attend(self, q, k, v, keep):
        phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
        phi_k = phi_k if keep is None else phi_k.masked_fill(~keep, 0.0)
        return feature_map_attention(phi_q, phi_k, v, causal=self.causal, chunk_size=self.chunk_size, eps=self.eps)

def orthogonal_random_features(num_features: int, dim: int, *, generator: torch.Generator | None = None,
                               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``(num_features, dim)`` Gaussian rows, orthogonal within blocks of ``dim`` (Performer Sec. 2.4).

    Each block is the Q factor of a square Gaussian matrix ``G = QR`` with its columns multiplied by
    ``sign(diag(R))``: that makes the factorisation unique and Q Haar-distributed (uniform over the
    orthogonal group; without it the QR routine's sign convention biases the rows, and Lemma 1's
    estimator with them). Rows are then rescaled by the norms of independent Gaussian vectors so that
    every row is marginally ``N(0, I)``. Drawn on the CPU in float64 from ``generator`` (the global
    RNG if None), so a seed gives the same features anywhere.
    """
    blocks = []
    for _ in range(-(-num_features // dim)):
        gauss = torch.randn(dim, dim, generator=generator, dtype=torch.float64)
        q, r = torch.linalg.qr(gauss)
        signs = torch.where(r.diagonal() < 0, -1.0, 1.0).to(q)  # sign(diag(R)); a zero (probability 0) counts +1
        blocks.append((q * signs).T)  # rows orthonormal, Haar-distributed
    rows = torch.cat(blocks)[:num_features]
    norms = torch.randn(num_features, dim, generator=generator, dtype=torch.float64).norm(dim=1)
    return (rows * norms[:, None]).to(dtype)


class PerformerAttention(_FeatureMapAttention):
    """FAVOR+ attention with positive orthogonal random features (Choromanski et al. 2021, arXiv:2009.14794).

    Lemma 1: ``exp(x^T y) = E_w[exp(w^T x - |x|^2/2) exp(w^T y - |y|^2/2)]``, ``w ~ N(0, I)``, so with
    ``phi(x) = exp(W x - |x|^2/2) / sqrt(m)`` on ``x = d^(-1/4) q`` (and k), softmax attention
    ``D^-1 exp(Q K^T / sqrt(d)) V`` is estimated by ``D^-1 phi(Q) (phi(K)^T V)``,
    ``D = diag(phi(Q) phi(K)^T 1)`` (Sec. 2.2-2.4). Notation: W = ``self.projection`` ``(m, d)``.

    Differences from the paper: the features are drawn once (from ``seed``) and kept in the buffer
    ``projection``; call :meth:`redraw` with an explicit generator to resample (the paper redraws
    periodically during training). Features are ``(exp(w^T x - |x|^2/2) + eps) / sqrt(m)`` with
    ``eps`` (default 1e-6), so they stay strictly positive; they are computed times ``exp(-r)`` for a
    detached stabiliser r (per query row; for keys the max over unmasked keys, or in causal mode the
    running max over the chunks so far with the state rescaled), which cancels in the ratio, so no
    exp overflows. Masked keys are zeroed in ``phi(K)`` and ``V``. The causal form is a loop over chunks.

    Shapes: ``x`` ``(b, n, dim)``, ``key_keep_mask`` ``(b, n)`` bool (True = real token) -> ``(b, n, dim)``.

    Complexity: O(n m (d + dv)) time, O(m dv) state per head (causal: plus O(n c m), c = chunk).

    Args:
        dim: model width.
        num_heads: number of heads (head width ``d = dim // num_heads``).
        num_features: random features m (default ``d * ceil(log(d))``, the paper's d log d).
        causal: sum over ``j <= i`` only.
        eps: added to each feature.
        chunk_size: causal chunk length (the causal form loops over chunks in Python: keep it in the hundreds for long
            inputs).
        seed: seed of the generator the first features are drawn from.

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> layer = PerformerAttention(32, 4, num_features=16, seed=1)
        >>> layer(torch.randn(2, 10, 32)).shape
        torch.Size([2, 10, 32])
    """

    def __init__(self, dim: int, num_heads: int, *, num_features: int | None = None, causal: bool = False,
                 eps: float = 1e-6, chunk_size: int = 128, seed: int = 0):
        super().__init__(dim, num_heads, causal, chunk_size, eps)
        d = self.head_dim
        self.num_features = num_features or d * max(1, math.ceil(math.log(d)))
        if self.num_features < 1:
            raise ArgumentError(f"num_features must be >= 1; got {num_features}")
        self.register_buffer("projection", orthogonal_random_features(
            self.num_features, d, generator=torch.Generator().manual_seed(seed)))

    @torch.no_grad()
    def redraw(self, generator: torch.Generator | None = None) -> None:
        """Resample the random features from ``generator`` (a CPU generator; the global RNG if None)."""
        fresh = orthogonal_random_features(self.num_features, self.head_dim, generator=generator)
        self.projection.copy_(fresh.to(self.projection))

    def _logits(self, x):
        x = x * self.head_dim ** -0.25
        w = self.projection.to(x.dtype)
        return x @ w.T - x.pow(2).sum(-1, keepdim=True) / 2  # (b, h, n, m)

    def _reference(self, top):
        """A stabiliser ``r >= max(top, log eps)``, detached; a constant (0) where every key is masked."""
        floor = math.log(self.eps) if self.eps > 0 else -math.inf
        ref = torch.clamp(top.detach(), min=floor)
        return torch.where(torch.isfinite(ref), ref, torch.zeros_like(ref))

    def _features(self, logits, ref):
        """``exp(-ref) (exp(logits) + eps) / sqrt(m)``: the factor ``exp(-ref)`` cancels in the ratio."""
        phi = torch.exp(logits - ref)
        if self.eps > 0:  # ref >= log(eps) then, so exp(-ref) <= 1 / eps cannot overflow
            phi = phi + self.eps * torch.exp(-ref)
        return phi * self.num_features ** -0.5

    def attend(self, q, k, v, keep):
        lq, lk = self._logits(q), self._logits(k)
        phi_q = self._features(lq, self._reference(lq.amax(-1, keepdim=True)))  # per row: cancels row by row
        seen = lk if keep is None else lk.masked_fill(~keep, -math.inf)
        if self.causal:
            return self._causal_scan(phi_q, lk, seen, v, keep)
        phi_k = self._features(lk, self._reference(seen.amax((-1, -2), keepdim=True)))  # one constant for all
        phi_k = phi_k if keep is None else phi_k.masked_fill(~keep, 0.0)
        return feature_map_attention(phi_q, phi_k, v, causal=False)

    def _causal_scan(self, phi_q, lk, seen, v, keep):
        """Chunk by chunk, key features relative to the running max of the keys so far, state rescaled.

        A key's stabiliser then never depends on a later chunk, so earlier outputs cannot move when
        later tokens change (within a chunk they may move by rounding).
        """
        b, h, n, m = phi_q.shape
        state = phi_q.new_zeros(b, h, m, v.shape[-1])
        zstate = phi_q.new_zeros(b, h, m, 1)
        top = torch.full((b, h, 1, 1), -math.inf, dtype=phi_q.dtype, device=phi_q.device)
        ref = self._reference(top)
        c = self.chunk_size
        keeps = (None,) * -(-n // c) if keep is None else keep.expand(b, h, n, 1).split(c, 2)
        outs = []  # split, not sliced in the loop: a slice's backward would write a full-size gradient
        for qc, lkc, sc, vc, kc in zip(phi_q.split(c, 2), lk.split(c, 2), seen.split(c, 2),
                                        v.to(phi_q.dtype).split(c, 2), keeps, strict=True):
            top = torch.maximum(top, sc.detach().amax((-1, -2), keepdim=True))
            new_ref = self._reference(top)
            phi_k = self._features(lkc, new_ref)  # (b, h, c, m)
            phi_k = phi_k if kc is None else phi_k.masked_fill(~kc, 0.0)
            decay = torch.exp((ref - new_ref).clamp(max=0))  # to the new stabiliser (state is 0 before any key)
            state, zstate = state * decay, zstate * decay
            scores = (qc @ phi_k.transpose(-1, -2)).tril()  # (b, h, c, c): later keys selected away
            num, den = qc @ state + scores @ vc, qc @ zstate + scores.sum(-1, keepdim=True)
            outs.append(num / torch.where(den > 0, den, torch.ones_like(den)))
            state = state + phi_k.transpose(-1, -2) @ vc
            zstate = zstate + phi_k.sum(2).unsqueeze(-1)
            ref = new_ref
        return torch.cat(outs, 2).to(v.dtype) if outs else v.new_zeros(b, h, 0, v.shape[-1])


def _example(cls, **kwargs):
    def build():
        g = torch.Generator().manual_seed(0)
        return cls(32, 4, **kwargs), (torch.randn(2, 16, 32, generator=g),)
    return build


def _prefix_state(t, s, f, dv):
    """What a causal layer decodes from: the prefix sums S ``(f, dv)`` and z ``(f)`` per head, accumulated."""
    t.decoding(fixed=s["heads"] * f * (dv + 1) * accumulate_dtype(dtype_of(s)).itemsize)


def _feature_sums(t, s, f, dv, causal, chunk):
    """:func:`feature_map_attention` on features of width ``f``."""
    bh, n = s["batch"] * s["heads"], s["length"]
    if not causal:
        t.mm("phi(K)^T V", bh, f, n, dv)
        t.mm("phi(Q) (phi(K)^T V)", bh, n, f, dv)
        t.mm("normaliser phi(Q) sum phi(K)", bh, n, f, 1)
        return
    chunks = -(-n // chunk)  # padded to whole chunks
    _prefix_state(t, s, f, dv)
    t.mm("chunk states phi(K)^T V", bh * chunks, f, chunk, dv)
    t.mm("in-chunk scores phi(Q) phi(K)^T", bh * chunks, chunk, f, chunk)
    t.mm("phi(Q) @ state (prefix)", bh, chunks * chunk, f, dv)
    t.mm("in-chunk scores @ V", bh * chunks, chunk, chunk, dv)
    t.mm("normaliser phi(Q) @ prefix sum", bh, chunks * chunk, f, 1)
    t.inter(bh * chunks * chunk * (chunk + f * dv // chunk))


def _linear_count(t, s, module=None):
    projections(t, s)
    if s["length"]:
        t.ew("feature map elu(x) + 1", 2 * s["batch"] * s["length"] * s["dim"], 2)
        _feature_sums(t, s, s["dim"] // s["heads"], s["dim"] // s["heads"], s["causal"], s["chunk_size"])


def _chunk_kinds(n: int, c: int):
    """``(count, size, first, last)`` of the chunks of :meth:`PerformerAttention._causal_scan`, alike ones together."""
    chunks = -(-n // c)
    kinds = [(1, min(c, n), True, chunks == 1), (chunks - 2, c, False, False), (1, n - (chunks - 1) * c, False, True)]
    return [kinds[0]] + ([kinds[1]] if chunks > 2 else []) + ([kinds[2]] if chunks > 1 else [])


def _performer_count(t, s, module=None):
    bh, n, d, m = s["batch"] * s["heads"], s["length"], s["dim"] // s["heads"], s["num_features"]
    projections(t, s)
    if not n:
        return
    t.mm("feature logits x W^T (W fixed)", 2, bh * n, d, m, grads=1)
    t.ew("features exp(. - |x|^2 / 2)", 2 * bh * n * m, 6)
    t.inter(2 * bh * n * m)
    if not s["causal"]:
        _feature_sums(t, s, m, d, False, 1)
        return
    _prefix_state(t, s, m, d)
    for count, ci, first, last in _chunk_kinds(n, s["chunk_size"]):
        g = 1 if first else 2  # the first chunk reads the zero state
        t.mm("in-chunk scores phi(Q) phi(K)^T", bh * count, ci, m, ci)
        t.mm("phi(Q) @ state", bh * count, ci, m, d, grads=g)
        t.mm("in-chunk scores @ V", bh * count, ci, ci, d)
        t.mm("normaliser phi(Q) @ zstate", bh * count, ci, m, 1, grads=g)
        t.mm("state update phi(K)^T V", bh * count, m, ci, d, grads=0 if last else 2)  # the last is never read


def _performer_derive(s):
    if s["num_features"] is None:
        d = s["dim"] // s["heads"]
        s["num_features"] = d * max(1, math.ceil(math.log(d)))
    return s


_SIZES = {"batch": 2, "length": 16, "dim": 32, "heads": 4, "dtype": "float32"}
_FEATURES = "phi(K)^T V 2 B H n f Dv, phi(Q) state 2 B H n f Dv, normaliser 2 B H n f"
_CAUSAL = " (causal: per chunk of c, plus in-chunk scores 2 B H n c (f + Dv))"


register(Entry("linear-attention", LinearAttention, "Katharopoulos et al. 2020, arXiv:2006.16236, eq. 4-6",
               "O(L D^2)", "elu(x)+1 feature map: phi(Q) (phi(K)^T V), causal by prefix sums", "long-sequence",
               _example(LinearAttention, causal=True),
               spec=Spec({**_SIZES, "causal": True, "chunk_size": 64}, _linear_count, sequence_input,
                         "projections 8 B n dim^2; " + _FEATURES + _CAUSAL + ", n padded to whole chunks",
                         make=lambda s: LinearAttention(s["dim"], s["heads"], causal=s["causal"],
                                                        chunk_size=s["chunk_size"]).to(dtype_of(s)),
                         module_type=LinearAttention,
                         config=lambda m: {"dim": m.dim, "heads": m.num_heads, "causal": m.causal,
                                           "chunk_size": m.chunk_size})))
register(Entry("performer", PerformerAttention, "Choromanski et al. 2021, arXiv:2009.14794, Lemma 1 (FAVOR+)",
               "O(L m D)", "positive orthogonal random features estimate softmax attention in linear time",
               "long-sequence", _example(PerformerAttention, num_features=32),
               spec=Spec({**_SIZES, "num_features": 32, "causal": False, "chunk_size": 128}, _performer_count,
                         sequence_input, "projections 8 B n dim^2; features 2 x 2 B H n d m; " + _FEATURES + _CAUSAL,
                         make=lambda s: PerformerAttention(s["dim"], s["heads"], num_features=s["num_features"],
                                                           causal=s["causal"],
                                                           chunk_size=s["chunk_size"]).to(dtype_of(s)),
                         derive=_performer_derive, module_type=PerformerAttention,
                         nullable=frozenset({"num_features"}),
                         config=lambda m: {"dim": m.dim, "heads": m.num_heads, "num_features": m.num_features,
                                           "causal": m.causal, "chunk_size": m.chunk_size})))
