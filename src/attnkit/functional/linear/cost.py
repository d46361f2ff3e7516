"""Matrix-product FLOPs of the three forms of a linear recurrence, as ``torch.utils.flop_counter`` counts them.

Per sample and head, with L tokens, key width Dk, value width Dv, block length c (``C = ceil(L / c)``
blocks: the last one padded) and ``r = 1`` with the delta rule (its ``T`` and ``W S`` products),
else 0::

    parallel    2 L^2 Dk (1 + r) + 2 L^2 Dv + 2 L Dk Dv (2 + r)
    chunk       C (2 c^2 Dk (1 + r) + 2 c^2 Dv + 2 c Dk Dv (2 + r))
    recurrent   2 L Dk Dv (1 + r)

The decays, gates and the delta rule's triangular solve are elementwise or counted by no counter
(a solve costs about ``c^2 (Dk + Dv)`` more per block). One decay per key channel costs as many
counted FLOPs as one per head (the block scores contract the same ``Dk``), but holds ``c x c x Dk``
decays per block instead of ``c x c``.
"""

from __future__ import annotations

from ...errors import check_int
from .checks import check_form

__all__ = ["recurrence_flops"]


def recurrence_flops(form: str, *, batch: int, heads: int, length: int, key_dim: int, value_dim: int,
                     chunk_size: int = 64, delta: bool = False) -> int:
    """Forward matmul FLOPs of :func:`attnkit.functional.linear.forms.linear_recurrence` in ``form`` (see above)."""
    check_form("recurrence_flops", form, chunk_size)
    for name, value in (("batch", batch), ("heads", heads), ("length", length), ("key_dim", key_dim),
                        ("value_dim", value_dim)):
        check_int("recurrence_flops", name, value, 0)
    r, n, dk, dv = int(bool(delta)), length, key_dim, value_dim
    if form == "recurrent":
        per_head = 2 * n * dk * dv * (1 + r)
    else:
        c = n if form == "parallel" else chunk_size
        blocks = 1 if form == "parallel" else -(-n // c)
        per_head = blocks * (2 * c * c * dk * (1 + r) + 2 * c * c * dv + 2 * c * dk * dv * (2 + r)) if n else 0
    return batch * heads * per_head
