"""attnkit: attention mechanisms for PyTorch on one small, exact, fast core.

>>> import torch, attnkit
>>> q = torch.randn(1, 4, 16, 8)
>>> attnkit.attention(q, q, q, mask=attnkit.masks.causal()).shape
torch.Size([1, 4, 16, 8])
"""

from . import bias, masks
from .attention import AttentionOutput, attention, explain
from .errors import ArgumentError, AttnkitError, BackendError, DeviceError, DTypeError, ShapeError, UnsupportedFeature

__version__ = "0.1.0"

__all__ = [
    "attention", "explain", "AttentionOutput", "masks", "bias",
    "AttnkitError", "ShapeError", "DTypeError", "DeviceError", "ArgumentError", "BackendError", "UnsupportedFeature",
    "__version__",
]
