"""Normalisers beyond softmax that run over key blocks: sigmoid attention, softpick, stick-breaking.

A row of scores ``s_1 .. s_Lk`` (the allowed keys of one query) becomes weights ``w_j``; the output
is ``sum_j w_j v_j``. Each normaliser here is written once, as a rule over *blocks* of a row: a
state per row (started by :meth:`Blockwise.start`), the unnormalised weights of each block with the
new state and the factor that rescales what the blocks before it added (:meth:`Blockwise.block`),
and one division at the end (:meth:`Blockwise.divisor`). The O(L)-memory online path
(:mod:`attnkit.kernels.online_softmax`) walks the key blocks with it, never holding a whole row; the
dense reference and the gathered block-sparse path take a whole row as one block
(:meth:`Blockwise.weights`). Masked keys (``allowed`` False) get weight 0 and enter no sum.

Sigmoid attention (Ramapuram et al. 2024, arXiv:2409.04431, Sec. 2)::

    w_j = sigmoid(s_j + b),    b = 0 ("sigmoid") or b = -log n ("sigmoid_log_n", the paper's bias)

with ``n = Lk``, the keys of the call. Softpick (Zuhri et al. 2025, arXiv:2504.20966, the softpick
function)::

    w_j = ReLU(exp(s_j) - 1) / (sum_l |exp(s_l) - 1| + eps),       eps = 1e-8

computed as ``ReLU(e^(s_j - m) - e^-m) / (sum_l |e^(s_l - m) - e^-m| + eps e^-m)`` with
``m = max(0, max_l s_l)``: the same numbers, no overflow, and ``e^-m <= 1``; across blocks the
running ``m`` rescales the sums as the online softmax does. Stick-breaking attention (Tan et al.
2024, arXiv:2410.17980, Sec. 2: ``A_ij = beta_ij prod_{i<k<j} (1 - beta_kj)``, ``beta = sigmoid(z)``
for key ``i`` and query ``j``)::

    w_j = sigmoid(s_j) * prod_{l allowed, l > j} (1 - sigmoid(s_l))
    log w_j = log sigmoid(s_j) + sum_{l allowed, l > j} log sigmoid(-s_l)

the nearest allowed key (largest index) breaks off its share first; key blocks are visited from
the last one, carrying the sum of ``log sigmoid(-s_l)`` of the blocks after. Weights sum to at
most 1 (what is left goes nowhere).

Differences from the papers: masks are attnkit's (the paper's strictly causal stick-breaking is
``masks.diagonals(None, -1)``; ``masks.causal()`` lets a query break off its own key first);
``n`` is the call's key length (decoding over a KV cache sees the cache's length: pass
``normalize="sigmoid"`` and the bias you want for a fixed ``n``); softpick's ``eps`` stands in the
unshifted sum, as the equation has it (its reference code adds it after the shift).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = ["Blockwise", "Sigmoid", "Softpick", "StickBreaking", "BLOCKWISE", "sigmoid", "sigmoid_log_n",
           "softpick", "stick_breaking"]

_NEG_INF = float("-inf")


def _kept(t: torch.Tensor, allowed: torch.Tensor | None, value: float) -> torch.Tensor:
    """``t`` with ``value`` where the key is masked (by select: NaN or inf there cannot leak)."""
    return t if allowed is None else t.masked_fill(~allowed, value)


class Blockwise:
    """A row normaliser as a rule over key blocks (see the module's docstring); ``reverse``: last block first."""

    reverse = False

    def start(self, rows: torch.Tensor):
        """The state before the first block; ``rows`` is a ``(..., rows, 1)`` tensor to shape it like."""
        return None

    def block(self, state, scores, allowed, kv_len: int):
        """``(weights, state, rescale)`` of one block ``(..., rows, keys)``: rescale (or None) multiplies the sums
        of the blocks before."""
        raise NotImplementedError

    def divisor(self, state) -> torch.Tensor | None:
        """What the summed ``weights @ v`` is divided by at the end (None: nothing)."""
        return None

    def weights(self, scores: torch.Tensor, allowed: torch.Tensor | None = None,
                kv_len: int | None = None) -> torch.Tensor:
        """The weights of whole rows (one block); ``kv_len`` defaults to the rows' length."""
        kv_len = scores.shape[-1] if kv_len is None else kv_len
        w, state, _ = self.block(self.start(scores.new_zeros(*scores.shape[:-1], 1)), scores, allowed, kv_len)
        div = self.divisor(state)
        return w if div is None else w / div


class Sigmoid(Blockwise):
    """``sigmoid(s + b)``, with ``b = -log n`` when ``log_n``."""

    def __init__(self, log_n: bool = False):
        self.log_n = log_n

    def block(self, state, scores, allowed, kv_len):
        shifted = scores - math.log(max(1, kv_len)) if self.log_n else scores
        return _kept(torch.sigmoid(shifted), allowed, 0.0), None, None


class Softpick(Blockwise):
    """``ReLU(e^s - 1) / (sum |e^s - 1| + eps)``; the state is the running shift ``m >= 0`` and sum."""

    def __init__(self, eps: float = 1e-8):
        self.eps = eps

    def start(self, rows):
        return torch.zeros_like(rows), torch.zeros_like(rows)

    def block(self, state, scores, allowed, kv_len):
        m, total = state
        z = _kept(scores, allowed, _NEG_INF)
        # the shift needs no gradient: the ratio is the same for every m
        m_new = torch.maximum(m, z.detach().amax(-1, keepdim=True)) if z.shape[-1] else m
        base = torch.exp(-m_new)
        t = _kept(torch.exp(z - m_new) - base, allowed, 0.0)  # e^-m (e^s - 1)
        rescale = torch.exp(m - m_new)
        return F.relu(t), (m_new, total * rescale + t.abs().sum(-1, keepdim=True)), rescale

    def divisor(self, state):
        m, total = state
        return total + self.eps * torch.exp(-m)


class StickBreaking(Blockwise):
    """``sigmoid(s_j) prod_{l > j} (1 - sigmoid(s_l))`` over allowed keys; the state is the log of what the later
    blocks left, ``sum log sigmoid(-s_l) = -sum softplus(s_l)``.

    One softplus per score gives both logs (``log sigmoid(s) = s - softplus(s)``), and the weights are one
    ``exp``, which autograd keeps for the backward as the product with ``v`` does: few score-sized tensors.
    """

    reverse = True

    def start(self, rows):
        return torch.zeros_like(rows)

    def block(self, state, scores, allowed, kv_len):
        if scores.shape[-1] == 0:
            return scores, state, None
        taken = _kept(F.softplus(scores), allowed, 0.0)  # -log(1 - beta) = softplus(s), 0 where masked
        after = _later_sums(taken)
        # log beta = s - softplus(s); masked keys get log w = -inf (by select), so exp() writes the weights at once
        log_w = _kept(scores - taken - after + state, allowed, _NEG_INF)
        return torch.exp(log_w), state - taken.sum(-1, keepdim=True), None


def _later_sums(t: torch.Tensor) -> torch.Tensor:
    """``sum_{l > j} t_l`` along the last dim: a cumulative sum from the end, shifted by one (exact: no subtraction).

    Every temporary has ``t``'s size: a slab-sized one a column short would sit just under glibc's largest mmap
    threshold and be served from the heap, which long calls then fragment (measured: 2.5x the peak at L = 16384).
    """
    later = t.flip(-1).cumsum(-1).roll(1, -1)
    later[..., 0] = 0.0
    return later.flip(-1)


SIGMOID, SIGMOID_LOG_N, SOFTPICK, STICK_BREAKING = Sigmoid(), Sigmoid(log_n=True), Softpick(), StickBreaking()
BLOCKWISE: dict[str, Blockwise] = {"sigmoid": SIGMOID, "sigmoid_log_n": SIGMOID_LOG_N, "softpick": SOFTPICK,
                                   "stick_breaking": STICK_BREAKING}


def sigmoid(scores: torch.Tensor, allowed: torch.Tensor | None = None) -> torch.Tensor:
    """Sigmoid attention weights ``sigmoid(s)`` (Ramapuram et al. 2024, arXiv:2409.04431); not normalised."""
    return SIGMOID.weights(scores, allowed)


def sigmoid_log_n(scores: torch.Tensor, allowed: torch.Tensor | None = None) -> torch.Tensor:
    """``sigmoid(s - log n)``, ``n`` the rows' length (Ramapuram et al. 2024, arXiv:2409.04431, Sec. 2)."""
    return SIGMOID_LOG_N.weights(scores, allowed)


def softpick(scores: torch.Tensor, allowed: torch.Tensor | None = None) -> torch.Tensor:
    """``ReLU(e^s - 1) / (sum |e^s - 1| + 1e-8)`` (Zuhri et al. 2025, arXiv:2504.20966): rectified, not sum-to-one."""
    return SOFTPICK.weights(scores, allowed)


def stick_breaking(scores: torch.Tensor, allowed: torch.Tensor | None = None) -> torch.Tensor:
    """Stick-breaking weights, nearest (last) key first (Tan et al. 2024, arXiv:2410.17980); keys in index order."""
    return STICK_BREAKING.weights(scores, allowed)
