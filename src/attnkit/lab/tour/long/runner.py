"""Run the long-range suite: one fresh process per (task, mechanism) and per speed measurement, each saved.

The folder is the run store's (:mod:`attnkit.lab.tour.store`), shared with the default tour::

    out/tour.json                                         the last invocation (suite "long", scale, pairs, seeds)
    out/runs/<scale>/<task>__<mechanism>__seed<k>.json    one training run (status "ok" with its result, or "failed")
    out/runs/<scale>/<task>__<mechanism>__lr<r>__seed<k>.json   the same at r times its learning rate (--lr-sweep)
    out/runs/<scale>/speed__<mechanism>.json              the speed/memory measurement at the longest length

A pair's process trains its seeds one after another and prints each result as it finishes, and
each is saved at once, so an interrupted suite resumes with the seeds (and pairs) not yet done.
``workers`` pairs train at once, each process at :func:`~attnkit.lab.tour.child.threads_per_worker` threads
(two pairs at one thread each on a 2-core machine); the speed
measurements run one at a time afterwards, alone, so no other run shares their core.
"""

from __future__ import annotations

import inspect
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from ... import tasks
from ...progress import bars
from ..child import ChildFailed, default_workers, run_child, threads_per_worker
from ..store import (
    FORMAT,
    Summary,
    cached,
    check_writable,
    finish_manifest,
    lr_scales,
    new_record,
    rate_label,
    read_json,
    run_path,
    slug,
    source_version,
    start_manifest,
    write_json,
)
from .jobs import speed_job, train_job
from .suite import TASKS, Plan, plan

__all__ = ["run_suite", "SuiteSummary", "suite_version", "speed_path", "load_speed", "SUITE"]

SUITE = "long"
SuiteSummary = Summary  # what one call of run_suite did: the same record as the default tour's


def suite_version() -> str:
    """attnkit's version and a short hash of the code that defines, builds and trains the suite's runs.

    Hashed: this package but the modules that change no result (runner, report, picture, claims,
    statistics, estimate), the tour's training loop and objectives, and the suite's task generators.
    """
    here = Path(__file__).parent
    generators = {Path(inspect.getsourcefile(type(tasks.get(name)))) for name in TASKS}
    idle = {"runner.py", "report.py", "picture.py", "claims.py", "estimate.py"}
    sources = {p for p in here.glob("*.py") if p.name not in idle}
    sources |= {here.parent / "experiments" / "train.py", here.parent / "experiments" / "tokens.py", *generators}
    return source_version(sources)


def speed_path(out, mechanism: str, scale: str) -> Path:
    """``out/runs/<scale>/speed__<mechanism>.json``."""
    return Path(out) / "runs" / scale / f"speed__{slug(mechanism)}.json"


def load_speed(path, *, scale: str | None = None, version: str | None = None) -> dict | None:
    """A saved speed record, or None when missing, corrupt, or from another scale or code version."""
    data = read_json(path)
    if data is None or not isinstance(data.get("result"), dict):
        return None
    if (scale is not None and data.get("mode") != scale) or (version is not None and data.get("version") != version):
        return None
    return data


def _train(out, task, mechanism, seeds, the_plan: Plan, version, device, step, summary, threads: int = 1,
           lr_scale: float = 1.0) -> None:
    """Train one pair's missing ``seeds`` in a fresh process, saving each seed's record as it arrives.

    A record's ``wall_seconds`` is the time since the pair's previous record (since the process
    started, for the first): summed over records, the process time of the pair.
    """
    done: set[int] = set()
    last = [time.perf_counter()]

    def since_last() -> float:
        now = time.perf_counter()
        elapsed, last[0] = now - last[0], now
        return elapsed

    def save(result: dict) -> None:
        seed = int(result["seed"])
        record = {**new_record(task, mechanism, seed, the_plan.scale, version, lr_scale=lr_scale, lr=lr),
                  "result": result, "wall_seconds": since_last()}
        write_json(run_path(out, task, mechanism, seed, the_plan.scale, lr_scale), record)
        done.add(seed)
        summary.ran.append(f"{task}/{mechanism}{rate_label(lr_scale)} seed {seed}")

    lr = the_plan.setup(task).budget.lr * lr_scale
    try:
        run_child({**train_job(task, mechanism, seeds, the_plan.scale, device, lr_scale), "threads": threads}, step,
                  save)
        error = None
    except ChildFailed as err:
        error = err
    for seed in seeds:
        if seed not in done:
            message = str(error) if error else "the run's process printed no result for this seed"
            record = {**new_record(task, mechanism, seed, the_plan.scale, version, lr_scale=lr_scale, lr=lr),
                      "status": "failed", "error": message, "traceback": getattr(error, "log", None),
                      "wall_seconds": since_last()}
            write_json(run_path(out, task, mechanism, seed, the_plan.scale, lr_scale), record)
            summary.failed.append(f"{task}/{mechanism}{rate_label(lr_scale)} seed {seed}")


def _speed(out, mechanism, the_plan: Plan, version, device, summary) -> None:
    record = {"format": FORMAT, "mechanism": mechanism, "length": the_plan.speed_length, "mode": the_plan.scale,
              "version": version, "status": "ok", "result": None, "error": None}
    try:
        record["result"] = run_child(speed_job(mechanism, the_plan.scale, device), None)[-1]
        summary.ran.append(f"speed {mechanism}")
    except ChildFailed as err:
        record.update(status="failed", error=str(err), traceback=err.log)
        summary.failed.append(f"speed {mechanism}")
    write_json(speed_path(out, mechanism, the_plan.scale), record)


