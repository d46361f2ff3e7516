"""docs/site/pages.py: the generated pages of the API reference site (links, headings, which modules and
mechanisms get pages). The whole site is built by ``make docs`` (CI), with warnings as errors."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def pages(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("site_pages", ROOT / "docs" / "site" / "pages.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "OUT", tmp_path)
    return module


def test_repository_links_become_pages_local_images_or_stay_absolute(pages, tmp_path):
    repo = pages._repository()
    raw = repo.replace("github.com", "raw.githubusercontent.com")
    text = (f"[design]({repo}/blob/main/docs/DESIGN.md) ![map]({raw}/main/docs/img/heatmap.png) "
            f"[code]({repo}/blob/main/src/attnkit/masks.py) [tour](docs/tour/README.md#table) [web](https://pytorch.org)")
    out = pages._relink(text, "guides/see-and-measure", "README.md")
    assert "[design](../project/design.md)" in out
    assert "![map](../files/docs/img/heatmap.png)" in out
    assert (tmp_path / "files" / "docs" / "img" / "heatmap.png").read_bytes() == \
        (ROOT / "docs" / "img" / "heatmap.png").read_bytes()
    assert f"[code]({repo}/blob/main/src/attnkit/masks.py)" in out
    assert "[tour](../reports/tour.md#table)" in out
    assert "[web](https://pytorch.org)" in out


def test_relative_links_resolve_from_the_source_file(pages):
    out = pages._relink("[the viewer](index.html)", "reports/tour", "docs/tour/README.md")
    assert out == f"[the viewer]({pages._repository()}/blob/main/docs/tour/index.html)"


def test_headings_move_up_outside_code_blocks(pages):
    text = "## Title\n\n### Part\n\n```bash\n## a comment, not a heading\n```\n"
    assert pages._shift_headings(text, -1) == "# Title\n\n## Part\n\n```bash\n## a comment, not a heading\n```\n"


def test_every_readme_section_is_a_guide(pages, tmp_path):
    names = pages.readme_guides()
    sections = [line[3:] for line in (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
                if line.startswith("## ")]
    assert len(names) == len(sections) and "guides/install" in names
    for name, title in zip(names, sections, strict=True):
        assert (tmp_path / f"{name}.md").read_text(encoding="utf-8").startswith(f"# {title}\n")


def test_api_pages_cover_the_public_packages_and_not_the_internal_ones(pages):
    modules = pages.api_modules()
    assert modules[0] == "attnkit"
    assert {"attnkit.nn", "attnkit.models", "attnkit.lab.analysis", "attnkit.lab.viz", "attnkit.masks",
            "attnkit.integrations.torch", "attnkit.integrations.transformers"} <= set(modules)
    assert not {"attnkit.lab.commands", "attnkit.functional", "attnkit.kernels"} & set(modules)
