"""The torchrun examples: attention agrees with one process for every scheme; the language model trains with
the losses of one process (slow)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from attnkit.distributed import SCHEMES
from tests.distributed.spawn import free_port

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "distributed_attention.py"


@pytest.mark.slow
@pytest.mark.parametrize("scheme", SCHEMES)
def test_torchrun_example_matches_one_process(scheme):
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
               str(free_port()), str(EXAMPLE), "--scheme", scheme, "--length", "64"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env={**os.environ,
                                                                                       "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if "on 2 ranks" in x)
    diffs = [float(x) for x in re.findall(r"(?:output|dq|dk|dv) ([0-9.e+-]+)", line)]
    assert len(diffs) == 4 and max(diffs) < 1e-12, line


def test_the_language_model_example_is_the_packages_module_so_a_wheel_has_it():
    import attnkit.lab.sequence_parallel_lm as module

    script = (EXAMPLE.parent / "sequence_parallel_lm.py").read_text(encoding="utf-8")
    assert callable(module.main) and "from attnkit.lab.sequence_parallel_lm import main" in script
    assert "-m attnkit.lab.sequence_parallel_lm" in module.__doc__


@pytest.mark.slow
@pytest.mark.parametrize("target", [["-m", "attnkit.lab.sequence_parallel_lm"], ["examples/sequence_parallel_lm.py"]])
def test_torchrun_language_model_trains_with_the_losses_of_one_process(target):
    if not target[0].startswith("-m"):
        target = [str(EXAMPLE.parents[1] / target[0])]
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4", "--master-port",
               str(free_port()), *target, "--steps", "5"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env={**os.environ,
                                                                                       "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [x for x in done.stdout.splitlines() if x.startswith("step")]
    assert len(steps) == 5
    worst = float(re.search(r"largest loss difference ([0-9.e+-]+)", done.stdout).group(1))
    assert worst <= 1e-10, done.stdout
