"""attnkit.lab.benchmarking.plain_gpt: the plain-torch GPT equals TransformerLM, with and without its KV
cache (float64)."""

from __future__ import annotations

import pytest
import torch

from attnkit.lab.benchmarking import whole_models as wm
from attnkit.lab.benchmarking.plain_gpt import PlainGPT
from tests.lab.benchmarking.test_whole_models import TINY


def test_the_plain_model_has_transformer_lm_logits_with_and_without_its_cache():
    lm, plain = wm.transformer_lm(TINY, torch.float64), wm.plain_gpt(TINY, dtype=torch.float64)
    assert sum(p.numel() for p in lm.parameters()) == sum(p.numel() for p in plain.parameters())
    ids = wm.tokens(TINY, 2, 11)
    logits = plain(ids)
    torch.testing.assert_close(logits, lm(ids), rtol=1e-12, atol=1e-12)
    caches = plain.new_caches(2, 11)
    stepped = torch.cat([plain(ids[:, :7], caches)] + [plain(ids[:, i:i + 1], caches) for i in range(7, 11)], 1)
    torch.testing.assert_close(stepped, logits, rtol=1e-10, atol=1e-12)


def test_load_from_lm_refuses_another_shape():
    plain = PlainGPT(TINY.vocab, TINY.width, TINY.heads, TINY.layers + 1, TINY.max_len)
    with pytest.raises(RuntimeError, match="Missing key"):
        plain.load_from_lm(wm.transformer_lm(TINY))
