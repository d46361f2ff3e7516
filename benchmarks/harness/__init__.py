"""The benchmark suite's harness: one row of BENCHMARKS.md measured, checked and rendered.

- :mod:`.rows`: :class:`~.rows.Spec` (a case, comparisons, targets) and :func:`~.rows.run_spec`
  (both sides timed interleaved, outputs and gradients compared, one :class:`~.rows.Row` each).
- :mod:`.methods`: the two sides of a comparison (attnkit, and SDPA / eager / fp32 / ...);
  :mod:`.flex` (compiled FlexAttention) and :mod:`.additive` (Bahdanau attention).
- :mod:`.check`: the timed call and the correctness check; :mod:`.profiling`: top operators of a miss.
- :mod:`.child`: peak memory of one side, and :mod:`.isolated`: a whole spec, each in a fresh process.
- :mod:`.machine`: CPU, versions, matmul ceiling; :mod:`.report`: the Markdown tables.

Built on :mod:`attnkit.analysis.timing` (:class:`~attnkit.analysis.timing.Case`, interleaved
timing) and :mod:`attnkit.analysis.patterns` (mask and bias texts), which stay in the package
for ``attnkit bench``. ``benchmarks/run.py`` runs the suite; ``attnkit bench --compare`` runs one row.
"""
