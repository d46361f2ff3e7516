"""One tour run in a fresh process: ``python -m attnkit.tour.child '{"key": ..., "seed": ..., "quick": ...}'``.

The runner (:func:`attnkit.tour.runner.tour`) starts one such process per (experiment, seed), so the
peak memory a run reports is the growth of a process that no earlier run has used: in a shared
process, memory freed by one run is reused by the next without growing the resident size, and
the next run would show 0. The protocol, on stdout (stderr is merged into it):

    progress <label>     one per curve point, for the progress bar
    result <json>        the last line: the :class:`~attnkit.tour.Result` as JSON data

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

    result = api().run(job["key"], int(job["seed"]), quick=bool(job["quick"]), progress=progress)
    data = result.to_json()
    print(RESULT + json.dumps(json.loads(data) if isinstance(data, str) else data), flush=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
