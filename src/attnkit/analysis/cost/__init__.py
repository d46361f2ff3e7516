"""Analytic cost of every registered mechanism: FLOPs (as torch's FlopCounterMode counts them), bytes, peak.

``cost("sliding-window", q_len=4096, window=128)`` or ``cost(module, batch=8, length=4096)``
returns a :class:`Cost`. What is counted:

- ``flops``: matrix products only, ``2 m k n`` per ``(m, k) @ (k, n)`` (mm, bmm, addmm,
  baddbmm, conv, SDPA), exactly as ``torch.utils.flop_counter.FlopCounterMode`` counts
  the mechanism's forward pass on CPU (the tests assert equality). For
  :func:`attnkit.attention` the count follows the kernel :func:`attnkit.explain` picks:
  SDPA's formula, all ``Lq x Lk`` pairs on the reference/chunked kernels, only the
  active key blocks (padding lanes included) on the block-sparse kernel. With
  ``backward=True`` the backward is added: a product costs once more per operand that
  needs a gradient (every input and parameter is taken to need one; buffers, constants
  and sampled one-hot weights do not), checkpointed kernels re-run their forward (a
  chunked slab all of it, a block-sparse slab its score product), and SDPA's fused CPU
  kernel and attnkit's band kernel follow their backward formulas (the scores recomputed).
- ``other_flops``: elementwise work (softmax ~5 operations per score, exp, tanh, masks,
  norms, matrix-vector products such as the additive score's ``v^T tanh(.)``, which the
  counter does not count), an estimate; the backward adds twice the forward's.
- ``bytes_moved``: inputs, outputs and parameters once, intermediates twice (written,
  read), at the dtype's size: an estimate of memory traffic with no cache reuse.
- ``peak_bytes``: the largest set of intermediates alive at once in the forward pass
  (kept activations plus a kernel's workspace as the dispatcher estimates it).

Sizes are keyword arguments; each mechanism accepts its own (:func:`sizes`), with the
registry example's values as defaults, and rejects any other name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from torch import nn

from ... import registry
from ...errors import ArgumentError, did_you_mean
from . import additive, core, linear, pooling, positional, sparse
from .tally import ITEMSIZE, Spec, Tally

__all__ = ["Cost", "Built", "cost", "sizes", "build", "spec", "resolve", "SPECS"]

_FAMILIES = (core, additive, pooling, sparse, linear, positional)
SPECS: dict[str, Spec] = {s.name: s for family in _FAMILIES for s in family.SPECS}


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

    def table(self) -> str:
        """The cost as a plain-text table (what ``attnkit cost`` prints)."""
        rows = [("matmul FLOPs" + (" (forward + backward)" if self.backward else " (forward)"), _num(self.flops))]
        rows += [(f"  {k}", _num(v)) for k, v in self.terms.items()]
        rows.append(("elementwise FLOPs (estimate)", _num(self.other_flops)))
        rows += [(f"  {k}", _num(v)) for k, v in self.other_terms.items()]
        rows += [("bytes moved (estimate)", _bytes(self.bytes_moved)),
                 ("peak bytes (estimate)", _bytes(self.peak_bytes))]
        width = max(len(k) for k, _ in rows)
        sizes = ", ".join(f"{k}={v}" for k, v in self.sizes.items())
        return "\n".join([f"{self.name}: {sizes}", *(f"{k:<{width}}  {v:>12}" for k, v in rows),
                          f"formula: {self.formula}"])


def _num(x: int) -> str:
    for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3f} {suffix}"
    return str(x)


def _bytes(x: int) -> str:
    return f"{x / 2**20:.2f} MiB" if x >= 2**20 else f"{x} B"


def spec(name_or_module) -> Spec:
    """The cost spec of a registry name, "dense", "sdpa", a mask expression, or a module instance."""
    if isinstance(name_or_module, nn.Module):
        found = [s for s in SPECS.values() if s.module_type is type(name_or_module)
                 and (s.matches is None or s.matches(name_or_module))]
        if not found:
            raise ArgumentError(f"cost: no cost formula for a {type(name_or_module).__name__} module; "
                                f"pass a registry name instead")
        return found[0]
    if not isinstance(name_or_module, str):
        raise ArgumentError(f"cost: expected a registry name or a module; got {type(name_or_module).__name__}")
    if name_or_module in SPECS:
        return SPECS[name_or_module]
    if "(" in name_or_module:  # a mask expression such as "sliding_window(128, 128)"
        return core.mask_spec(name_or_module)
    known = sorted({e.name for e in registry.entries()} | {"dense", "sdpa"})
    raise ArgumentError(f"unknown mechanism {name_or_module!r}; {did_you_mean(name_or_module, known)}"
                        f"known: {', '.join(known)} "
                        "or a mask expression such as 'sliding_window(128, 128)'")


def sizes(name_or_module) -> dict:
    """The sizes and options a mechanism accepts, with their defaults (None: derived from the others)."""
    return dict(spec(name_or_module).defaults)


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


def resolve(sp: Spec, given: Mapping[str, object], module: nn.Module | None = None) -> dict:
    """Defaults, then the module's configuration, then ``given``; unknown names raise ArgumentError."""
    unknown = sorted(set(given) - set(sp.defaults))
    if unknown:
        raise ArgumentError(f"cost({sp.name!r}): unknown size(s) {', '.join(unknown)}; accepted: "
                            f"{', '.join(sp.defaults)}")
    config = sp.config(module) if module is not None and sp.config else {}
    clash = sorted(set(config) & set(given))
    if clash:
        raise ArgumentError(f"cost({sp.name!r}): {', '.join(clash)} come(s) from the module; "
                            f"give only the other sizes ({', '.join(k for k in sp.defaults if k not in config)})")
    for key, value in given.items():
        if not (value is None and key in sp.nullable):
            _check_value(sp.name, key, value, sp.defaults[key])
    s = {**sp.defaults, **config, **given}
    if "dtype" in s and module is not None and "dtype" not in given:
        param = next(module.parameters(), None)
        s["dtype"] = str(param.dtype).removeprefix("torch.") if param is not None else s["dtype"]
    return sp.derive(s) if sp.derive else s


