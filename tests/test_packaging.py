"""pyproject.toml: what the wheel and the sdist built from a clean copy of the project ship (slow: runs setuptools)."""

from __future__ import annotations

import email
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
# What a fresh clone holds that the build reads; tests/ and benchmarks/ are copied too, to show they stay out.
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "CHANGELOG.md", "MANIFEST.in", "src", "tests", "benchmarks")


def _clean_copy(dest: Path) -> Path:
    dest.mkdir()
    for name in SOURCES:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(src, dest / name)
    return dest


def _build(tmp_path: Path) -> tuple[Path, Path]:
    """(wheel, sdist) built with the environment's setuptools (no download: no build isolation)."""
    project, out = _clean_copy(tmp_path / "project"), tmp_path / "dist"
    # setuptools rewrites sys.argv while it builds: the folder is read once, first.
    code = "import sys; from setuptools import build_meta as b; d = sys.argv[1]; b.build_sdist(d); b.build_wheel(d)"
    out.mkdir()
    subprocess.run([sys.executable, "-c", code, str(out)], cwd=project, check=True, capture_output=True, timeout=300)
    return next(out.glob("*.whl")), next(out.glob("*.tar.gz"))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return _build(tmp_path_factory.mktemp("packaging"))


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


@pytest.mark.slow
def test_wheel_ships_the_licence_the_type_marker_and_no_tests(built):
    wheel, _ = built
    names = zipfile.ZipFile(wheel).namelist()
    licence = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
    assert licence, names
    assert zipfile.ZipFile(wheel).read(licence[0]) == (ROOT / "LICENSE").read_bytes()
    assert "attnkit/py.typed" in names
    assert "attnkit/__init__.py" in names
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/"))]
    assert all(n.startswith(("attnkit/", "attnkit-")) for n in names), sorted({n.split("/")[0] for n in names})


@pytest.mark.slow
def test_wheel_metadata_is_pyproject(built):
    wheel, _ = built
    archive = zipfile.ZipFile(wheel)
    meta = email.message_from_bytes(archive.read(next(n for n in archive.namelist() if n.endswith("/METADATA"))))
    project = _project()
    assert meta["Version"] == project["version"]
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta["Requires-Python"] == project["requires-python"]
    assert set(meta.get_all("Provides-Extra")) >= {"plot", "cli", "hf", "dev", "all", "docs"}
    assert any(url.startswith("Repository, ") for url in meta.get_all("Project-URL"))


@pytest.mark.slow
def test_sdist_ships_the_licence_changelog_and_sources(built):
    _, sdist = built
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {"LICENSE", "CHANGELOG.md", "README.md", "pyproject.toml", "src/attnkit/py.typed"} <= names
