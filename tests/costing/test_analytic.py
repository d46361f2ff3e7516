"""analysis.cost: the analytic matmul FLOPs of every registered mechanism equal torch's FlopCounterMode count.

Every registry entry runs at its example's sizes and at one or two other settings (distinct
sizes; lengths that leave partial blocks and send masks to the block-sparse kernel), forward
and forward + backward (gradients of the sum of every output, every float input and parameter
requiring one) under ``torch.utils.flop_counter.FlopCounterMode``, and the counted total must
equal ``cost(...).flops`` exactly.

torch 2.13's counter has no formula for the fused CPU SDPA kernel
(``aten._scaled_dot_product_flash_attention_for_cpu`` and its backward): without one it counts
0 for every call that takes it. :data:`CPU_SDPA` maps both ops to torch's own SDPA formulas
(``sdpa_flop_count`` / ``sdpa_backward_flop_count``). Its formula for a convolution's backward
ignores ``groups`` in the weight gradient (a depthwise convolution of C channels counts C times
its products): :data:`CPU_SDPA` counts each gradient as one forward, as for any product. It has no
formula for the sparse products of selected keys (``aten.sparse_sampled_addmm``: ``2 nnz K``;
``aten._embedding_bag`` with weights: ``2`` per index per feature): :data:`CPU_SDPA` adds them. With
that, every entry is countable.
Parts the counter ignores by design (matrix-vector products, elementwise work) are in
``other_flops``, never in ``flops``: :data:`NOT_COUNTED` lists the entries that have such parts.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode, conv_flop_count, sdpa_backward_flop_count, sdpa_flop_count

import attnkit
from attnkit import masks, registry
from attnkit.costing.analytic import SPECS, build, cost, sizes
from attnkit.errors import ArgumentError
from attnkit.kernels import blocksparse_gathered, online_softmax

aten = torch.ops.aten


def _sdpa(q, k, v, *args, out_shape=None, **kwargs):
    return sdpa_flop_count(q, k, v)


def _sdpa_backward(grad_out, q, k, v, *args, out_shape=None, **kwargs):
    return sdpa_backward_flop_count(grad_out, q, k, v)


def _conv_backward(grad_out, x, w, bias, stride, padding, dilation, transposed, output_padding, groups, output_mask,
                   out_shape=None, **kwargs):
    forward = conv_flop_count(x, w, grad_out, transposed=transposed)  # reads C_in per group off the weight
    return forward * (int(output_mask[0]) + int(output_mask[1]))


def _sampled_addmm(pattern, mat1, mat2, *args, out_shape=None, **kwargs):
    return 2 * pattern._nnz() * mat1.shape[-1] * (mat1.numel() // (mat1.shape[-2] * mat1.shape[-1]))


def _embedding_bag(weight, indices, *args, out_shape=None, **kwargs):
    return 2 * indices[0] * weight[-1]  # shapes: (rows, E) and (indices,)


_sampled_addmm._get_raw = True  # the counter passes the tensors (a sparse pattern's nnz), not only their shapes


CPU_SDPA = {aten._scaled_dot_product_flash_attention_for_cpu: _sdpa,
            aten._scaled_dot_product_flash_attention_for_cpu_backward: _sdpa_backward,
            aten.convolution_backward: _conv_backward,
            aten.sparse_sampled_addmm: _sampled_addmm,
            aten._embedding_bag: _embedding_bag, aten._embedding_bag_forward_only: _embedding_bag}

# Entries whose cost has a part FlopCounterMode does not count (kept in other_flops).
NOT_COUNTED = {
    "additive": "v^T tanh(W_q q + W_k k) is a matrix-vector product (aten.mv)",
    "coverage-attention": "the additive score's matrix-vector product",
    "hard-attention": "the additive score's matrix-vector product",
    "pointer": "the additive score's matrix-vector product",
    "memory-attention": "h . w_mh is a matrix-vector product",
    "sinusoidal-positional-encoding": "elementwise only", "learned-positional-embedding": "elementwise only",
    "rotary-embedding": "elementwise only",
}

_CORE = dict(batch=1, heads=2, kv_heads=1, q_len=450, kv_len=450, head_dim=4, value_dim=4)  # 450 = 7 * 64 + 2
_ODD = dict(batch=2, heads=3, q_len=7, kv_len=11, head_dim=3, value_dim=5)  # Dv != D: SDPA's math path
_LONG = dict(_CORE, q_len=260, kv_len=270)  # over the reference kernel's size: chunked
_SEQ = dict(batch=1, length=19, dim=12, heads=3)
_RECURRENT = dict(batch=2, length=11, dim=12)  # 11 = 2 * 4 + 3: the chunk form's last block is padded
SETTINGS = {
    "sliding-window": [dict(_CORE, window=20), dict(_CORE, q_len=200, window=30), _ODD],
    "dilated-window": [dict(_CORE, window=10, dilation=3), _ODD],
    "sparse-strided": [dict(_CORE, stride=17), dict(_ODD, stride=3)],
    "sparse-fixed": [dict(_CORE, stride=40, summary=2), dict(_ODD, stride=3)],
    "global-tokens": [dict(_CORE, globals=2, window=10), _ODD],
    "prefix-lm": [dict(_CORE, prefix=20), _ODD],
    "segment-level": [dict(_CORE, segment=50), _ODD],
    "causal": [_CORE, _ODD],
    "alibi": [dict(_CORE, q_len=200, kv_len=330), _ODD],
    "softcap": [_LONG, _ODD],
    "cosine": [_LONG, _ODD],
    "scaled-dot-product": [_CORE, _ODD, dict(_ODD, dtype="float64", value_dim=3)],
    "dot-product": [_CORE, _ODD],
    "sparsemax": [_ODD], "sigmoid": [_ODD], "hard-argmax": [_ODD], "gumbel-softmax": [_ODD],
    "sigmoid-log-n": [_LONG, _ODD], "softpick": [_LONG, _ODD], "stick-breaking": [_LONG, _ODD],
    "attention-sinks": [_CORE, _LONG, _ODD],
    "relative-position-bias": [dict(_CORE, q_len=200, kv_len=330), _ODD],
    "dot-product-module": [_ODD, dict(_CORE, need_weights=True, scaled=False)],
    "multi-head": [dict(batch=1, q_len=7, kv_len=11, embed_dim=12, heads=4, kv_heads=2, need_weights=False),
                   dict(batch=3, q_len=5, embed_dim=6, heads=2)],
    "gated-attention": [dict(batch=1, q_len=7, kv_len=11, embed_dim=12, heads=4, kv_heads=2, need_weights=False),
                        dict(batch=3, q_len=5, embed_dim=6, heads=2, qk_norm=False)],
    "multi-head-latent": [dict(batch=1, length=7, dim=12, heads=2, kv_lora_rank=5, q_lora_rank=None,
                               qk_nope_head_dim=3, qk_rope_head_dim=2, v_head_dim=4),
                          dict(batch=2, length=9, form="absorbed", causal=False),
                          dict(batch=1, length=300, dim=8, heads=2, kv_lora_rank=6, q_lora_rank=5, qk_nope_head_dim=3,
                               qk_rope_head_dim=2, v_head_dim=3, form="absorbed")],
    "differential": [dict(batch=1, length=7, dim=12, heads=3, kv_heads=1),
                     dict(batch=2, length=300, dim=8, heads=2, causal=False)],
    "qk-norm": [dict(batch=1, q_len=7, kv_len=11, embed_dim=12, heads=4, kv_heads=2, need_weights=False),
                dict(batch=3, q_len=5, embed_dim=6, heads=2, gate=True)],
    "bigbird": [dict(batch=1, length=300, dim=8, heads=2, block_size=16, global_blocks=2),
                dict(batch=2, length=9, dim=6, heads=3, block_size=4, global_blocks=0)],
    "block-sparse": [dict(batch=1, length=500, dim=8, heads=2, block_size=32, layout="band", band=1, columns=1),
                     dict(batch=2, length=23, dim=6, heads=3, block_size=5, density=0.3, seed=3)],
    "local": [dict(batch=1, length=400, dim=8, heads=2, size=20, dtype="bfloat16"),
              dict(batch=1, length=300, dim=8, heads=2, size=50, mode="blocks", causal=True),
              dict(batch=2, length=9, dim=6, heads=3, size=2, causal=True)],
    "longformer": [dict(batch=1, length=400, dim=8, heads=2, window=40, dilation=1, global_tokens=(0, 7)),
                   dict(batch=2, length=11, dim=6, heads=3, window=2, dilation=1, global_tokens=())],
    "sparse-transformer": [dict(batch=1, length=300, dim=8, heads=2),
                           dict(batch=1, length=300, dim=8, heads=2, pattern="fixed", stride=20, summary=3),
                           dict(batch=2, length=19, dim=6, heads=3, causal=False, stride=4),
                           dict(batch=2, length=13, dim=6, heads=3, pattern="fixed", causal=False, stride=4,
                                summary=2)],
    "reformer": [dict(_SEQ, n_hashes=3, chunk_size=5, causal=False),
                 dict(batch=2, length=10, dim=8, heads=2, n_hashes=1, n_buckets=1)],
    "linear-attention": [dict(_SEQ, causal=False), dict(batch=2, length=21, dim=8, heads=2, chunk_size=4)],
    "performer": [dict(_SEQ, causal=True, chunk_size=5, num_features=7),
                  dict(batch=2, length=9, dim=8, heads=2, num_features=None)],
    "linformer": [dict(_SEQ, k_proj_dim=5, max_len=30), dict(batch=2, length=9, dim=8, heads=2, k_proj_dim=4,
                                                              sharing="none")],
    "lambda-layer": [dict(_SEQ, key_dim=5, max_len=30), dict(batch=2, length=9, dim=8, heads=2, key_dim=3, dim_out=6)],
    "lambda-layer-local": [dict(_SEQ, key_dim=5, local_context=7),
                           dict(batch=2, length=9, dim=8, heads=2, key_dim=3, local_context=3)],
    "perceiver-attention": [dict(batch=1, latents=5, length=70, query_dim=6, context_dim=9, heads=3, head_dim=4),
                            dict(batch=3, latents=2, length=11, query_dim=4, context_dim=4, heads=1, head_dim=5)],
    "perceiver-encoder": [dict(batch=1, length=13, input_dim=5, latents=3, latent_dim=6, depth=2, cross_heads=2,
                               latent_heads=3, head_dim=4),
                          dict(batch=2, length=7, input_dim=3, latents=2, latent_dim=4, depth=0)],
    "additive": [dict(batch=1, q_len=3, kv_len=11, query_dim=4, key_dim=5, hidden_dim=7, value_dim=9,
                      need_weights=False), dict(batch=3, q_len=2, kv_len=4)],
    "coverage-attention": [dict(batch=1, q_len=3, kv_len=11, query_dim=4, key_dim=5, hidden_dim=7, value_dim=9)],
    "hard-attention": [dict(mode="soft", value_dim=3), dict(mode="argmax", straight_through=True),
                       dict(mode="argmax"), dict(mode="gumbel", batch=1, q_len=2)],
    "luong": [dict(score="dot", mode="global", key_dim=8),
              dict(score="concat", mode="local-m", hidden_dim=5, out_dim=3),
              dict(score="general", mode="global", batch=1)],
    "pointer": [dict(batch=1, q_len=4, kv_len=9, encoder_dim=3, decoder_dim=5, hidden_dim=7)],
    "derived-key": [dict(batch=1, q_len=4, kv_len=9, value_dim=3, attn_dim=5)],
    "memory-attention": [dict(batch=1, length=11, dim=5, memory_size=3)],
    "co-attention-parallel": [dict(batch=1, q_len=3, kv_len=7, question_dim=4, image_dim=5, hidden_dim=6)],
    "co-attention-alternating": [dict(batch=1, q_len=3, kv_len=7, question_dim=4, image_dim=5, hidden_dim=6)],
    "attention-pooling": [dict(batch=3, length=5, dim=4, attn_dim=7)],
    "hierarchical-attention": [dict(batch=1, sentences=2, words=4, input_dim=5, hidden_dim=4, attn_dim=3),
                               dict(batch=2, sentences=3, words=2, input_dim=4, hidden_dim=6, word_encoder="identity")],
    "segment-attention": [dict(batch=1, q_len=3, length=11, dim=5, query_dim=7, segments=4, pool="attention")],
    "tiered-attention": [dict(batch=1, q_len=3, length=11, dim=5, query_dim=7, groups=4, top_k=None)],
    "sinusoidal-positional-encoding": [dict(batch=1, length=3, dim=6)],
    "learned-positional-embedding": [dict(batch=1, length=3, dim=6, max_len=5)],
    "rotary-embedding": [dict(batch=1, heads=2, q_len=3, kv_len=4, dim=5)],
    "dsa": [dict(batch=1, length=40, dim=12, heads=3, top_k=7, index_heads=3, index_dim=5),
            dict(batch=2, length=300, dim=8, heads=2, top_k=100, index_heads=2, index_dim=4)],
    "moba": [dict(batch=1, length=300, dim=8, heads=2, block_size=16, top_k=3),
             dict(batch=2, length=9, dim=6, heads=3, block_size=2, top_k=9)],
    "native-sparse-attention": [dict(batch=1, length=300, dim=8, heads=2, kv_heads=1, compress_block=16,
                                     compress_stride=8, select_block=32, num_selected=4, window=40),
                                dict(batch=2, length=3, dim=6, heads=3, kv_heads=3, compress_block=4,
                                     compress_stride=2, select_block=2, num_selected=2, window=2)],
    "retnet": [dict(_RECURRENT, heads=3, chunk_size=4), dict(_RECURRENT, heads=2, value_factor=1, form="parallel"),
               dict(_RECURRENT, length=5, dim=6, heads=3, form="recurrent")],
    "gla": [dict(_RECURRENT, heads=2, chunk_size=4, gate_rank=3), dict(_RECURRENT, heads=3, expand_k=1.0,
                                                                         form="recurrent")],
    "mamba2": [dict(_RECURRENT, head_dim=4, state_dim=5, num_groups=2, chunk_size=4, form="parallel"),
               dict(_RECURRENT, length=3, head_dim=6, state_dim=2, expand=1, conv_size=2, chunk_size=4)],
    "deltanet": [dict(_RECURRENT, heads=3, chunk_size=4), dict(_RECURRENT, heads=2, form="recurrent"),
                 dict(_RECURRENT, length=3, heads=3, chunk_size=4)],
    "gated-deltanet": [dict(_RECURRENT, heads=4, key_heads=2, key_head_dim=5, value_head_dim=3, chunk_size=4),
                       dict(_RECURRENT, heads=3, form="recurrent"), dict(_RECURRENT, heads=2, form="parallel")],
    "kimi-delta-attention": [dict(_RECURRENT, heads=3, head_dim=5, chunk_size=4, form="recurrent"),
                             dict(_RECURRENT, heads=2, chunk_size=3), dict(_RECURRENT, heads=3, form="parallel")],
    "lightning-attention": [dict(_RECURRENT, heads=3, head_dim=5, chunk_size=4),
                            dict(_RECURRENT, heads=2, form="recurrent"), dict(_RECURRENT, heads=3, form="parallel")],
    "rwkv4": [dict(_RECURRENT, attention_dim=7, chunk_size=4), dict(_RECURRENT, form="recurrent"),
              dict(_RECURRENT, attention_dim=5, form="parallel")],
    "delta-product": [dict(_RECURRENT, heads=3, num_householder=3, chunk_size=4),
                      dict(_RECURRENT, heads=2, num_householder=2, forget_gate=False, form="recurrent"),
                      dict(_RECURRENT, heads=3, num_householder=2, allow_neg_eigval=True, form="parallel")],
    "comba": [dict(_RECURRENT, heads=4, key_heads=2, key_head_dim=5, value_head_dim=3, chunk_size=4),
              dict(_RECURRENT, heads=3, form="recurrent"), dict(_RECURRENT, heads=2, form="parallel"),
              dict(_RECURRENT, heads=3, form="recurrent", read_before_decay=False)],
    "rwkv7": [dict(_RECURRENT, heads=3, decay_rank=4, a_rank=3, gate_rank=5, chunk_size=4),
              dict(_RECURRENT, heads=2, form="recurrent"), dict(_RECURRENT, heads=4, form="parallel")],
    "log-linear-mamba2": [dict(_RECURRENT, head_dim=4, state_dim=5, num_groups=2, chunk_size=4, max_length=16),
                          dict(_RECURRENT, head_dim=6, state_dim=2, expand=1, form="recurrent"),
                          dict(_RECURRENT, length=3, head_dim=4, state_dim=3, form="parallel"),
                          dict(_RECURRENT, length=4, head_dim=4, state_dim=3, chunk_size=4)],
    "log-linear-gated-deltanet": [dict(_RECURRENT, heads=4, key_heads=2, key_head_dim=5, value_head_dim=3,
                                       chunk_size=4),
                                  dict(_RECURRENT, heads=3, form="recurrent"),
                                  dict(_RECURRENT, heads=2, form="parallel"),
                                  dict(_RECURRENT, length=4, heads=2, chunk_size=4)],
    "path-attention": [dict(batch=1, length=13, dim=8, heads=2, kv_heads=1, forget_gate=True),
                       dict(batch=2, length=9, dim=6, heads=3),
                       dict(batch=2, length=11, dim=8, heads=2, kv_heads=1, forget_gate=True, form="chunk",
                            chunk_size=4),
                       dict(batch=1, length=8, dim=6, heads=3, form="chunk", chunk_size=4),
                       dict(batch=1, length=3, dim=6, heads=3, form="chunk", chunk_size=4)],
    "forgetting-attention": [dict(batch=1, length=300, dim=8, heads=2, kv_heads=1), dict(batch=2, length=9, dim=6,
                                                                                         heads=3)],
    "dense": [_CORE], "sdpa": [_CORE, _ODD, dict(_CORE, kv_heads=2)],
    "dilated(10, 3)": [dict(_CORE, normalize="sigmoid"), dict(_CORE, normalize="sparsemax", q_len=300)],
}
CASES = [(name, {}) for name in sorted(SETTINGS)] + [(n, s) for n, settings in SETTINGS.items() for s in settings]


def counted(name, **kw) -> tuple[int, int]:
    """FlopCounterMode's totals of one forward and of the backward of the sum of every differentiable output."""
    fn, inputs, _, _ = build(name, **kw)
    inputs = [t.requires_grad_(True) if t.is_floating_point() else t for t in inputs]
    with FlopCounterMode(display=False, custom_mapping=CPU_SDPA) as counter:
        out = fn(*inputs)
    forward = counter.get_total_flops()
    outs = [out] if isinstance(out, torch.Tensor) else [o for o in out if isinstance(o, torch.Tensor)]
    outs = [o for o in outs if o.requires_grad]
    with FlopCounterMode(display=False, custom_mapping=CPU_SDPA) as counter:
        if outs:
            sum(o.float().sum() for o in outs).backward()
    return forward, counter.get_total_flops()


