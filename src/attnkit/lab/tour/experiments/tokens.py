"""Token-tagging experiments (MQAR, selective copy): a causal Transformer LM with a chosen self-attention."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .... import masks
from ....models import TransformerLM
from ....nn.linear import LinearAttention, PerformerAttention
from ... import tasks
from .train import Objective, recorded

__all__ = ["TokenObjective", "MQARObjective", "language_model", "record_maps", "short_name"]


def short_name(name: str) -> str:
    """``"body.layers.1.self_attn"`` -> ``"layer 1"`` (other names unchanged)."""
    parts = name.split("#")[0].split(".")
    if len(parts) >= 3 and parts[-3] == "layers" and parts[-1] in ("self_attn", "attention"):
        return f"layer {parts[-2]}"
    return name


def _features(mod: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The positive feature map of a linear attention layer, in float64 (up to a constant factor)."""
    x = x.double()
    if isinstance(mod, PerformerAttention):  # Choromanski et al. 2021, Lemma 1: exp(W x - |x|^2 / 2), x = q d^-1/4
        x = x * mod.head_dim ** -0.25
        logits = x @ mod.projection.double().T - x.pow(2).sum(-1, keepdim=True) / 2  # (B, H, n, m)
        return torch.exp(logits - logits.amax())
    return F.elu(x) + 1  # Katharopoulos et al. 2020, eq. 7


def implied_linear_maps(model: nn.Module, inputs: torch.Tensor) -> dict[str, torch.Tensor]:
    """The weights linear attention applies implicitly, ``phi(q_i).phi(k_j) / sum_j``, per layer ``(B, H, n, n)``.

    Katharopoulos et al. 2020 (arXiv:2006.16236) eq. 4 as a matrix, for :class:`LinearAttention` and
    :class:`PerformerAttention`: the layers never form it, so it is recomputed here from each
    layer's input (captured by a pre-hook). The Performer's ``eps`` is left out.
    """
    seen: dict[str, tuple[nn.Module, torch.Tensor]] = {}
    kinds = (LinearAttention, PerformerAttention)
    hooks = [m.register_forward_pre_hook(lambda mod, args, name=name: seen.__setitem__(name, (mod, args[0])))
             for name, m in model.named_modules() if isinstance(m, kinds)]
    try:
        with torch.no_grad():
            model(inputs)
    finally:
        for h in hooks:
            h.remove()
    out = {}
    with torch.no_grad():
        for name, (mod, x) in seen.items():
            q, k, _ = mod.project(x)  # (B, H, n, d)
            scores = _features(mod, q) @ _features(mod, k).transpose(-1, -2)  # (B, H, n, n), positive
            if mod.causal:
                scores = scores.tril()
            out[short_name(name)] = (scores / scores.sum(-1, keepdim=True)).float()
    return out


def record_maps(model: nn.Module, inputs: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-layer attention maps ``(B, H, n, n)`` of ``model(inputs)``: recorded, or implied for linear attentions.

    Only whole ``n x n`` maps count: mechanisms that attend in pieces (the strided Sparse
    Transformer's blocks) report partial maps, which are left out.
    """
    b, n = inputs.shape
    with recorded(model) as rec:
        model(inputs)
    whole = [m for m in rec if m.weights.dim() == 4 and m.weights.shape[0] == b and m.weights.shape[-2:] == (n, n)]
    maps = {short_name(m.name): m.weights for m in whole}
    return maps or implied_linear_maps(model, inputs)


class TokenObjective(Objective):
    """Per-position classification (``tokens`` tasks): cross-entropy on the scored positions, their accuracy."""

    def loss(self, model, batch, task):
        logits = model(batch["inputs"])  # (B, n, V)
        return F.cross_entropy(logits.transpose(1, 2), batch["targets"], ignore_index=tasks.IGNORE_INDEX)

    def score(self, model, batch, task):
        return task.accuracy(model(batch["inputs"]).argmax(-1), batch)

    def labels(self, ids: list[int], task) -> list[str]:
        return [str(i) for i in ids]

    def examples(self, model, batch, task):
        maps = record_maps(model, batch["inputs"][:1])
        if not maps:
            return []
        ids = batch["inputs"][0].tolist()
        pred = model(batch["inputs"][:1]).argmax(-1)[0]
        scored = batch["targets"][0] != tasks.IGNORE_INDEX
        right = int((pred[scored] == batch["targets"][0][scored]).sum())
        words = self.labels(ids, task)
        title = f"test example 0: {right}/{int(scored.sum())} scored positions right"
        return [{"title": title, "maps": {n: w[0] for n, w in maps.items()}, "q_tokens": words, "k_tokens": words}]


class MQARObjective(TokenObjective):
    """:class:`TokenObjective` for MQAR, plus where the last layer looks from each query."""

    def labels(self, ids, task):
        return ["·" if i == 0 else f"k{i}" if i <= task.num_keys else f"v{i - task.num_keys}" for i in ids]

    def extra(self, model, batch, task):
        """``attention_on_bound_value``: share of queries whose last-layer map (mean over heads) peaks at the
        value token bound to the queried key (the position a 2-layer recall circuit reads)."""
        inputs = batch["inputs"][:256]
        maps = record_maps(model, inputs)
        if not maps:
            return {}
        last = list(maps.values())[-1].mean(1)  # (B, n, n)
        p, start = task.num_pairs, 2 * task.num_pairs + task.gap
        keys = inputs[:, 0:2 * p:2]  # (B, P)
        queries = inputs[:, start:]  # (B, Q)
        pair = (queries[:, :, None] == keys[:, None, :]).float().argmax(-1)  # (B, Q): index of the queried pair
        looked = last[:, start:, :].argmax(-1)  # (B, Q)
        return {"attention_on_bound_value": (looked == 2 * pair + 1).double().mean().item()}


class CopyObjective(TokenObjective):
    """:class:`TokenObjective` for selective copy (readable token labels)."""

    def labels(self, ids, task):
        return ["·" if i == 0 else "M" if i == 1 else f"d{i - 2}" for i in ids]


def language_model(task, attention: str = "softmax", *, layers: int = 2, dim: int = 64, heads: int = 2,
                   window: int | None = None) -> TransformerLM:
    """A causal, pre-norm, dropout-free Transformer LM for ``task`` (``window``: softmax over ``i - window .. i``)."""
    mask = None if window is None else masks.sliding_window(window, 0)
    return TransformerLM(task.vocab_size, dim=dim, num_heads=heads, num_layers=layers, causal=True, dropout=0.0,
                         norm_first=True, attention=attention, attention_mask=mask, max_len=task.seq_len)
