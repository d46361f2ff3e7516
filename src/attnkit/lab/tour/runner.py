"""Run the default tour: every (experiment, seed) not already saved, each saved as JSON the moment it finishes.

The folder and its records are the run store's (:mod:`attnkit.lab.tour.store`), shared with the long
suite; this module decides what to run: ``out/runs/<mode>/scaling.json`` adds the measured
scaling (default mode only). ``<mode>`` is ``quick`` or ``default``. Each run trains in a fresh
process (:func:`attnkit.lab.tour.child.run_child`), so its peak memory is its own.
"""

from __future__ import annotations

import inspect
import json
import time
import traceback
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ...errors import ArgumentError, check_int
from ..progress import bars
from .child import ChildFailed, api, default_workers, run_child, threads_per_worker
from .store import (
    Summary,
    cached,
    check_writable,
    finish_manifest,
    lr_scales,
    new_record,
    rate_label,
    run_path,
    source_version,
    start_manifest,
    write_json,
)

__all__ = ["tour", "TourSummary", "mode_name", "code_version", "api"]

TourSummary = Summary  # what one call of tour() did


def mode_name(quick: bool) -> str:
    """``"quick"`` or ``"default"``: the cache folder of a budget."""
    return "quick" if quick else "default"


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
    return source_version(sources)


def _as_dict(result) -> dict:
    data = result.to_json()
    return json.loads(data) if isinstance(data, str) else dict(data)


def _run_in_child(key: str, seed: int, quick: bool, step, device: str = "cpu", threads: int | None = None,
                  lr_scale: float = 1.0) -> dict:
    """``api().run(...)`` in a fresh process (:mod:`attnkit.lab.tour.child`) at ``threads``: its result as JSON data."""
    job = {"key": key, "seed": seed, "quick": quick, "device": device}
    if lr_scale != 1.0:
        job["lr_scale"] = lr_scale
    return run_child(job if threads is None else {**job, "threads": threads}, step)[-1]


def _run_one(key: str, exp, seed: int, quick: bool, version: str, step, isolate: bool = True,
             device: str = "cpu", threads: int | None = None, lr_scale: float = 1.0) -> dict:
    """One run as a saved record; an exception is recorded as a failed run, never raised.

    ``isolate``: train in a fresh process, so its peak memory is measured; in this process instead,
    the peak is dropped (None): memory freed by an earlier run would be reused without being counted.
    """
    budget = getattr(exp, "quick" if quick else "budget", None)
    lr = budget.lr * lr_scale if budget is not None and hasattr(budget, "lr") else None
    record = new_record(exp.task, exp.mechanism, seed, mode_name(quick), version, key=key, lr_scale=lr_scale, lr=lr)
    start = time.perf_counter()
    try:
        if isolate:
            result = _run_in_child(key, seed, quick, step, device, threads, lr_scale)
        else:
            options: dict[str, object] = {"device": device} if device != "cpu" else {}  # a stand-in API: no devices
            if lr_scale != 1.0:
                options["lr_scale"] = lr_scale
            result = {**_as_dict(api().run(key, seed, quick=quick, progress=step, **options)), "peak_bytes": None}
        json.dumps(result)  # a result that cannot be saved is a failed run, not a crash of the tour
        record["result"] = result
    except ChildFailed as err:
        record.update(status="failed", error=str(err), traceback=err.log)
    except Exception as err:  # a broken experiment must not stop the tour: it is reported as failed
        record.update(status="failed", error=f"{type(err).__name__}: {err}", traceback=traceback.format_exc())
    record["wall_seconds"] = time.perf_counter() - start
    return record


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
         scaling: bool | None = None, isolate: bool = True, device: str = "cpu",
         workers: int | None = None, lr_sweep: bool = False) -> TourSummary:
    """Run every (experiment, seed) of the tour not already cached under ``out``, caching each as it finishes.

    Args:
        keys: experiment keys (``attnkit.lab.tour.experiments()``); None: ``default_set(quick)``.
        seeds: seeds to run each experiment with.
        quick: the short budget (cached apart from the default one).
        out: the report folder.
        fresh: ignore the cache and run everything again.
        progress: show an overall bar (runs) and a bar per run (steps).
        command: the command line to record in the report (default: "python API").
        scaling: measure the scaling plot's data; None: only in default mode.
        isolate: train each run in a fresh process (:mod:`attnkit.lab.tour.child`), which measures its
            peak memory; False: in this process, with the peak memory left out (None).
        device: where the models train (``"cpu"`` or ``"cuda"``).
        workers: runs trained at once, each in its own process at
            :func:`~attnkit.lab.tour.child.threads_per_worker` threads (this process's thread count divided among
            them, at least 1) (default :func:`~attnkit.lab.tour.child.default_workers`: two on a 2-core CPU, one
            thread each); 1 with ``isolate=False``.
        lr_sweep: train each (experiment, seed) at :data:`~attnkit.lab.tour.store.LR_SWEEP` times its own
            learning rate; the report reads, per experiment, the rate with the best mean accuracy over seeds.

    Returns:
        A :class:`TourSummary`. Failed runs are recorded and reported, not raised.
    """
    start, out = time.perf_counter(), Path(out)
    known = api().experiments()
    keys, seeds = _check(keys, seeds, known, quick)
    mode, version = mode_name(quick), code_version()
    summary = TourSummary(out, mode)
    scales = lr_scales(lr_sweep)
    manifest = start_manifest(out, mode=mode, keys=keys, seeds=seeds, version=version,
                              command=command or "attnkit.lab.tour.runner.tour(...)", device=device,
                              **({"lr_scales": list(scales)} if lr_sweep else {}))
    todo = []
    for key in keys:
        for scale in scales:
            for seed in seeds:
                exp, name = known[key], f"{key}{rate_label(scale)} seed {seed}"
                if not fresh and cached(out, exp.task, exp.mechanism, seed, mode, version, scale):
                    summary.cached.append(name)
                else:
                    path = check_writable(run_path(out, exp.task, exp.mechanism, seed, mode, scale))
                    todo.append((key, seed, scale, name, path))
    workers = 1 if not isolate else workers or default_workers(device)
    threads = threads_per_worker(workers)  # the runs together use the cores once, never more threads than cores
    with bars(progress and bool(todo), len(todo), f"tour ({mode})") as overall:
        def one(item):
            key, seed, scale, name, path = item
            steps = getattr(known[key], "steps", None)
            with bars(progress and workers == 1, steps, name, position=1, per_step=True) as step:
                record = _run_one(key, known[key], seed, quick, version, step, isolate, device, threads, scale)
            write_json(path, record)
            (summary.ran if record["status"] == "ok" else summary.failed).append(name)
            if overall:
                overall(f"{name}: {record['status']}")

        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(one, todo))
    if scaling if scaling is not None else not quick:
        from .report.scaling import measure
        measure(out, [known[k] for k in keys], mode=mode, version=version, fresh=fresh, progress=progress)
    summary.seconds = time.perf_counter() - start
    finish_manifest(out, manifest, summary.seconds)
    return summary
