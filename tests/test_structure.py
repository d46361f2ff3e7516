"""The package's structure: no import circle among the modules of src/attnkit.

Every ``import`` and ``from ... import`` in a module (at the top or inside a function, which
still ties the two files together) is an arrow from that module to the module it names. A
package's ``__init__`` re-exporting its own submodules is not counted (``attnkit.nn`` importing
``attnkit.nn.linear``), nor is an import of a package from inside it for a name its ``__init__``
holds (the arrow goes to the ``__init__``, which is then excluded as a re-export hub). Any other
circle fails the test, naming its files.

The library (everything outside ``attnkit.lab``) never imports the lab: no arrow points into it, and
importing the library with its registry loads none of it.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import attnkit

SRC = Path(attnkit.__file__).parent


def _module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _imports(path: Path, name: str, modules: set[str]) -> set[str]:
    """The package modules ``path`` imports (relative imports resolved)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            base = base[:len(base) - (node.level - 1)] if node.level else []
            root = ".".join([*base, *(node.module.split(".") if node.module else [])])
            targets = [f"{root}.{alias.name}" for alias in node.names] + [root]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # "pkg.mod.Name" -> "pkg.mod"
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    paths = {_module_name(p): p for p in SRC.rglob("*.py")}
    modules = set(paths)
    graph = {}
    for name, path in paths.items():
        edges = _imports(path, name, modules)
        if path.name == "__init__.py":  # a package re-exporting its own submodules is not an arrow back up
            edges = {e for e in edges if not e.startswith(name + ".")}
        graph[name] = edges
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circle_in_the_package():
    cycles = _cycles(import_graph())
    assert not cycles, "import circles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_the_check_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# ------------------------------------------------------------------------------ the library and the lab

LAB = "attnkit.lab"
LAB_DOORS = {"attnkit.__main__"}  # ``python -m attnkit`` runs the command line, which lives in the lab


def _in_lab(module: str) -> bool:
    return module == LAB or module.startswith(LAB + ".")


def lab_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every arrow from a library module (outside the lab and its doors) into the lab, as ``a -> b``."""
    return sorted(f"{module} -> {target}" for module, targets in graph.items()
                  if not _in_lab(module) and module not in LAB_DOORS for target in targets if _in_lab(target))


def test_the_library_never_imports_the_lab():
    wrong = lab_imports(import_graph())
    assert not wrong, "the library imports the lab: " + "; ".join(wrong)


def test_the_lab_check_finds_an_arrow_into_the_lab():
    graph = {"attnkit.nn.x": {"attnkit.lab.viz"}, "attnkit.lab.tour": {"attnkit.nn.x"},
             "attnkit.__main__": {"attnkit.lab.cli"}}
    assert lab_imports(graph) == ["attnkit.nn.x -> attnkit.lab.viz"]


def test_importing_the_library_and_its_registry_loads_nothing_of_the_lab():
    code = ("import sys, attnkit, attnkit.nn, attnkit.models, attnkit.kernels, attnkit.distributed, attnkit.masks\n"
            "from attnkit import registry\nregistry.entries()\n"
            "print(sorted(m for m in sys.modules if m.startswith('attnkit.lab')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout


def unresolved_imports() -> list[str]:
    """Every ``from X import ...`` in the package whose ``X`` (relative ones resolved) is no module of it."""
    paths = {_module_name(p): p for p in SRC.rglob("*.py")}
    wrong = []
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom) or not (node.level or (node.module or "").startswith("attnkit")):
                continue
            base = package.split(".")
            base = base[:len(base) - (node.level - 1)] if node.level else []
            root = ".".join([*base, *(node.module.split(".") if node.module else [])])
            if root not in paths:
                wrong.append(f"{path.relative_to(SRC.parent)}:{node.lineno} imports from {root}, no module")
    return wrong


def test_every_import_from_the_package_names_one_of_its_modules():
    """A file moved to another depth with its relative imports left as they were fails here, named."""
    wrong = unresolved_imports()
    assert not wrong, "; ".join(wrong)


def test_the_import_check_finds_a_relative_import_left_behind_by_a_move(tmp_path, monkeypatch):
    package = tmp_path / "attnkit"
    (package / "lab" / "tour").mkdir(parents=True)
    for init in (package, package / "lab", package / "lab" / "tour"):
        (init / "__init__.py").write_text("")
    (package / "errors.py").write_text("E = 1\n")
    # tour/runner.py moved to lab/tour/runner.py: its "..errors" now means attnkit.lab.errors
    (package / "lab" / "tour" / "runner.py").write_text("from ...errors import E\nfrom ..errors import E\n")
    monkeypatch.setitem(globals(), "SRC", package)
    assert unresolved_imports() == ["attnkit/lab/tour/runner.py:2 imports from attnkit.lab.errors, no module"]
