"""Run one :class:`~.rows.Spec` in a fresh child process, both sides interleaved there.

A long benchmark run leaves its process in a state no user's process is in: a heap
grown and fragmented by gigabyte-sized dense masks of earlier rows, and caches
built for other rows. Rows measured late then differ from the same rows measured
alone (attnkit's block-sparse BigBird row at L = 4096, 2 threads: 0.18x of SDPA
with the dense mask alone, 0.24x after the suite's earlier targets). Each row of
the suite therefore gets its own process, with the parent's thread count and
allocator setting; both sides of a comparison still run interleaved in it.
"""

from __future__ import annotations

import json
import sys

import torch

__all__ = ["run_spec_isolated"]


def run_spec_isolated(spec, *, ceiling: dict, retain_memory: bool = False, profile_misses: bool = True,
                      timeout: float = 3600.0):
    """The rows of ``spec`` measured in a fresh ``python`` child; raises RuntimeError with its stderr on failure."""
    from .child import child_output
    from .rows import Row

    payload = {"spec": spec.to_json(), "ceiling": ceiling, "threads": torch.get_num_threads(),
               "retain": retain_memory, "profile": profile_misses}
    try:
        line = child_output("attnkit.lab.benchmarking.isolated", payload, timeout)
    except RuntimeError as err:
        raise RuntimeError(f"the child measuring {spec.label!r} failed: {err}") from None
    return [Row(**row) for row in json.loads(line)]


def main(payload: str) -> None:
    from ...runtime import retain_freed_memory
    from .rows import Spec, run_spec

    data = json.loads(payload)
    torch.set_num_threads(data["threads"])
    if data["retain"]:
        retain_freed_memory()
    rows = run_spec(Spec.from_json(data["spec"]), ceiling=data["ceiling"], profile_misses=data["profile"])
    print(json.dumps([row.__dict__ for row in rows]))


if __name__ == "__main__":
    main(sys.argv[1])
