"""Benchmarks of attnkit against what a torch user would write instead: everything ``attnkit bench`` runs.

- :mod:`.rows`: :class:`~.rows.Spec` (a case, comparisons, targets) and :func:`~.rows.run_spec`
  (both sides timed interleaved, outputs and gradients compared, one :class:`~.rows.Row` each);
  :mod:`.report` renders rows as Markdown.
- :mod:`.methods`: the two sides of a comparison (attnkit, and SDPA / eager / fp32 / ...),
  each a :class:`~.side.Method`; :mod:`.flex` (compiled FlexAttention) and :mod:`.additive`
  (Bahdanau attention).
- :mod:`.check`: the timed call and the correctness check; :mod:`.profiling`: top operators of a miss.
- :mod:`.child`: a fresh Python process per measurement (the peak memory of one side);
  :mod:`.isolated`: a whole spec in a fresh process.
- :mod:`.machine`: CPU, versions and the matmul ceiling; :mod:`.roofline`: each execution
  path's fraction of that ceiling (``attnkit bench --roofline``).
- :mod:`.pairs`: two callables as a ratio per interleaved round; :mod:`.whole_models` and
  :mod:`.plain_gpt`: whole models against the same model in plain torch (``attnkit bench --models``).

Every time is taken by :func:`attnkit.lab.analysis.timing.time_rounds` and every peak by
:mod:`attnkit.lab.analysis.memory`. The repository's ``benchmarks/`` scripts run these and
write BENCHMARKS.md, each its own section (:mod:`.sections`).
"""
