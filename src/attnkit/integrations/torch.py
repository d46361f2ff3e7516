"""attnkit inside plain torch models: swap every ``torch.nn.MultiheadAttention`` for attnkit's.

:class:`attnkit.nn.MultiHeadAttention` computes the function of ``torch.nn.MultiheadAttention``
with the same parameters and state_dict keys, inside torch's ``Transformer*`` layers too
(their fused eval path is declined and nested inputs are accepted, see
:mod:`attnkit.integrations.torch_layers`). :func:`replace_attention` puts it in place of every torch
module of a model, optionally AND-ing an attnkit mask into every call (a sliding window
turns a dense model into a local one; block-sparse kernels then skip the empty blocks).
"""

from __future__ import annotations

from torch import nn

from ..errors import ArgumentError, DTypeError
from ..masks.base import Mask
from ..nn.multihead import MultiHeadAttention

__all__ = ["replace_attention"]


def replace_attention(model: nn.Module, *, mask: Mask | None = None) -> int:
    """Replace, in place, every ``torch.nn.MultiheadAttention`` inside ``model`` by attnkit's module.

    Each replacement keeps its module's configuration, weights (frozen ones stay frozen),
    dtype, device and training mode, so the model computes the same function (a query
    with no allowed key gets 0 where torch gives NaN). A module shared by several
    parents gets one replacement, still shared. Subclasses of torch's module are left
    alone (their ``forward`` may differ), and so are hooks registered on the old modules.

    Args:
        model: any ``nn.Module`` holding ``torch.nn.MultiheadAttention`` modules at any depth
            (not one itself: use ``MultiHeadAttention.from_torch``).
        mask: an :mod:`attnkit.masks` mask AND-ed with the masks of every call, or None.

    Returns:
        How many distinct modules were replaced.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from attnkit import masks
        >>> from attnkit.integrations.torch import replace_attention
        >>> _ = torch.manual_seed(0)
        >>> layer = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True).eval()
        >>> x = torch.randn(2, 10, 16)
        >>> before = layer(x)
        >>> replace_attention(layer)
        1
        >>> torch.allclose(layer(x), before, atol=1e-5)
        True
        >>> encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 4, 32, batch_first=True), 2)
        >>> replace_attention(encoder, mask=masks.sliding_window(2, 2))  # each position sees 2 on either side
        2
    """
    if isinstance(model, nn.MultiheadAttention):
        raise ArgumentError("replace_attention: model is itself a torch.nn.MultiheadAttention and has no parent to "
                            "hold its replacement; use attnkit.nn.MultiHeadAttention.from_torch(model)")
    if not isinstance(model, nn.Module):
        raise DTypeError(f"replace_attention: model must be a torch.nn.Module; got {type(model).__name__}")
    if mask is not None and not isinstance(mask, Mask):
        raise DTypeError(f"replace_attention: mask must be an attnkit.masks.Mask or None; got {type(mask).__name__}")
    replacements: dict[int, MultiHeadAttention] = {}
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.MultiheadAttention:
                if id(child) not in replacements:
                    replacements[id(child)] = MultiHeadAttention.from_torch(child, mask=mask)
                setattr(parent, name, replacements[id(child)])
    return len(replacements)
