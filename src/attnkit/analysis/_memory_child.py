"""Child process for :func:`attnkit.analysis.bench.peak_memory`: run one method once, print bytes added.

Linux only: the peak resident size is reset through ``/proc/self/clear_refs`` just
before the call, so the import of torch and the inputs do not count.
"""

import json
import sys

import torch

from attnkit.analysis.bench import Case, methods, with_backward


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024  # reported in kB
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # Linux: reset the peak resident set size (VmHWM) to the current one


def main(spec_text: str) -> None:
    spec = json.loads(spec_text)
    case = Case(**spec["case"])
    q, k, v = case.inputs()
    fn = methods(case, q, k, v, spec["backends"])[spec["method"]]
    call = with_backward(fn, (q, k, v)) if case.backward else fn
    with torch.set_grad_enabled(case.backward):
        _reset_peak()
        before = _status_bytes("VmRSS")
        call()
        print(_status_bytes("VmHWM") - before)


if __name__ == "__main__":
    main(sys.argv[1])
