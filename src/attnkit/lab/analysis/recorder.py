"""Record the attention maps of a forward pass, named after the modules that computed them."""

from __future__ import annotations

import contextlib
import fnmatch
import threading
import warnings
from collections.abc import Iterator
from typing import NamedTuple

import torch
from torch import nn

from ... import recording
from ...errors import ArgumentError, DTypeError, ShapeError, check_int

__all__ = ["AttentionRecorder", "RecordedMap", "pick_names", "pick_heads"]



class RecordedMap(NamedTuple):
    """One recorded map.

    name: the module's qualified name (``"encoder.layers.0.self_attn"``, the root is ``"model"``,
    a bare :func:`attnkit.attention` call ``"attention"``), ``"#k"`` added on its k-th repeat.
    index: position in call order. weights: detached float32 copy, in the layout it was reported
    (``(B, H, Lq, Lk)`` from :func:`attnkit.attention`). source: the module that reported its own
    weights, or None for an :func:`attnkit.attention` call.
    """

    name: str
    index: int
    weights: torch.Tensor
    source: object


def pick_names(names: list[str], layers, who: str) -> list[str]:
    """The names ``layers`` picks among ``names``, in ``names``' order: map names, glob patterns
    (``"encoder.*"``) or indices into ``names`` (negative from the end), mixed freely; None picks all."""
    if layers is None:
        return list(names)
    items = [layers] if isinstance(layers, (str, int)) else list(layers)
    chosen = set()
    for item in items:
        if isinstance(item, bool) or not isinstance(item, (int, str)):
            raise DTypeError(f"{who}: layers must be map names, patterns or indices; got {item!r}")
        if isinstance(item, int):
            if not -len(names) <= item < len(names):
                raise ArgumentError(f"{who}: layer index {item} is out of range for {len(names)} maps")
            chosen.add(names[item])
            continue
        hits = fnmatch.filter(names, item)
        if not hits:
            raise ArgumentError(f"{who}: no map is named {item!r}; the maps: {', '.join(names)}")
        chosen.update(hits)
    return [n for n in names if n in chosen]


def pick_heads(name: str, count: int, heads, who: str) -> list[int] | None:
    """The head indices ``heads`` picks in a map with ``count`` heads (negative from the end); None keeps all."""
    if heads is None:
        return None
    items = [heads] if isinstance(heads, int) else list(heads)
    if not items or any(isinstance(h, bool) or not isinstance(h, int) for h in items):
        raise DTypeError(f"{who}: heads must be a non-empty list of head indices; got {heads!r}")
    bad = [h for h in items if not -count <= h < count]
    if bad:
        raise ArgumentError(f"{who}: map {name!r} has {count} head{'s' * (count != 1)}; heads {bad} do not exist")
    return list(dict.fromkeys(h % count for h in items))  # in the order given, each once


def _per_sample(name: str, w: torch.Tensor, sample: int) -> torch.Tensor:
    """``(H, Lq, Lk)`` of one sample: 4-D ``(B, H, Lq, Lk)``, 3-D ``(B, Lq, Lk)`` or 2-D ``(B, Lk)``."""
    if w.dim() not in (2, 3, 4):
        raise ShapeError(f"AttentionRecorder: map {name!r} has shape {tuple(w.shape)}; as_dict knows 2-D (B, Lk), "
                         f"3-D (B, Lq, Lk) and 4-D (B, H, Lq, Lk) maps")
    if not -w.shape[0] <= sample < w.shape[0]:
        raise ArgumentError(f"AttentionRecorder: sample={sample} is out of range for map {name!r} of shape "
                            f"{tuple(w.shape)} (batch {w.shape[0]})")
    one = w[sample]
    return one if w.dim() == 4 else one[None] if w.dim() == 3 else one[None, None]  # (H, Lq, Lk)


