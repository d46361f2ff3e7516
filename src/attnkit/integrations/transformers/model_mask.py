"""What the mask function hands a transformers model: attnkit's structured mask, and transformers' 4-D mask on demand.

transformers passes the object its mask function returns to the model's layers as
``attention_mask``. Most layers only hand it on to the attention function, which wants
the structured mask (a band, causal, key padding: the fast paths). Some read it
themselves: sparse-attention indexers take ``attention_mask[:, 0]`` to score the keys
(DeepSeek-V3.2, GLM-MoE-DSA), encoders add it to scores they compute (BigBird-Pegasus),
dynamic masks ask its ``dtype`` (Doge). For them :class:`ModelMask` behaves as the
mask transformers builds for ``"eager"``, the implementation every model supports: a
float tensor ``(B, 1, Lq, Lk)`` (heads ``H`` when a registered mask reads them), 0 where
a key may be attended and the dtype's minimum elsewhere. It is built on first use
(indexing, an attribute or method of a tensor, an operator, a ``torch`` function) and
kept, so the common path never builds a dense ``Lq x Lk`` tensor; ``shape``, ``dtype``
and ``device`` are answered without building it.
"""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_map

from ...masks.base import Mask

__all__ = ["ModelMask"]


class ModelMask:
    """The mask of one block of a sequence: structured for attnkit, a tensor for model code.

    Args:
        mask: the block's attnkit mask, a bool tensor ``(B|1, H|1, Lq, Lk)`` or an additive
            float tensor (None: every key).
        q_offset: the global position of the block's first query.
        kv_offset: the global position of the block's first key.
        length: the length of the whole sequence the positions count in.
        shape: ``(B, Lq, Lk)``, the batch and the block's sizes.
        dtype: the dtype of the dense form (the model's, as transformers' eager mask).
        device: the device of the dense form.
        packing: for one row of packed documents (``position_ids`` restarting), their ids per position and the
            mask inside each (:func:`~.model_masks.packing`); the attention function then runs
            :func:`attnkit.varlen_attn`.
    """

    ndim = 4  # transformers reads a prepared mask's rank (a 4-D mask is used as it is, not as padding)

    def __init__(self, mask: Mask | torch.Tensor | None, q_offset: int, kv_offset: int, length: int, *,
                 shape: tuple[int, int, int], dtype: torch.dtype = torch.float32, device="cpu", packing=None):
        self.mask, self.q_offset, self.kv_offset, self.length = mask, q_offset, kv_offset, length
        self.sizes, self.dtype, self.device = tuple(shape), dtype, torch.device(device)
        self.packing = packing
        self._dense = None

    def with_mask(self, mask: Mask | torch.Tensor | None) -> ModelMask:
        """The same block and positions with another mask (no longer the packed documents' own)."""
        return ModelMask(mask, self.q_offset, self.kv_offset, self.length, shape=self.sizes, dtype=self.dtype,
                         device=self.device)

    @property
    def shape(self) -> torch.Size:
        batch, q_len, kv_len = self.sizes
        return torch.Size((batch, self._heads(), q_len, kv_len))

    def _heads(self) -> int:
        mask = self.mask
        if mask is None:
            return 1
        heads = mask.shape[1] if torch.is_tensor(mask) else ("h" in mask.uses and mask.num_heads) or 1
        return int(heads)

    def dense(self) -> torch.Tensor:
        """transformers' eager mask of the block: 0 where a key may be attended, the dtype's minimum elsewhere."""
        if self._dense is None:
            self._dense = self._build_dense()
        return self._dense

    def _build_dense(self) -> torch.Tensor:
        mask, (batch, q_len, kv_len) = self.mask, self.sizes
        if torch.is_tensor(mask) and mask.is_floating_point():
            return torch.broadcast_to(mask.to(self.dtype), (batch, mask.shape[1], q_len, kv_len))
        if mask is None:
            allowed = torch.ones(1, 1, q_len, kv_len, dtype=torch.bool, device=self.device)
        elif torch.is_tensor(mask):
            allowed = mask
        else:
            allowed = mask.materialize(q_len, kv_len, batch=batch, device=self.device)
        allowed = torch.broadcast_to(allowed, (batch, allowed.shape[1], q_len, kv_len))
        zero = torch.zeros((), dtype=self.dtype, device=allowed.device)
        return torch.where(allowed, zero, torch.finfo(self.dtype).min)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        # a torch function or Tensor method given a ModelMask (tensor + mask, torch.where(.., mask)) sees the tensor
        args, kwargs = tree_map(lambda x: x.dense() if isinstance(x, ModelMask) else x, (args, kwargs or {}))
        return func(*args, **kwargs)

    def __getattr__(self, name):
        # only names the object lacks get here: a tensor's attributes and methods (.to, .masked_fill, .bool, ...);
        # any other name (a probe such as hasattr(mask, "x")) is missing without building the tensor
        if name.startswith("_") or not hasattr(torch.Tensor, name):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(self.dense(), name)

    def __getitem__(self, index):
        return self.dense()[index]

    __hash__ = object.__hash__  # identity, as a tensor's: __eq__ below compares elementwise

    def __repr__(self):
        return (f"ModelMask(mask={self.mask!r}, q_offset={self.q_offset}, kv_offset={self.kv_offset}, "
                f"length={self.length}, shape={tuple(self.shape)})")


def _on_dense(name: str):
    def operator(self, *args):
        return getattr(self.dense(), name)(*args)
    operator.__name__ = name
    return operator


# Python looks operators up on the type, not through __getattr__: each one is the dense tensor's
for _name in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__", "__neg__",
              "__and__", "__rand__", "__or__", "__ror__", "__xor__", "__invert__", "__eq__", "__ne__", "__lt__",
              "__le__", "__gt__", "__ge__", "__len__", "__iter__", "__array__"):
    setattr(ModelMask, _name, _on_dense(_name))
