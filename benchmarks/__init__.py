"""The scripts that write BENCHMARKS.md: the suite, scaling, overhead, ceiling and model sections.

The measuring code is the package's :mod:`attnkit.lab.benchmarking` (what ``attnkit bench``
runs); these scripts choose the rows, add their notes and write each section. A package
so that ``python -m benchmarks.<script>`` and the tests import them; ``python
benchmarks/run.py`` and the other documented file paths run them too.
"""
