"""The package's structure: no import circle among the modules of src/attnkit.

Every ``import`` and ``from ... import`` in a module (at the top or inside a function, which
still ties the two files together) is an arrow from that module to the module it names. A
package's ``__init__`` re-exporting its own submodules is not counted (``attnkit.nn`` importing
``attnkit.nn.linear``), nor is an import of a package from inside it for a name its ``__init__``
holds (the arrow goes to the ``__init__``, which is then excluded as a re-export hub). Any other
circle fails the test, naming its files.
"""

from __future__ import annotations

import ast
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
