"""Run the long-range suite: one fresh process per (task, mechanism) and per speed measurement, each cached.

The folder ``out`` is laid out as the default tour's (:mod:`attnkit.tour.runner`, whose atomic
JSON writes, run records, cache checks and child processes this reuses)::

    out/tour.json                                        the last invocation (suite "long", mode, pairs, seeds)
    out/runs/<mode>/<task>__<mechanism>__seed<k>.json    one training run (status "ok" with its result, or "failed")
    out/runs/<mode>/speed__<mechanism>.json              the speed/memory measurement at the longest length

A pair's process trains its seeds one after another and prints each result as it finishes, and
each is cached at once, so an interrupted suite resumes with the seeds (and pairs) not yet done.
A cached record is reused only when its mode and code version (:func:`suite_version`) match.
"""

from __future__ import annotations

import datetime
import hashlib
import inspect
import time
from dataclasses import replace
from pathlib import Path

from ... import __version__
from ...progress import bars
from ..runner import FORMAT, ChildFailed, TourSummary, load_run, machine, run_child, run_path, slug, write_json
from .jobs import speed_job, train_job
from .suite import TASKS, Plan, plan

__all__ = ["run_suite", "SuiteSummary", "suite_version", "speed_path", "load_speed", "SUITE"]

SUITE = "long"


def suite_version() -> str:
    """attnkit's version and a short hash of the code that defines, builds and trains the suite's runs.

    Hashed: this package but its runner, report, picture and claims (which change no result), the
    tour's training loop, and the source files of the suite's task generators.
    """
    here = Path(__file__).parent
    generators = {Path(inspect.getsourcefile(type(TASKS[name].make(True)))) for name in TASKS}
    sources = sorted({*here.glob("*.py"), here.parent / "experiments" / "train.py", *generators} -
                     {here / "runner.py", here / "report.py", here / "picture.py", here / "claims.py"})
    digest = hashlib.sha256()
    for src in sources:
        digest.update(src.name.encode() + b"\0" + src.read_bytes())
    return f"{__version__}+{digest.hexdigest()[:12]}"


def speed_path(out, mechanism: str, mode: str) -> Path:
    """``out/runs/<mode>/speed__<mechanism>.json``."""
    return Path(out) / "runs" / mode / f"speed__{slug(mechanism)}.json"


def load_speed(path, *, mode: str | None = None, version: str | None = None) -> dict | None:
    """A cached speed record, or None when missing, corrupt, failed, or from another mode or code version."""
    import json

    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("result"), dict):
        return None
    if (mode is not None and data.get("mode") != mode) or (version is not None and data.get("version") != version):
        return None
    return data


SuiteSummary = TourSummary  # what one call of run_suite did: the same record as the default tour's


def _record(task: str, mechanism: str, seed: int, mode: str, version: str) -> dict:
    return {"format": FORMAT, "key": f"{task}/{mechanism}", "task": task, "mechanism": mechanism, "seed": seed,
            "mode": mode, "version": version, "status": "ok", "result": None, "error": None, "traceback": None}


def _train(out, task, mechanism, seeds, the_plan: Plan, version, step, summary) -> None:
    """Train one pair's missing ``seeds`` in a fresh process, caching each seed's record as it arrives."""
    done, start = set(), time.perf_counter()

    def cache(result: dict) -> None:
        seed = int(result["seed"])
        record = {**_record(task, mechanism, seed, the_plan.mode, version), "result": result,
                  "wall_seconds": time.perf_counter() - start}
        write_json(run_path(out, task, mechanism, seed, the_plan.mode), record)
        done.add(seed)
        summary.ran.append(f"{task}/{mechanism} seed {seed}")

    try:
        run_child(train_job(task, mechanism, seeds, the_plan.mode == "quick"), step, cache)
        error = None
    except ChildFailed as err:
        error = err
    for seed in seeds:
        if seed not in done:
            message = str(error) if error else "the run's process printed no result for this seed"
            record = {**_record(task, mechanism, seed, the_plan.mode, version), "status": "failed", "error": message,
                      "traceback": getattr(error, "log", None), "wall_seconds": time.perf_counter() - start}
            write_json(run_path(out, task, mechanism, seed, the_plan.mode), record)
            summary.failed.append(f"{task}/{mechanism} seed {seed}")


