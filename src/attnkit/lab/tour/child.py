"""One tour run in a fresh process, both sides: :func:`run_child` starts it, :func:`main` is the process.

``python -m attnkit.lab.tour.child '{"key": ..., "seed": ..., "quick": ...}'`` trains one run of the
default tour (with ``"lr_scale"``: at that factor of its learning rate); a job with ``"suite": "long"``
is a job of the long-range suite instead (:func:`attnkit.lab.tour.long.jobs.run_job`: one (task,
mechanism) pair for its seeds, or one speed measurement), which prints one result line per run.

Both runners start one such process per run (or per pair), so the peak memory a run reports is the
growth of a process that no earlier run has used: in a shared process, memory freed by one run is
reused by the next without growing the resident size, and the next run would show 0. The
protocol, on stdout (stderr is merged into it):

    progress <label>     one per curve point, for the progress bar
    result <json>        a finished run: the :class:`~attnkit.lab.tour.Result` as JSON data

Any other line is log; a run that prints no result line failed, and its log is its traceback.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys

__all__ = ["ChildFailed", "run_child", "main", "api", "default_workers", "threads_per_worker", "PROGRESS", "RESULT"]

PROGRESS, RESULT = "progress ", "result "


def api():
    """The experiments API (``experiments``, ``default_set``, ``run``), looked up at call time so tests can patch it."""
    return importlib.import_module("attnkit.lab.tour")


class ChildFailed(RuntimeError):
    """A run in a fresh process ended without a result; the message is its last log line, ``log`` the rest."""

    def __init__(self, message: str, log: str):
        super().__init__(message)
        self.log = log


def default_workers(device: str = "cpu") -> int:
    """Runs trained at once, each in its own process: one per core up to two on the CPU (each at
    :func:`threads_per_worker` threads: one on 2 cores), one on a GPU."""
    return 1 if device != "cpu" else max(1, min(2, os.cpu_count() or 1))


def threads_per_worker(workers: int, threads: int | None = None) -> int:
    """Torch threads for each of ``workers`` runs trained at once: ``threads // workers``, at least 1.

    ``threads`` is the budget of the whole tour (default: this process's torch thread count, which
    ``attnkit tour`` sets to ``--threads`` or all cores), so the runs together never ask for more
    threads than the machine has cores: two workers on 2 cores train at one thread each.

    Example:
        >>> threads_per_worker(2, 2), threads_per_worker(2, 16), threads_per_worker(4, 2), threads_per_worker(1, 6)
        (1, 8, 1, 6)
    """
    import torch

    return max(1, (threads or torch.get_num_threads()) // max(1, workers))


def run_child(job: dict, step, on_result=None) -> list[dict]:
    """``job`` in a fresh process at ``job["threads"]`` torch threads (default: this process's count): its results.

    ``step(label)`` gets each progress line, ``on_result(data)`` each result as it arrives (so a caller
    can save finished runs before the process ends). Raises :class:`ChildFailed` when the process
    fails or prints no result; results printed before a failure were already passed to ``on_result``.
    """
    import torch

    job = {"threads": torch.get_num_threads(), **job}
    log, results = [], []
    with subprocess.Popen([sys.executable, "-m", "attnkit.lab.tour.child", json.dumps(job)], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True) as child:
        assert child.stdout is not None  # stdout=PIPE
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


def main(job: dict) -> None:
    import torch

    torch.set_num_threads(int(job.get("threads") or 1))

    def progress(label: str) -> None:
        print(PROGRESS + " ".join(str(label).split()), flush=True)

    def emit(result) -> None:
        data = result.to_json() if hasattr(result, "to_json") else result
        print(RESULT + json.dumps(json.loads(data) if isinstance(data, str) else data), flush=True)

    if job.get("suite") == "long":
        from .long.jobs import run_job

        run_job(job, progress, emit)
        return
    options = {"device": job["device"]} if job.get("device", "cpu") != "cpu" else {}
    if float(job.get("lr_scale", 1.0)) != 1.0:  # a stand-in API need not know rates it is never asked for
        options["lr_scale"] = float(job["lr_scale"])
    emit(api().run(job["key"], int(job["seed"]), quick=bool(job["quick"]), progress=progress, **options))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
