"""The error contract: every attnkit error names the argument and expected vs actual.

Each class subclasses the builtin a caller would catch (``ValueError`` or
``TypeError``) as well as :class:`AttnkitError`, so ``except ValueError`` keeps
working and ``except attnkit.AttnkitError`` catches everything attnkit raises.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = [
    "AttnkitError",
    "ShapeError",
    "DTypeError",
    "DeviceError",
    "ArgumentError",
    "BackendError",
    "UnsupportedFeature",
    "check_int",
    "check_bool_mask",
    "did_you_mean",
]


class AttnkitError(Exception):
    """Base class of every error raised by attnkit."""


class ShapeError(AttnkitError, ValueError):
    """A tensor has the wrong rank or size (the message shows expected vs got)."""


class DTypeError(AttnkitError, TypeError):
    """A tensor has the wrong dtype, or an argument has the wrong type."""


class DeviceError(AttnkitError, ValueError):
    """Tensors that must share a device do not."""


class ArgumentError(AttnkitError, ValueError):
    """A scalar argument is out of range or an option is unknown."""


class BackendError(AttnkitError, ValueError):
    """A forced backend cannot honour every argument of the call."""


class UnsupportedFeature(AttnkitError, ValueError):
    """A model asks attention for something attnkit cannot honour exactly (a registered mask on cross-attention)."""


def check_int(who: str | None, name: str, value, minimum: int = 0, hint: str = "") -> int:
    """``value`` as an int ``>= minimum`` (bools refused), else an :class:`ArgumentError` naming it.

    ``who`` prefixes the message (``"LuongAttention: window must be ..."``); ``hint``
    follows the bound, e.g. what the number means.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        prefix = f"{who}: " if who else ""
        raise ArgumentError(f"{prefix}{name} must be an int >= {minimum}{hint}; got {value!r}")
    return value


def check_bool_mask(who: str, name: str, mask, shape: tuple[int, ...], *, true_means: str = "keep",
                    dims: str = ""):
    """``mask`` unchanged if it is a bool tensor of exactly ``shape`` (None passes), else a named error.

    Raises :class:`DTypeError` for a non-bool value and :class:`ShapeError` for another shape,
    each naming ``who``, the argument and expected vs actual. ``true_means`` and ``dims`` (e.g.
    ``"(batch, n)"``) only word the message.
    """
    import torch  # here, not at the top: the command line's help and errors import this module without torch

    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise DTypeError(f"{who}: {name} must be a bool tensor (True = {true_means}); got {got}")
    if tuple(mask.shape) != tuple(shape):
        expected = f"{dims} = {tuple(shape)}" if dims else f"{tuple(shape)}"
        raise ShapeError(f"{who}: {name} must have shape {expected}; got {tuple(mask.shape)}")
    return mask


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """``"did you mean 'causal'? "`` for the close matches of ``name`` among ``known`` (difflib), else ``""``.

    The one wording of a suggestion, put in front of the list of known names in every
    "unknown name" message (mechanisms, masks, comparisons, tasks, subcommands).

    Example:
        >>> did_you_mean("causl", ["causal", "full", "sliding_window"])
        "did you mean 'causal'? "
    """
    close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.6)
    return f"did you mean {' or '.join(map(repr, close))}? " if close else ""
