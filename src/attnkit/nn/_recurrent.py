"""What the linear-recurrent layers share: the base that runs them, the decoding cache, their registry helpers.

Each layer (:mod:`.retnet`, :mod:`.gla`, :mod:`.mamba2`, :mod:`.deltanet`, :mod:`.gated_deltanet`,
:mod:`.kimi_delta`) only says how it turns ``x`` into the recurrence's inputs (``_mix``) and the
recurrence's output into ``y`` (``_finish``); :class:`RecurrentLayer` runs the recurrence of
:mod:`attnkit.functional.recurrences` in the form asked for, keeps the cache, and makes padded
positions inert: they neither write to nor decay the state, and the short convolution reads
zeros there, so a left-padded sequence gives at its real positions what it gives unpadded. The pieces a
layer's ``_mix`` and ``_finish`` call (the short convolution, the gated RMS norm, the decays) are in
:mod:`._recurrent_parts`, below the layers, so a forward enters no file twice.
"""

from __future__ import annotations

import torch

from ..errors import ArgumentError, DTypeError, ShapeError, UnsupportedFeature
from ..functional.recurrences.forms import linear_recurrence
from ..masks.tree import TreeMask, check_parents
from ._inputs import check_keep_mask, check_sequence
from ._recurrent_parts import ConvolvedInputs, DraftTree, Mixed

__all__ = ["RecurrentCache", "tree_parents", "RecurrentLayer", "DeltaRuleLayer", "example",
           "transformers_layer", "copy_weights"]


class RecurrentCache:
    """The decoding state of one linear-recurrent layer: ``O(1)`` in the length, unlike a KV cache.

    Attributes:
        conv: the short convolution's last ``kernel - 1`` inputs ``(B, channels, kernel - 1)``, or None.
        state: the recurrence's state ``(B, H, Dk, Dv)`` (float32, float64 for float64 layers), or None.
        length: tokens seen so far (positions of rotary layers continue from it).

    A fresh cache is empty (None: zeros); the layer fills it on ``forward(x, cache=cache)`` and
    ``forward_step(x, cache)``. ``forward(x, cache=cache, parents=...)`` verifies a draft tree without
    advancing the cache: it keeps every node's state and convolution inputs (``draft``) until
    :meth:`commit` keeps an accepted path.
    """

    def __init__(self):
        self.conv: torch.Tensor | None = None
        self.state: torch.Tensor | None = None
        self.length = 0
        self.draft: tuple | None = None  # (TreeMask, node states (B, H, T, Dk, Dv), node conv tails or None)

    def __len__(self) -> int:
        return self.length

    def reset(self) -> None:
        self.conv, self.state, self.length, self.draft = None, None, 0, None

    def commit(self, nodes) -> None:
        """Keep the accepted root-to-node path ``nodes`` of the draft tree last verified (one list for every batch
        row, or one per row, all as long): the cache then equals one that decoded the path alone. An empty path
        keeps the cache as it was before the tree."""
        who = "RecurrentCache.commit"
        if self.draft is None:
            raise ArgumentError(f"{who}: no draft tree to commit; verify one first with forward(x, cache=cache, "
                                "parents=parents)")
        tree, states, tails = self.draft
        batch = states.shape[0]
        rows = [list(nodes)] * batch if not nodes or not isinstance(nodes[0], (list, tuple)) else list(nodes)
        if len(rows) != batch or len({len(r) for r in rows}) > 1:
            raise ShapeError(f"{who}: nodes must be one path, or one per batch row ({batch}) all as long; got "
                             f"{[len(r) for r in rows]} paths' lengths")
        paths = [tree.check_path(who, r, b if tree.batch_size else 0) for b, r in enumerate(rows)]
        if paths[0]:
            last, every = torch.tensor([p[-1] for p in paths]), torch.arange(batch)
            self.state = states[every, :, last]
            self.conv = None if tails is None else tails[every, :, last]
            self.length += len(paths[0])
        self.draft = None


def tree_parents(who: str, parents, batch: int, nodes: int) -> TreeMask:
    """``parents`` (a :func:`attnkit.masks.tree` or its parents ``(T,)`` / ``(B, T)``) as a checked TreeMask of
    ``nodes`` nodes for ``batch`` rows."""
    tree = parents if isinstance(parents, TreeMask) else TreeMask(check_parents(who, parents))
    if tree.nodes != nodes or tree.batch_size not in (None, 1, batch):
        raise ShapeError(f"{who}: parents must have shape ({nodes},) or ({batch}, {nodes}) (one per draft token); "
                         f"got {tuple(tree.parents.shape)}")
    return tree


def example(cls, *args, **kwargs):
    """A registry example: ``cls(32, *args, **kwargs)`` on a ``(2, 16, 32)`` input."""
    def build():
        g = torch.Generator().manual_seed(0)
        return cls(32, *args, **kwargs), (torch.randn(2, 16, 32, generator=g),)
    return build


