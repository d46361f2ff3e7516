"""Paged attention without autograd, causal or unmasked: each sequence's keys cut where its queries' view changes.

With bottom-right causality the ``c`` queries ``[r0, r1)`` of sequence ``b`` (``n_b`` keys,
``Lq`` queries, query ``i`` sees keys ``j <= n_b - Lq + i``) all see its *shared* keys
``[0, m_b)``, ``m_b = n_b - Lq + r0``, and see its last ``c`` keys ``[m_b, m_b + c)``
causally: query ``r0 + t`` the first ``t + 1`` of them, top-left causality on a ``c x c``
block. With one query (a decoding step) or no mask every key is shared (``m_b = n_b - Lq +
r1``). So, on torch's fused CPU kernel with the heads of a key/value group as rows of one
product (:mod:`.page_chunks`):

- the shared keys are cut into chunks of ``step`` positions (:data:`.selected.SPLIT_KEYS`);
  the sequences that share all of a chunk run in one call with no mask (their pages copied
  with one ``index_select`` per pool), the sequences whose shared keys end inside it in one
  call with a key mask (the copy zeroed past each end), and the others skip it, so ragged
  lengths cost the keys each sequence holds;
- the last ``c`` keys of every sequence run in one call with ``is_causal``;
- the partials are merged by log-sum-exp in one step.

Where every key is shared (a decoding step, or no mask) and the chunks would take as many
calls as there are sequences, each sequence runs alone in one call instead, on a copy of its
pages (at most :data:`SEQUENCE_BYTES`; its first ``n_b`` positions, so no mask): no split and
no merge; sequences of one length on consecutive pages whose first pages are equally spaced in
the pool (as :class:`attnkit.nn.PagedKVCache` places a batch) run together in one call, on a
view of the pool with that spacing as its batch stride (:meth:`_Keys.together`). Each small
operator costs microseconds, more right after the kernel has streamed a chunk through the
caches, so the number of operators per call is what these routes save.
:func:`segments` runs on plain tensors, for the path (:func:`run`) and for the paged lane
(:func:`.paged.lane`), which gives it the same split, so the two give the same bits.

Every row sees a key (the route is taken only when every sequence holds ``Lq`` keys), and
the kernel's answers are checked as the fast lane checks them (:func:`.lane.trusted`), one
reduction per call; where one fails, or a case falls outside the above, :func:`run` answers
None and the chunked route runs (:func:`.page_chunks.fused_pages`). The copies are the same
bytes in the same layout for a pool of pages and for a contiguous cache with ``seqused_k``,
so the two give the same bits.
"""

from __future__ import annotations

import itertools
import math

import torch

from ..functional.validate import Problem
from ..masks.selected import Pages
from . import lane, rules
from .page_chunks import merge_stacked, page_table, workspace

__all__ = ["applies", "run", "segments"]

_NEG_INF = float("-inf")
# A sequence's keys and values copied for one call of the kernel, at most (bytes): a copy this size is still read
# back from the caches (a copy of every sequence's 4096 keys at once, 16 MB, made a decoding step 1.6x slower).
# Sequences whose pages are consecutive are read in place, at any length.
SEQUENCE_BYTES = 4 << 20
# torch's kernel sums in another order when the keys start off this boundary (bytes): a view of the pool is read in
# place only where it starts on one, as the copies (fresh buffers) do, so either gives the same bits.
ALIGNMENT = 16
# A page table of at most this many entries is read as Python ints (runs()); a larger one by tensor operators.
LISTED_PAGES = 4096


def _pages(p: Problem) -> Pages:
    """The call's page table, lengths and mask (a paged call's mask holds them)."""
    selection = getattr(p.mask, "selection", None)
    assert isinstance(selection, Pages)
    return selection


