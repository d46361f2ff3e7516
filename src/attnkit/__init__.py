"""attnkit: attention mechanisms for PyTorch on one small, exact, fast core.

>>> import torch, attnkit
>>> q = torch.randn(1, 4, 16, 8)
>>> attnkit.attention(q, q, q, mask=attnkit.masks.causal()).shape
torch.Size([1, 4, 16, 8])
"""

import importlib
from importlib import metadata as _metadata
from typing import TYPE_CHECKING

from . import _moved
from .errors import ArgumentError, AttnkitError, BackendError, DeviceError, DTypeError, ShapeError, UnsupportedFeature

_moved.install()  # the lab's old import paths (attnkit.viz, attnkit.tour, ...) for one release, with a warning


def _version() -> str:
    """The installed distribution's version: pyproject.toml is the one place the number is written.

    A source tree that is not installed (``src`` on ``sys.path``) reads pyproject.toml beside ``src``;
    anything else says ``0+unknown`` rather than a number that may be wrong.
    """
    try:
        return _metadata.version("attnkit")
    except _metadata.PackageNotFoundError:
        from pathlib import Path

        import tomllib

        pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
        try:
            project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
        except (OSError, KeyError, tomllib.TOMLDecodeError):
            return "0+unknown"
        return project.get("version", "0+unknown") if project.get("name") == "attnkit" else "0+unknown"


__version__ = _version()

__all__ = [
    "attention", "explain", "AttentionOutput", "masks", "bias", "flex_attention", "varlen_attn", "explain_varlen",
    "cascade_attention", "explain_cascade",
    "AttnkitError", "ShapeError", "DTypeError", "DeviceError", "ArgumentError", "BackendError", "UnsupportedFeature",
    "__version__",
]

if TYPE_CHECKING:  # what type checkers see; at run time the same names load lazily, below
    from . import bias, masks
    from .cascade import cascade_attention, explain_cascade
    from .core import AttentionOutput, attention, explain
    from .flex import flex_attention
    from .varlen import explain_varlen, varlen_attn

# The names below import torch; they load on first use, so that ``attnkit --help`` and
# ``attnkit --version`` answer without importing torch (the commands that run import it).
_LAZY = {"attention": (".core", "attention"), "explain": (".core", "explain"),
         "AttentionOutput": (".core", "AttentionOutput"), "masks": (".masks", None), "bias": (".bias", None),
         "flex_attention": (".flex", "flex_attention"), "varlen_attn": (".varlen", "varlen_attn"),
         "explain_varlen": (".varlen", "explain_varlen"), "cascade_attention": (".cascade", "cascade_attention"),
         "explain_cascade": (".cascade", "explain_cascade")}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'attnkit' has no attribute {name!r}")
    module_name, attribute = _LAZY[name]
    module = importlib.import_module(module_name, __name__)
    value = module if attribute is None else getattr(module, attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))

