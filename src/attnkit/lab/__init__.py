"""attnkit's lab: the workbench beside the library.

What is here measures, draws and compares the library's mechanisms; the library itself
(everything in ``attnkit`` outside this package) never imports it.

- ``tour``: ``attnkit tour``, the quality suite's experiments, runs and reports
- ``tasks``: generated learning tasks the tour trains on
- ``analysis``: attention maps recorded from models, their statistics, measured scaling and
  memory, analytic cost tables
- ``viz``: heatmaps, pattern plots, the HTML report
- ``benchmarking``: what ``attnkit bench`` runs and the one writer of BENCHMARKS.md's sections
- ``commands`` and ``cli``: the ``attnkit`` command line; ``progress``: its progress bars
"""
