"""Co-attention between two modalities (question words and image regions), parallel and alternating."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from ..core import attention
from ..costing.spec import Spec
from ..costing.tally import dtype_of, randn
from ..errors import ArgumentError
from ..registry.entry import Entry, register
from ._inputs import check_keep_mask, check_sequence
from .pooling import count_pool

__all__ = ["CoAttention", "CoAttentionOutput"]

_WHO = "CoAttention"


class CoAttentionOutput(NamedTuple):
    """question ``q_hat (B, Dq)``, image ``v_hat (B, Dv)``, question_weights ``(B, T)``, image_weights ``(B, N)``."""

    question: torch.Tensor
    image: torch.Tensor
    question_weights: torch.Tensor
    image_weights: torch.Tensor


def _vector(size):
    return nn.Parameter(torch.empty(size).uniform_(-size ** -0.5, size ** -0.5))


def _pool(hidden, w, x, keep):
    """``a = softmax(w^T H)`` over kept rows, ``x_hat = sum_i a_i x_i``: H (B, L, k), x (B, L, D) -> (B, D), (B, L)."""
    query = w.to(hidden.dtype).expand(hidden.shape[0], 1, -1)  # (B, 1, k)
    out = attention(query, hidden, x, score="dot", scale=1.0, return_weights=True,
                    mask=None if keep is None else keep[:, None, :])
    return out.output[:, 0], out.weights[:, 0]


class CoAttention(nn.Module):
    """Co-attention: question attention guided by the image and image attention guided by the question.

    Lu, Yang, Batra & Parikh 2016, "Hierarchical Question-Image Co-Attention for Visual
    Question Answering", NeurIPS, arXiv:1606.00061, Sec. 3.3. Parallel (eqs. 3-5)::

        C = tanh(Q^T W_b V)
        H^v = tanh(W_v V + (W_q Q) C),        H^q = tanh(W_q Q + (W_v V) C^T)
        a^v = softmax(w_hv^T H^v),            a^q = softmax(w_hq^T H^q)
        v_hat = sum_n a^v_n v_n,              q_hat = sum_t a^q_t q_t

    Alternating (eq. 6), ``x_hat = A(X; g)`` with ``H = tanh(W_x X + (W_g g) 1^T)``,
    ``a^x = softmax(w_hx^T H)``, ``x_hat = sum_i a^x_i x_i``, applied three times:
    ``s = A(Q; 0)``, ``v_hat = A(V; s)``, ``q_hat = A(Q; v_hat)``.

    Notation: the paper's columns are our rows: ``Q`` = ``question`` ``(B, T, Dq)``,
    ``V`` = ``image`` ``(B, N, Dv)``, ``C`` is ``(B, T, N)``; ``W_b`` = ``affinity``,
    ``W_v, W_q`` = ``image_proj, question_proj``, ``w_hv, w_hq`` = ``image_score,
    question_score``; alternating steps 1-3 own ``step{i}_x`` (``W_x``), ``step{i}_g``
    (``W_g``) and ``step{i}_score`` (``w_hx``).

    Differences from the paper: ``Q`` and ``V`` may have different widths
    (``W_b`` is ``Dq x Dv``); masks for padded words/regions (a padded pair's
    affinity is 0, so it adds nothing to ``H``; a row with nothing kept gives a zero
    vector); the paper does not say whether the three alternating steps share
    weights: here each step has its own.

    Shapes:
        question ``(B, T, Dq)``, image ``(B, N, Dv)``, question_mask ``(B, T)``,
        image_mask ``(B, N)`` -> :class:`CoAttentionOutput`.

    Complexity: parallel ``O(B T N (Dq + k))`` plus ``O(B (T Dq + N Dv) k)``; alternating ``O(B (T Dq + N Dv) k)``.

    Args:
        question_dim: ``Dq``, features of a question word.
        image_dim: ``Dv``, features of an image region.
        hidden_dim: ``k``, the size of ``H``.
        mode: ``"parallel"`` or ``"alternating"``.

    Example:
        >>> import torch
        >>> from attnkit.nn.coattention import CoAttention
        >>> _ = torch.manual_seed(0)
        >>> co = CoAttention(4, 6, 5)
        >>> q_hat, v_hat, a_q, a_v = co(torch.randn(2, 3, 4), torch.randn(2, 7, 6))
        >>> q_hat.shape, v_hat.shape, a_q.shape, a_v.shape
        (torch.Size([2, 4]), torch.Size([2, 6]), torch.Size([2, 3]), torch.Size([2, 7]))
    """

    def __init__(self, question_dim: int, image_dim: int, hidden_dim: int, *, mode: str = "parallel"):
        super().__init__()
        if mode not in ("parallel", "alternating"):
            raise ArgumentError(f"{_WHO}: mode must be 'parallel' or 'alternating'; got {mode!r}")
        self.question_dim, self.image_dim, self.mode = question_dim, image_dim, mode
        linear = lambda d: nn.Linear(d, hidden_dim, bias=False)
        if mode == "parallel":
            self.affinity = nn.Parameter(torch.randn(question_dim, image_dim) * (question_dim * image_dim) ** -0.25)
            self.question_proj, self.image_proj = linear(question_dim), linear(image_dim)
            self.question_score, self.image_score = _vector(hidden_dim), _vector(hidden_dim)
        else:
            self.step1_x, self.step1_score = linear(question_dim), _vector(hidden_dim)
            self.step2_x, self.step2_g, self.step2_score = linear(image_dim), linear(question_dim), _vector(hidden_dim)
            self.step3_x, self.step3_g, self.step3_score = linear(question_dim), linear(image_dim), _vector(hidden_dim)

    def _parallel(self, q, v, q_keep, v_keep):
        c = torch.tanh(q @ self.affinity.to(q.dtype) @ v.transpose(1, 2))  # (B, T, N); 0 at padded pairs
        wq, wv = self.question_proj(q), self.image_proj(v)  # (B, T, k), (B, N, k)
        h_v = torch.tanh(wv + c.transpose(1, 2) @ wq)  # (B, N, k)
        h_q = torch.tanh(wq + c @ wv)  # (B, T, k)
        v_hat, a_v = _pool(h_v, self.image_score, v, v_keep)
        q_hat, a_q = _pool(h_q, self.question_score, q, q_keep)
        return CoAttentionOutput(q_hat, v_hat, a_q, a_v)

    def _alternating(self, q, v, q_keep, v_keep):
        s, _ = _pool(torch.tanh(self.step1_x(q)), self.step1_score, q, q_keep)  # g = 0: W_g g vanishes
        v_hat, a_v = _pool(torch.tanh(self.step2_x(v) + self.step2_g(s)[:, None, :]), self.step2_score, v, v_keep)
        q_hat, a_q = _pool(torch.tanh(self.step3_x(q) + self.step3_g(v_hat)[:, None, :]), self.step3_score, q, q_keep)
        return CoAttentionOutput(q_hat, v_hat, a_q, a_v)

    def forward(self, question: torch.Tensor, image: torch.Tensor, *, question_mask: torch.Tensor | None = None,
                image_mask: torch.Tensor | None = None) -> CoAttentionOutput:
        """Co-attend; masks are bool, True = a real word / region."""
        check_sequence(_WHO, "question", question, self.question_dim, length="length", like=self)
        check_sequence(_WHO, "image", image, self.image_dim, batch=question.shape[0], length="length", like=self)
        q_keep = check_keep_mask(_WHO, "question_mask", question_mask, *question.shape[:2], true_means="keep", dims="")
        v_keep = check_keep_mask(_WHO, "image_mask", image_mask, *image.shape[:2], true_means="keep", dims="")
        # Zeroed padding gives zero affinity and projections (no biases), and NaN there cannot leak.
        if q_keep is not None:
            question = question.masked_fill(~q_keep[..., None], 0.0)
        if v_keep is not None:
            image = image.masked_fill(~v_keep[..., None], 0.0)
        run = self._parallel if self.mode == "parallel" else self._alternating
        return run(question, image, q_keep, v_keep)


def _example(mode):
    def build():
        g = torch.Generator().manual_seed(0)
        return CoAttention(6, 8, 5, mode=mode), (torch.randn(2, 4, 6, generator=g), torch.randn(2, 9, 8, generator=g))
    return build


def _parallel_count(t, s, module=None):
    b, lq, lv, dq, dv, k = s["batch"], s["q_len"], s["kv_len"], s["question_dim"], s["image_dim"], s["hidden_dim"]
    t.mm("affinity: Q W_b", 1, b * lq, dq, dv)
    t.mm("affinity: (Q W_b) V^T", b, lq, dv, lv)
    t.mm("W_q Q, W_v V", 1, b * lq, dq, k)
    t.mm("W_q Q, W_v V", 1, b * lv, dv, k)
    t.mm("C^T (W_q Q), C (W_v V)", 2 * b, lv, lq, k)
    t.inter(b * lq * lv, b * (lq + lv) * k * 2)
    count_pool(t, "image pooling: ", b, 1, lv, k, dv, dtype_of(s))
    count_pool(t, "question pooling: ", b, 1, lq, k, dq, dtype_of(s))


def _alternating_count(t, s, module=None):
    b, lq, lv, dq, dv, k = s["batch"], s["q_len"], s["kv_len"], s["question_dim"], s["image_dim"], s["hidden_dim"]
    t.mm("projections of Q and V", 2, b * lq, dq, k)
    t.mm("projections of Q and V", 1, b * lv, dv, k)
    t.mm("projections of the guides", 1, b, dq, k)
    t.mm("projections of the guides", 1, b, dv, k)
    t.inter(2 * b * lq * k, b * lv * k)
    for label, n, width in (("step 1", lq, dq), ("step 2", lv, dv), ("step 3", lq, dq)):
        count_pool(t, f"{label}: ", b, 1, n, k, width, dtype_of(s))


def _spec(mode):
    return Spec({"batch": 2, "q_len": 4, "kv_len": 9, "question_dim": 6, "image_dim": 8, "hidden_dim": 5, "mode": mode,
                 "dtype": "float32"}, _parallel_count if mode == "parallel" else _alternating_count,
                lambda s, m: (m, (randn(s["batch"], s["q_len"], s["question_dim"], dtype=dtype_of(s)),
                                  randn(s["batch"], s["kv_len"], s["image_dim"], seed=1, dtype=dtype_of(s)))),
                "affinity 2 B T (Dq Dv + Dv N) + projections 2 B (T Dq + N Dv) k + pooling" if mode == "parallel"
                else "projections 2 B (2 T Dq + N Dv) k + three pooling steps",
                make=lambda s: CoAttention(s["question_dim"], s["image_dim"], s["hidden_dim"],
                                           mode=s["mode"]).to(dtype_of(s)),
                length=("q_len", "kv_len"), module_type=CoAttention, matches=lambda m: m.mode == mode,
                config=lambda m: {"question_dim": m.question_dim, "image_dim": m.image_dim, "mode": m.mode,
                                  "hidden_dim": (m.question_proj if m.mode == "parallel" else m.step1_x).out_features})


_PAPER = "Lu et al. 2016, arXiv:1606.00061"
register(Entry("co-attention-parallel", CoAttention, _PAPER + ", eqs. 3-5", "O(T N (Dq + k))",
               "question and image attend to each other through a bilinear affinity matrix",
               family="module", example=_example("parallel"), spec=_spec("parallel")))
register(Entry("co-attention-alternating", CoAttention, _PAPER + ", eq. 6", "O((T Dq + N Dv) k)",
               "summarise the question, attend to the image, then attend back to the question",
               family="module", example=_example("alternating"), spec=_spec("alternating")))
