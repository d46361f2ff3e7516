"""One vocabulary for problem sizes on the command line: ``--batch --heads --q-len --kv-len --head-dim``.

Every command that takes sizes takes these, with the same defaults (B=1, H=8, L=4096,
D=64: a realistic layer, :data:`attnkit.costing.vocabulary.LAYER`), and so does
:func:`attnkit.costing.analytic.cost`. Mechanisms name some sizes their own way (``length`` for a
self-attention module, ``dim`` for its model width, ``words`` for a hierarchical model):
:meth:`attnkit.costing.spec.Spec.translate` is the one translation, :func:`mechanism_sizes`
applies it for the commands. The commands that measure also take ``--device`` (:func:`add_device_arg`).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from ...costing.vocabulary import LAYER, VOCABULARY
from .common import positive_int

__all__ = ["DEFAULTS", "VOCABULARY", "add_size_args", "add_device_arg", "device", "values", "mechanism_sizes",
           "title"]

DEFAULTS = LAYER  # kv_len None: q_len


def add_size_args(p: argparse.ArgumentParser, *, lengths: bool = True, shape: bool = True,
                  defaults: bool = True) -> None:
    """Add the size options: ``--batch --heads --head-dim`` (``shape``) and ``--q-len --kv-len`` (``lengths``).

    ``defaults=False``: every option defaults to None (not given), its help still naming the layer's value.
    """
    def option(flag, key, text):
        if defaults:
            p.add_argument(flag, type=positive_int, default=DEFAULTS[key], help=text)
        else:
            p.add_argument(flag, type=positive_int, default=None, help=f"{text} (default: {DEFAULTS[key]})")

    if shape:
        option("--batch", "batch", "batch size B")
        option("--heads", "heads", "attention heads H")
    if lengths:
        option("--q-len", "q_len", "query length Lq")
        p.add_argument("--kv-len", type=positive_int, default=None, help="key/value length Lk (default: --q-len)")
    if shape:
        option("--head-dim", "head_dim", "features per head D (a module's width is H * D)")


def device(text: str) -> str:
    """An argparse type: ``cpu``, or ``cuda`` / ``cuda:N`` when torch sees that GPU here.

    The CPU needs no check (and no torch import, so parsing stays cheap); a CUDA device
    is refused with what torch sees: no CUDA at all, or fewer devices than the index.
    """
    if text == "cpu":
        return text
    kind, colon, index = text.partition(":")
    if kind != "cuda" or (colon and not index.isdigit()):
        raise argparse.ArgumentTypeError(f"must be cpu, cuda or cuda:N; got {text!r}")
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not available: torch {torch.__version__} sees no CUDA device "
                                         "here (use cpu)")
    if colon and int(index) >= count:
        raise argparse.ArgumentTypeError(f"{text!r} is not available: torch sees {count} CUDA device(s), "
                                         f"cuda:0 to cuda:{count - 1}")
    return text


def add_device_arg(p: argparse.ArgumentParser, what: str) -> None:
    """``--device`` (default cpu): ``what`` runs there; times wait for the device, memory is its allocator's."""
    p.add_argument("--device", type=device, default="cpu",
                   help=f"{what}: cpu, cuda or cuda:N (on cuda each timed call waits for the GPU, and peak memory "
                        "is the CUDA allocator's)")


def values(args) -> dict:
    """The vocabulary's values in ``args`` (those the command has; ``kv_len`` None means ``q_len``)."""
    return {key: getattr(args, key) for key in VOCABULARY if hasattr(args, key)}


def title(sizes: Mapping[str, object]) -> str:
    """``"B=1 H=8 Lq=4096 Lk=4096 D=64"`` for the vocabulary's values present in ``sizes``."""
    short = {"batch": "B", "heads": "H", "q_len": "Lq", "kv_len": "Lk", "head_dim": "D"}
    return " ".join(f"{short[k]}={sizes[k]}" for k in short if sizes.get(k) is not None)


def mechanism_sizes(name: str, common: Mapping[str, int], given: Mapping[str, object], *,
                    lengths: bool = True) -> dict:
    """The sizes of mechanism ``name`` (:func:`attnkit.costing.analytic.sizes`) from the vocabulary.

    ``common`` holds the vocabulary's values; ``given`` the ``--size K=V`` options, which win; a
    vocabulary name in ``given`` (``q_len=4096``) counts as the option of that name, so it works
    for a module with one ``length`` too. Each value goes where the mechanism has a use for it
    (:meth:`~attnkit.costing.spec.Spec.translate`: batch, heads and head_dim under their names or
    as the model width heads * head_dim; q_len and kv_len to its own length names, a different
    ``kv_len`` being an error for a mechanism with one length); the others are left out.
    ``lengths=False`` leaves the lengths out (``attnkit scaling`` sets them).
    """
    from ...costing.analytic import spec

    common, given = dict(common), dict(given)
    for key in VOCABULARY:
        if key in given:
            common[key] = given.pop(key)
    if not lengths:
        common = {k: v for k, v in common.items() if k not in ("q_len", "kv_len")}
    elif common.get("kv_len") is None and "q_len" in common:
        common["kv_len"] = common["q_len"]
    return {**spec(name).translate(common)[0], **given}
