"""A mechanism's cost spec: the sizes it takes, how to count one pass and how to run it; the :class:`Cost` it gives.

A spec is written beside its mechanism and carried by the mechanism's registry entry
(``register(Entry(..., spec=Spec(...)))``). Sizes are resolved in one place,
:meth:`Spec.resolve`:

- no size given: the registry example's values (``defaults``), so a quick example run and its
  cost describe the same small problem;
- a sequence length given (``q_len``, ``kv_len`` or the mechanism's own length names): every size
  not given takes a realistic layer's value (:data:`~.vocabulary.LAYER`: batch 1, 8 heads of 64
  features) and every option the paper's setting (``at_scale``, cited in ``source``);
- the vocabulary's names (``batch, heads, q_len, kv_len, head_dim``) are accepted by every
  mechanism that has a use for them, translated to its own names (:meth:`Spec.translate`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from ..errors import ArgumentError
from .tally import ITEMSIZE, Tally
from .vocabulary import LAYER, LENGTHS, VOCABULARY, WIDTHS

__all__ = ["Spec", "Cost", "Built", "MODULE_LENGTH_LIMIT"]

MODULE_LENGTH_LIMIT = 1 << 20
"""The longest sequence a count builds its module for (a spec with ``reads_module``): block layouts
and random rotations grow with the length, some as its square."""


@dataclass(frozen=True)
class Cost:
    """The cost of one forward (and with ``backward``, backward) pass of a mechanism at given sizes.

    Attributes:
        name: registry name (or "dense", "sdpa", a mask expression).
        sizes: every size and option used, defaults filled in.
        flops: matmul FLOPs, as FlopCounterMode counts them; ``sum(terms.values())``.
        other_flops: elementwise FLOPs (estimate); ``sum(other_terms.values())``.
        bytes_moved: inputs + outputs + parameters once, intermediates twice (estimate).
        peak_bytes: largest set of live intermediates in the forward pass (estimate).
        terms: matmul FLOPs by named part ("scores (q k^T)", "weights @ v", "projections ...").
        other_terms: elementwise FLOPs by named part.
        formula: the formula in symbols.
        backward: whether the backward pass is included.
        state_fixed: the decoding cache of one sequence that does not grow with the context (a recurrent
            state), in bytes; 0 for a mechanism that keeps none or was not counted for decoding.
        state_per_token: the bytes that cache grows by per token of context (a KV cache).
        context: the context length the cost was counted at (the spec's last length).
        forms: matmul FLOPs of the same pass in each form the mechanism can run in ("parallel",
            "chunk", "recurrent"), counted as ``flops``; empty for a mechanism with one form.
    """

    name: str
    sizes: Mapping[str, object]
    flops: int
    other_flops: int
    bytes_moved: int
    peak_bytes: int
    terms: Mapping[str, int]
    other_terms: Mapping[str, int]
    formula: str
    backward: bool
    state_fixed: int = 0
    state_per_token: int = 0
    context: int = 0
    forms: Mapping[str, int] = field(default_factory=dict)

    @property
    def state_bytes(self) -> int:
        """The decoding cache of one sequence after ``context`` tokens, in bytes (per layer)."""
        return self.state_fixed + self.state_per_token * self.context

    def table(self) -> str:
        """The cost as a plain-text table (what ``attnkit cost`` prints)."""
        passes = " (forward + backward)" if self.backward else " (forward)"
        rows = [("matmul FLOPs" + passes, _num(self.flops))]
        rows += [(f"  {k}", _num(v)) for k, v in self.terms.items()]
        rows.append(("elementwise FLOPs (estimate)", _num(self.other_flops)))
        rows += [(f"  {k}", _num(v)) for k, v in self.other_terms.items()]
        rows += [("bytes moved (estimate)", _bytes(self.bytes_moved)),
                 ("peak bytes (estimate)", _bytes(self.peak_bytes))]
        if self.forms:
            rows.append(("matmul FLOPs by form" + passes, ""))
            rows += [(f"  {k}", _num(v)) for k, v in self.forms.items()]
        if self.state_fixed or self.state_per_token:
            rows += [(f"decoding state, one sequence at length {self.context}", _bytes(self.state_bytes)),
                     ("  fixed, whatever the length (a recurrent state)", _bytes(self.state_fixed)),
                     ("  growing per token (a KV cache)", _bytes(self.state_per_token)),
                     ("  per token at this length", _bytes(round(self.state_bytes / max(1, self.context))))]
        width = max(len(k) for k, _ in rows)
        sizes = ", ".join(f"{k}={v}" for k, v in self.sizes.items() if v is not None)  # None: the mechanism's default
        return "\n".join([f"{self.name}: {sizes}", *(f"{k:<{width}}  {v:>12}" for k, v in rows),
                          f"formula: {self.formula}"])


def _num(x: int) -> str:
    for scale, suffix in ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3f} {suffix}"
    return str(x)


def _bytes(x: int) -> str:
    for shift, unit in ((50, "PiB"), (40, "TiB"), (30, "GiB"), (20, "MiB")):
        if x >= 1 << shift:
            return f"{x / 2**shift:.2f} {unit}"
    return f"{x} B"


class Built(NamedTuple):
    """A mechanism ready to run: ``fn(*inputs)``; ``module`` holds its parameters (None for attention())."""

    fn: Callable
    inputs: tuple
    sizes: dict
    module: object | None


@dataclass(frozen=True)
class Spec:
    """How to count and how to run one registry entry.

    Attributes:
        defaults: every size and option the mechanism takes, with the registry example's value
            (``None``: derived from the others by ``derive``).
        count: ``count(tally, sizes, module)`` records the terms of one forward pass; ``module`` is
            the module given to :meth:`cost` (or, with ``reads_module``, built by ``make``), else None.
        inputs: ``inputs(sizes, module) -> (callable, args)`` for one forward call.
        formula: the cost in words and symbols.
        make: ``make(sizes) -> module`` (None for :func:`attnkit.attention` entries).
        length: the sizes one sequence length sets (the vocabulary's ``q_len`` sets them).
        at_scale: the paper's settings of the options, taken when a length is given.
        source: where ``at_scale`` comes from: paper and section.
        derive: fills the ``None`` defaults from the other sizes.
        config: ``config(module) -> sizes`` read from a module instance; ``module_type`` selects it.
        matches: for a module type shared by several entries, whether an instance is this entry's.
        nullable: sizes that also accept None (with a meaning of their own, e.g. "no top-k").
        aliases: a vocabulary name -> this mechanism's own name for it (``{"head_dim": "dim"}``).
        reads_module: ``count`` reads the module's own masks, so :meth:`cost` builds it.
        name: the registry name (:class:`attnkit.registry.Entry` sets it).
    """

    defaults: Mapping[str, object]
    count: Callable
    inputs: Callable
    formula: str
    make: Callable | None = None
    length: tuple[str, ...] = ("length",)
    at_scale: Mapping[str, object] = field(default_factory=dict)
    source: str = ""
    derive: Callable | None = None
    config: Callable | None = None
    module_type: type | None = None
    matches: Callable | None = field(default=None, compare=False)
    nullable: frozenset = frozenset()
    aliases: Mapping[str, str] = field(default_factory=dict)
    reads_module: bool = False
    name: str = ""

    def translate(self, vocabulary: Mapping[str, object]) -> tuple[dict, list[str]]:
        """The vocabulary's values in this mechanism's names, and the names it has no use for.

        ``q_len`` sets every ``length`` size of a mechanism with one sequence (``kv_len`` must then
        equal it); ``heads`` and ``head_dim`` set the model width (``dim``, ``embed_dim``) as their
        product, the one not given read off the defaults.
        """
        own, unused = {}, []
        widths = [w for w in WIDTHS if w in self.defaults and w not in self.aliases.values()]
        for key, value in vocabulary.items():
            name = self.aliases.get(key, key)
            if name in self.defaults:
                own[name] = value
            elif key in LENGTHS and self.length and "q_len" not in self.defaults:
                continue  # one sequence length: below
            elif not (key in ("heads", "head_dim") and widths):
                unused.append(key)
        q, kv = vocabulary.get("q_len"), vocabulary.get("kv_len")
        if "q_len" not in self.defaults and (q, kv) != (None, None):
            if q is not None and kv is not None and q != kv:
                raise ArgumentError(f"{self.name} takes one sequence length ({', '.join(self.length)}): give "
                                    f"q_len (--q-len only on the command line); got q_len={q}, kv_len={kv}")
            own.update(dict.fromkeys(self.length, q if q is not None else kv))
        if widths and ("heads" in vocabulary or "head_dim" in vocabulary):
            heads = vocabulary.get("heads", self.defaults.get("heads")) or 1
            example_heads = self.defaults.get("heads") or 1
            head_dim = vocabulary.get("head_dim") or self.defaults[widths[0]] // example_heads
            own.update(dict.fromkeys(widths, heads * head_dim))
        return own, unused

    def resolve(self, given: Mapping[str, object], module=None) -> dict:
        """Every size: defaults, the layer and the paper's settings at scale, the module's configuration,
        then ``given`` (see the module docstring); unknown names raise ArgumentError."""
        own = {k: v for k, v in given.items() if k in self.defaults}
        vocab = {k: v for k, v in given.items() if k in VOCABULARY}
        for key, value in vocab.items():
            if key not in own and not (value is None and key == "kv_len"):
                _check_value(self.name, key, value, 1)
        by_vocab, unused = self.translate(vocab)
        unknown = sorted(set(given) - set(own) - set(vocab)) + sorted(unused)
        if unknown:
            raise ArgumentError(f"cost({self.name!r}): unknown size(s) {', '.join(unknown)}; accepted: "
                                f"{', '.join(self.defaults)} (or the vocabulary's {', '.join(VOCABULARY)})")
        twice = sorted(k for k in self.length if k in own and k in by_vocab and own[k] != by_vocab[k])
        if twice:
            raise ArgumentError(f"cost({self.name!r}): {', '.join(twice)} given twice, by name and as q_len")
        scale = any(k in LENGTHS or k in self.length for k in given)
        layer = {k: v for k, v in LAYER.items() if k not in LENGTHS} if scale else {}
        translated = self.translate({**layer, **vocab})[0]
        config = self.config(module) if module is not None and self.config else {}
        clash = sorted(set(config) & (set(own) | set(by_vocab)))
        if clash:
            raise ArgumentError(f"cost({self.name!r}): {', '.join(clash)} come(s) from the module; "
                                f"give only the other sizes ({', '.join(k for k in self.defaults if k not in config)})")
        for key, value in own.items():
            if not (value is None and key in self.nullable):
                _check_value(self.name, key, value, self.defaults[key])
        s = {**self.defaults, **(self.at_scale if scale else {}), **translated, **config, **own}
        if scale and "kv_len" in s and "kv_len" not in own and vocab.get("kv_len") is None and "q_len" in s:
            s["kv_len"] = s["q_len"]  # one length given: both sequences have it
        if "dtype" in s and module is not None and "dtype" not in given:
            param = next(module.parameters(), None)
            s["dtype"] = str(param.dtype).removeprefix("torch.") if param is not None else s["dtype"]
        return self.derive(s) if self.derive else s

    def cost(self, sizes: Mapping[str, object], *, backward: bool = False, module=None) -> Cost:
        """The analytic cost at ``sizes`` (:func:`attnkit.costing.analytic.cost` documents what is counted)."""
        s = self.resolve(sizes, module)
        if module is None and self.reads_module:
            long = {k: s[k] for k in self.length if isinstance(s.get(k), int) and s[k] > MODULE_LENGTH_LIMIT}
            if long:
                raise ArgumentError(f"cost({self.name!r}): the count reads the module's own masks, built for "
                                    f"{', '.join(f'{k}={v}' for k, v in long.items())}; lengths up to "
                                    f"{MODULE_LENGTH_LIMIT} are priced")
            module = self.make(s)
        t = Tally(backward=bool(backward), itemsize=ITEMSIZE.get(s.get("dtype", "float32"), 4))
        self.count(t, s, module)
        context = s.get(self.length[-1]) if self.length else None
        return Cost(self.name, s, sum(t.terms.values()), sum(t.other.values()), t.bytes, t.peak, dict(t.terms),
                    dict(t.other), self.formula, bool(backward), t.state_fixed, t.state_per_token,
                    context if isinstance(context, int) else 0, dict(t.forms))

    def build(self, sizes: Mapping[str, object], module=None) -> Built:
        """The mechanism at ``sizes`` (as :meth:`cost` counts it), with seeded Gaussian inputs."""
        s = self.resolve(sizes, module)
        if module is None and self.make is not None:
            module = self.make(s)
        fn, inputs = self.inputs(s, module)
        return Built(fn, inputs, s, module)


def _check_value(name: str, key: str, value, default) -> None:
    if isinstance(default, bool) or isinstance(value, bool):
        ok = isinstance(value, bool) and (isinstance(default, bool) or default is None)
    elif isinstance(default, int) or (default is None and isinstance(value, int)):
        ok = isinstance(value, int) and value >= 0
    elif isinstance(default, float):
        ok = isinstance(value, (int, float)) and value >= 0
    elif isinstance(default, tuple):
        ok = isinstance(value, (tuple, list)) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    elif isinstance(default, str):
        ok = isinstance(value, str) and (key != "dtype" or value in ITEMSIZE)
    else:
        ok = value is None or isinstance(value, (int, str))
    if not ok:
        raise ArgumentError(f"cost({name!r}): size {key}={value!r} has the wrong type or value "
                            f"(default {default!r}{'; dtypes: ' + ', '.join(ITEMSIZE) if key == 'dtype' else ''})")
