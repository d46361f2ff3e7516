"""The one writer of a Markdown report's sections (BENCHMARKS.md): the text between a section's markers.

Each script of the repository's ``benchmarks/`` owns one section, ``<!-- NAME:start -->``
... ``<!-- NAME:end -->``, with its ``## heading`` just above the start marker. Writing
replaces what is between the markers and keeps every other byte of the file (the other
sections, notes written by hand); a section not in the file yet is appended under its heading.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["markers", "replace_section", "write_section", "emit"]

NEW_FILE = "# Benchmarks\n"


def markers(name: str) -> tuple[str, str]:
    """``("<!-- NAME:start -->", "<!-- NAME:end -->")``."""
    return f"<!-- {name}:start -->", f"<!-- {name}:end -->"


def replace_section(doc: str, name: str, text: str, title: str) -> str:
    """``doc`` with section ``name`` holding ``text`` (appended under ``## title`` when it has no such section).

    Example:
        >>> doc = replace_section("# B\\n", "x", "one", "X")
        >>> doc
        '# B\\n\\n## X\\n\\n<!-- x:start -->\\none\\n<!-- x:end -->\\n'
        >>> replace_section(doc, "x", "two", "X") == doc.replace("one", "two")
        True
    """
    start, end = markers(name)
    block = f"{start}\n{text.strip(chr(10))}\n{end}"
    if start in doc and end in doc.split(start, 1)[1]:
        head, rest = doc.split(start, 1)
        return head + block + rest.split(end, 1)[1]
    return doc.rstrip("\n") + f"\n\n## {title}\n\n{block}\n"


def write_section(path: Path, name: str, text: str, title: str) -> None:
    """:func:`replace_section` on the file at ``path`` (created, with a ``# Benchmarks`` title, if missing)."""
    path = Path(path)
    doc = path.read_text(encoding="utf-8") if path.exists() else NEW_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(replace_section(doc, name, text, title), encoding="utf-8")


def emit(text: str, path: Path | None, name: str, title: str) -> int:
    """A benchmark script's ending: print the section's text, write it into ``path`` if given; exit status 0."""
    print(text)
    if path:
        write_section(path, name, text, title)
    return 0
