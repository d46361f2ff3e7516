"""The documents users read: README.md and the guides in docs/guide/ (the README links each)."""

from __future__ import annotations

import doctest
import os
import re
import socket
import subprocess
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
GUIDES = ROOT / "docs" / "guide"


def guide(stem: str) -> str:
    """The text of ``docs/guide/<stem>.md``."""
    return (GUIDES / f"{stem}.md").read_text(encoding="utf-8")


def every_document() -> str:
    """README.md and every guide, one after the other."""
    return "\n\n".join(path.read_text(encoding="utf-8") for path in [README, *sorted(GUIDES.glob("*.md"))])


class Snippet(NamedTuple):
    """A ``python`` block of a document: its code, the ``text`` block right after it (its expected output, or
    None), and how it runs: ``world`` > 0 under a gloo process group of that many ranks on 127.0.0.1 (the block
    is preceded by ``<!-- snippet: gloo N -->``), each rank printing; rank 0's output is compared."""

    document: str
    index: int
    code: str
    expected: str | None
    world: int


SNIPPET = re.compile(r"(?:<!-- snippet: gloo (\d+) -->\n)?```python\n(.*?)```(?:\n+```text\n(.*?)```)?", re.S)


def snippets(path: Path) -> list[Snippet]:
    """Every ``python`` block of ``path``, in order."""
    text = path.read_text(encoding="utf-8")
    name = path.relative_to(ROOT).as_posix()
    found = enumerate(SNIPPET.finditer(text))
    return [Snippet(name, i, m.group(2), m.group(3), int(m.group(1) or 0)) for i, m in found]


def every_snippet() -> list[Snippet]:
    """The ``python`` blocks of README.md and of every guide."""
    return [s for path in [README, *sorted(GUIDES.glob("*.md"))] for s in snippets(path)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_snippet(snippet: Snippet, python: str, cwd: Path, env: dict[str, str] | None = None,
                timeout: float = 600) -> str:
    """Run ``snippet`` as a user would paste it (``python -c``) in ``cwd``: under a gloo group of ``world`` ranks
    as torchrun starts them (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR=127.0.0.1``, ``MASTER_PORT``); rank 0's
    output. AssertionError with the error's end when a process fails."""
    env = dict(os.environ if env is None else env) | {"OMP_NUM_THREADS": "1"}
    ranks = range(snippet.world or 1)
    if snippet.world:
        env |= {"WORLD_SIZE": str(snippet.world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    procs = [subprocess.Popen([python, "-c", snippet.code], cwd=cwd, text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE,
                              env=env | ({"RANK": str(r), "LOCAL_RANK": str(r)} if snippet.world else {}))
             for r in ranks]
    outs = [p.communicate(timeout=timeout) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0 and "Traceback" not in err, f"{snippet.document} block {snippet.index}: {err[-3000:]}"
    return outs[0][0]


def output_matches(expected: str, got: str) -> bool:
    """Whether ``got`` is the output a document shows (doctest's rules: ``...`` stands for any text, runs of
    blanks compare equal)."""
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    return doctest.OutputChecker().check_output(expected, got, flags)