def test_every_registered_entry_has_a_cost_formula_and_test_settings():
    names = {e.name for e in registry.entries()}
    assert names <= set(SPECS), f"no cost formula for {sorted(names - set(SPECS))}"
    assert len(names) >= 49
    assert names <= set(SETTINGS), f"no test settings for {sorted(names - set(SETTINGS))}"


@pytest.mark.parametrize(("name", "kw"), CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_analytic_flops_equal_flop_counter_forward_and_backward(name, kw):
    forward, backward = counted(name, **kw)
    c, cb = cost(name, **kw), cost(name, backward=True, **kw)
    assert c.flops == forward, c.terms
    assert cb.flops == forward + backward, cb.terms
    assert sum(c.terms.values()) == c.flops and sum(c.other_terms.values()) == c.other_flops


def test_parts_the_counter_ignores_are_in_other_flops():
    for name in NOT_COUNTED:
        c = cost(name)
        assert c.other_flops > 0 and "no matmul" not in NOT_COUNTED[name]
        assert any("not counted" in k or "no matmul" in k for k in c.other_terms), (name, c.other_terms)


def test_checkpointed_kernels_count_their_recomputed_forward(monkeypatch):
    monkeypatch.setattr(online_softmax, "BUDGET", 1 << 12)  # slabs of a few rows: checkpointed under autograd
    monkeypatch.setattr(blocksparse_gathered, "BUDGET", 1 << 13)
    for name, kw in (("cosine", _LONG), ("dilated(10, 3)", dict(_CORE, normalize="sigmoid"))):
        forward, backward = counted(name, **kw)
        c = cost(name, backward=True, **kw)
        assert c.flops == forward + backward
        assert c.flops > 3 * cost(name, **kw).flops  # 2x for the gradients, once more for the recomputation


def test_count_follows_the_dispatcher():
    q = torch.zeros(1, 2, 450, 4)
    mask = masks.dilated(10, 3)
    assert attnkit.explain(q, q, q, mask=mask).backend == "blocksparse"
    sparse = cost("dilated-window", **dict(_CORE, window=10, dilation=3))
    dense = cost("scaled-dot-product", **_CORE)
    assert any("active blocks" in k for k in sparse.terms) and sparse.flops < dense.flops / 2
    assert cost("dilated-window", **dict(_CORE, window=10, dilation=3, backend="reference")).flops == dense.flops


def test_a_mask_expression_costs_what_the_registry_entry_costs():
    kw = dict(_CORE, window=20)
    text = cost("sliding_window(20, 20)", **{k: v for k, v in kw.items() if k != "window"})
    assert text.flops == cost("sliding-window", **kw).flops


def test_a_module_instance_is_read_for_its_configuration():
    layer = attnkit.nn.LocalAttention(8, 2, 20)
    by_module = cost(layer, batch=1, length=400, backward=True)
    assert by_module.flops == cost("local", batch=1, length=400, dim=8, heads=2, size=20, backward=True).flops
    assert by_module.sizes["size"] == 20
    lam = attnkit.nn.LambdaLayer(12, key_dim=5, num_heads=3, local_context=7)
    assert cost(lam, length=19).name == "lambda-layer-local"
    with pytest.raises(ArgumentError, match=r"come.* from the module"):
        cost(layer, dim=16)


def test_unknown_sizes_and_names_are_errors_that_list_what_is_accepted():
    with pytest.raises(ArgumentError, match=r"unknown size\(s\) windw; accepted: .*window"):
        cost("sliding-window", windw=3)
    with pytest.raises(ArgumentError, match=r"unknown mechanism 'nosuch'.*sliding-window"):
        cost("nosuch")
    with pytest.raises(ArgumentError, match="q_len=-1"):
        cost("causal", q_len=-1)
    with pytest.raises(ArgumentError, match="dtype"):
        cost("causal", dtype="float8")
    assert "window" in sizes("sliding-window") and "q_len" in sizes("sliding-window")


def test_defaults_are_the_registry_examples_sizes():
    for entry in registry.entries():
        example, inputs = entry.example()
        built = build(entry.name)
        got = [tuple(t.shape) for t in built.inputs if t.is_floating_point()]
        want = [tuple(t.shape) for t in inputs if isinstance(t, torch.Tensor) and t.is_floating_point()]
        assert got == want, entry.name
        sp = SPECS[entry.name]
        if isinstance(example, torch.nn.Module) and sp.config is not None:  # and the example's configuration
            runtime = {k: v for k, v in built.sizes.items() if k not in sp.config(example) and k in sp.defaults}
            assert cost(example, **runtime).flops == cost(entry.name).flops, entry.name


def test_bytes_peak_and_backward_are_consistent():
    c, cb = cost("sliding-window", **dict(_CORE, window=20)), cost("causal", **_CORE, backward=True)
    assert c.bytes_moved >= 4 * (2 * 450 * 4 * 2 + 2 * 450 * 4)  # q and out (2 heads), k and v (1 head) at least
    assert c.peak_bytes > 0 and cb.flops > cost("causal", **_CORE).flops
    assert "matmul FLOPs" in c.table() and "formula" in c.table()


def test_modules_training_with_dropout_are_counted_as_they_run():
    torch.manual_seed(0)
    modules = [(attnkit.nn.MultiHeadAttention(12, 3, dropout=0.1, batch_first=True), dict(batch=2, q_len=5)),
               (attnkit.nn.LocalAttention(8, 2, 20, dropout=0.2), dict(batch=1, length=400)),
               (attnkit.nn.PerceiverAttention(6, 4, num_heads=2, head_dim=3, dropout=0.1), dict(latents=3, length=9)),
               (attnkit.nn.DotProductAttention(dropout=0.3), dict(q_len=6, kv_len=9))]
    for module, kw in modules:
        module.train()
        forward, backward = counted(module, **kw)
        assert cost(module, **kw).flops == forward, type(module).__name__
        assert cost(module, backward=True, **kw).flops == forward + backward, type(module).__name__


def test_no_size_prices_the_registry_example_and_a_length_the_papers_settings_at_a_realistic_layer():
    small = {name: cost(name).sizes for name in ("longformer", "bigbird", "reformer")}
    assert (small["longformer"]["window"], small["bigbird"]["block_size"], small["reformer"]["chunk_size"]) == (4, 2, 4)
    longformer, bigbird, reformer = (cost(name, q_len=4096).sizes for name in ("longformer", "bigbird", "reformer"))
    for s in (longformer, bigbird, reformer):
        assert (s["batch"], s["length"], s["heads"], s["dim"]) == (1, 4096, 8, 512)
    assert (longformer["window"], longformer["dilation"], longformer["global_tokens"]) == (512, 1, (0,))
    assert [bigbird[k] for k in ("block_size", "window_blocks", "global_blocks", "random_blocks")] == [64, 3, 2, 3]
    assert (reformer["chunk_size"], reformer["n_buckets"], reformer["n_hashes"]) == (64, 2 * 4096 // 64, 4)
    assert cost("sliding-window", q_len=4096).sizes["window"] == 256  # Longformer's w = 512: 256 on each side
    assert cost("longformer", q_len=4096, window=64).sizes["window"] == 64  # a setting given wins
    for name, sp in SPECS.items():
        if sp.at_scale:  # every paper setting says where it comes from
            assert re.search(r"et al\. 20\d\d, arXiv:\d{4}\.\d{5}, (Sec|App)\. ", sp.source), (name, sp.source)


def test_the_vocabulary_reaches_every_mechanism_under_its_own_names():
    by_vocabulary = cost("longformer", batch=2, q_len=300, heads=2, head_dim=4)
    assert by_vocabulary == cost("longformer", batch=2, length=300, heads=2, dim=8)
    assert cost("rotary-embedding", q_len=7, head_dim=6).sizes["dim"] == 6
    assert cost("pointer", q_len=9).sizes["kv_len"] == 9  # one length given: both sequences have it
    with pytest.raises(ArgumentError, match="longformer takes one sequence length"):
        cost("longformer", q_len=300, kv_len=200)
    with pytest.raises(ArgumentError, match="length given twice"):
        cost("longformer", q_len=300, length=200)
    with pytest.raises(ArgumentError, match=r"unknown size\(s\) heads"):
        cost("pointer", heads=8)


_BILLION = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))  # a tensor of a billion positions cannot exist here
from attnkit.costing.analytic import cost
from attnkit.errors import ArgumentError
n = 10 ** 9
assert cost("dense", q_len=n).flops == 2 * 8 * n * n * (64 + 64)
assert cost("causal", q_len=n, backward=True).flops > 0
for name in ("multi-head", "linformer", "performer", "attention-pooling", "hierarchical-attention"):
    assert cost(name, q_len=n).flops > 0, name
for name in ("sliding-window", "alibi", "segment-level", "longformer", "bigbird", "reformer"):
    try:
        cost(name, q_len=n)
    except ArgumentError as err:
        assert "price a shorter sequence" in str(err) or "lengths up to" in str(err), err
    else:
        sys.exit(name + " priced")
print("ok")
"""


def test_a_billion_tokens_is_priced_by_arithmetic_or_refused_without_allocating():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", _BILLION], capture_output=True, text=True, env=env, timeout=300)
    assert done.stdout.strip() == "ok", done.stdout + done.stderr[-3000:]
