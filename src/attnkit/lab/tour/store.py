"""The run store both tours share: finished runs saved as JSON the moment they end, loaded back, resumed.

Layout of a report folder ``out``::

    out/tour.json                                        the last invocation (suite, mode, keys, seeds, machine, times)
    out/runs/<mode>/<task>__<mechanism>__seed<k>.json    one run: status "ok" with its result, or "failed"
    out/runs/<mode>/<other>.json                         a suite's other measurements (scaling, speed)

``<mode>`` names a budget (``default``, ``quick``, ``lra``), so budgets never mix. A saved run
is reused only when its JSON parses, its status is "ok", and its mode and code ``version`` (the
package version plus a hash of the code that defines and trains the runs, :func:`source_version`)
match; anything else runs again. Each file is written to a temporary name and moved into place
with :func:`os.replace`, so an interrupted tour leaves only whole files behind. A path the store
cannot write (a folder where a run file belongs, no permission) is an
:class:`~attnkit.errors.ArgumentError` naming it, raised before any training starts.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import platform
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ... import __version__
from ...errors import ArgumentError

__all__ = ["FORMAT", "Summary", "slug", "run_path", "write_json", "read_json", "load_run", "new_record",
           "load_manifest", "load_records", "start_manifest", "finish_manifest", "source_version", "machine",
           "check_writable", "cached"]

FORMAT = 1


def slug(text: str) -> str:
    """``text`` as a file-name part: anything but letters, digits and ``-_.`` becomes ``-``."""
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in str(text)) or "-"


def run_path(out, task: str, mechanism: str, seed: int, mode: str) -> Path:
    """``out/runs/<mode>/<task>__<mechanism>__seed<k>.json``."""
    return Path(out) / "runs" / mode / f"{slug(task)}__{slug(mechanism)}__seed{seed}.json"


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


def cached(out, task: str, mechanism: str, seed: int, mode: str, version: str) -> bool:
    """Whether a finished ("ok") run of this mode and code version is saved for (task, mechanism, seed)."""
    record = load_run(run_path(out, task, mechanism, seed, mode), mode=mode, version=version)
    return record is not None and record["status"] == "ok"


def new_record(task: str, mechanism: str, seed: int, mode: str, version: str, *, key: str | None = None) -> dict:
    """A run record before its outcome: status "ok" and no result yet; the runner fills ``result`` or the error."""
    return {"format": FORMAT, "key": key or f"{task}/{mechanism}", "task": task, "mechanism": mechanism,
            "seed": seed, "mode": mode, "version": version, "status": "ok", "result": None, "error": None,
            "traceback": None}


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


def load_records(out, manifest: dict | None = None) -> list[dict]:
    """The run records of the last invocation: its mode, keys, seeds and code version (all of a mode without one)."""
    manifest = load_manifest(out) if manifest is None else manifest
    if manifest is None:
        modes = [p.name for p in sorted((Path(out) / "runs").glob("*")) if p.is_dir()]
        mode = "default" if "default" in modes else (modes[0] if modes else "default")
    else:
        mode = manifest["mode"]
    records = []
    for path in sorted((Path(out) / "runs" / mode).glob("*__seed*.json")):
        rec = load_run(path, mode=mode, version=None if manifest is None else manifest.get("version"))
        if rec is None or (manifest and (rec["key"] not in manifest["keys"] or rec["seed"] not in manifest["seeds"])):
            continue
        records.append(rec)
    order = {k: i for i, k in enumerate(manifest["keys"])} if manifest else {}
    return sorted(records, key=lambda r: (order.get(r["key"], len(order)), r["key"], r["seed"]))


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
