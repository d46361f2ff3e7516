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
