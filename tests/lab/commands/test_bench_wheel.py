"""``attnkit bench`` offers what ships: no module of the package reaches for a checkout's ``benchmarks/``, and
every ``attnkit bench`` form the README and its guides show runs from an installed wheel, in a folder outside
the checkout.

The wheel test is slow (it builds the wheel, makes a fresh virtual environment with the CPU
torch wheel from this machine's disk, and compiles FlexAttention and the whole models at tiny
sizes: minutes). Run it with
``.venv/bin/python -m pytest -m slow tests/lab/commands/test_bench_wheel.py``.
"""

from __future__ import annotations

import ast
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.test_packaging import ROOT, installed_wheel
from tests.user_docs import every_document

SRC = ROOT / "src" / "attnkit"
TINY_MODELS = ("batch=2,length=12,window_length=16,window=3,width=16,heads=2,layers=1,vocab=23,prompt=4,"
               "new_tokens=3,gen_batch=1")
WINDOW = ["--mask", "sliding_window(4, 4)"]
SMALL = ["--q-len", "64", "--heads", "2", "--head-dim", "8", "--repeats", "1"]
# Each form of the README (its mode flags) at tiny sizes.
FORMS = {
    "": [*SMALL, *WINDOW, "--memory"],
    "--compare": ["--compare", "flex", *SMALL, *WINDOW],
    "--compile --compare": ["--compile", "--compare", "compiled-sdpa-mask,attnkit-eager", *SMALL, *WINDOW,
                            "--threads", "1"],
    "--roofline": ["--roofline", "128", "--heads", "2", "--head-dim", "8", "--repeats", "2"],
    "--models --compiled": ["--models", "all", "--compiled", "--model-sizes", TINY_MODELS, "--repeats", "1"],
    "--distributed": ["--distributed", "--procs", "2", "--q-len", "32", "--heads", "2", "--head-dim", "4",
                      "--repeats", "1"],
}
MODE_FLAGS = ("--compare", "--compile", "--roofline", "--models", "--compiled", "--distributed")


def _reaches_for_a_checkout(tree: ast.AST) -> list[str]:
    """The lines of a module that import ``benchmarks`` (by statement or by name) or touch ``sys.path``."""
    found = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        elif isinstance(node, ast.Call) and node.args and getattr(node.func, "attr", getattr(node.func, "id", "")) \
                in ("import_module", "__import__"):
            first = node.args[0]
            text = first.values[0] if isinstance(first, ast.JoinedStr) and first.values else first
            names = [text.value] if isinstance(text, ast.Constant) and isinstance(text.value, str) else []
        elif isinstance(node, ast.Attribute) and node.attr == "path" and getattr(node.value, "id", "") == "sys":
            found.append(f"line {node.lineno}: sys.path")
        found += [f"line {node.lineno}: imports {n}" for n in names if n.split(".")[0] == "benchmarks"]
    return found


def test_no_module_of_the_package_imports_benchmarks_or_edits_sys_path():
    offenders = {str(path.relative_to(SRC)): found for path in sorted(SRC.rglob("*.py"))
                 if (found := _reaches_for_a_checkout(ast.parse(path.read_text(encoding="utf-8"))))}
    assert offenders == {}


def test_the_check_sees_each_way_of_reaching_for_a_checkout():
    code = ("import sys\nsys.path.insert(0, 'x')\nfrom benchmarks.harness import rows\nimport benchmarks\n"
            "importlib.import_module(f'benchmarks.{name}')\n__import__('benchmarks.ceiling')\n"
            "import benchmarking\nfrom attnkit.lab.benchmarking import rows\n")
    lines = sorted(int(found.split(":")[0].removeprefix("line ")) for found in _reaches_for_a_checkout(ast.parse(code)))
    assert lines == [2, 3, 4, 5, 6]


def readme_bench_forms() -> set[str]:
    """The mode flags of every ``attnkit bench`` command the README shows (code blocks and inline code)."""
    text = every_document()
    forms = set()
    for command in re.findall(r"attnkit bench\b([^`\n]*(?:\n(?!\n)[^`\n]*)?)", text):
        words = shlex.split(command.split("#")[0].replace("\n", " "))
        forms.add(" ".join(w for w in words if w in MODE_FLAGS))
    return forms


def test_the_wheel_test_covers_every_form_the_readme_shows():
    assert readme_bench_forms() <= set(FORMS), readme_bench_forms() - set(FORMS)


@pytest.mark.slow
def test_every_readme_form_of_bench_runs_from_an_installed_wheel(tmp_path):
    work = tmp_path / "elsewhere"
    work.mkdir()
    venv, env = installed_wheel(tmp_path, "tqdm")
    run = lambda *argv, **kw: subprocess.run(argv, check=True, capture_output=True, text=True, **kw)
    where = run(str(venv / "bin" / "python"), "-c", "import attnkit; print(attnkit.__file__)", cwd=work, env=env)
    assert Path(where.stdout.strip()).is_relative_to(venv)  # the installed package, not the checkout's src/
    for form, argv in FORMS.items():
        done = subprocess.run([str(venv / "bin" / "attnkit"), "bench", *argv], cwd=work, env=env,
                              capture_output=True, text=True, timeout=1200)
        assert done.returncode == 0, f"attnkit bench {form}: {done.stderr[-2000:]}"
        assert "| " in done.stdout and "Traceback" not in done.stderr, form
