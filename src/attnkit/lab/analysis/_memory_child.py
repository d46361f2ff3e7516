"""Child process for :func:`attnkit.lab.analysis.timing.peak_memory`: run one method once, print bytes added.

The peak is reset (:func:`attnkit.lab.analysis.memory.reset_peak`) just before the call, so
the import of torch and the inputs do not count.
"""

import json
import sys

import torch

from attnkit.lab.analysis.memory import peak_bytes, reset_peak
from attnkit.lab.analysis.timing import Case, methods, with_backward


def main(spec_text: str) -> None:
    spec = json.loads(spec_text)
    case = Case(**spec["case"])
    q, k, v = case.inputs()
    fn = methods(case, q, k, v, spec["backends"])[spec["method"]]
    call = with_backward(fn, (q, k, v)) if case.backward else fn
    with torch.set_grad_enabled(case.backward):
        base = reset_peak(case.device)
        call()
        print(peak_bytes(case.device) - base)


if __name__ == "__main__":
    main(sys.argv[1])
