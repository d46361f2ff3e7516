"""The one section writer of BENCHMARKS.md (attnkit.lab.benchmarking.sections): every other byte stays."""

from __future__ import annotations

from attnkit.lab.benchmarking.sections import markers, replace_section, write_section

DOC = """# Benchmarks

## Benchmark suite

<!-- suite:start -->
old suite
<!-- suite:end -->

## Scaling

<!-- scaling:start -->
| a | b |
<!-- scaling:end -->

## Notes written by hand

before and after, kept
"""


def test_a_section_is_replaced_and_every_other_byte_kept():
    new = replace_section(DOC, "suite", "new suite\n| x |", "Benchmark suite")
    assert new == DOC.replace("old suite", "new suite\n| x |")
    assert replace_section(new, "suite", "new suite\n| x |", "Benchmark suite") == new  # idempotent


def test_a_missing_section_is_appended_under_its_heading():
    new = replace_section(DOC, "models", "| m |", "Whole models")
    start, end = markers("models")
    assert new.startswith(DOC.rstrip("\n")) and new.endswith(f"\n\n## Whole models\n\n{start}\n| m |\n{end}\n")
    assert replace_section(new, "models", "| n |", "Whole models").count("## Whole models") == 1


def test_an_end_marker_before_the_start_does_not_count():
    start, end = markers("x")
    doc = f"# B\n{end}\n{start}\nold\n"  # no end after the start: the section is absent
    assert replace_section(doc, "x", "new", "X").endswith(f"## X\n\n{start}\nnew\n{end}\n")


def test_write_section_creates_the_file_with_its_title(tmp_path):
    path = tmp_path / "out" / "BENCHMARKS.md"
    write_section(path, "suite", "rows", "Benchmark suite")
    write_section(path, "suite", "rows again", "Benchmark suite")
    start, end = markers("suite")
    assert path.read_text() == f"# Benchmarks\n\n## Benchmark suite\n\n{start}\nrows again\n{end}\n"


def test_emit_prints_the_text_and_writes_the_section_only_when_given_a_path(tmp_path, capsys):
    from attnkit.lab.benchmarking.sections import emit

    path = tmp_path / "B.md"
    assert emit("rows", None, "suite", "Benchmark suite") == 0
    assert capsys.readouterr().out == "rows\n" and not path.exists()
    assert emit("rows", path, "suite", "Benchmark suite") == 0
    assert capsys.readouterr().out == "rows\n"
    assert replace_section(path.read_text(encoding="utf-8"), "suite", "rows", "Benchmark suite") == path.read_text(
        encoding="utf-8")
    assert "rows" in path.read_text(encoding="utf-8")
