"""Peak memory of one side of a spec, measured in a fresh child process (attnkit.lab.benchmarking.child)."""

from attnkit.lab.analysis.timing import Case
from attnkit.lab.benchmarking.child import run_as_child, side_peak
from attnkit.lab.benchmarking.rows import Spec


def test_side_peak_counts_the_dense_mask_a_baseline_holds():
    """SDPA given a dense (L, L) bool mask holds it: at L = 2048 that alone is 4 MiB (built after the reset)."""
    spec = Spec(2, "w", Case(batch=1, heads=1, q_len=2048, head_dim=8, mask="sliding_window(8, 8)"), ("sdpa-mask",))
    assert side_peak(spec, "sdpa-mask") > 4 * 2**20
    assert side_peak(spec, "no such side") is None  # a failing child is reported as None, not raised


def test_one_json_argument_makes_a_script_the_child(capsys):
    """run_as_child: the payload child_output passes runs the measurement and prints its answer last; any other
    command line is left to the script's own parser."""
    seen = []
    assert run_as_child(lambda payload: seen.append(payload) or 42, ['{"length": 8}'])
    assert seen == [{"length": 8}] and capsys.readouterr().out.splitlines()[-1] == "42"
    for argv in ([], ["--length", "8"], ['{"length": 8}', "--write", "B.md"]):
        assert not run_as_child(lambda payload: seen.append(payload), argv)
    assert len(seen) == 1 and capsys.readouterr().out == ""
