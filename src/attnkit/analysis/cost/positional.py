"""Cost specs of the positional encodings: sinusoidal, learned, rotary.

Sizes: ``batch``, the lengths, ``dim`` (and ``heads`` for rotary), ``dtype``. They are
elementwise (adds, sin/cos, rotations of feature pairs): no matmul FLOPs, only ``other_flops``.
"""

from __future__ import annotations

from ...nn.positional import LearnedPositionalEmbedding, SinusoidalPositionalEncoding
from ...nn.rotary import RotaryEmbedding
from .core import dtype_of
from .tally import Spec, randn

__all__ = ["SPECS"]


def _positional_count(t, s, module=None):
    t.ew("x + position (elementwise; no matmul)", s["batch"] * s["length"] * s["dim"], 1)
    t.io(2 * s["batch"] * s["length"] * s["dim"])


def _rotary_count(t, s, module=None):
    numel = s["batch"] * s["heads"] * (s["q_len"] + s["kv_len"]) * s["dim"]
    t.ew("rotation of feature pairs (elementwise; no matmul)", numel, 3)
    t.io(2 * numel)


def _rotary_inputs(s, module):
    dt = dtype_of(s)
    return module, (randn(s["batch"], s["heads"], s["q_len"], s["dim"], dtype=dt),
                    randn(s["batch"], s["heads"], s["kv_len"], s["dim"], seed=1, dtype=dt))


SPECS = [
    Spec("sinusoidal-positional-encoding", {"batch": 2, "length": 10, "dim": 16, "dtype": "float32"},
         _positional_count, lambda s, m: (m, (randn(s["batch"], s["length"], s["dim"], dtype=dtype_of(s)),)),
         "elementwise only: B n dim adds (and n dim sin/cos)",
         make=lambda s: SinusoidalPositionalEncoding(s["dim"]), module_type=SinusoidalPositionalEncoding,
         config=lambda m: {"dim": m.dim}),
    Spec("learned-positional-embedding", {"batch": 2, "length": 10, "dim": 16, "max_len": 32, "dtype": "float32"},
         _positional_count, lambda s, m: (m, (randn(s["batch"], s["length"], s["dim"], dtype=dtype_of(s)),)),
         "elementwise only: B n dim adds",
         make=lambda s: LearnedPositionalEmbedding(s["max_len"], s["dim"]).to(dtype_of(s)),
         module_type=LearnedPositionalEmbedding, config=lambda m: {"dim": m.dim, "max_len": m.max_len}),
    Spec("rotary-embedding", {"batch": 2, "heads": 3, "q_len": 10, "kv_len": 12, "dim": 8, "dtype": "float32"},
         _rotary_count, _rotary_inputs, "elementwise only: 6 operations per rotated pair of q and k",
         make=lambda s: RotaryEmbedding(s["dim"]), length=("q_len", "kv_len"), module_type=RotaryEmbedding,
         config=lambda m: {"dim": m.dim}),
]
