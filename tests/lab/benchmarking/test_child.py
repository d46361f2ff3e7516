"""Peak memory of one side of a spec, measured in a fresh child process (attnkit.lab.benchmarking.child)."""

from attnkit.lab.analysis.timing import Case
from attnkit.lab.benchmarking.child import side_peak
from attnkit.lab.benchmarking.rows import Spec


def test_side_peak_counts_the_dense_mask_a_baseline_holds():
    """SDPA given a dense (L, L) bool mask holds it: at L = 2048 that alone is 4 MiB (built after the reset)."""
    spec = Spec(2, "w", Case(batch=1, heads=1, q_len=2048, head_dim=8, mask="sliding_window(8, 8)"), ("sdpa-mask",))
    assert side_peak(spec, "sdpa-mask") > 4 * 2**20
    assert side_peak(spec, "no such side") is None  # a failing child is reported as None, not raised
