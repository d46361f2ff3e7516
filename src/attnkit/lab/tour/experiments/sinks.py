"""Learned attention sinks lower the first token's attention mass (Xiao et al. 2023; gpt-oss, OpenAI 2025).

StreamingLLM (Xiao et al. 2023, arXiv:2309.17453, Sec. 3.1) finds that softmax heads with nothing
to attend to park their weight on the first token, which every query can see; a learned sink (a
logit per head in the softmax's denominator that takes weight and gives no value: gpt-oss,
arXiv:2508.10925) gives them somewhere else to put it. Here the MQAR model of the tour is trained
twice, with and without sinks (``MultiHeadAttention(sinks=True)``'s parameter on every layer), and
:class:`SinkObjective` reports ``first_token_mass``: the mean weight on position 0 of the queries
after it, over layers and heads.
"""

from __future__ import annotations

import torch
from torch import nn

from ....nn.multihead import MultiHeadAttention
from .tokens import MQARObjective, record_maps

__all__ = ["SinkObjective", "with_sinks", "first_token_mass"]


def with_sinks(model: nn.Module) -> nn.Module:
    """``model`` with a learned sink per head (initialised to 0) on each of its multi-head attention layers."""
    for module in model.modules():
        if isinstance(module, MultiHeadAttention):
            module.sinks = nn.Parameter(torch.zeros(module.num_heads, dtype=module.out_proj.weight.dtype))
    return model


def first_token_mass(maps: dict[str, torch.Tensor]) -> float:
    """Mean weight on key 0 of the queries 1.. (each map ``(B, H, n, n)``), over every layer, head and query."""
    return torch.stack([w[:, :, 1:, 0].mean() for w in maps.values()]).mean().item()


class SinkObjective(MQARObjective):
    """MQAR's objective, plus ``first_token_mass`` on held-out inputs."""

    def extra(self, model, batch, task):
        maps = record_maps(model, batch["inputs"][:256])
        return {**super().extra(model, batch, task), "first_token_mass": first_token_mass(maps)} if maps else {}