def applies(p: Problem) -> bool:
    """Full-precision keys of the dtype the queries are computed in (copied as they are: float32 on CPU, not a
    half-precision pool torch's kernel would read in float32), and no mask or bottom-right causality."""
    within = _pages(p).within
    dtype = p.compute_dtype
    return p.quant is None and p.q.dtype == p.k.dtype == p.v.dtype == dtype and (
        within is None or (within.kind == "causal" and getattr(within, "align", None) == "bottom_right"))


class _Keys:
    """Copies of positions of some sequences, token-major ``(n, c, H_kv, E)``, in this thread's buffers."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor, table: torch.Tensor | None, ps: int, q: torch.Tensor,
                 step: int, extent: int, table_rows: list[list[int]] | None = None):
        self.k, self.v, self.table, self.ps, self.step, self.extent = k, v, table, ps, step, extent
        self.table_rows = table_rows  # the table as Python ints, where the caller has read it
        self.pooled, self.space = table is not None, workspace(q)
        self.whole: list[torch.Tensor] | None = None  # every sequence's pages of each whole chunk, made when asked
        self._runs: tuple[list[int], list[tuple[int, bool]]] | None = None  # runs() of the lengths last asked
        self.hkv, self.e = (k.shape[-2], k.shape[-1]) if table is not None else (k.shape[1], k.shape[-1])

    @property
    def rows(self) -> list[torch.Tensor]:
        """The pools' pages, one row each ``(P, ps H_kv E)`` (what a page copy selects from)."""
        return [t.reshape(-1, self.ps * self.hkv * self.e) for t in (self.k, self.v)]

    @property
    def pools(self) -> list[torch.Tensor]:
        """The pools' positions ``(P ps, H_kv, E)``."""
        return [t.reshape(-1, self.hkv, self.e) for t in (self.k, self.v)]

    def whole_chunk(self, start: int) -> list[torch.Tensor] | None:
        """Every sequence's whole chunk ``[start, start + step)`` of pages tiling it, head-major ``(B, H_kv, step,
        E)`` views of token-major copies: two copies and nothing else (each small operator costs microseconds,
        more right after the kernel has streamed a chunk through the caches; the page lists and views are made
        by the first chunk); None when the pages do not tile the chunks."""
        if self.table is None or self.step % self.ps:
            return None
        if self.whole is None:
            per, chunks, batch = self.step // self.ps, self.extent // self.step, self.table.shape[0]
            self.whole = list(self.table[:, :chunks * per].reshape(batch, chunks, per).transpose(0, 1)
                              .reshape(chunks, batch * per).unbind(0)) if chunks else []
            self.bufs = [self.space.take(name + "-pages", batch * per, r.shape[1]) for name, r in
                         zip("kv", self.rows, strict=True)]
            self.views = [buf.view(batch, self.step, self.hkv, self.e).transpose(1, 2)
                          for buf in self.bufs]  # (B, H_kv, step, E), as the kernel reads
            self.page_rows = self.rows
        if start // self.step >= len(self.whole):
            return None
        for rows, buf in zip(self.page_rows, self.bufs, strict=True):
            torch.index_select(rows, 0, self.whole[start // self.step], out=buf)
        return self.views

    def runs(self, lengths: list[int]) -> list[tuple[int, bool]]:
        """Per sequence of a pool: its first page, and whether the pages holding its first ``lengths[b]``
        positions follow it one by one (empty for a contiguous cache). Read once per call: a table of at most
        :data:`LISTED_PAGES` entries as Python ints (one copy, no operator: right after the kernel each operator
        costs microseconds), a larger one by one reduction over it."""
        if self.table is None:
            return []
        if self._runs is None or self._runs[0] != lengths:
            used = [-(-n // self.ps) for n in lengths]
            rows = self.table_rows
            if rows is None and self.table.numel() <= LISTED_PAGES:
                rows = self.table.tolist()
            if rows is not None:
                runs = [(row[0], row[:u] == list(range(row[0], row[0] + u))) for row, u in zip(rows, used, strict=True)]
            else:
                steps = (self.table.diff(dim=1) == 1).cumprod(1).sum(1)  # pages following the first one by one
                firsts = torch.stack((self.table[:, 0], steps), 1).tolist()
                runs = [(first, run >= u - 1) for (first, run), u in zip(firsts, used, strict=True)]
            self._runs = (list(lengths), runs)
        return self._runs[1]

    def in_place(self, lengths: list[int]) -> bool:
        """Whether the first ``lengths[b]`` positions of every sequence ``b`` lie on consecutive pages (always,
        in a contiguous cache)."""
        return self.table is None or all(consecutive for _, consecutive in self.runs(lengths))

    def _readable_in_place(self, views: list[torch.Tensor]) -> bool:
        """Whether torch's kernel reads these views of the caller's pools as it reads the copies: pools of the
        contiguous layout (a pool read every other element reshapes to views of stride 2, summed in another
        order), views starting on :data:`ALIGNMENT`."""
        return (self.k.is_contiguous() and self.v.is_contiguous()
                and all(t.data_ptr() % ALIGNMENT == 0 for t in views))

    def together(self, lengths: list[int]) -> tuple[list[int] | None, list[torch.Tensor]] | None:
        """Every sequence's keys and values as one view ``(B, H_kv, n, E)`` of the pool, where one exists: the
        sequences hold the same number ``n`` of keys on consecutive pages whose first pages, taken in some order,
        are equally spaced (a batch stride), the pool is contiguous and each view starts on :data:`ALIGNMENT`, as
        :meth:`sequences` reads them in place one by one. ``(order, [keys, values])``: row ``i`` of the view is
        sequence ``order[i]`` (None: the batch's own order). None otherwise (ragged lengths, scattered pages, a
        contiguous cache)."""
        n = lengths[0]
        if self.table is None or any(m != n for m in lengths) or not (
                self.k.is_contiguous() and self.v.is_contiguous()):
            return None
        runs = self.runs(lengths)
        if not all(consecutive for _, consecutive in runs):
            return None
        ranked = sorted(range(len(runs)), key=lambda b: runs[b][0])
        firsts = [runs[b][0] for b in ranked]
        order = None if ranked == list(range(len(runs))) else ranked
        gap = firsts[1] - firsts[0] if len(firsts) > 1 else 0
        token = self.hkv * self.e  # elements per position
        if any(b - a != gap for a, b in itertools.pairwise(firsts)) or (
                gap * self.ps * token * self.k.element_size()) % ALIGNMENT:
            return None
        views = []
        for pool in (self.k, self.v):
            offset = pool.storage_offset() + firsts[0] * self.ps * token
            view = pool.as_strided((len(lengths), self.hkv, n, self.e), (gap * self.ps * token, self.e, token, 1),
                                   offset)
            if view.data_ptr() % ALIGNMENT:
                return None
            views.append(view)
        return order, views

    def sequences(self, lengths: list[int]):
        """The first ``lengths[b]`` positions of each sequence ``b``, one after the other: keys and values ``(1,
        H_kv, n_b, E)``, head-major views of token-major positions. A sequence whose pages are consecutive in the
        contiguous pool is read in place (a view of it, where it starts on :data:`ALIGNMENT`); the others are copied
        into the same buffers (pages copied whole, one ``index_select`` per pool), in the same layout, so either
        gives the same bits. A contiguous cache is copied into that layout up to :data:`SEQUENCE_BYTES` a
        sequence, read in place beyond where aligned (torch's kernel gives the same bits for either layout of the
        same keys; tests/kernels/test_paged.py checks it). A
        view of the buffers is valid until the next sequence's copy."""
        hkv, e = self.hkv, self.e
        runs = self.runs(lengths)
        if runs:
            pools = [t.reshape(1, -1, hkv, e).transpose(1, 2) for t in (self.k, self.v)]  # (1, H_kv, P ps, E)
        views: dict[int, list[torch.Tensor]] = {}
        copied = self.table is not None or max(lengths) * hkv * 2 * e * self.k.element_size() <= SEQUENCE_BYTES
        for b, n in enumerate(lengths):
            used = -(-n // self.ps)
            if runs and runs[b][1]:  # in place, where the view starts as a copy would
                start = runs[b][0] * self.ps
                views_b = [pool[:, :, start:start + n] for pool in pools]
                if self._readable_in_place(views_b):
                    yield views_b
                    continue
            if not copied:  # a contiguous cache too long to copy: read in place, head-major (where aligned)
                views_b = [t[b:b + 1, :, :n] for t in (self.k, self.v)]
                if self._readable_in_place(views_b):
                    yield views_b
                    continue
            if not views:  # the buffers, for the longest sequence copied
                longest = max(lengths)
                width = -(-longest // self.ps)
                page_rows = self.rows if runs else []
                tokens = ([self.space.take(name + "-pages", width, r.shape[1]).view(1, width * self.ps, hkv, e)
                           for name, r in zip("kv", page_rows, strict=True)] if runs else
                          [self.space.take(name, 1, longest, hkv, e) for name in "kv"])
            if n not in views:
                views[n] = [t[:, :n].transpose(1, 2) for t in tokens]
            if runs:
                assert self.table is not None
                pages = self.table[b, :used]
                for rows, t in zip(page_rows, tokens, strict=True):
                    torch.index_select(rows, 0, pages, out=t.view(-1, rows.shape[1])[:used])
            else:
                for t, into in zip((self.k, self.v), tokens, strict=True):
                    into[0, :n].copy_(t[b, :, :n].transpose(0, 1))
            yield views[n]

    def chunk(self, seqs: torch.Tensor | None, start: int, stop: int) -> list[torch.Tensor]:
        """Positions ``[start, stop)`` of the sequences ``seqs`` (None: all): keys and values."""
        c, out = stop - start, []
        for i, (name, t) in enumerate((("k", self.k), ("v", self.v))):
            if self.pooled:
                assert self.table is not None
                rows, ps = self.rows[i], self.ps
                first, last = start // ps, -(-stop // ps)
                table = self.table if seqs is None else self.table.index_select(0, seqs)
                pages, n = table[:, first:last].flatten(), table.shape[0]
                buf = self.space.take(name + "-pages", len(pages), rows.shape[1])
                got = torch.index_select(rows, 0, pages, out=buf).view(n, -1, self.hkv, self.e)
                skip = start - first * ps
                if skip or got.shape[1] != c:  # part of a page: copied out, in the layout of a whole chunk
                    got = got[:, skip:skip + c]
            else:
                got = t[:, :, start:stop] if seqs is None else t[:, :, start:stop].index_select(0, seqs)
                got = got.transpose(1, 2)
            if not got.is_contiguous():
                got = self.space.take(name, *got.shape).copy_(got)
            out.append(got)
        return out

    def last(self, ends: torch.Tensor, c: int) -> list[torch.Tensor]:
        """Positions ``[ends[b] - c, ends[b])`` of every sequence ``b``: keys and values ``(B, c, H_kv, E)``."""
        pos = ends[:, None] - c + torch.arange(c, device=ends.device)  # (B, c)
        out: list[torch.Tensor] = []
        for t in (self.k, self.v):
            if self.pooled:
                assert self.table is not None
                tokens = self.table.gather(1, pos // self.ps) * self.ps + pos % self.ps
                pool = self.pools[len(out)]  # (P ps, H_kv, E)
                out.append(pool.index_select(0, tokens.flatten()).view(*pos.shape, self.hkv, self.e))
            else:
                rows = torch.arange(pos.shape[0], device=pos.device)[:, None]
                out.append(t.transpose(1, 2)[rows, pos])  # (B, c, H_kv, E), a copy
        return out


def run(p: Problem, q: torch.Tensor, r0: int, r1: int, step: int, lengths: list[int]):
    """Queries ``[r0, r1)`` over every sequence's keys, merged: ``(out (B, H_kv, g c, Dv), lse (B, H_kv, g c))``;
    None where this route does not apply (a sequence holds fewer keys than queries) or the kernel's answer
    cannot be trusted."""
    sel = _pages(p)
    k, v = (t[0].transpose(0, 1) for t in (p.k, p.v)) if sel.pooled else (p.k, p.v)  # pools: (P ps, H_kv, E)
    return segments(q, k, v, page_table(p), sel.block_size, sel.within is not None, p.scale, r0, r1, step, lengths)


def segments(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, table: torch.Tensor | None, ps: int, causal: bool,
             scale: float, r0: int, r1: int, step: int, lengths: list[int], want_lse: bool = True,
             table_rows: list[list[int]] | None = None):
    """:func:`run` on plain tensors: ``k``, ``v`` pools ``(P ps, H_kv, E)`` or ``(P, ps, H_kv, E)`` read through
    ``table`` ``(B, n)`` (every entry a page of the pool) of pages of ``ps`` positions, or contiguous caches ``(B,
    H_kv, Lk, E)`` with ``table`` None; ``causal``: bottom-right causality, else no mask; ``lengths``: the keys each
    sequence holds; the merged lse is None unless ``want_lse`` (the output's bits do not depend on it);
    ``table_rows``: ``table`` as Python ints, where the caller has read it."""
    assert rules.FLASH is not None  # the fused path runs only where torch has the kernel
    flash = rules.FLASH
    batch, hq, lq, d = q.shape
    hkv, c = k.shape[-2] if table is not None else k.shape[1], r1 - r0
    if min(lengths) < lq:
        return None
    causal_tail = causal and c > 1
    shared = [n - lq + (r0 if causal_tail else r1) if causal else n for n in lengths]
    extent = max(shared)
    keys, dev = _Keys(k, v, table, ps, q, step, extent, table_rows), q.device
    q_c = (q if c == lq else q[:, :, r0:r1]).reshape(batch, hkv, hq // hkv * c, d)
    if not causal_tail and batch <= -(-extent // step) and (
            extent * hkv * 2 * d * q.element_size() <= SEQUENCE_BYTES or keys.in_place(shared)):
        return _each_sequence(q_c, keys, shared, scale, want_lse)
    every: list[tuple[torch.Tensor, torch.Tensor]] = []  # partials of every sequence
    some: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []  # (sequences, out, lse) of some
    for start in range(0, extent, step):
        stop = min(extent, start + step)  # (a cache shorter than the split: one chunk, wherever its keys lie)
        whole = [b for b, m in enumerate(shared) if m >= stop]
        ends = [b for b, m in enumerate(shared) if start < m < stop]
        if whole:
            seqs = None if len(whole) == batch else torch.tensor(whole, device=dev)
            copied = keys.whole_chunk(start) if seqs is None and stop - start == step else None
            k_g, v_g = copied or [t.transpose(1, 2) for t in keys.chunk(seqs, start, stop)]
            q_w = q_c if seqs is None else q_c.index_select(0, seqs)
            out, lse = flash(q_w, k_g, v_g, 0.0, False, scale=scale)[:2]
            if seqs is None:
                every.append((out, lse))
            else:
                some.append((seqs, out, lse))
        if ends:
            seqs = torch.tensor(ends, device=dev)
            last = max(shared[b] for b in ends)
            k_g, v_g = keys.chunk(seqs, start, last)
            held = torch.arange(start, last, device=dev) < torch.tensor([shared[b] for b in ends], device=dev)[:, None]
            k_g, v_g = (t.masked_fill_(~held[:, :, None, None], 0.0) for t in (k_g, v_g))  # (copies)
            mask = torch.zeros(held.shape, dtype=q.dtype, device=dev).masked_fill_(~held, _NEG_INF)
            out, lse = flash(q_c.index_select(0, seqs), k_g.transpose(1, 2), v_g.transpose(1, 2), 0.0, False,
                             attn_mask=mask[:, None, None, :], scale=scale)[:2]
            some.append((seqs, out, lse))
    if causal_tail:  # the last c keys: query row (group head, t) sees the first t + 1 (a float mask, the rows
        k_g, v_g = keys.last(torch.tensor(shared, device=dev) + c, c)  # folded: is_causal would misalign them)
        t = torch.arange(hq // hkv * c, device=dev) % c
        mask = torch.zeros(t.shape[0], c, dtype=q.dtype, device=dev).masked_fill_(
            torch.arange(c, device=dev) > t[:, None], _NEG_INF)
        every.append(tuple(flash(q_c, k_g.transpose(1, 2), v_g.transpose(1, 2), 0.0, False, attn_mask=mask,
                                 scale=scale)[:2]))
    return _merge_checked(every, some, batch, want_lse)


def _each_sequence(q_c: torch.Tensor, keys: _Keys, shared: list[int], scale: float, want_lse: bool):
    """Every sequence's keys in one call of the kernel, no split and no merge: ``B`` calls where the chunks would
    take as many or more, each on a copy of at most :data:`SEQUENCE_BYTES`, or one call for all where
    :meth:`_Keys.together` gives one view of them. Checked as the fast lane checks its call
    (:func:`.lane.trusted`); None if the kernel's answer cannot be trusted."""
    assert rules.FLASH is not None
    together = keys.together(shared)
    if together is not None:  # one call: the bits of one call per sequence (the kernel computes each row alone)
        order, (k_t, v_t) = together
        rows = None if order is None else torch.tensor(order, device=q_c.device)
        if rows is not None:  # the view's row i is sequence order[i]
            q_c = q_c.index_select(0, rows)
        out, lse = rules.FLASH(q_c, k_t, v_t, 0.0, False, scale=scale)[:2]
    else:
        rows, outs, lses = None, [], []
        for q_b, (k_b, v_b) in zip(q_c.split(1), keys.sequences(shared), strict=True):
            out, lse = rules.FLASH(q_b, k_b, v_b, 0.0, False, scale=scale)[:2]
            outs.append(out)
            lses.append(lse)
        out, lse = torch.cat(outs), torch.cat(lses)
    if not lane.trusted(out, lse):
        return None  # NaN, inf, or a row torch zeroed: the chunked route, with its exact splits
    if rows is not None:  # back to the batch's order: sequence order[i] is row i
        out = torch.empty_like(out).index_copy_(0, rows, out)
        lse = torch.empty_like(lse).index_copy_(0, rows, lse) if want_lse else lse
    return out, lse if want_lse else None


def _merge_checked(every, some, batch: int, want_lse: bool = True):
    """The partials checked (one reduction per group of calls, one sync) and merged in one step; None if one
    fails. ``every``: ``(out, lse)`` of every sequence; ``some``: ``(sequences, out, lse)`` of some, the others
    given out 0 and lse -inf there (weight 0 in the merge). Every row has a finite lse in some partial; the
    merged lse is None unless ``want_lse``."""
    checks = []
    if every:
        outs, lses = torch.stack([o for o, _ in every]), torch.stack([lse for _, lse in every])
        checks.append(torch.addcdiv(outs.sum(-1), lses, lses).sum())
    full_out, full_lse = [], []
    for seqs, out, lse in some:
        checks.append(torch.addcdiv(out.sum(-1), lse, lse).sum())
        full_out.append(out.new_zeros(batch, *out.shape[1:]).index_copy_(0, seqs, out))
        full_lse.append(lse.new_full((batch, *lse.shape[1:]), _NEG_INF).index_copy_(0, seqs, lse))
    checked = checks[0].item() if len(checks) == 1 else sum(torch.stack(checks).tolist())
    if not math.isfinite(checked):
        return None  # NaN, inf, or a row torch zeroed: the chunked route, with its exact splits
    if full_out:
        outs = torch.cat([outs, torch.stack(full_out)]) if every else torch.stack(full_out)
        lses = torch.cat([lses, torch.stack(full_lse)]) if every else torch.stack(full_lse)
    return merge_stacked(outs, lses, empty_rows=False, want_lse=want_lse)
