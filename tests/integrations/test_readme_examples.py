"""The guide to using attnkit inside transformers and torch models (docs/guide/integrations.md) runs as written,
and so does the README's transformers recipe."""

import re

import pytest

from tests.user_docs import README, guide


def _examples() -> list[str]:
    return re.findall(r"```python\n(.*?)```", guide("integrations"), flags=re.S)


def test_the_readme_recipe_is_the_guides():
    recipe = README.read_text(encoding="utf-8").split("## In transformers models", 1)[1]
    assert re.search(r"```python\n(.*?)```", recipe, flags=re.S).group(1) == _examples()[0]


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
