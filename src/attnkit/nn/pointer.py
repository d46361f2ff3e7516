"""Pointer attention: the attention weights are the output distribution over input positions."""

from __future__ import annotations

import torch
from torch import nn

from .. import recording
from ..costing.spec import Spec
from ..costing.tally import dtype_of, randn
from ..functional.normalize import softmax
from ..functional.scores import additive
from ..registry.entry import Entry, register
from ._inputs import check_key_mask, check_sequence, check_shape

__all__ = ["PointerAttention"]

_WHO = "PointerAttention"


class PointerAttention(nn.Module):
    """Pointer network attention: log-probabilities of pointing at each input position.

    Vinyals, Fortunato & Jaitly 2015, "Pointer Networks", NeurIPS, arXiv:1506.03134, eq. 3::

        u^i_j = v^T tanh(W_1 e_j + W_2 d_i),   p(C_i | C_1, ..., C_{i-1}, P) = softmax(u^i)

    Notation: ``e_j`` = ``encoder[:, j]``, ``d_i`` = ``decoder[:, i]``, ``W_1`` =
    ``encoder_proj.weight``, ``W_2`` = ``decoder_proj.weight``, ``v`` = ``v``; the
    result is ``log p``, the log of the softmax (computed stably, not as ``log(softmax)``).

    Differences from the paper: log-probabilities instead of probabilities; a
    ``mask`` of positions that may be chosen (True), e.g. to forbid positions already
    pointed at (a common constraint for permutation outputs, not in eq. 3): masked
    positions get log-probability ``-inf`` (probability 0); a row with no allowed
    position gives all ``-inf`` (probabilities 0, never NaN; gradients 0). The
    ``W_1 e_j + W_2 d_i`` hidden tensor is built a band of positions at a time.

    Shapes:
        decoder ``(B, Lq, decoder_dim)`` or ``(B, decoder_dim)``, encoder ``(B, n, encoder_dim)``,
        mask ``(B, n)`` or ``(B, Lq, n)`` -> log-probabilities ``(B, Lq, n)`` or ``(B, n)``.

    Complexity: ``O(B Lq n hidden_dim)`` time; the hidden tensor is bounded in memory.

    Args:
        encoder_dim: features of an encoder state ``e_j``.
        decoder_dim: features of a decoder state ``d_i``; default ``encoder_dim``.
        hidden_dim: size of ``v``; default ``encoder_dim``.

    Example:
        >>> import torch
        >>> from attnkit.nn.pointer import PointerAttention
        >>> _ = torch.manual_seed(0)
        >>> ptr = PointerAttention(6, 4, 5)
        >>> chosen = torch.tensor([[True, False, False, False, False, False, False]] * 2)
        >>> logp = ptr(torch.randn(2, 4), torch.randn(2, 7, 6), mask=~chosen)
        >>> logp.shape, logp[0, 0].item(), round(logp.exp().sum(-1)[0].item(), 6)
        (torch.Size([2, 7]), -inf, 1.0)
    """

    def __init__(self, encoder_dim: int, decoder_dim: int | None = None, hidden_dim: int | None = None):
        super().__init__()
        decoder_dim = encoder_dim if decoder_dim is None else decoder_dim
        hidden_dim = encoder_dim if hidden_dim is None else hidden_dim
        self.encoder_dim, self.decoder_dim = encoder_dim, decoder_dim
        self.encoder_proj = nn.Linear(encoder_dim, hidden_dim, bias=False)
        self.decoder_proj = nn.Linear(decoder_dim, hidden_dim, bias=False)
        self.v = nn.Parameter(torch.empty(hidden_dim).uniform_(-hidden_dim ** -0.5, hidden_dim ** -0.5))

    def scores(self, decoder: torch.Tensor, encoder: torch.Tensor) -> torch.Tensor:
        """``u`` of eq. 3, ``(B, Lq, n)``, for 3-D ``decoder`` and ``encoder``."""
        dtype = encoder.dtype
        return additive(decoder, encoder, self.decoder_proj.weight.T.to(dtype), self.encoder_proj.weight.T.to(dtype),
                        self.v.to(dtype))

    def forward(self, decoder: torch.Tensor, encoder: torch.Tensor, *, mask: torch.Tensor | None = None):
        """Log-probabilities of pointing at each encoder position; see the class docstring."""
        check_sequence(_WHO, "encoder", encoder, self.encoder_dim, like=self)
        single = isinstance(decoder, torch.Tensor) and decoder.dim() == 2
        check_shape(_WHO, "decoder", decoder, lambda t: t.dim() in (2, 3) and t.shape[-1] == self.decoder_dim
                    and t.shape[0] == encoder.shape[0],
                    f"have shape (batch, {self.decoder_dim}) or (batch, Lq, {self.decoder_dim}) "
                    f"with batch={encoder.shape[0]}")
        dec = decoder[:, None, :] if single else decoder  # (B, Lq, Dd)
        b, lq, n = dec.shape[0], dec.shape[1], encoder.shape[1]
        allowed = check_key_mask(_WHO, "mask", mask, b, lq, n, true_means="may be chosen")
        u = self.scores(dec.to(encoder.dtype), encoder)  # (B, Lq, n)
        if allowed is not None:
            allowed = allowed.expand(b, lq, n)
        probs, lse = softmax(u, allowed)  # lse (B, Lq): -inf for a row with no allowed position
        if recording.is_recording():  # computed without attnkit.attention: hand them to a recorder
            recording.report(probs[:, 0] if single else probs, self)  # the layout of exp(output)
        logp = u - lse[..., None]
        if allowed is not None:  # select, so the -inf rows never turn into NaN (inf - inf)
            logp = torch.where(allowed, logp, torch.full_like(logp, float("-inf")))
        return logp[:, 0] if single else logp


