"""The input checks the modules and models share, written once, and the head layout they split their inputs into.

A module's ``(batch, n, dim)`` inputs (a floating tensor of that rank and width, the batch of
another input, the dtype and device of the module's parameters), other shapes, the masks modules
take (keep masks ``(batch, n)``, True = a real token; key masks ``(batch, n)`` or
``(batch, Lq, n)``, True = attend) and length vectors. Each error is an attnkit error
(:mod:`attnkit.errors`) that names the module, the argument, what was expected and what came.

The head split and merge every module shares, ``(B, L, H * D) <-> (B, H, L, D)``, are here too (the inputs
every forward checks are the ones it splits, so a forward enters one file for both):

>>> x = torch.randn(2, 5, 12)
>>> split_heads(x, 3).shape
torch.Size([2, 3, 5, 4])
>>> torch.equal(merge_heads(split_heads(x, 3)), x)
True
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..errors import ArgumentError, DeviceError, DTypeError, ShapeError, check_bool_mask
from ..masks.base import Mask

__all__ = ["describe", "check_floating", "check_placement", "check_like", "check_shape", "check_sequence",
           "check_memory", "check_keep_mask", "check_key_mask", "check_lengths", "split_heads", "merge_heads"]


def describe(t) -> str:
    """A tensor's shape, or the type of something that is no tensor."""
    return str(tuple(t.shape)) if isinstance(t, torch.Tensor) else type(t).__name__


def check_floating(who: str, name: str, t) -> None:
    """DTypeError unless ``t`` is a floating tensor."""
    if not isinstance(t, torch.Tensor) or not t.is_floating_point():
        got = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
        raise DTypeError(f"{who}: {name} must be a floating tensor; got {got}")


def check_placement(who: str, name: str, t, *, dtype: torch.dtype, device: torch.device, owner: str) -> None:
    """``t`` is a tensor of ``owner``'s dtype and on its device (``owner``: "the cache", "the parameters'")."""
    if not isinstance(t, torch.Tensor):
        raise DTypeError(f"{who}: {name} must be a torch.Tensor; got {type(t).__name__}")
    if t.dtype != dtype:
        raise DTypeError(f"{who}: {name} must have {owner} dtype {dtype}; got {t.dtype}")
    if t.device != device:
        raise DeviceError(f"{who}: {name} must be on {owner} device {device}; got {t.device}")


def _first_floating(module: torch.nn.Module) -> torch.Tensor | None:
    """The first floating parameter in ``module.parameters()`` order (its own, then its children's, depth first),
    found without the generator ``parameters()`` builds: this check runs on every call of every layer."""
    for param in module._parameters.values():
        if param is not None and param.is_floating_point():
            return param
    for child in module._modules.values():
        found = None if child is None else _first_floating(child)
        if found is not None:
            return found
    return None


def check_like(who: str, name: str, t, module: torch.nn.Module) -> None:
    """``t`` has the dtype (autocast may cast it) and device of ``module``'s first floating parameter."""
    param = _first_floating(module)
    if param is None:
        return
    # Autocast is asked about only when the dtypes differ: the common call pays two comparisons.
    autocast = (isinstance(t, torch.Tensor) and t.dtype != param.dtype and torch._C._is_any_autocast_enabled()
                and torch.is_autocast_enabled(t.device.type))
    check_placement(who, name, t, dtype=t.dtype if autocast else param.dtype, device=param.device,
                    owner="the parameters'")


def check_shape(who: str, name: str, t, ok: Callable[[torch.Tensor], bool], expected: str) -> None:
    """ShapeError ``"{who}: {name} must {expected}; got {shape}"`` unless ``t`` is a tensor and ``ok(t)``."""
    if not (isinstance(t, torch.Tensor) and ok(t)):
        raise ShapeError(f"{who}: {name} must {expected}; got {describe(t)}")


