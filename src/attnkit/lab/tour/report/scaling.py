"""Cost and scaling for the tour report: the analytic cost of each mechanism, a small measured scaling run.

A tour mechanism is matched to a cost formula (:mod:`attnkit.costing.analytic`) by the
experiment's ``cost_name`` attribute when it has one, else by its mechanism name when
that is a registry name, else through :data:`ALIASES`; unmatched mechanisms are listed
as such.

The measured scaling (time and peak memory against length) runs each (mechanism, L) in a
fresh child process at one thread (:func:`attnkit.lab.analysis.scaling.scaling`), with one
untimed warm-up and :data:`REPEATS` timed passes; a point is their median and spread
(max - min). It is cached in ``out/runs/<mode>/scaling.json`` like a run. The fitted
exponent of ``time ~ L^p`` is shown only when it can be trusted (:func:`exponent_text`):
a poor fit (R^2 below :data:`MIN_R_SQUARED`) or a point whose spread is more than
:data:`MAX_RELATIVE_SPREAD` of its median is shown as "noisy", never as a number.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from .... import __version__
from ...analysis.scaling import MAX_RELATIVE_SPREAD, MIN_R_SQUARED, PowerFit, exponent_text, power_fit
from ...progress import bars
from ..child import api
from ..store import write_json

__all__ = ["SCALING_LENGTHS", "ALIASES", "cost_name", "cost_sizes", "cost_entries", "cost_table", "length_sizes",
           "measure", "load_scaling", "MEASURED_FAMILIES", "SIZES", "REPEATS", "THREADS", "MIN_R_SQUARED",
           "MAX_RELATIVE_SPREAD", "PowerFit", "power_fit", "exponent_text", "scaling_markdown"]

SCALING_LENGTHS = (256, 512, 1024, 2048)  # the lengths each mechanism is timed at

ALIASES = {
    "softmax": "scaled-dot-product", "full": "scaled-dot-product", "dense": "scaled-dot-product",
    "softmax-1layer": "scaled-dot-product", "softmax-2layer": "scaled-dot-product",
    "linear": "linear-attention", "window": "sliding-window", "sliding_window": "sliding-window",
    "bahdanau": "additive", "luong-general": "luong", "luong-dot": "luong", "sparse": "sparse-strided",
}
MEASURED_FAMILIES = ("score", "mask", "long-sequence", "normalize")
SIZES = {"batch": 1, "heads": 4, "head_dim": 32, "dim": 128}  # one layer of a small model: seconds, not minutes
REPEATS = 3  # timed passes per point after the warm-up: a median and a spread
THREADS = 1  # one thread: the numbers do not depend on the core count or on other work's threads
def _known(name: str) -> bool:
    from ....costing.analytic import spec

    try:
        spec(name)
    except ValueError:
        return False
    return "(" not in name


def _candidates(mech: str) -> list[str]:
    """Names to try for a mechanism: as given, normalised, without a layer count or a trailing number."""
    norm = re.sub(r"[\s_]+", "-", mech.strip().lower())
    bare = re.sub(r"-?\d+-?(layers?|l)$", "", norm)
    plain = re.sub(r"-?\d+$", "", bare)
    names = []
    for name in (mech, norm, bare, plain):
        names += [name, ALIASES.get(name)]
    return [n for n in dict.fromkeys(names) if n]


def cost_name(exp_or_mechanism) -> str | None:
    """The cost formula's name for an experiment (or a mechanism name), or None."""
    explicit = getattr(exp_or_mechanism, "cost_name", None)
    if explicit:
        return str(explicit)
    mech = str(getattr(exp_or_mechanism, "mechanism", exp_or_mechanism))
    return next((name for name in _candidates(mech) if _known(name)), None)


