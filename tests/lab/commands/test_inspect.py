"""``attnkit explain`` (commands/inspect.py) at sizes no machine could hold, and the mask errors it reports."""

from __future__ import annotations

import subprocess
import sys

import pytest

from attnkit.lab import cli


@pytest.mark.parametrize(("mask", "path"), [("causal()", "torch-sdpa"), ("sliding_window(128, 128)", "band-windows"),
                                            ("causal() & strided(64)", "blocksparse-fused")])
def test_explain_at_a_billion_tokens_allocates_nothing_and_names_the_path(capsys, mask, path):
    assert cli.main(["explain", "--q-len", "1000000000", "--mask", mask]) == 0
    out = capsys.readouterr().out
    assert f"path: {path}" in out and "compiled:" in out


def test_explain_names_the_fast_lane_for_a_decoding_step(capsys):
    assert cli.main(["explain", "--q-len", "1", "--kv-len", "4096", "--mask", "causal()"]) == 0
    assert "lane: fast lane" in capsys.readouterr().out


@pytest.mark.parametrize("text", ["sliding_window(100000000000000000000)", "~" * 5000 + "causal()", "nope()"])
def test_a_bad_mask_is_one_error_line_and_status_2(capsys, text):
    assert cli.main(["explain", "--mask", text]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnkit: error: ") and err.count("\n") == 1 and "Traceback" not in err


def test_a_reader_that_leaves_early_ends_the_command_quietly():
    done = subprocess.run(f"{sys.executable} -m attnkit explain --q-len 64 | head -1", shell=True,
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.startswith("attention(") and "Traceback" not in done.stderr
