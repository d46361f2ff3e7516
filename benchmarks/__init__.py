"""The benchmark suite and scaling scripts that write BENCHMARKS.md, and the harness they share.

A package so that the scripts, ``attnkit bench --compare`` (from a source checkout) and
the tests import the harness as ``benchmarks.harness``; the scripts themselves are run as
``python benchmarks/run.py`` and ``python benchmarks/scaling.py``.
"""
