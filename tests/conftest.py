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
