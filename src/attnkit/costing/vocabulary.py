"""One vocabulary of problem sizes: ``batch, heads, q_len, kv_len, head_dim``, and the layer they describe.

The command line's ``--batch --heads --q-len --kv-len --head-dim`` and the keywords of
:func:`attnkit.costing.analytic.cost` are these names. A mechanism that names a size otherwise
(``length`` for a self-attention module's one sequence, ``dim`` or ``embed_dim`` for its model
width) receives them translated (:meth:`attnkit.costing.spec.Spec.translate`). No torch here: the
command line reads this module to build its parsers.
"""

from __future__ import annotations

__all__ = ["LAYER", "VOCABULARY", "WIDTHS", "LENGTHS"]

LAYER = {"batch": 1, "heads": 8, "q_len": 4096, "kv_len": None, "head_dim": 64}
"""A realistic layer: one sequence of 4096 tokens, 8 heads of 64 features (``kv_len`` None: ``q_len``)."""

VOCABULARY = tuple(LAYER)
LENGTHS = ("q_len", "kv_len")
WIDTHS = ("dim", "embed_dim")
"""A module's model width, heads x head_dim, where a mechanism has one."""