def _speed(out, mechanism, the_plan: Plan, version, summary) -> None:
    record = {"format": FORMAT, "mechanism": mechanism, "length": the_plan.speed_length, "mode": the_plan.mode,
              "version": version, "status": "ok", "result": None, "error": None}
    try:
        record["result"] = run_child(speed_job(mechanism, the_plan.speed_length), None)[-1]
        summary.ran.append(f"speed {mechanism}")
    except ChildFailed as err:
        record.update(status="failed", error=str(err), traceback=err.log)
        summary.failed.append(f"speed {mechanism}")
    write_json(speed_path(out, mechanism, the_plan.mode), record)


def run_suite(out="docs/tour-long", *, quick: bool = False, fresh: bool = False, progress: bool = True,
              command: str | None = None, pairs=None, seeds=None, speed=None) -> SuiteSummary:
    """Run every (task, mechanism, seed) and speed measurement of the suite not already cached under ``out``.

    Args:
        out: the report folder.
        quick: the ``--quick`` plan (cached apart from the default one).
        fresh: ignore the cache and run everything again.
        progress: show bars (pairs, and the curve points of the running pair).
        command: the command line to record in the report.
        pairs: (task, mechanism) pairs to run instead of the mode's (at the mode's budget).
        seeds: seeds instead of the mode's.
        speed: mechanisms whose speed to measure at the longest length (default: those of the pairs).

    Returns:
        A :class:`SuiteSummary`; failed runs are recorded and reported, not raised.
    """
    start, out = time.perf_counter(), Path(out)
    the_plan = plan(quick)
    the_plan = replace(the_plan, pairs=tuple(map(tuple, pairs or the_plan.pairs)), seeds=tuple(seeds or the_plan.seeds))
    version, mode = suite_version(), the_plan.mode
    summary = SuiteSummary(out, mode)
    manifest = {"format": FORMAT, "suite": SUITE, "mode": mode, "keys": [f"{t}/{m}" for t, m in the_plan.pairs],
                "seeds": list(the_plan.seeds), "version": version, "speed_length": the_plan.speed_length,
                "budget": vars(the_plan.budget), "command": command or "attnkit.tour.long.run_suite(...)",
                "machine": machine(), "seconds": None,
                "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}
    write_json(out / "tour.json", manifest)
    todo = []
    for task, mech in the_plan.pairs:
        missing = []
        for seed in the_plan.seeds:
            cached = None if fresh else load_run(run_path(out, task, mech, seed, mode), mode=mode, version=version)
            if cached is not None and cached["status"] == "ok":
                summary.cached.append(f"{task}/{mech} seed {seed}")
            else:
                missing.append(seed)
        if missing:
            todo.append((task, mech, missing))
    mechanisms = list(dict.fromkeys(m for _, m in the_plan.pairs) if speed is None else speed)
    speed_todo = [m for m in mechanisms if fresh or load_speed(speed_path(out, m, mode), mode=mode, version=version)
                  is None or load_speed(speed_path(out, m, mode))["status"] != "ok"]
    summary.cached += [f"speed {m}" for m in mechanisms if m not in speed_todo]
    with bars(progress and bool(todo or speed_todo), len(todo) + len(speed_todo), f"long suite ({mode})") as overall:
        for task, mech, seeds in todo:
            steps = len(seeds) * (the_plan.evals + 1)
            with bars(progress, steps, f"{task}/{mech}", position=1, per_step=True) as step:
                _train(out, task, mech, seeds, the_plan, version, step, summary)
            if overall:
                overall(f"{task}/{mech}")
        for mech in speed_todo:
            _speed(out, mech, the_plan, version, summary)
            if overall:
                overall(f"speed {mech}")
    summary.seconds = time.perf_counter() - start
    write_json(out / "tour.json", {**manifest, "seconds": summary.seconds})
    return summary
