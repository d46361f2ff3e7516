"""Cost specs that are no registry entry: "dense" (attention() with no mask), "sdpa" (torch's own
``scaled_dot_product_attention``) and mask expressions such as ``"sliding_window(128, 128)"``.

Sizes: ``batch, heads, kv_heads (default heads), q_len, kv_len (default q_len), head_dim,
value_dim (default head_dim), dtype, backend``. FLOPs follow the kernel the dispatcher picks
(:mod:`attnkit.costing.attend`).
"""

from __future__ import annotations

import functools

import torch.nn.functional as F

from .. import masks
from .attend import ATTENTION_SIZES, attention_inputs, attention_spec, derive_lengths, kv_cache
from .spec import Spec

__all__ = ["SPECS", "mask_spec"]


def mask_spec(text: str) -> Spec:
    """A spec for ``attention(q, k, v, mask=masks.parse(text), normalize=...)`` ("sliding_window(128,128)")."""
    mask = masks.parse(text)
    return attention_spec(lambda s: {"mask": mask, "normalize": s["normalize"]}, name=text, normalize="softmax")


def _sdpa_count(t, s, module=None):
    flash = s["head_dim"] == s["value_dim"]
    t.sdpa("attention (SDPA)", s["batch"], s["heads"], s["q_len"], s["kv_len"], s["head_dim"], s["value_dim"],
           flash=flash)
    width = s["head_dim"] + s["value_dim"]
    t.io(s["batch"] * (s["heads"] * s["q_len"] + s["kv_heads"] * s["kv_len"]) * width)
    kv_cache(t, s["kv_heads"], s["head_dim"], s["value_dim"])


def _sdpa_inputs(s, module=None):
    return (functools.partial(F.scaled_dot_product_attention, enable_gqa=s["heads"] != s["kv_heads"]),
            attention_inputs(s))


SPECS = [
    attention_spec(lambda s: {}, name="dense"),
    Spec({k: v for k, v in ATTENTION_SIZES.items() if k != "backend"}, _sdpa_count, _sdpa_inputs,
         "torch SDPA: 2 B H Lq Lk (D + Dv)", length=("q_len", "kv_len"), derive=derive_lengths, name="sdpa"),
]
