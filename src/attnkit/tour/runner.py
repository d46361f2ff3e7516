"""Run the tour: every (experiment, seed) not already done, each result cached as JSON the moment it finishes.

Layout of the output folder ``out``::

    out/tour.json                                        the last invocation (mode, keys, seeds, machine, times)
    out/runs/<mode>/<task>__<mechanism>__seed<k>.json    one run: status "ok" with its Result, or "failed"
    out/runs/<mode>/scaling.json                          measured scaling (default mode only)

``<mode>`` is ``quick`` or ``default``, so the two budgets never mix. A cached run is
reused only when its JSON parses, its status is "ok", and its ``version`` (attnkit's
version plus a hash of the code that defines and trains the experiments) matches;
anything else is run again. Each file is written to a temporary name and moved into
place with :func:`os.replace`, so an interrupted tour leaves only whole files behind.
"""

from __future__ import annotations

import datetime
import hashlib
import importlib
import inspect
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .. import __version__
from ..errors import ArgumentError, check_int
from ..progress import bars

__all__ = ["tour", "TourSummary", "run_path", "load_run", "write_json", "mode_name", "code_version", "api", "slug",
           "run_child", "ChildFailed", "machine"]

FORMAT = 1
SCALING_LENGTHS = (256, 512, 1024, 2048)


def api():
    """The experiments API (``experiments``, ``default_set``, ``run``), looked up at call time so tests can patch it."""
    return importlib.import_module("attnkit.tour")


def mode_name(quick: bool) -> str:
    """``"quick"`` or ``"default"``: the cache folder of a budget."""
    return "quick" if quick else "default"


def slug(text: str) -> str:
    """``text`` as a file-name part: anything but letters, digits and ``-_.`` becomes ``-``."""
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in str(text)) or "-"


def run_path(out, task: str, mechanism: str, seed: int, mode: str) -> Path:
    """``out/runs/<mode>/<task>__<mechanism>__seed<k>.json``."""
    return Path(out) / "runs" / mode / f"{slug(task)}__{slug(mechanism)}__seed{seed}.json"


def code_version() -> str:
    """attnkit's version and a short hash of the code that defines and trains the experiments.

    Hashed: this package's ``__init__`` and its ``experiments`` subpackage (not the runner and the
    report, which do not change results), and the source files of ``run``/``experiments``/``default_set``
    wherever they live.
    """
    here = Path(__file__).parent
    sources = {here / "__init__.py", *(here / "experiments").glob("*.py")}
    for name in ("run", "experiments", "default_set"):
        try:
            sources.add(Path(inspect.getsourcefile(getattr(api(), name))))
        except (AttributeError, TypeError):
            continue
    digest = hashlib.sha256()
    for src in sorted(sources):
        digest.update(src.name.encode() + b"\0" + src.read_bytes())
    return f"{__version__}+{digest.hexdigest()[:12]}"


def write_json(path, data) -> Path:
    """Write ``data`` as JSON atomically: a temporary file in the same folder, flushed, then ``os.replace``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1, allow_nan=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def load_run(path, *, mode: str | None = None, version: str | None = None) -> dict | None:
    """A cached run record, or None when it is missing, corrupt, or from another mode or code version."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    required = {"format", "key", "task", "mechanism", "seed", "mode", "version", "status"}
    if not isinstance(data, dict) or not required <= data.keys() or data["format"] != FORMAT:
        return None
    if data["status"] == "ok" and not isinstance(data.get("result"), dict):
        return None
    if (mode is not None and data["mode"] != mode) or (version is not None and data["version"] != version):
        return None
    return data


def _as_dict(result) -> dict:
    data = result.to_json()
    return json.loads(data) if isinstance(data, str) else dict(data)


class ChildFailed(RuntimeError):
    """A run in a fresh process ended without a result; the message is its last log line, ``log`` the rest."""

    def __init__(self, message: str, log: str):
        super().__init__(message)
        self.log = log


def run_child(job: dict, step, on_result=None) -> list[dict]:
    """``job`` in a fresh process (:mod:`attnkit.tour.child`) at this process's thread count: its results as JSON data.

    ``step(label)`` gets each progress line, ``on_result(data)`` each result as it arrives (so a caller
    can cache finished runs before the process ends). Raises :class:`ChildFailed` when the process
    fails or prints no result; results printed before a failure were already passed to ``on_result``.
    """
    from .child import PROGRESS, RESULT

    job = {"threads": torch.get_num_threads(), **job}
    log, results = [], []
    with subprocess.Popen([sys.executable, "-m", "attnkit.tour.child", json.dumps(job)], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True) as child:
        for line in child.stdout:
            if line.startswith(PROGRESS):
                if step is not None:
                    step(line[len(PROGRESS):].rstrip("\n"))
            elif line.startswith(RESULT):
                results.append(json.loads(line[len(RESULT):]))
                if on_result is not None:
                    on_result(results[-1])
            else:
                log.append(line)
    if child.returncode or not results:
        last = next((line.strip() for line in reversed(log) if line.strip()), f"exit status {child.returncode}")
        raise ChildFailed(f"the run's process failed: {last}", "".join(log)[-8000:])
    return results


