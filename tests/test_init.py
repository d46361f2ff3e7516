"""attnkit/__init__.py: the version comes from the package metadata, whose one source is pyproject.toml."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
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


@pytest.mark.parametrize("first", ["", "from attnkit import masks", "import attnkit.bias", "import attnkit.core"])
def test_the_public_names_in_a_fresh_interpreter(first):
    # attnkit loads its torch names on first use: whatever is imported first, attnkit.attention is the function
    code = (f"import attnkit\n{first}\nimport types\n"
            "assert callable(attnkit.attention) and not isinstance(attnkit.attention, types.ModuleType)\n"
            "assert callable(attnkit.explain) and isinstance(attnkit.masks, types.ModuleType)\n"
            "from attnkit import attention, AttentionOutput\nassert callable(attention)\n"
            "import torch\nq = torch.randn(1, 2, 5, 4)\nassert attnkit.attention(q, q, q).shape == q.shape\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