def check_sequence(who: str, name: str, x, dim: int, *, batch: int | None = None, length: str = "n",
                   named: bool = False, like: torch.nn.Module | None = None) -> None:
    """``x`` is a floating ``(batch, length, dim)`` tensor.

    Args:
        batch: the batch size ``x`` must have (another input's), if any.
        length: the name of the sequence axis in the message ("n", "length", "T").
        named: the message writes the width as ``dim=8`` rather than ``8``.
        like: a module whose parameters' dtype and device ``x`` must have.
    """
    # every layer of every model calls this on each call: the valid input passes on attribute reads alone
    if (type(x) is torch.Tensor and x.is_floating_point() and x.dim() == 3 and x.shape[-1] == dim
            and batch in (None, x.shape[0])):
        if like is not None:
            check_like(who, name, x, like)
        return
    check_floating(who, name, x)
    if like is not None:
        check_like(who, name, x, like)
    shape = f"(batch{'' if batch is None else f'={batch}'}, {length}, {'dim=' if named else ''}{dim})"
    check_shape(who, name, x, lambda t: t.dim() == 3 and t.shape[-1] == dim and batch in (None, t.shape[0]),
                f"have shape {shape}")


def check_memory(who: str, query: torch.Tensor, key: torch.Tensor, value=None, key_name: str = "key") -> None:
    """Query and key (and value) share the batch size; value is ``(batch, key_len, value_dim)``."""
    if query.shape[0] != key.shape[0]:
        raise ShapeError(f"{who}: query and {key_name} must share the batch size; got query {tuple(query.shape)} "
                         f"and {key_name} {tuple(key.shape)}")
    if value is not None:
        check_shape(who, "value", value, lambda t: t.dim() == 3 and t.shape[:2] == key.shape[:2],
                    f"have shape (batch, key_len, value_dim) = ({key.shape[0]}, {key.shape[1]}, ...)")


def check_keep_mask(who: str, name: str, keep, *shape: int, true_means: str = "real token",
                    dims: str = "(batch, n)") -> torch.Tensor | None:
    """``keep`` unchanged if None or a bool tensor of ``shape`` (True = ``true_means``); ``dims`` words the shape."""
    if keep is None:
        return None
    return check_bool_mask(who, name, keep, shape, true_means=true_means, dims=dims)


def check_key_mask(who: str, name: str, mask, batch: int, lq: int, n: int, *, true_means: str = "attend",
                   masks_too: bool = False):
    """A bool ``(batch, n)`` key mask as ``(batch, 1, n)``, or a ``(batch, Lq, n)`` one; None passes.

    ``masks_too``: an :mod:`attnkit.masks` mask passes as well (for :func:`attnkit.attention`).
    """
    if mask is None or (masks_too and isinstance(mask, Mask)):
        return mask
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__
        also = " or an attnkit.masks mask" if masks_too else ""
        raise DTypeError(f"{who}: {name} must be a bool tensor (True = {true_means}){also}; got {got}")
    if tuple(mask.shape) == (batch, n):
        return mask[:, None, :]
    check_shape(who, name, mask, lambda t: tuple(t.shape) == (batch, lq, n),
                f"have shape (batch, n) = {(batch, n)} or (batch, Lq, n) = {(batch, lq, n)}")
    return mask


def check_lengths(who: str, name: str, lengths, batch: int, most: int) -> None:
    """``lengths`` is an integer ``(batch,)`` tensor with values in ``[0, most]``."""
    if not isinstance(lengths, torch.Tensor) or lengths.is_floating_point() or lengths.is_complex() \
            or lengths.dtype == torch.bool:
        got = f"{lengths.dtype} tensor of shape {tuple(lengths.shape)}" if isinstance(lengths, torch.Tensor) \
            else type(lengths).__name__
        raise DTypeError(f"{who}: {name} must be an integer tensor of shape ({batch},); got {got}")
    check_shape(who, name, lengths, lambda t: tuple(t.shape) == (batch,), f"have shape (batch,) = ({batch},)")
    if batch and (int(lengths.min()) < 0 or int(lengths.max()) > most):
        raise ArgumentError(f"{who}: {name} must lie in [0, {most}]; got [{int(lengths.min())}, "
                            f"{int(lengths.max())}]")


def split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """``(B, L, H * D) -> (B, H, L, D)``: the last dimension as ``heads`` equal slices, heads before length."""
    return x.unflatten(-1, (heads, -1)).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """``(B, H, L, D) -> (B, L, H * D)``: the inverse of :func:`split_heads`."""
    return x.transpose(1, 2).flatten(2)
