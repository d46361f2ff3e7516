"""Every text family of transformers runs on "attnkit" equal to "eager", or is refused as the guide says.

The families come from transformers itself (families.py); the refusals from the one table in the
guide's transformers section (docs/guide/integrations.md), so a family refused for a reason the guide does not
state fails, and so does a stale row (a family the guide lists that runs, or that transformers no longer has).
Only families whose own code reads the mask build its dense form. The whole enumeration is marked
slow; the quick test runs one family of each convention and the families that read the mask.
"""

import re

import pytest

import attnkit
from attnkit.integrations.transformers import ModelMask
from tests.user_docs import guide

from .families import compare_with_eager, families

FAMILIES = families()
# Their own code reads the mask: sparse-attention indexers, an encoder adding it to its scores, dynamic masks.
# Only they build its dense form.
READS_THE_MASK = ("deepseek_v32", "glm_moe_dsa", "axk2", "dots3_note_text", "hy_v4", "qwen4_exp_text",
                  "bigbird_pegasus", "doge", "deepseek_v4")  # V4 extends the mask tensor with its compressed keys
QUICK = [
    "llama", "mistral", "gemma2", "gpt2", "qwen3_next", "deepseek_v3", "llama4_text",  # decoders
    "bert", "modernbert", "t5", "bart",  # encoders, encoder-decoders
    "gpt_oss", "deepseek_v4", "inkling2_text",  # sinks per head (passed on), a compressor, sinks per token
    *READS_THE_MASK,
]


def refusals() -> dict[str, list[str]]:
    """``family -> the keywords of its reason``, from the README's table of refused families."""
    section = guide("integrations").split("## In transformers models", 1)[1].split("\n## ", 1)[0]
    table = section.split("| Refused because |", 1)[1]
    rows = {}
    for line in table.splitlines()[2:]:
        if not line.startswith("|"):
            break
        names, reason = line.strip("|").split("|")
        for name in re.findall(r"`([^`]+)`", names):
            rows[name] = re.findall(r"`([^`]+)`", reason)
    return rows


REFUSED = refusals()


def _check(family, monkeypatch):
    head, model_class = FAMILIES[family]
    built = []
    real = ModelMask.dense
    monkeypatch.setattr(ModelMask, "dense", lambda self: built.append(family) or real(self))
    if family not in REFUSED:
        compare_with_eager(family, head, model_class)
    else:
        keywords = "|".join(map(re.escape, REFUSED[family]))
        with pytest.raises(attnkit.UnsupportedFeature, match=keywords):
            compare_with_eager(family, head, model_class)
    assert family in READS_THE_MASK or not built, f"{family} built a dense mask"


def test_the_families_come_from_transformers():
    assert len(FAMILIES) > 150
    assert {"llama", "bert", "t5", "gemma3_text", "deepseek_v32"} <= set(FAMILIES)
    assert not {"gemma3", "whisper", "llava", "bloom"} & set(FAMILIES)  # multimodal, or no attention interface
    assert set(REFUSED) <= set(FAMILIES), "the README refuses families transformers does not have"
    assert set(QUICK) <= set(FAMILIES)


@pytest.mark.parametrize("family", QUICK)
def test_one_family_of_each_convention(family, monkeypatch):
    _check(family, monkeypatch)


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family(family, monkeypatch):
    _check(family, monkeypatch)
