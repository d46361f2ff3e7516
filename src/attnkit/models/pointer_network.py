"""Pointer network: an LSTM encoder-decoder whose attention over the inputs is the output (Vinyals et al. 2015)."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from ..errors import ArgumentError, ShapeError, check_int
from ..nn._inputs import check_sequence
from ..nn.pointer import PointerAttention
from ._rnn import check_index_dtype, encode_padded, source_mask

__all__ = ["PointerNetwork", "PointerDecode"]

_WHO = "PointerNetwork"


class PointerDecode(NamedTuple):
    """ids ``(B, T)`` chosen positions; log_probs ``(B, T, n_out)`` of every step."""

    ids: torch.Tensor
    log_probs: torch.Tensor


class PointerNetwork(nn.Module):
    """Pointer network: at each step, point at one input position with the attention distribution.

    Vinyals, Fortunato & Jaitly 2015, "Pointer Networks", NeurIPS, arXiv:1506.03134, eqs. 1-3::

        e_j = LSTM_enc(P_1..P_j),   d_i = LSTM_dec(d_{i-1}, P_{C_{i-1}}),   d_0 = e_n (final state)
        u^i_j = v^T tanh(W_1 e_j + W_2 d_i),   p(C_i | C_1, ..., C_{i-1}, P) = softmax_j(u^i_j)   (eq. 3)

    Notation: ``P_j`` = ``points[:, j]``, ``C_i`` = ``targets[:, i]``; the first decoder
    input ``P_{C_0}`` is the learned ``start``; ``W_1, W_2, v`` belong to ``pointer``
    (:class:`~attnkit.nn.pointer.PointerAttention`).

    End of sequence (``end_token=True``): a learned encoder state ``end_state`` is placed
    at position ``n`` after the inputs (``n`` = the padded width), so the output has
    ``n_out = n + 1`` positions and "index n = end"; choosing it feeds the learned
    ``end_input`` to the decoder. Without it, ``n_out = n`` and the length is fixed by the caller.

    ``exclude_chosen=True`` forbids the positions already chosen in the steps before (not
    the end index), as permutation outputs (sorting, TSP) need; the teacher-forced pass
    applies the same rule to ``targets`` so training and decoding see the same support.
    Forbidden and padded positions get log-probability ``-inf``.

    Differences from the paper: the paper's inputs are fed to the LSTMs as they are, as
    here; the end token is learned rather than a special input symbol; the exclusion is an
    option (the paper constrains beam search for the hull/TSP); padding by ``mask``.

    Shapes:
        points ``(B, n, input_dim)``, targets ``(B, T)`` in ``[0, n_out)`` -> log-probabilities ``(B, T, n_out)``.

    Complexity: ``O(B (n + T) H^2)`` for the LSTMs, ``O(B T n H)`` for pointing.

    Args:
        input_dim: features of an input point.
        hidden_dim: LSTM size ``H``.
        end_token: add the end position ``n`` (see above).
        exclude_chosen: forbid positions chosen before (see above).

    Example:
        >>> import torch
        >>> from attnkit.models.pointer_network import PointerNetwork
        >>> _ = torch.manual_seed(0)
        >>> points = torch.rand(2, 5, 2)
        >>> PointerNetwork(2, 8, end_token=True)(points, torch.tensor([[3, 1, 5], [0, 2, 4]])).shape  # 5 = end
        torch.Size([2, 3, 6])
        >>> ids = PointerNetwork(2, 8).greedy_decode(points).ids  # n steps, each position once
        >>> sorted(ids[0].tolist()), sorted(ids[1].tolist())
        ([0, 1, 2, 3, 4], [0, 1, 2, 3, 4])
    """

    def __init__(self, input_dim: int, hidden_dim: int = 64, *, end_token: bool = False, exclude_chosen: bool = True):
        super().__init__()
        check_int(_WHO, "input_dim", input_dim, 1)
        check_int(_WHO, "hidden_dim", hidden_dim, 1)
        self.input_dim, self.end_token, self.exclude_chosen = input_dim, bool(end_token), bool(exclude_chosen)
        self.encoder = nn.LSTM(input_dim, hidden_dim, batch_first=True)
        self.decoder = nn.LSTM(input_dim, hidden_dim, batch_first=True)
        self.pointer = PointerAttention(hidden_dim, hidden_dim, hidden_dim)
        self.start = nn.Parameter(torch.empty(input_dim).uniform_(-1.0, 1.0))
        if self.end_token:
            self.end_state = nn.Parameter(torch.empty(hidden_dim).uniform_(-1.0, 1.0))
            self.end_input = nn.Parameter(torch.empty(input_dim).uniform_(-1.0, 1.0))

    def _encode(self, points, mask):
        """``(memory (B, n_out, H), inputs (B, n_out, d), keep (B, n_out), decoder start state)``."""
        check_sequence(_WHO, "points", points, self.input_dim, like=self)
        keep, lengths = source_mask(_WHO, points.shape[:2], points.device, None, mask)
        memory, state = encode_padded(self.encoder, points, lengths)  # (B, n, H)
        if self.end_token:
            b = points.shape[0]
            memory = torch.cat([memory, self.end_state.to(memory.dtype).expand(b, 1, -1)], 1)  # (B, n + 1, H)
            points = torch.cat([points, self.end_input.to(points.dtype).expand(b, 1, -1)], 1)
            keep = torch.cat([keep, keep.new_ones(b, 1)], 1)
        return memory, points, keep, state

    def _check_targets(self, targets, b, n_out):
        check_index_dtype(_WHO, "targets", targets, "positions")
        if targets.dim() != 2 or targets.shape[0] != b:
            raise ShapeError(f"{_WHO}: targets must have shape (batch={b}, steps); got {tuple(targets.shape)}")
        if targets.numel() and (int(targets.min()) < 0 or int(targets.max()) >= n_out):
            raise ArgumentError(f"{_WHO}: targets must lie in [0, {n_out}) (n_out = n{' + 1' if self.end_token else ''}"
                                f"); got [{int(targets.min())}, {int(targets.max())}]")

    def _choosable(self, keep, chosen):
        """Positions step ``i`` may choose: real (or end) and, with exclusion, not chosen before."""
        if not self.exclude_chosen:
            return keep.expand_as(chosen)
        if self.end_token:
            chosen = chosen.clone()
            chosen[..., -1] = False  # the end position is never used up
        return keep & ~chosen

    def forward(self, points: torch.Tensor, targets: torch.Tensor, *, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Teacher-forced log-probabilities ``(B, T, n_out)``; ``targets[:, i]`` = ``C_i``; mask (B, n): True = real."""
        memory, inputs, keep, state = self._encode(points, mask)
        b, n_out = keep.shape
        self._check_targets(targets, b, n_out)
        t = targets.shape[1]
        if t == 0:
            return memory.new_zeros(b, 0, n_out)
        fed = inputs.gather(1, targets[:, :-1, None].expand(-1, -1, self.input_dim))  # (B, T - 1, d): P_{C_{i-1}}
        dec_in = torch.cat([self.start.to(points.dtype).expand(b, 1, -1), fed], 1)[:, :t]  # (B, T, d)
        d, _ = self.decoder(dec_in, state)  # (B, T, H)
        onehot = torch.zeros(b, t, n_out, dtype=torch.bool, device=points.device).scatter_(-1, targets[..., None], True)
        before = (onehot.cumsum(1) - onehot.long()) > 0  # (B, T, n_out): chosen at an earlier step
        return self.pointer(d, memory, mask=self._choosable(keep[:, None, :], before))

    @torch.no_grad()
    def greedy_decode(self, points: torch.Tensor, *, mask: torch.Tensor | None = None,
                      max_len: int | None = None) -> PointerDecode:
        """Feed back the most likely position ``max_len`` times (default ``n_out``); after the end, repeat it.

        A step with no choosable position (all used, no end token) has log-probabilities ``-inf`` and id 0.
        """
        memory, inputs, keep, state = self._encode(points, mask)
        b, n_out = keep.shape
        max_len = n_out if max_len is None else check_int(_WHO, "max_len", max_len, 0)
        x = self.start.to(points.dtype).expand(b, 1, -1)  # (B, 1, d)
        chosen = torch.zeros_like(keep)
        done = torch.zeros(b, dtype=torch.bool, device=points.device)
        ids, logps = [], []
        for _ in range(max_len):
            d, state = self.decoder(x, state)  # (B, 1, H)
            logp = self.pointer(d[:, 0], memory, mask=self._choosable(keep, chosen))  # (B, n_out)
            idx = torch.where(done, n_out - 1, logp.argmax(-1)) if self.end_token else logp.argmax(-1)
            ids.append(idx)
            logps.append(logp)
            chosen = chosen.scatter(1, idx[:, None], True)
            done = done | (self.end_token & (idx == n_out - 1))
            x = inputs.gather(1, idx[:, None, None].expand(-1, 1, self.input_dim))
        if not ids:
            return PointerDecode(keep.new_zeros(b, 0, dtype=torch.long), memory.new_zeros(b, 0, n_out))
        return PointerDecode(torch.stack(ids, 1), torch.stack(logps, 1))
