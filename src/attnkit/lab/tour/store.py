"""The run store both tours share: finished runs saved as JSON the moment they end, loaded back, resumed.

Layout of a report folder ``out``::

    out/tour.json                                        the last invocation (suite, mode, keys, seeds, machine, times)
    out/runs/<mode>/<task>__<mechanism>__seed<k>.json    one run: status "ok" with its result, or "failed"
    out/runs/<mode>/<task>__<mechanism>__lr<r>__seed<k>.json   one run at ``r`` times the run's own learning rate
    out/runs/<mode>/<other>.json                         a suite's other measurements (scaling, speed)

``<mode>`` names a budget (``default``, ``quick``, ``lra``), so budgets never mix. A saved run
is reused only when its JSON parses, its status is "ok", and its mode and code ``version`` (the
package version plus a hash of the code that defines and trains the runs, :func:`source_version`)
match; anything else runs again. Each file is written to a temporary name and moved into place
with :func:`os.replace`, so an interrupted tour leaves only whole files behind. A path the store
cannot write (a folder where a run file belongs, no permission) is an
:class:`~attnkit.errors.ArgumentError` naming it, raised before any training starts.

A learning-rate sweep (``--lr-sweep``) trains each run at :data:`LR_SWEEP` times its own rate. The
factor is part of a run's key (its file name and its record's ``lr_scale``); factor 1 keeps the
plain name, so runs saved before sweeps existed are the factor-1 runs. :func:`load_records` reads
the factors the last invocation named (its manifest's ``lr_scales``, ``[1.0]`` without one) and keeps,
per experiment, the runs of the factor with the best mean accuracy over seeds (:func:`best_rates`):
every claim and table downstream reads the best rate's runs.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import os
import platform
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ... import __version__
from ...errors import ArgumentError

__all__ = ["FORMAT", "LR_SWEEP", "Summary", "slug", "run_path", "rate_tag", "rate_label", "lr_scales", "best_rates",
           "write_json", "read_json", "load_run", "new_record",
           "load_manifest", "load_records", "start_manifest", "finish_manifest", "source_version", "machine",
           "check_writable", "cached"]

FORMAT = 1

LR_SWEEP = (1 / 3, 1.0, 3.0)
"""The factors of an experiment's own learning rate a sweep trains at: a factor of 3 either side, the
width of the window in which recall results of recurrent models hold (Okpekpe and Orvieto,
arXiv 2508.19029)."""


def slug(text: str) -> str:
    """``text`` as a file-name part: anything but letters, digits and ``-_.`` becomes ``-``."""
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in str(text)) or "-"


def rate_tag(lr_scale: float) -> str:
    """A learning-rate factor as a file-name part: ``""`` for 1, else ``"__lr"`` and the factor to 3 digits.

    Example:
        >>> rate_tag(1.0), rate_tag(1 / 3), rate_tag(3.0)
        ('', '__lr0.333', '__lr3')
    """
    return "" if float(lr_scale) == 1.0 else f"__lr{float(lr_scale):.3g}"


def run_path(out, task: str, mechanism: str, seed: int, mode: str, lr_scale: float = 1.0) -> Path:
    """``out/runs/<mode>/<task>__<mechanism>[__lr<r>]__seed<k>.json`` (no rate part at factor 1)."""
    return Path(out) / "runs" / mode / f"{slug(task)}__{slug(mechanism)}{rate_tag(lr_scale)}__seed{seed}.json"


def rate_label(lr_scale: float) -> str:
    """A learning-rate factor for people: ``""`` at 1, else `` at lr x<r>``.

    Example:
        >>> rate_label(1.0), rate_label(1 / 3), rate_label(3.0)
        ('', ' at lr x0.333', ' at lr x3')
    """
    return "" if float(lr_scale) == 1.0 else f" at lr x{float(lr_scale):.3g}"


def lr_scales(sweep: bool) -> tuple[float, ...]:
    """The learning-rate factors a tour trains at: :data:`LR_SWEEP` with ``sweep``, else ``(1.0,)``."""
    return LR_SWEEP if sweep else (1.0,)


def check_writable(path) -> Path:
    """``path`` if a file can be written there; an ArgumentError naming it when a folder or a file is in the way."""
    path = Path(path)
    for parent in reversed(path.parents):
        if parent.exists() and not parent.is_dir():
            raise ArgumentError(f"tour: cannot write {path}: {parent} is a file, not a folder; remove it or "
                                f"choose another --out")
    if path.exists() and not path.is_file():
        raise ArgumentError(f"tour: cannot write {path}: a folder is in the way of the file; remove it or "
                            f"choose another --out")
    return path


def write_json(path, data) -> Path:
    """Write ``data`` as JSON atomically: a temporary file in the same folder, flushed, then ``os.replace``."""
    path = check_writable(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1, allow_nan=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:  # a full disk or a read-only folder: one line for the user, not a traceback
        raise ArgumentError(f"tour: cannot write {path}: {err.strerror or err}") from err
    finally:
        tmp.unlink(missing_ok=True)
    return path


def read_json(path) -> dict | None:
    """The JSON object in ``path`` of this store's format, or None (missing, unreadable, corrupt, other format)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("format") == FORMAT else None


def load_run(path, *, mode: str | None = None, version: str | None = None) -> dict | None:
    """A saved run record, or None when it is missing, corrupt, or from another mode or code version."""
    data = read_json(path)
    required = {"key", "task", "mechanism", "seed", "mode", "version", "status"}
    if data is None or not required <= data.keys():
        return None
    if data["status"] == "ok" and not isinstance(data.get("result"), dict):
        return None
    if (mode is not None and data["mode"] != mode) or (version is not None and data["version"] != version):
        return None
    return data


