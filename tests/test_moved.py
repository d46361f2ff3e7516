"""attnkit._moved: the lab's old import paths warn and give the very modules at the new paths."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest

from attnkit import _moved


def _forget(monkeypatch, *names):
    """Drop the old names from sys.modules, so their next import goes through the finder again."""
    for name in names:
        monkeypatch.delitem(sys.modules, name, raising=False)


def test_an_old_submodule_path_warns_and_is_the_module_at_the_new_path(monkeypatch):
    import attnkit.lab.viz.maps

    _forget(monkeypatch, "attnkit.viz", "attnkit.viz.maps")
    with pytest.warns(DeprecationWarning) as caught:
        import attnkit.viz.maps
    assert {str(w.message).partition(";")[0] for w in caught} == {
        "attnkit.viz moved to attnkit.lab.viz", "attnkit.viz.maps moved to attnkit.lab.viz.maps"}
    assert sys.modules["attnkit.viz.maps"] is attnkit.lab.viz.maps
    assert sys.modules["attnkit.viz"] is attnkit.lab.viz


def test_from_an_old_package_import_gives_the_same_objects(monkeypatch):
    from attnkit.lab.tour import catalogue as new
    from attnkit.lab.tour import experiments as new_experiments

    _forget(monkeypatch, "attnkit.tour", "attnkit.tour.catalogue")
    with pytest.warns(DeprecationWarning, match=r"attnkit\.tour moved to attnkit\.lab\.tour"):
        from attnkit.tour import catalogue, experiments
    assert catalogue is new and experiments is new_experiments


@pytest.mark.parametrize("old", sorted(_moved.MOVED))
def test_every_old_path_imports_with_a_warning(monkeypatch, old):
    import importlib

    _forget(monkeypatch, old)
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {_moved.MOVED[old]}"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(_moved.MOVED[old])


def test_new_paths_and_the_library_raise_no_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        import attnkit.lab.viz
        import attnkit.masks  # noqa: F401
    assert _moved.new_name("attnkit.masks") is None and _moved.new_name("attnkit.vizier") is None


def test_the_warning_points_at_the_importing_code():
    code = "import warnings; warnings.simplefilter('always')\nimport attnkit.analysis\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "<string>:2: DeprecationWarning: attnkit.analysis moved to attnkit.lab.analysis" in done.stderr