def length_sizes(name: str, length: int, kv_length: int | None = None) -> dict:
    """The size keywords that set the sequence length(s) of ``cost(name)``."""
    from ....costing.analytic import sizes as accepted

    ok = accepted(name)
    if "q_len" in ok:
        return {"q_len": length, **({"kv_len": kv_length or length} if "kv_len" in ok else {})}
    if "length" in ok:
        big = {"max_len": length} if isinstance(ok.get("max_len"), int) and ok["max_len"] < length else {}
        return {"length": kv_length or length, **big}
    return {}


def cost_sizes(name: str, record: dict | None, exp=None) -> dict:
    """Sizes for ``cost(name)``: the experiment's ``cost_sizes``, else heads and lengths read off a recorded map."""
    from ....costing.analytic import sizes as accepted

    given = dict(getattr(exp, "cost_sizes", None) or {})
    examples = ((record or {}).get("result") or {}).get("examples") or []
    maps = examples[0].get("maps") if examples and isinstance(examples[0], dict) else None
    if not given and isinstance(maps, dict) and maps:
        shape = _shape(next(iter(maps.values())))
        ok = accepted(name)
        if len(shape) == 3:
            dim = ok.get("dim")  # modules taking (b, n, dim) need dim divisible by heads: keep their default heads
            heads = {"heads": shape[0]} if not isinstance(dim, int) or dim % shape[0] == 0 else {}
            given = {**heads, **length_sizes(name, shape[1], shape[2])}
    ok = accepted(name)
    return {k: v for k, v in given.items() if k in ok}


def _shape(nested) -> tuple[int, ...]:
    shape = []
    while isinstance(nested, list) and nested:
        shape.append(len(nested))
        nested = nested[0]
    return tuple(shape)


def cost_entries(rows, records: list[dict] | None = None) -> list[dict]:
    """One entry per distinct (mechanism, formula): ``mechanism``, ``name``, ``sizes`` given, ``cost`` or ``error``."""
    from ....costing.analytic import cost
    try:
        exps = api().experiments()
    except Exception:  # report without the experiments module: match by mechanism name only
        exps = {}
    first = {}
    for rec in records or []:
        if rec["status"] == "ok":
            first.setdefault(rec["key"], rec)
    entries, seen = [], set()
    for r in rows:
        exp = exps.get(r.key)
        name = cost_name(exp if exp is not None else r.mechanism)
        if name is None or (r.mechanism, name) in seen:
            continue
        seen.add((r.mechanism, name))
        entry = {"mechanism": r.mechanism, "name": name, "cost": None, "error": None, "sizes": {}}
        try:
            entry["sizes"] = cost_sizes(name, first.get(r.key), exp)
            entry["cost"] = cost(name, **entry["sizes"])
        except (ValueError, TypeError) as err:
            entry["error"] = str(err)
        entries.append(entry)
    return entries


def cost_table(entries: list[dict]) -> list[list[str]]:
    """The analytic cost table as strings, header first."""
    table = [["mechanism", "formula name", "sizes", "matmul FLOPs", "peak bytes", "formula"]]
    for e in entries:
        c = e["cost"]
        if c is None:
            table.append([e["mechanism"], e["name"], "-", "-", "-", f"no cost: {e['error']}"])
            continue
        sizes = ", ".join(f"{k}={v}" for k, v in c.sizes.items() if v is not None)
        table.append([e["mechanism"], e["name"], sizes, f"{c.flops:,}", f"{c.peak_bytes:,}", c.formula])
    return table


def _path(out, mode: str) -> Path:
    return Path(out) / "runs" / mode / "scaling.json"


def load_scaling(out, manifest: dict | None) -> dict | None:
    """The cached scaling measurement of the manifest's mode, or None."""
    mode = (manifest or {}).get("mode", "default")
    try:
        data = json.loads(_path(out, mode).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("series"), dict) else None


def _names(exps) -> list[str]:
    from .... import registry

    names = ["dense"]
    for exp in exps:
        name = cost_name(exp)
        try:
            family = registry.get(name).family if name else None
        except KeyError:
            family = None
        if family in MEASURED_FAMILIES and name not in names:
            names.append(name)
    return names