def _example():
    g = torch.Generator().manual_seed(0)
    return PointerAttention(8, 6, 5), (torch.randn(2, 3, 6, generator=g), torch.randn(2, 7, 8, generator=g))


def _count(t, s, module=None):
    b, lq, n, a = s["batch"], s["q_len"], s["kv_len"], s["hidden_dim"]
    t.mm("W_2 d (decoder)", 1, b * lq, s["decoder_dim"], a)
    t.mm("W_1 e (encoder)", 1, b * n, s["encoder_dim"], a)
    t.ew("u = v^T tanh(W_1 e + W_2 d) (matrix-vector, not counted)", b * lq * n * a, 4)
    t.ew("log-softmax", b * lq * n, 5)
    t.inter(b * lq * a, b * n * a, b * lq * n)


def _inputs(s, module):
    dt = dtype_of(s)
    return module, (randn(s["batch"], s["q_len"], s["decoder_dim"], dtype=dt),
                    randn(s["batch"], s["kv_len"], s["encoder_dim"], seed=1, dtype=dt))


register(Entry("pointer", PointerAttention, "Vinyals et al. 2015, arXiv:1506.03134, eq. 3", "O(Lq n A)",
               "attention weights as the output distribution over input positions (log-probabilities)",
               family="module", example=_example,
               spec=Spec({"batch": 2, "q_len": 3, "kv_len": 7, "encoder_dim": 8, "decoder_dim": 6, "hidden_dim": 5,
                          "dtype": "float32"}, _count, _inputs,
                         "W_1 e, W_2 d: 2 B (n De + Lq Dd) A; v^T tanh(.): 2 B Lq n A (other)",
                         length=("q_len", "kv_len"), module_type=PointerAttention,
                         make=lambda s: PointerAttention(s["encoder_dim"], s["decoder_dim"],
                                                         s["hidden_dim"]).to(dtype_of(s)),
                         config=lambda m: {"encoder_dim": m.encoder_dim, "decoder_dim": m.decoder_dim,
                                           "hidden_dim": m.v.shape[0]})))
