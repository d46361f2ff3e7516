"""pyproject.toml: what the wheel and the sdist built from a clean copy of the project ship (slow: runs setuptools)."""

from __future__ import annotations

import email
import importlib.metadata
import os
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


def installed_wheel(tmp_path: Path, *packages: str) -> tuple[Path, dict]:
    """A fresh virtual environment holding torch 2.13.0, this checkout's wheel and ``packages`` (from PyPI), and
    the environment to run its programs in a folder outside the checkout: ``(venv, env)``."""
    dist, venv = tmp_path / "dist", tmp_path / "venv"
    project = _clean_copy(tmp_path / "project")
    run = lambda *argv: subprocess.run(argv, check=True, capture_output=True, text=True, timeout=900)
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(dist), str(project))
    run(sys.executable, "-m", "venv", str(venv))
    pip = str(venv / "bin" / "pip")
    run(pip, "install", "--quiet", "torch==2.13.0")
    run(pip, "install", "--quiet", "--no-deps", str(next(dist.glob("attnkit-*.whl"))))
    if packages:
        run(pip, "install", "--quiet", *packages)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"OMP_NUM_THREADS": "1"}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return venv, env


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
    assert set(meta.get_all("Provides-Extra")) >= {"plot", "cli", "hf", "dev", "all", "docs", "onnx"}
    assert any(url.startswith("Repository, ") for url in meta.get_all("Project-URL"))
    assert f"Documentation, {project['urls']['Documentation']}" in meta.get_all("Project-URL")


@pytest.mark.slow
def test_sdist_ships_the_licence_changelog_and_sources(built):
    _, sdist = built
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {"LICENSE", "CHANGELOG.md", "README.md", "pyproject.toml", "src/attnkit/py.typed"} <= names


@pytest.mark.slow
def test_sdist_ships_the_package_and_no_tests_that_could_not_run(built):
    """setuptools adds tests/test*.py to an sdist by itself; without conftest, helpers and the repository they
    cannot run, so MANIFEST.in prunes them: the sdist holds the package and the project's top-level files only."""
    _, sdist = built
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n and tar.getmember(n).isfile()}
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/"))], sorted(names)
    outside = {n for n in names if not n.startswith(("src/attnkit/", "src/attnkit.egg-info/"))}
    assert outside == {"LICENSE", "CHANGELOG.md", "README.md", "pyproject.toml", "MANIFEST.in", "PKG-INFO",
                       "setup.cfg"}, sorted(outside)
    shipped = {n.removeprefix("src/") for n in names if n.startswith("src/attnkit/") and n.endswith(".py")}
    package = {str(p.relative_to(ROOT / "src")) for p in (ROOT / "src" / "attnkit").rglob("*.py")}
    assert shipped == package


def test_the_onnx_extra_holds_what_the_readme_export_needs_at_the_tested_versions():
    extras = _project()["optional-dependencies"]
    assert sorted(extras["onnx"]) == ["onnx==1.23.2", "onnxruntime==1.32.0", "onnxscript==0.7.2"]
    assert "attnkit[onnx]" in extras["dev"]  # the tests run the versions the extra installs
    for requirement in extras["onnx"]:
        name, version = requirement.split("==")
        assert importlib.metadata.version(name) == version  # this environment has what the extra pins


def test_read_the_docs_builds_the_site_as_make_docs_does():
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load((ROOT / ".readthedocs.yaml").read_text(encoding="utf-8"))
    assert config["version"] == 2 and config["sphinx"] == {"configuration": "docs/site/conf.py",
                                                           "fail_on_warning": True}
    assert (ROOT / config["sphinx"]["configuration"]).is_file()
    assert "-W" in (ROOT / "Makefile").read_text(encoding="utf-8")  # make docs: warnings are errors there too
    python = config["build"]["tools"]["python"]
    floor = _project()["requires-python"].removeprefix(">=")
    assert tuple(map(int, python.split("."))) >= tuple(map(int, floor.split(".")))
    (install,) = config["python"]["install"]
    extras = _project()["optional-dependencies"]
    assert install["method"] == "pip" and install["path"] == "."
    assert set(install["extra_requirements"]) == {"all", "docs"} and {"all", "docs"} <= set(extras)
    assert any("torch==" in job and "/whl/cpu" in job for job in config["build"]["jobs"]["pre_install"])
    assert _project()["urls"]["Documentation"].startswith("https://attnkit.readthedocs.io")


def test_mypy_checks_the_whole_package_and_silences_only_named_codes_of_named_modules():
    mypy = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mypy"]
    assert "src/attnkit" in mypy["files"] and "tests/typing/public_api.py" in mypy["files"]
    assert not {"ignore_errors", "disable_error_code"} & mypy.keys()  # nothing turned off for the whole package
    for override in mypy.get("overrides", []):
        assert set(override) == {"module", "disable_error_code"} and override["disable_error_code"], override
        assert all(not m.endswith("*") for m in override["module"])  # modules by name, no wildcard
