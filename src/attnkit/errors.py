"""The error contract: every attnkit error names the argument and expected vs actual.

Each class subclasses the builtin a caller would catch (``ValueError`` or
``TypeError``) as well as :class:`AttnkitError`, so ``except ValueError`` keeps
working and ``except attnkit.AttnkitError`` catches everything attnkit raises.
"""

from __future__ import annotations

__all__ = [
    "AttnkitError",
    "ShapeError",
    "DTypeError",
    "DeviceError",
    "ArgumentError",
    "BackendError",
    "check_int",
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


def check_int(who: str | None, name: str, value, minimum: int = 0, hint: str = "") -> int:
    """``value`` as an int ``>= minimum`` (bools refused), else an :class:`ArgumentError` naming it.

    ``who`` prefixes the message (``"LuongAttention: window must be ..."``); ``hint``
    follows the bound, e.g. what the number means.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        prefix = f"{who}: " if who else ""
        raise ArgumentError(f"{prefix}{name} must be an int >= {minimum}{hint}; got {value!r}")
    return value
