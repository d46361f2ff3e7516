"""Superseded by ``benchmarks/run.py``: the benchmark suite, which now owns BENCHMARKS.md's former core section.

Kept so that ``python benchmarks/core.py [--quick] [--print]`` keeps working; it runs the suite.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root

from benchmarks.run import main

if __name__ == "__main__":
    print("benchmarks/core.py: running the suite, benchmarks/run.py", file=sys.stderr)
    sys.exit(main())
