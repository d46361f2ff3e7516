"""MultiHeadAttention's x-transformers options against x-transformers' own ``Attention`` (a test-only oracle).

Skipped unless ``x_transformers`` (2.31.10: with einops, einx, frozendict, loguru, torch-einops-utils) imports.
The weights are copied across; where x-transformers writes a formula another way, the mapping says so:
its pre-softmax talking heads add their mix to the logits (``P = I + W``), its CoPE embeddings are not
scaled (attnkit's are: ``e = e_xt sqrt(d)``), and its LASER soft-clamps the values (set out of reach here).
Its softmax runs in float32 whatever the input's dtype; here it is given a float64 one (the same function).
"""

from __future__ import annotations

import functools

import pytest
import torch

from attnkit.nn.multihead import MultiHeadAttention

xt = pytest.importorskip("x_transformers.x_transformers")

B, L, E, H, D = 2, 7, 12, 3, 4
TOL = {"atol": 1e-10, "rtol": 1e-10}


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def pair(xt_options, options, extra=None):
    """x-transformers' causal Attention (every parameter random, float64) and the attnkit module with its weights."""
    torch.manual_seed(0)
    ref = xt.Attention(E, dim_head=D, heads=H, causal=True, **xt_options).double()
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_(0, 0.4)
    if "sparse_topk" not in xt_options:  # its softmax casts to float32: the same softmax in float64
        ref.attend.attn_fn = functools.partial(torch.softmax, dim=-1)
    m = MultiHeadAttention(E, H, bias=False, batch_first=True, dtype=torch.float64, **options)
    with torch.no_grad():
        m.in_proj_weight.copy_(torch.cat([ref.to_q.weight, ref.to_k.weight, ref.to_v.weight]))
        m.out_proj.weight.copy_(ref.to_out.weight)
        if extra is not None:
            extra(ref, m)
    return ref, m


def x_of(seed=1):
    return torch.randn(B, L, E, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def ours(m, x, **kwargs):
    return m(x, x, x, is_causal=True, need_weights=False, **kwargs)[0]


def _talking(ref, m):
    if m.pre_talking_heads is not None:  # x-transformers: sim + W sim
        m.pre_talking_heads.copy_(torch.eye(H) + ref.attend.pre_softmax_talking_heads.weight[:, :, 0, 0])
    if m.post_talking_heads is not None:
        m.post_talking_heads.copy_(ref.attend.post_softmax_talking_heads.weight[:, :, 0, 0])


def _memory(ref, m):
    m.memory_k.copy_(ref.mem_k)
    m.memory_v.copy_(ref.mem_v)


def _cope(ref, m):
    m.cope_positions.copy_(ref.attend.cope.pos_emb * D ** 0.5)


CASES = {
    "talking heads (pre)": ({"pre_talking_heads": True}, {"talking_heads": "pre"}, _talking),
    "talking heads (post)": ({"post_talking_heads": True}, {"talking_heads": "post"}, _talking),
    "talking heads (both)": ({"pre_talking_heads": True, "post_talking_heads": True}, {"talking_heads": "both"},
                             _talking),
    "memory key-values": ({"num_mem_kv": 3}, {"num_memory_kv": 3}, _memory),
    "selective": ({"selective": True}, {"selective": True}, None),
    "cope": ({"use_cope": True, "cope_max_pos": 4}, {"cope": 4}, _cope),
    "top-k": ({"sparse_topk": 3}, {"topk": 3}, None),
    "l2 distance": ({"l2_distance": True}, {"scores": "l2"}, None),
    "laser": ({"laser": True, "laser_softclamp_value": 1e9}, {"laser": True}, None),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_option_equals_x_transformers(case):
    xt_options, options, extra = CASES[case]
    ref, m = pair(xt_options, options, extra)
    x = x_of()
    torch.testing.assert_close(ours(m, x), ref(x), **TOL)


def test_learned_value_residual_equals_x_transformers():
    def mix(ref, m):
        m.value_residual_mix.weight.copy_(ref.to_value_residual_mix[0].weight)
        m.value_residual_mix.bias.copy_(ref.to_value_residual_mix[0].bias)
    ref, m = pair({"learned_value_residual_mix": True}, {"value_residual": "learned"}, mix)
    x = x_of()
    first = torch.randn(B, H, L, D, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    out, intermediates = ref(x, value_residual=first, return_intermediates=True)
    got, _, values = m(x, x, x, is_causal=True, need_weights=False, value_residual=first, return_values=True)
    torch.testing.assert_close(got, out, **TOL)
    torch.testing.assert_close(values, intermediates.values, **TOL)  # the layer's own values, for the next layers


def test_learned_value_residual_beside_memory_key_values_equals_x_transformers():
    def copy(ref, m):
        _memory(ref, m)
        m.value_residual_mix.weight.copy_(ref.to_value_residual_mix[0].weight)
        m.value_residual_mix.bias.copy_(ref.to_value_residual_mix[0].bias)
    ref, m = pair({"learned_value_residual_mix": True, "num_mem_kv": 2},
                  {"value_residual": "learned", "num_memory_kv": 2}, copy)
    x = x_of()
    first = torch.randn(B, H, L, D, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(ours(m, x, value_residual=first), ref(x, value_residual=first), **TOL)