def _todo(out, the_plan: Plan, seeds, version, fresh: bool, summary, scales=(1.0,)
          ) -> list[tuple[str, str, list[int], float]]:
    """The (pair, rate) with seeds not saved yet (longest sequences first, so two workers finish together)."""
    todo = []
    for task, mech in the_plan.pairs:
        for scale in scales:
            missing = []
            for seed in seeds or the_plan.setup(task).seeds:
                if not fresh and cached(out, task, mech, seed, the_plan.scale, version, scale):
                    summary.cached.append(f"{task}/{mech}{rate_label(scale)} seed {seed}")
                else:
                    check_writable(run_path(out, task, mech, seed, the_plan.scale, scale))
                    missing.append(seed)
            if missing:
                todo.append((task, mech, missing, scale))
    cost = {s.task: s.budget.steps * s.budget.batch_size * s.make().length ** 2 for s in the_plan.setups}
    return sorted(todo, key=lambda item: -cost[item[0]])


def _speed_todo(out, scale: str, mechanisms, version: str, fresh: bool, summary) -> list[str]:
    """The mechanisms whose speed is not saved yet at ``scale`` and code ``version``."""
    todo = []
    for mech in mechanisms:
        saved = None if fresh else load_speed(speed_path(out, mech, scale), scale=scale, version=version)
        if saved is not None and saved["status"] == "ok":
            summary.cached.append(f"speed {mech}")
        else:
            check_writable(speed_path(out, mech, scale))
            todo.append(mech)
    return todo


def _restricted(the_plan: Plan, pairs) -> Plan:
    """``the_plan`` with only ``pairs`` (task, mechanism), each task at its own setup."""
    wanted: dict[str, list[str]] = {}
    for task, mech in pairs:
        the_plan.setup(task)  # an unknown task is an error here
        wanted.setdefault(task, []).append(mech)
    return replace(the_plan, setups=tuple(replace(s, mechanisms=tuple(dict.fromkeys(wanted[s.task])))
                                          for s in the_plan.setups if s.task in wanted))


def run_suite(out="tour-long", *, scale: str = "default", fresh: bool = False, progress: bool = True,
              command: str | None = None, pairs=None, seeds=None, speed=None, device: str = "cpu",
              workers: int | None = None, lr_sweep: bool = False) -> SuiteSummary:
    """Run every (task, mechanism, seed) and speed measurement of the suite not already saved under ``out``.

    Args:
        out: the report folder.
        scale: ``"default"``, ``"quick"`` or ``"lra"`` (:func:`.suite.plan`; each saved apart).
        fresh: ignore saved runs and run everything again.
        progress: show bars (pairs; with one worker, also the curve points of the running pair).
        command: the command line to record in the report.
        pairs: (task, mechanism) pairs to run instead of the scale's (at the scale's setups).
        seeds: seeds instead of each setup's.
        speed: mechanisms whose speed to measure at the longest length (default: those of the pairs).
        device: where the models train (``"cpu"`` or ``"cuda"``).
        workers: pairs trained at once (default :func:`~attnkit.lab.tour.child.default_workers`).
        lr_sweep: train each pair at :data:`~attnkit.lab.tour.store.LR_SWEEP` times its setup's learning
            rate; the report and its claims read, per pair, the rate with the best mean accuracy over seeds.

    Returns:
        A :class:`SuiteSummary`; failed runs are recorded and reported, not raised.
    """
    start, out = time.perf_counter(), Path(out)
    the_plan = plan(scale)
    if pairs is not None:
        the_plan = _restricted(the_plan, pairs)
    workers = workers or default_workers(device)
    threads = threads_per_worker(workers)  # the pairs together use the cores once
    version = suite_version()
    summary = SuiteSummary(out, the_plan.scale)
    run_seeds = tuple(seeds) if seeds else None
    manifest = start_manifest(
        out, mode=the_plan.scale, keys=[f"{t}/{m}" for t, m in the_plan.pairs],
        seeds=list(run_seeds or the_plan.seeds), version=version,
        command=command or "attnkit.lab.tour.long.run_suite(...)",
        suite=SUITE, speed_length=the_plan.speed_length, device=device, workers=workers,
        budgets={s.task: vars(s.budget) for s in the_plan.setups},
        **({"lr_scales": list(lr_scales(True))} if lr_sweep else {}))
    todo = _todo(out, the_plan, run_seeds, version, fresh, summary, lr_scales(lr_sweep))
    mechanisms = list(dict.fromkeys(m for _, m in the_plan.pairs) if speed is None else speed)
    speed_todo = _speed_todo(out, the_plan.scale, mechanisms, version, fresh, summary)
    with bars(progress and bool(todo or speed_todo), len(todo) + len(speed_todo),
              f"long suite ({the_plan.scale})") as overall:
        def pair(item):
            task, mech, missing, scale = item
            steps, name = len(missing) * (the_plan.evals + 1), f"{task}/{mech}{rate_label(scale)}"
            with bars(progress and workers == 1, steps, name, position=1, per_step=True) as step:
                _train(out, task, mech, missing, the_plan, version, device, step, summary, threads, scale)
            if overall:
                overall(name)

        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(pair, todo))
        for mech in speed_todo:
            _speed(out, mech, the_plan, version, device, summary)
            if overall:
                overall(f"speed {mech}")
    summary.seconds = time.perf_counter() - start
    finish_manifest(out, manifest, summary.seconds)
    return summary