def transformers_layer(who: str, layer, expected: str):
    """``layer`` if it is transformers' ``expected`` class with a SiLU short convolution, else a named error."""
    if type(layer).__name__ != expected:
        raise DTypeError(f"{who}.from_transformers takes a {expected}; got {type(layer).__name__}")
    if layer.activation not in ("silu", "swish"):
        raise UnsupportedFeature(f"{who}.from_transformers: the convolution's activation must be silu; got "
                                 f"{layer.activation!r}")
    return layer


@torch.no_grad()
def copy_weights(pairs) -> None:
    """``mine.copy_(theirs)`` for each pair of parameters (shapes must agree)."""
    for mine, theirs in pairs:
        mine.copy_(theirs.reshape(mine.shape))


class RecurrentLayer(ConvolvedInputs):
    """Base of the linear-recurrent layers: ``forward`` (any form), ``forward_step`` (decoding), ``new_cache``.

    A subclass sets ``dim``, ``chunk_size``, ``core_sizes``, ``scale`` (None: ``Dk^-1/2``), ``normalize_qk``,
    ``delta_rule``, ``learned_decay`` and ``steps_per_token`` (for its cost spec, :mod:`._recurrent_spec`), an
    optional ``conv1d`` (:class:`._recurrent_parts.ShortConvolution`, read through
    :class:`~._recurrent_parts.ConvolvedInputs`) and defines ``_mix(x, keep, context, offset) -> (Mixed, conv
    tail)`` and ``_finish(out, mixed, x) -> y``.
    """

    scale: float | None = None
    normalize_qk: bool = False
    delta_rule: bool = False
    learned_decay: bool = True  # the log decays come from parameters or the input (they take gradients)
    per_channel_decay: bool = False  # a decay per key channel (GLA, KDA, RWKV-7): the blocks' products split
    steps_per_token: int = 1  # recurrence steps per token (DeltaProduct: n_h), for the cost spec
    # why a layer that runs a recurrence of its own (overrides ``recurrence``) runs no draft tree nor pieces
    own_recurrence: str = ("its tokens read their predecessor's sums (the recurrence's output shifted along the "
                           "sequence)")
    core_sizes: tuple[int, int, int]  # the recurrence's (H, Dk, Dv), for the cost spec

    def new_cache(self) -> RecurrentCache:
        """An empty :class:`RecurrentCache` for :meth:`forward` and :meth:`forward_step`."""
        return RecurrentCache()

    def forward(self, x: torch.Tensor, *, key_keep_mask: torch.Tensor | None = None,
                cache: RecurrentCache | None = None, form: str = "chunk", parents=None) -> torch.Tensor:
        """``(B, n, dim) -> (B, n, dim)``, causal; ``cache`` continues an earlier call and is updated.

        ``parents`` (:func:`attnkit.masks.tree` or its parents): the ``n`` tokens are a speculative draft tree
        after ``cache``, verified in one call (:mod:`attnkit.functional.recurrences.tree`): each node's output is
        that of its root-to-node path decoded alone; ``cache`` is not advanced but keeps the nodes' states
        for :meth:`RecurrentCache.commit`."""
        check_sequence(type(self).__name__, "x", x, self.dim, like=self)
        keep = check_keep_mask(type(self).__name__, "key_keep_mask", key_keep_mask, x.shape[0], x.shape[1])
        if cache is not None and not isinstance(cache, RecurrentCache):
            raise DTypeError(f"{type(self).__name__}: cache must be a RecurrentCache (new_cache()); got "
                             f"{type(cache).__name__}")
        if parents is not None:
            return self._verify(x, keep, cache, parents)
        if keep is not None:  # by select, so NaN or inf there reaches nothing
            x = x.masked_fill(~keep[..., None], 0.0)
        mixed, tail = self._mix(x, keep, None if cache is None else cache.conv, 0 if cache is None else cache.length)
        out, state = self.recurrence(mixed, keep, form, None if cache is None else cache.state)
        if cache is not None:
            cache.conv, cache.state, cache.length = tail, state, cache.length + x.shape[1]
        return self._finish(out, mixed, x)

    def check_one_step_a_token(self, what: str) -> None:
        """Refuse ``what`` (a draft tree, pieces across ranks: each runs tokens apart from their order) unless the
        recurrence takes one step a token and its output is read as it comes: not DeltaProduct's several steps
        a token, not RWKV-4's sums read one token late."""
        if self.steps_per_token != 1:
            raise UnsupportedFeature(f"{what} does not take {type(self).__name__}'s {self.steps_per_token} recurrence "
                                     "steps per token")
        if type(self).recurrence is not RecurrentLayer.recurrence:
            raise UnsupportedFeature(f"{what} does not take {type(self).__name__}: {self.own_recurrence}")

    def _verify(self, x, keep, cache, parents):
        """:meth:`forward` over the nodes of a draft tree (see there)."""
        who = type(self).__name__
        if keep is not None:
            raise UnsupportedFeature(f"{who}: a draft tree (parents) takes no key_keep_mask: its nodes are all real")
        if getattr(self, "rotary", None) is not None:
            raise UnsupportedFeature(f"{who}: a draft tree (parents) through rotary positions is not supported")
        self.check_one_step_a_token(f"{who}: a draft tree (parents)")
        tree = tree_parents(who, parents, x.shape[0], x.shape[1])
        rows = tree.parents.reshape(-1, tree.nodes).expand(x.shape[0], -1)
        context = DraftTree(None if cache is None else cache.conv, rows)
        mixed, tails = self._mix(x, None, context, 0 if cache is None else cache.length)
        out, states = linear_recurrence(who, mixed.q, mixed.k, mixed.v, mixed.g, mixed.beta, scale=self.scale,
                                        normalize_qk=self.normalize_qk, form="recurrent", chunk_size=self.chunk_size,
                                        initial_state=None if cache is None else cache.state, cu_seqlens=None,
                                        parents=rows)
        if cache is not None:
            cache.draft = (tree, states, tails)
        return self._finish(out, mixed, x)

    def forward_step(self, x: torch.Tensor, cache: RecurrentCache) -> torch.Tensor:
        """One token ``(B, dim) -> (B, dim)`` in the recurrent form, continuing ``cache`` (updated)."""
        if isinstance(x, torch.Tensor) and x.dim() != 2:
            raise ShapeError(f"{type(self).__name__}.forward_step: x must have shape (batch, dim={self.dim}); got "
                             f"{tuple(x.shape)}")
        return self(x[:, None], cache=cache, form="recurrent")[:, 0]

    def recurrence(self, mixed: Mixed, keep, form: str, initial_state):
        """The recurrence of ``mixed`` (:meth:`inert` at padded positions), by :meth:`family`."""
        mixed = self.inert(mixed, keep)
        return self.family(mixed, scale=self.scale, form=form, chunk_size=self.chunk_size, initial_state=initial_state)

    def family(self, mixed: Mixed, **options):
        """The layer's family function of :mod:`attnkit.functional.recurrences` on ``mixed`` (``options``: ``scale``,
        ``form``, ``chunk_size``, ``initial_state``) -> ``(out, final state)``. Each layer calls its family's public
        function (:class:`~.gated_deltanet.GatedDeltaNet`: ``gated_delta_rule``; RetNet and Lightning ``retention``
        with log decays per token, Mamba-2 ``ssd``); the base runs the recurrence they all share, for a layer whose
        family has no function of its own (RWKV-4, which reads its sums one token late, calls it itself)."""
        return linear_recurrence(type(self).__name__, mixed.q, mixed.k, mixed.v, mixed.g, mixed.beta,
                                 normalize_qk=self.normalize_qk, cu_seqlens=None, **options)

    @staticmethod
    def inert(mixed: Mixed, keep) -> Mixed:
        """``mixed`` with zero keys and log decays where ``keep`` is False: those tokens neither write nor decay (a
        zero key writes nothing, delta rule or not). A layer with a recurrence of its own masks its inputs itself
        (so that no call returns into this file)."""
        if keep is None:
            return mixed
        pad = ~keep[:, None, :, None]
        return mixed._replace(k=mixed.k.masked_fill(pad, 0.0), g=mixed.g.masked_fill(pad, 0.0))


class DeltaRuleLayer(RecurrentLayer):
    """Base of the delta-rule layers (:mod:`.deltanet`, :mod:`.gated_deltanet`, :mod:`.kimi_delta`): their q and k
    are L2-normalised, so that with ``0 <= beta <= 1`` every transition ``I - beta k k^T`` is a contraction.

    ``allow_neg_eigval`` (a constructor option of each) doubles the range of ``beta`` to ``[0, 2]``:
    the transition's eigenvalue along ``k``, ``1 - beta``, then reaches ``[-1, 1]``, so a token can
    reflect the state (``beta = 2``: ``I - 2 k k^T``, a Householder reflection) and the layer can
    track state such as parity (Grazzi et al. 2025, "Unlocking State-Tracking in Linear RNNs
    Through Negative Eigenvalues", ICLR 2025, arXiv:2411.12537). The transition stays
    non-expansive (its eigenvalues lie in ``[-1, 1]``) (``beta``: :func:`._recurrent_parts.write_strength`).
    """

    normalize_qk = True
    delta_rule = True
    allow_neg_eigval: bool = False
