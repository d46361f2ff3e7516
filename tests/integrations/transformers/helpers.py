"""Tiny seeded transformers models, built twice with the same weights: one eager, one on attnkit."""

import copy

import torch

import attnkit.integrations.transformers  # noqa: F401  (registers "attnkit")

VOCAB = 97


def twins(model_class, config, implementation="attnkit"):
    """``(eager, attnkit)`` models of ``model_class`` with equal weights, in eval mode."""
    torch.manual_seed(0)
    eager = model_class(copy.deepcopy(config)).eval()
    other = model_class(copy.deepcopy(config)).eval()
    other.load_state_dict(eager.state_dict())
    eager.set_attn_implementation("eager")
    other.set_attn_implementation(implementation)
    return eager, other


def tokens(batch=2, length=12, seed=1):
    return torch.randint(3, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def left_padded(batch=2, length=12, pad=4):
    keep = torch.ones(batch, length, dtype=torch.long)
    keep[1, :pad] = 0
    return keep


def right_padded(batch=2, length=12, pad=3):
    keep = torch.ones(batch, length, dtype=torch.long)
    keep[1, length - pad:] = 0
    return keep


def main_output(out):
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def assert_same_outputs(eager, other, attention_mask=None, atol=1e-5, **inputs):
    """Outputs (at real tokens) and, with ``output_attentions``, every layer's weights (at real queries) agree."""
    with torch.no_grad():
        a = eager(**inputs, attention_mask=attention_mask, output_attentions=True)
        b = other(**inputs, attention_mask=attention_mask, output_attentions=True)
    real = torch.ones(main_output(a).shape[:2], dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    torch.testing.assert_close(main_output(b)[real], main_output(a)[real], rtol=0, atol=atol)
    assert len(a.attentions) == len(b.attentions) > 0
    for wa, wb in zip(a.attentions, b.attentions, strict=True):
        assert wb is not None and wb.shape == wa.shape
        rows = real[:, None, :, None].expand_as(wa)
        torch.testing.assert_close(wb[rows], wa[rows], rtol=0, atol=atol)
