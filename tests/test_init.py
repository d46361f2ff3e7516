"""attnkit/__init__.py: the version comes from the package metadata, whose one source is pyproject.toml."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import tomllib

import attnkit

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def _declared_version() -> str:
    return tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]["version"]


def test_version_is_the_installed_metadata_and_the_pyproject_number():
    assert attnkit.__version__ == metadata.version("attnkit")
    assert attnkit.__version__ == _declared_version()


def test_a_source_tree_without_metadata_reads_pyproject(monkeypatch):
    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(attnkit._metadata, "version", not_installed)
    assert attnkit._version() == _declared_version()