class AttentionRecorder:
    """Context manager that records every attention map computed inside its block.

    While active, every :func:`attnkit.attention` call takes the exact reference
    path and hands over its post-normalisation, pre-dropout weights ``(B, H, Lq, Lk)``;
    modules that compute weights themselves (Luong, hard, pointer, coverage, tiered)
    report theirs in their own layout. Forward hooks on every submodule of ``model``
    name each map after the innermost module executing when it was computed. Every
    hook is removed on exit (also after an exception); nothing is stored on the
    modules; after the block the model runs on its usual fast path again.

    What is recorded: calls made on the thread that entered the block (other threads
    running the same model are neither recorded nor mixed into the names), outside
    ``torch.compile``'d code (compiled regions keep their fast path and report nothing;
    nothing crashes). Under ``torch.no_grad``, ``torch.inference_mode`` and autocast the
    maps are recorded as usual (float32 copies). A block that records no map at all
    warns on exit, naming these reasons.

    Layout rule of :meth:`as_dict`: a map becomes ``(H, Lq, Lk)`` for one sample:
    ``(B, H, Lq, Lk)`` -> ``w[sample]``; ``(B, Lq, Lk)`` -> ``(1, Lq, Lk)``; ``(B, Lk)``
    (pooling) -> ``(1, 1, Lk)``. ``sample`` indexes each map's first dimension, which
    is the batch the computing call saw: modules that fold steps or sentences into
    the batch (memory, hierarchical words) give one step or sentence per sample.

    Shapes: whatever the attention calls compute; nothing is reshaped in :attr:`maps`.
    :attr:`tokens` holds ``{name: (q_tokens, k_tokens)}`` labels where they are known (maps
    given to :meth:`from_maps`, e.g. a transformers model's); pictures use them.

    Complexity: a forced reference pass (``O(B H Lq Lk)`` memory per call) and a copy
    of every map; ``max_maps`` bounds the number kept.

    Args:
        model: module whose submodules name the maps; None names every map after its
            reporting module's class, or ``"attention"``.
        to_cpu: move the copies to the CPU (default) or keep them on their device.
        max_maps: keep at most this many maps (a warning on exit counts the rest).

    Example:
        >>> import torch
        >>> from attnkit.lab.analysis.recorder import AttentionRecorder
        >>> from attnkit.nn import MultiHeadAttention
        >>> _ = torch.manual_seed(0)
        >>> mha = MultiHeadAttention(12, 3, batch_first=True)
        >>> x = torch.randn(2, 5, 12)
        >>> with AttentionRecorder(mha) as rec:
        ...     _ = mha(x, x, x, need_weights=False)
        ...     _ = mha(x, x, x, need_weights=False)
        >>> rec.names(), tuple(rec.as_dict()["model#1"].shape)
        (['model', 'model#1'], (3, 5, 5))
    """

    def __init__(self, model: nn.Module | None = None, *, to_cpu: bool = True, max_maps: int | None = None):
        if model is not None and not isinstance(model, nn.Module):
            raise DTypeError(f"AttentionRecorder: model must be an nn.Module or None; got {type(model).__name__}")
        if max_maps is not None:
            check_int("AttentionRecorder", "max_maps", max_maps, 1)
        self.model, self.to_cpu, self.max_maps = model, bool(to_cpu), max_maps
        self.maps: list[RecordedMap] = []
        self.tokens: dict[str, tuple[list[str] | None, list[str] | None]] = {}  # name -> (query, key) labels
        self.dropped = 0  # maps not kept because of max_maps
        self._calls: dict[str, int] = {}  # name -> maps reported under it so far
        self._names: dict[nn.Module, str] = {}
        self._running: list[tuple[str, nn.Module]] = []  # hooked modules executing now, innermost last
        self._thread: int | None = None  # the thread that entered: hooks on other threads are ignored
        self._seen = 0  # maps reported before the block (to warn about a block that records none)
        self._exit: contextlib.ExitStack | None = None

    @classmethod
    def from_maps(cls, maps, *, tokens=None, source=None) -> AttentionRecorder:
        """An inactive recorder holding ``maps`` as if recorded in this order: ``{name: (B, H, Lq, Lk)}``
        (float32 CPU copies), with optional labels ``tokens = {name: (q_tokens, k_tokens)}``.

        Maps computed elsewhere (a transformers model's ``outputs.attentions``:
        :func:`attnkit.lab.analysis.recording_from_outputs`) then go wherever a recording goes.

        Example:
            >>> import torch
            >>> maps = {"layer": torch.ones(1, 2, 3, 3) / 3}
            >>> rec = AttentionRecorder.from_maps(maps, tokens={"layer": ("abc", "xyz")})
            >>> rec.names(), tuple(rec.as_dict()["layer"].shape), rec.tokens["layer"][1]
            (['layer'], (2, 3, 3), ['x', 'y', 'z'])
        """
        rec = cls()
        for name, w in maps.items():
            if not isinstance(w, torch.Tensor) or w.dim() not in (2, 3, 4):
                got = tuple(w.shape) if isinstance(w, torch.Tensor) else type(w).__name__
                raise ShapeError(f"AttentionRecorder.from_maps: maps[{name!r}] must be a (B, H, Lq, Lk), (B, Lq, Lk) "
                                 f"or (B, Lk) tensor; got {got}")
            copy = w.detach().to("cpu", torch.float32, copy=True)
            rec.maps.append(RecordedMap(str(name), len(rec.maps), copy, source))
            rec._calls[str(name)] = 1
        def labels(seq):
            return None if seq is None else [str(t) for t in seq]

        rec.tokens = {str(name): (labels(q), labels(k)) for name, (q, k) in (tokens or {}).items()}
        return rec

    def __enter__(self) -> AttentionRecorder:
        if self._exit is not None:
            raise ArgumentError("AttentionRecorder: this recorder is already active; use a second one to nest")
        stack = contextlib.ExitStack()
        self._thread, self._seen = threading.get_ident(), len(self.maps) + self.dropped
        try:
            if self.model is not None:
                self._names = {m: name or "model" for name, m in self.model.named_modules()}
                for module, name in self._names.items():
                    stack.callback(module.register_forward_pre_hook(self._enter_hook(name)).remove)
                    stack.callback(module.register_forward_hook(self._exit_hook, always_call=True).remove)
            stack.enter_context(recording.listen(self._listen))
        except BaseException:
            stack.close()
            raise
        self._exit = stack
        return self

    def __exit__(self, *exc) -> bool:
        stack, self._exit = self._exit, None
        self._running.clear()
        if stack is not None:
            stack.close()
        if exc[0] is None and len(self.maps) + self.dropped == self._seen:
            warnings.warn("AttentionRecorder: no attention map was recorded in this block (the code ran no attnkit "
                          "attention with weights on this thread outside torch.compile'd code)", RuntimeWarning,
                          stacklevel=2)
        if self.dropped:
            warnings.warn(f"AttentionRecorder: max_maps={self.max_maps} reached; {self.dropped} more maps were not "
                          f"kept", RuntimeWarning, stacklevel=2)
        return False

    def _enter_hook(self, name: str):
        def hook(module, args):
            if not self._foreign():
                self._running.append((name, module))
        return hook

    def _foreign(self) -> bool:
        """True in compiled code (which reports nothing) and on threads other than the recording one."""
        return torch.compiler.is_compiling() or threading.get_ident() != self._thread

    def _exit_hook(self, module, args, output):
        if self._foreign():
            return
        for i in range(len(self._running) - 1, -1, -1):  # innermost first; always_call runs it after errors too
            if self._running[i][1] is module:
                del self._running[i]
                break

    def _name_of(self, source) -> str:
        if isinstance(source, nn.Module) and source in self._names:
            return self._names[source]
        if self._running:
            return self._running[-1][0]
        return type(source).__name__ if isinstance(source, nn.Module) else "attention"

    def _listen(self, weights: torch.Tensor, source) -> None:
        base = self._name_of(source)
        repeat = self._calls.get(base, 0)
        self._calls[base] = repeat + 1
        if self.max_maps is not None and len(self.maps) >= self.max_maps:
            self.dropped += 1
            return
        device = torch.device("cpu") if self.to_cpu else weights.device
        copy = weights.detach().to(device=device, dtype=torch.float32, copy=True)
        self.maps.append(RecordedMap(base if repeat == 0 else f"{base}#{repeat}", len(self.maps), copy, source))

    def names(self) -> list[str]:
        """The names of the recorded maps, in call order."""
        return [m.name for m in self.maps]

    def __getitem__(self, name: str) -> RecordedMap:
        for m in self.maps:
            if m.name == name:
                return m
        raise KeyError(f"no recorded map named {name!r}; recorded: {', '.join(self.names()) or 'none'}")

    def __len__(self) -> int:
        return len(self.maps)

    def __iter__(self) -> Iterator[RecordedMap]:
        return iter(self.maps)

    def as_dict(self, sample: int = 0) -> dict[str, torch.Tensor]:
        """``{name: (H, Lq, Lk)}`` for one sample, in call order (layout rule in the class docstring)."""
        return {m.name: _per_sample(m.name, m.weights, sample) for m in self.maps}

    def clear(self) -> None:
        """Forget the recorded maps; names count from the start again."""
        self.maps, self.tokens, self.dropped, self._calls = [], {}, 0, {}

    def select(self, layers=None, heads=None) -> AttentionRecorder:
        """A new recording of some of these maps and heads: what to draw of a long model.

        A 512-token map of 12 layers x 12 heads holds 38M weights, too many for one page
        or picture; pick a few: ``rec.select(layers=[0, -1], heads=[3])``.

        Args:
            layers: map names, glob patterns (``"encoder.*"``) or indices into :meth:`names`
                (negative from the end), mixed; None keeps every map.
            heads: head indices (negative from the end), kept in every chosen map; a map
                without a head axis ``(B, Lq, Lk)`` or ``(B, Lk)`` counts as one head. None keeps all.

        Returns:
            An inactive :class:`AttentionRecorder` with those maps (in their order) and their tokens.
        """
        who = "AttentionRecorder.select"
        chosen = set(pick_names(self.names(), layers, who))
        out = AttentionRecorder()
        for m in self.maps:
            if m.name not in chosen:
                continue
            w = m.weights
            keep = pick_heads(m.name, w.shape[1] if w.dim() == 4 else 1, heads, who)
            w = w if keep is None or w.dim() != 4 else w[:, keep]
            out.maps.append(RecordedMap(m.name, len(out.maps), w, m.source))
            out._calls[m.name] = 1
        out.tokens = {n: t for n, t in self.tokens.items() if n in chosen}
        return out

    def picture_maps(self, sample: int = 0) -> dict[str, torch.Tensor]:
        """``{name: (H, Lq, Lk)}`` to draw: :meth:`as_dict` of ``sample``, except pooling maps.

        A pooling map has one query per batch entry (``(N, Lk)``, ``(N, 1, Lk)`` or ``(N, 1, 1, Lk)``), and
        modules fold steps or sentences into that batch: one entry alone is a one-row strip (or, for the
        first step of a memory, empty). Those are drawn with all N entries stacked as rows, ``(1, N, Lk)``.
        """
        maps = self.as_dict(sample)
        for m in self.maps:
            w = m.weights
            pooled = w.dim() == 2 or (w.dim() == 3 and w.shape[1] == 1) or (w.dim() == 4 and w.shape[1:3] == (1, 1))
            if pooled and w.shape[0] > 1:
                maps[m.name] = w.reshape(w.shape[0], w.shape[-1])[None]  # (1, N, Lk): batch entries as rows
        return maps

    def labels(self) -> dict[str, dict[str, list[str] | None]]:
        """The recorded tokens as the pictures take them: ``{"q_tokens": {name: ...}, "k_tokens": {name: ...}}``
        (empty without tokens)."""
        if not self.tokens:
            return {}
        return {"q_tokens": {n: q for n, (q, _) in self.tokens.items()},
                "k_tokens": {n: k for n, (_, k) in self.tokens.items()}}
