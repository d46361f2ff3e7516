#!/usr/bin/env bash
# The GPU check, one script for a machine with one NVIDIA GPU (run from anywhere):
#   1. checks that torch sees the GPU and installs what the run needs (pytest; attnkit from this checkout);
#   2. runs the tests marked cuda (torch-sdpa, the lane and flex on CUDA against the float64 oracle, the
#      FlexAttention front end), at most TEST_BUDGET seconds;
#   3. measures the GPU rows (benchmarks/gpu/rows.py) for at most ROW_BUDGET seconds, each row saved as it
#      finishes in benchmarks/results/gpu/rows.json, and writes BENCHMARKS.md's GPU section from that file.
# Within 8 minutes with the defaults. Where $OUT is set (a folder that is copied back), the results, the section
# and the logs are copied there too. Nothing here asserts a time: the targets are recorded in the table.
set -u
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
TEST_BUDGET=${TEST_BUDGET:-240}
ROW_BUDGET=${ROW_BUDGET:-180}
LOGS=benchmarks/results/gpu
mkdir -p "$LOGS"

if ! "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "check.sh: torch sees no CUDA GPU here ($("$PYTHON" -c 'import torch; print(torch.__version__)' 2>&1))" >&2
    exit 2
fi
"$PYTHON" -c "import pytest" 2>/dev/null || "$PYTHON" -m pip install --quiet pytest hypothesis \
    || echo "check.sh: pytest could not be installed; the tests will not run" >&2
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}"   # this checkout's attnkit, no install needed
"$PYTHON" -c "import torch, attnkit; print('attnkit', attnkit.__version__, 'torch', torch.__version__, \
torch.cuda.get_device_name(0))" | tee "$LOGS/machine.txt"

# 2. the tests marked cuda (their files only: the CPU suite runs elsewhere)
timeout "$TEST_BUDGET" "$PYTHON" -m pytest -m cuda -q -p no:cacheprovider -o addopts="" -rs \
    tests/kernels/test_sdpa.py tests/kernels/test_flex.py tests/test_flex.py 2>&1 | tee "$LOGS/tests.log"
tests_rc=${PIPESTATUS[0]}

# 3. the rows, then the section
timeout $((ROW_BUDGET + 60)) "$PYTHON" -m benchmarks.gpu.run --budget "$ROW_BUDGET" 2>&1 | tee "$LOGS/rows.log"
"$PYTHON" -m benchmarks.gpu.run --report BENCHMARKS.md

if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT/gpu"
    cp "$LOGS"/* "$OUT/gpu/" 2>/dev/null
    cp BENCHMARKS.md "$OUT/gpu/BENCHMARKS.md"
fi
echo "check.sh: tests exit status $tests_rc; rows in $LOGS/rows.json; BENCHMARKS.md's GPU section rewritten"
exit "$tests_rc"
