"""Old name of :mod:`attnkit.analysis.timing`, kept only while ``tests/test_kernels.py`` imports it from here.

Delete this file once that test imports ``Case`` and ``peak_memory`` from :mod:`attnkit.analysis.timing`;
the benchmark suite's harness that used to sit next to it is in ``benchmarks/harness/``.
"""

from .timing import Case, peak_memory

__all__ = ["Case", "peak_memory"]
