"""One tour run in a fresh process: ``python -m attnkit.tour.child '{"key": ..., "seed": ..., "quick": ...}'``.

A job with ``"suite": "long"`` is a job of the long-range suite instead (:func:`attnkit.tour.long.jobs.run_job`:
one (task, mechanism) pair for its seeds, or one speed measurement), which prints one result line per run.

The runner (:func:`attnkit.tour.runner.tour`) starts one such process per (experiment, seed), so the
peak memory a run reports is the growth of a process that no earlier run has used: in a shared
process, memory freed by one run is reused by the next without growing the resident size, and
the next run would show 0. The protocol, on stdout (stderr is merged into it):

    progress <label>     one per curve point, for the progress bar
    result <json>        a finished run: the :class:`~attnkit.tour.Result` as JSON data

Any other line is log; a run that prints no result line failed, and its log is its traceback.
"""

from __future__ import annotations

import json
import sys

PROGRESS, RESULT = "progress ", "result "


def main(job: dict) -> None:
    import torch

    from .runner import api

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
    emit(api().run(job["key"], int(job["seed"]), quick=bool(job["quick"]), progress=progress))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
