"""The channel between attention calls and :class:`attnkit.lab.analysis.AttentionRecorder`.

While a listener is installed, :func:`attnkit.attention` takes the exact
reference path, computes the post-normalisation weights and hands them to
:func:`report`; modules that compute their weights without
:func:`attnkit.attention` call :func:`report` themselves, and wrap inner
:func:`attnkit.attention` calls that are not attention maps (a mean of keys)
in :func:`suspended`. With no listener, nothing here costs more than one check.

Listeners are per thread: a listener sees the reports made on the thread that
installed it, never those of other threads (which may be running the same model
for someone else). Inside ``torch.compile``'d code nothing is reported.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

import torch

__all__ = ["is_recording", "listen", "report", "suspended"]

Listener = Callable[[torch.Tensor, object], None]
_local = threading.local()
listening = 0  # listeners installed on any thread: while 0, attention() needs no per-thread look (its fast lane)
_count = threading.Lock()


def _listeners() -> list[Listener]:
    if not hasattr(_local, "listeners"):
        _local.listeners, _local.suspended = [], 0
    return _local.listeners


def is_recording() -> bool:
    """True while a listener is installed on this thread and reporting is not suspended."""
    return bool(_listeners()) and not _local.suspended and not torch.compiler.is_compiling()


@contextlib.contextmanager
def listen(listener: Listener) -> Iterator[None]:
    """Install ``listener(weights, source)`` for the duration of the block."""
    global listening
    listeners = _listeners()
    listeners.append(listener)
    with _count:
        listening += 1
    try:
        yield
    finally:
        listeners.remove(listener)
        with _count:
            listening -= 1


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """No report reaches the listeners inside the block (a module reporting its own weights uses it)."""
    _listeners()
    _local.suspended += 1
    try:
        yield
    finally:
        _local.suspended -= 1


def report(weights: torch.Tensor, source: object = None) -> None:
    """Hand post-normalisation ``weights`` (``(B, H, Lq, Lk)`` or the module's own layout) to every listener.

    ``source`` names who computed them (a module, or None for a bare
    :func:`attnkit.attention` call). Inside :func:`suspended` nothing is
    reported; a module checks :func:`is_recording` first to skip building
    weights nobody listens to.
    """
    if not is_recording():
        return
    for listener in list(_listeners()):
        listener(weights.detach(), source)