def cost(name_or_module, *, backward: bool = False, **size_kwargs) -> Cost:
    """The analytic cost of a mechanism at given sizes (see the module docstring for what is counted).

    Args:
        name_or_module: a registry name (``attnkit list``), "dense", "sdpa", a mask expression
            for :func:`attnkit.attention` such as ``"causal() & sliding_window(64, 0)"``, or a
            module instance (its configuration is read from it; give only batch and lengths).
        backward: include the backward pass (FLOPs only; bytes and peak stay forward).
        size_kwargs: sizes and options, see :func:`sizes`; unknown names raise ArgumentError.

    Example:
        >>> from attnkit.analysis.cost import cost
        >>> c = cost("scaled-dot-product", batch=1, heads=2, q_len=64, head_dim=16)
        >>> c.flops == 2 * 1 * 2 * 64 * 64 * (16 + 16)
        True
        >>> cb = cost("scaled-dot-product", batch=1, heads=2, q_len=64, head_dim=16, backward=True)
        >>> cb.flops / c.flops  # torch's fused CPU SDPA backward recomputes the scores: 2.5x the forward
        3.5
    """
    module = name_or_module if isinstance(name_or_module, nn.Module) else None
    sp = spec(name_or_module)
    s = resolve(sp, size_kwargs, module)
    if module is None and sp.make is not None:
        module = sp.make(s)
    t = Tally(backward=bool(backward), itemsize=ITEMSIZE.get(s.get("dtype", "float32"), 4))
    sp.count(t, s, module)
    return Cost(sp.name, s, sum(t.terms.values()), sum(t.other.values()), t.bytes, t.peak, dict(t.terms),
                dict(t.other), sp.formula, bool(backward))


class Built(NamedTuple):
    """A mechanism ready to run: ``fn(*inputs)``; ``module`` holds its parameters (None for attention())."""

    fn: Callable
    inputs: tuple
    sizes: dict
    module: nn.Module | None


def build(name_or_module, **size_kwargs) -> Built:
    """The mechanism at the given sizes (as :func:`cost` counts it), with seeded Gaussian inputs.

    Integer inputs (segment ids) are built too; modules are in eval mode where that matters.
    """
    module = name_or_module if isinstance(name_or_module, nn.Module) else None
    sp = spec(name_or_module)
    s = resolve(sp, size_kwargs, module)
    if module is None and sp.make is not None:
        module = sp.make(s)
    fn, inputs = sp.inputs(s, module)
    return Built(fn, inputs, s, module)