def cached(out, task: str, mechanism: str, seed: int, mode: str, version: str, lr_scale: float = 1.0) -> bool:
    """Whether a finished ("ok") run of this mode and code version is saved for (task, mechanism, seed, rate)."""
    record = load_run(run_path(out, task, mechanism, seed, mode, lr_scale), mode=mode, version=version)
    return record is not None and record["status"] == "ok"


def new_record(task: str, mechanism: str, seed: int, mode: str, version: str, *, key: str | None = None,
               lr_scale: float = 1.0, lr: float | None = None) -> dict:
    """A run record before its outcome: status "ok" and no result yet; the runner fills ``result`` or the error.

    ``lr_scale`` is the factor of the run's own learning rate it trained at, ``lr`` that rate (None: unknown).
    """
    return {"format": FORMAT, "key": key or f"{task}/{mechanism}", "task": task, "mechanism": mechanism,
            "seed": seed, "mode": mode, "version": version, "lr_scale": float(lr_scale), "lr": lr, "status": "ok",
            "result": None, "error": None, "traceback": None}


def _accuracy(record: dict) -> float | None:
    result = record.get("result") if record.get("status") == "ok" else None
    value = result.get("accuracy") if isinstance(result, dict) else None
    return float(value) if isinstance(value, (int, float)) and value == value else None


def best_rates(records: list[dict]) -> list[dict]:
    """Per experiment key, the records of the learning-rate factor with the best mean accuracy over seeds.

    A factor with no finished run scores below every other; ties go to the factor nearest 1 (the
    experiment's own rate), then the smaller. Records without ``lr_scale`` are factor-1 runs. A key
    swept at several factors keeps copies of its best factor's records with ``lr_swept``, the factors
    it was trained at; with one factor per key, ``records`` come back unchanged.
    """
    by_key: dict[str, dict[float, list[dict]]] = {}
    for rec in records:
        by_key.setdefault(rec["key"], {}).setdefault(float(rec.get("lr_scale", 1.0)), []).append(rec)

    def score(item):
        factor, recs = item
        values = [v for v in map(_accuracy, recs) if v is not None]
        return (sum(values) / len(values) if values else float("-inf"), -abs(math.log(factor)), -factor)

    best = {key: max(rates.items(), key=score)[0] for key, rates in by_key.items()}
    swept = {key: sorted(rates) for key, rates in by_key.items() if len(rates) > 1}
    return [{**rec, "lr_swept": swept[rec["key"]]} if rec["key"] in swept else rec
            for rec in records if float(rec.get("lr_scale", 1.0)) == best[rec["key"]]]


def load_manifest(out) -> dict | None:
    """``out/tour.json`` (the last invocation), or None."""
    try:
        data = json.loads((Path(out) / "tour.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def start_manifest(out, *, mode: str, keys: Iterable[str], seeds: Iterable[int], version: str, command: str,
                   **more) -> dict:
    """Write and return ``out/tour.json`` for an invocation that starts now (``seconds`` None until it ends)."""
    manifest = {"format": FORMAT, "mode": mode, "keys": list(keys), "seeds": list(seeds), "version": version,
                **more, "command": command, "machine": machine(),
                "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"), "seconds": None}
    write_json(Path(out) / "tour.json", manifest)
    return manifest


def finish_manifest(out, manifest: dict, seconds: float) -> None:
    """Record in ``out/tour.json`` that the invocation ended after ``seconds``."""
    write_json(Path(out) / "tour.json", {**manifest, "seconds": seconds})


def load_records(out, manifest: dict | None = None, *, every_rate: bool = False) -> list[dict]:
    """The run records of the last invocation: its mode, keys, seeds, learning-rate factors and code version
    (all of a mode, at factor 1, without one); per key, only the best factor's runs (:func:`best_rates`)
    unless ``every_rate``."""
    manifest = load_manifest(out) if manifest is None else manifest
    if manifest is None:
        modes = [p.name for p in sorted((Path(out) / "runs").glob("*")) if p.is_dir()]
        mode = "default" if "default" in modes else (modes[0] if modes else "default")
    else:
        mode = manifest["mode"]
    scales = {float(f) for f in (manifest or {}).get("lr_scales") or [1.0]}
    records = []
    for path in sorted((Path(out) / "runs" / mode).glob("*__seed*.json")):
        rec = load_run(path, mode=mode, version=None if manifest is None else manifest.get("version"))
        if rec is None or (manifest and (rec["key"] not in manifest["keys"] or rec["seed"] not in manifest["seeds"])):
            continue
        if float(rec.get("lr_scale", 1.0)) not in scales:
            continue
        records.append(rec)
    order = {k: i for i, k in enumerate(manifest["keys"])} if manifest else {}
    records.sort(key=lambda r: (order.get(r["key"], len(order)), r["key"], float(r.get("lr_scale", 1.0)), r["seed"]))
    return records if every_rate else best_rates(records)


def source_version(sources: Iterable[Path]) -> str:
    """attnkit's version and a short hash of the ``sources`` files (names and bytes, in sorted order)."""
    digest = hashlib.sha256()
    for src in sorted(set(map(Path, sources))):
        digest.update(src.name.encode() + b"\0" + src.read_bytes())
    return f"{__version__}+{digest.hexdigest()[:12]}"


def machine() -> dict:
    """The machine and software a tour ran on, for the report."""
    import torch

    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
            "attnkit": __version__, "threads": torch.get_num_threads()}


@dataclass
class Summary:
    """What one tour call did: the folder, and the runs it ran, reused and saw fail."""

    out: Path
    mode: str
    ran: list[str] = field(default_factory=list)
    cached: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    seconds: float = 0.0
