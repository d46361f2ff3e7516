"""The README's section on using attnkit inside transformers and torch models runs as written."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
SECTION = "## Use attnkit inside transformers and torch models"


def _examples() -> list[str]:
    text = README.read_text()
    section = text[text.index(SECTION):]
    section = section[:section.index("\n## ", len(SECTION))]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def test_the_section_has_an_example_for_each_library():
    blocks = _examples()
    assert any("attnkit.integrations.transformers" in b for b in blocks)
    assert any("replace_attention" in b for b in blocks)
    assert any("torch.export" in b for b in blocks)


@pytest.mark.slow
@pytest.mark.parametrize("index", range(3))
def test_each_example_runs(index, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the export example writes a file
    exec(compile(_examples()[index], f"README example {index}", "exec"), {})
