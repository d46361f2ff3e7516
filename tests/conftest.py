import pytest
import torch

from attnkit import runtime

# Tests use tiny tensors, where OpenMP's thread start-up costs more than the work
# (and thrashes when the machine is shared); one thread keeps the suite fast.
torch.set_num_threads(1)
torch.manual_seed(0)


@pytest.fixture
def mode():
    """``mode(name)`` sets attnkit.runtime's low-precision mode for one test, then back to "auto"."""
    def force(name):
        runtime.set_low_precision_math(name)
    yield force
    runtime.set_low_precision_math("auto")


# Tests marked cuda need one CUDA GPU, nccl two and torch's NCCL backend; without them they are skipped, with the
# command that runs them where the hardware is (benchmarks/gpu/check.sh runs the cuda ones).
_GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
_NEEDS = {"cuda": (_GPUS >= 1, "needs a CUDA GPU: run `python -m pytest -m cuda` on a machine with one "
                                "(benchmarks/gpu/check.sh)"),
          "nccl": (_GPUS >= 2 and torch.distributed.is_available() and torch.distributed.is_nccl_available(),
                   "needs two CUDA GPUs and NCCL: run `python -m pytest -m nccl` on a machine with them")}


def pytest_collection_modifyitems(config, items):
    for item in items:
        for marker, (present, reason) in _NEEDS.items():
            if marker in item.keywords and not present:
                item.add_marker(pytest.mark.skip(reason=reason))
