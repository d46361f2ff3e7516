"""The GPU check: the tests marked ``cuda`` and the GPU rows of BENCHMARKS.md, run by ``check.sh`` on one GPU."""