def measure(out, exps, *, mode: str, version: str, fresh: bool = False, progress: bool = True,
            lengths=SCALING_LENGTHS) -> dict:
    """Measure time and peak memory against length for the tour's mechanisms (cached; failures recorded).

    Each point in a fresh process at :data:`THREADS` thread(s), :data:`REPEATS` timed passes, :data:`SIZES`.
    The cache holds ``points``: ``{mechanism: [[L, median_s, spread_s, peak_bytes, status], ...]}`` and
    ``series`` (the finished points, for the plot).
    """
    names, lengths = _names(exps), list(lengths)
    setup = {"names": names, "lengths": lengths, "attnkit": __version__, "sizes": SIZES, "repeats": REPEATS,
             "threads": THREADS}
    cached = None if fresh else load_scaling(out, {"mode": mode})
    if cached and cached.get("status") == "ok" and all(cached.get(k) == v for k, v in setup.items()):
        return cached
    data = {"format": 2, "mode": mode, "version": version, **setup, "status": "ok", "points": {}, "series": {},
            "error": None}
    start = time.perf_counter()
    try:
        from ...analysis.scaling import scaling

        with bars(progress, len(names) * len(lengths), "scaling") as step:
            table = scaling(names, lengths, repeats=REPEATS, threads=THREADS, sizes=SIZES, progress=step)
        for r in table.rows:
            data["points"].setdefault(r.mechanism, []).append(
                [r.length, r.median_s, r.spread, r.peak_bytes, r.status])
        data["series"] = {k: [list(p) for p in v] for k, v in table.series().items()}
    except Exception as err:  # the runs are the main result: a failed measurement is reported, not raised
        data.update(status="failed", error=f"{type(err).__name__}: {err}")
    data["seconds"] = time.perf_counter() - start
    write_json(_path(out, mode), data)
    return data


def _point_cell(value, status: str, scale: float, spread=None) -> str:
    if status != "ok":
        return status
    if value is None:
        return "n/a"
    return f"{value * scale:.1f}" + ("" if spread is None else f" ± {spread * scale / 2:.1f}")


def scaling_markdown(data: dict) -> str:
    """The measured scaling as a Markdown table: median ms ± half the spread, peak MiB, exponents or "noisy".

    Empty for a cache without ``points`` (measured before repeats were taken: not shown).
    """
    points = data.get("points") or {}
    if not points:
        return ""
    lengths = list(data.get("lengths") or sorted({p[0] for pts in points.values() for p in pts}))
    head = (["mechanism"] + [f"L={n} ms" for n in lengths] + [f"L={n} MiB" for n in lengths]
            + ["time exponent", "memory exponent"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for mech, pts in points.items():
        at = {p[0]: p for p in pts}
        times = [_point_cell(at[n][1], at[n][4], 1e3, at[n][2]) if n in at else "-" for n in lengths]
        peaks = [_point_cell(at[n][3], at[n][4], 2.0 ** -20) if n in at else "-" for n in lengths]
        ok = [p for p in pts if p[4] == "ok"]
        ls = [p[0] for p in ok]
        lines.append("| " + " | ".join([mech, *times, *peaks, exponent_text(ls, [p[1] for p in ok], [p[2] for p in ok]),
                                        exponent_text(ls, [p[3] for p in ok])]) + " |")
    repeats, threads = data.get("repeats", "?"), data.get("threads", "?")
    sizes = ", ".join(f"{k}={v}" for k, v in (data.get("sizes") or {}).items())
    note = (f"Forward + backward of one layer ({sizes}), each point in a fresh process at {threads} thread(s): "
            f"median of {repeats} timed passes after a warm-up, ± half their spread (max - min). An exponent is "
            f"fitted on log-log axes and shown as \"noisy\" when R² < {MIN_R_SQUARED} or a point's spread exceeds "
            f"{100 * MAX_RELATIVE_SPREAD:.0f} % of its median. Peak memory is one measurement per point.")
    return "\n".join([note, "", *lines])