def _run_in_child(key: str, seed: int, quick: bool, step) -> dict:
    """``api().run(...)`` in a fresh process (:mod:`attnkit.tour.child`): its result as JSON data."""
    return run_child({"key": key, "seed": seed, "quick": quick}, step)[-1]


def _run_one(key: str, exp, seed: int, quick: bool, version: str, step, isolate: bool = True) -> dict:
    """One run as a cache record; an exception is recorded as a failed run, never raised.

    ``isolate``: train in a fresh process, so its peak memory is measured; in this process instead,
    the peak is dropped (None): memory freed by an earlier run would be reused without being counted.
    """
    record = {"format": FORMAT, "key": key, "task": exp.task, "mechanism": exp.mechanism, "seed": seed,
              "mode": mode_name(quick), "version": version, "status": "ok", "result": None,
              "error": None, "traceback": None}
    start = time.perf_counter()
    try:
        if isolate:
            result = _run_in_child(key, seed, quick, step)
        else:
            result = {**_as_dict(api().run(key, seed, quick=quick, progress=step)), "peak_bytes": None}
        json.dumps(result)  # a result that cannot be cached is a failed run, not a crash of the tour
        record["result"] = result
    except ChildFailed as err:
        record.update(status="failed", error=str(err), traceback=err.log)
    except Exception as err:  # a broken experiment must not stop the tour: it is reported as failed
        record.update(status="failed", error=f"{type(err).__name__}: {err}", traceback=traceback.format_exc())
    record["wall_seconds"] = time.perf_counter() - start
    return record


@dataclass
class TourSummary:
    """What one call of :func:`tour` did: the folder, and the runs it ran, reused and saw fail."""

    out: Path
    mode: str
    ran: list[str] = field(default_factory=list)
    cached: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    seconds: float = 0.0


def machine() -> dict:
    """The machine and software a tour ran on, for the report."""
    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
            "attnkit": __version__, "threads": torch.get_num_threads()}


def _check(keys, seeds, known: dict, quick: bool) -> tuple[list[str], list[int]]:
    keys = [keys] if isinstance(keys, str) else list(api().default_set(quick) if keys is None else keys)
    unknown = [k for k in keys if k not in known]
    if unknown or not keys:
        raise ArgumentError(f"tour: unknown experiment(s) {', '.join(map(repr, unknown)) or '(none given)'}; "
                            f"known: {', '.join(known)}")
    seeds = list(seeds)
    if not seeds:
        raise ArgumentError("tour: seeds must hold at least one seed; got none")
    for s in seeds:
        check_int("tour", "seed", s, 0)
    return list(dict.fromkeys(keys)), list(dict.fromkeys(seeds))


def tour(keys: Iterable[str] | None = None, seeds: Sequence[int] = (0, 1, 2), *, quick: bool = False,
         out="tour-report", fresh: bool = False, progress: bool = True, command: str | None = None,
         scaling: bool | None = None, isolate: bool = True) -> TourSummary:
    """Run every (experiment, seed) of the tour not already cached under ``out``, caching each as it finishes.

    Args:
        keys: experiment keys (``attnkit.tour.experiments()``); None: ``default_set(quick)``.
        seeds: seeds to run each experiment with.
        quick: the short budget (cached apart from the default one).
        out: the report folder.
        fresh: ignore the cache and run everything again.
        progress: show an overall bar (runs) and a bar per run (steps).
        command: the command line to record in the report (default: "python API").
        scaling: measure the scaling plot's data; None: only in default mode.
        isolate: train each run in a fresh process (:mod:`attnkit.tour.child`), which measures its
            peak memory; False: in this process, with the peak memory left out (None).

    Returns:
        A :class:`TourSummary`. Failed runs are recorded and reported, not raised.
    """
    start, out = time.perf_counter(), Path(out)
    known = api().experiments()
    keys, seeds = _check(keys, seeds, known, quick)
    mode, version = mode_name(quick), code_version()
    summary = TourSummary(out, mode)
    manifest = {"format": FORMAT, "mode": mode, "keys": keys, "seeds": seeds, "version": version,
                "command": command or "attnkit.tour.runner.tour(...)", "machine": machine(),
                "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"), "seconds": None}
    write_json(out / "tour.json", manifest)
    todo = []
    for key in keys:
        for seed in seeds:
            path = run_path(out, known[key].task, known[key].mechanism, seed, mode)
            cached = None if fresh else load_run(path, mode=mode, version=version)
            if cached is not None and cached["status"] == "ok":
                summary.cached.append(f"{key} seed {seed}")
            else:
                todo.append((key, seed, path))
    with bars(progress and bool(todo), len(todo), f"tour ({mode})") as overall:
        for key, seed, path in todo:
            name = f"{key} seed {seed}"
            with bars(progress, getattr(known[key], "steps", None), name, position=1, per_step=True) as step:
                record = _run_one(key, known[key], seed, quick, version, step, isolate)
            write_json(path, record)
            (summary.ran if record["status"] == "ok" else summary.failed).append(name)
            if overall:
                overall(f"{name}: {record['status']}")
    if scaling if scaling is not None else not quick:
        from .report.scaling import measure
        measure(out, [known[k] for k in keys], mode=mode, version=version, fresh=fresh, progress=progress)
    summary.seconds = time.perf_counter() - start
    write_json(out / "tour.json", {**manifest, "seconds": summary.seconds})
    return summary
