"""A model saved as its constructor's arguments and its weights, in one file that loads without running code.

:func:`save` writes ``{"format", "config" (JSON text), "state_dict"}`` with ``torch.save``;
:func:`load` reads it with ``torch.load(weights_only=True)`` (plain values and tensors only, so
a file from elsewhere cannot run code), rebuilds the model from the arguments and loads the
weights strictly. Arguments must be plain values: an attnkit mask is kept as its text
(:func:`attnkit.masks.parse` rebuilds it), a RoPE scaling as its dict; a factory function or
anything else without a text form cannot be saved (build the model again and use
``load_state_dict``).
"""

from __future__ import annotations

import inspect
import json
import os

import torch
from torch import nn

from .. import masks
from ..errors import ArgumentError
from ..nn.rope_scaling import RopeScaling

__all__ = ["arguments", "save", "load"]

_MASK = "__attnkit_mask__"


def arguments(init, frame: dict) -> dict:
    """The values of ``init``'s parameters (``self`` left out) in ``frame``, the ``locals()`` at its start."""
    return {name: frame[name] for name in inspect.signature(init).parameters if name != "self"}


def _plain(who: str, key: str, value):
    if isinstance(value, masks.Mask):
        if not value.text:
            raise ArgumentError(f"{who}: {key}={value!r} has no text form to save it by")
        return {_MASK: value.text}
    if isinstance(value, RopeScaling):
        return value.as_dict()
    if isinstance(value, dict):
        return {k: _plain(who, f"{key}[{k!r}]", v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(who, key, v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise ArgumentError(f"{who}: {key} is a {type(value).__name__}, which cannot be saved (plain values, attnkit "
                        "masks and RoPE scalings can); rebuild the model in code and use load_state_dict instead")


def _restore(value):
    if isinstance(value, dict):
        if set(value) == {_MASK}:
            return masks.parse(value[_MASK])
        return {k: _restore(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_restore(v) for v in value]
    return value


def save(model: nn.Module, path: str | os.PathLike) -> None:
    """Write ``model.config`` (its constructor's arguments) and its weights to ``path``."""
    who = f"{type(model).__name__}.save"
    config = json.dumps({k: _plain(who, k, v) for k, v in model.config.items()})
    torch.save({"format": type(model).__name__, "config": config, "state_dict": model.state_dict()}, path)


def load(cls: type[nn.Module], path: str | os.PathLike, *, map_location=None) -> nn.Module:
    """The ``cls`` model :func:`save` wrote to ``path``, in eval mode, with its weights."""
    saved = torch.load(path, map_location=map_location, weights_only=True)
    if not isinstance(saved, dict) or saved.get("format") != cls.__name__:
        got = saved.get("format") if isinstance(saved, dict) else type(saved).__name__
        raise ArgumentError(f"{cls.__name__}.load: {os.fspath(path)!r} is not a saved {cls.__name__}; got {got!r}")
    model = cls(**_restore(json.loads(saved["config"])))
    model.load_state_dict(saved["state_dict"])
    return model.eval()
