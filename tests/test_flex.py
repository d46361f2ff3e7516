"""attnkit.flex_attention: torch's FlexAttention API, forward and backward on the CPU.

The masks and score mods are attention-gym's, written as FlexAttention users write them.
Forward: equal to torch's own ``flex_attention`` on the CPU (its forward runs there).
Backward, where torch raises: equal to the float64 oracle (tests/oracle.py) given torch's own
dense picture of the mask (``create_mask``) and the same score mod, for q, k, v and a learned
bias table the score mod captures.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.nn.attention.flex_attention import AuxRequest, create_block_mask, create_mask
from torch.nn.attention.flex_attention import flex_attention as torch_flex

import attnkit
from attnkit.flex import register_transformers, transformers_attention
from tests.helpers import rand_qkv
from tests.oracle import dense_attention

B, H, HKV, L, D = 2, 4, 2, 300, 16
DOCS = torch.tensor([0] * 70 + [1] * 150 + [2] * 80)
SLOPES = torch.exp2(-8.0 * torch.arange(1, H + 1) / H)
MASKS = {
    "causal": lambda b, h, q, k: q >= k,
    "sliding window": lambda b, h, q, k: (q - k <= 64) & (q >= k),
    "prefix LM": lambda b, h, q, k: (k < 50) | (q >= k),
    "documents": lambda b, h, q, k: DOCS[q] == DOCS[k],
    "dilated": lambda b, h, q, k: ((q - k) % 4 == 0) & ((q - k).abs() < 100),
    "strided": lambda b, h, q, k: (q >= k) & (((q - k) < 17) | ((q - k) % 17 == 0)),
    "global + window": lambda b, h, q, k: (k < 4) | (q < 4) | ((q - k).abs() <= 20),
}
SCORE_MODS = {
    "none": None,
    "ALiBi": lambda s, b, h, q, k: s + SLOPES[h] * (k - q),
    "soft-cap": lambda s, b, h, q, k: 20 * torch.tanh(s / 20),
    "relative position": lambda s, b, h, q, k: s + (q - k) / 10,
}


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():  # torch warns that its eager FlexAttention is a slow reference
        warnings.simplefilter("ignore", UserWarning)
        yield


def _inputs(dtype=torch.float32, grad=False):
    return rand_qkv(B, H, L, L, D, hkv=HKV, dtype=dtype, seed=7, requires_grad=grad)


@pytest.mark.parametrize("mod", list(SCORE_MODS))
@pytest.mark.parametrize("name", list(MASKS))
def test_the_forward_equals_torchs(name, mod):
    q, k, v = _inputs()
    block_mask = create_block_mask(MASKS[name], None, None, L, L, device="cpu")
    want, want_lse = torch_flex(q, k, v, score_mod=SCORE_MODS[mod], block_mask=block_mask, enable_gqa=True,
                                return_aux=AuxRequest(lse=True))
    got, aux = attnkit.flex_attention(q, k, v, score_mod=SCORE_MODS[mod], block_mask=block_mask, enable_gqa=True,
                                      return_aux=AuxRequest(lse=True))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-5)
    torch.testing.assert_close(aux.lse, want_lse.lse, rtol=1e-5, atol=2e-5)


def _oracle_grads(q, k, v, mask_mod, score_mod, dout, extra=()):
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    picture = create_mask(mask_mod, 1, 1, L, L, device="cpu")
    out = dense_attention(*leaves, mask=picture, bias=score_mod, differentiable=True)
    return out, torch.autograd.grad(out, [*leaves, *extra], dout.double())


@pytest.mark.parametrize("mod", list(SCORE_MODS))
@pytest.mark.parametrize("name", ["causal", "sliding window", "documents", "prefix LM"])
def test_it_trains_on_the_cpu_where_torchs_raises(name, mod):
    q, k, v = _inputs(grad=True)
    block_mask = create_block_mask(MASKS[name], None, None, L, L, device="cpu")
    with pytest.raises(NotImplementedError, match="backward on CPU"):
        torch_flex(q, k, v, block_mask=block_mask, enable_gqa=True)
    out = attnkit.flex_attention(q, k, v, score_mod=SCORE_MODS[mod], block_mask=block_mask, enable_gqa=True)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    grads = torch.autograd.grad(out, (q, k, v), dout)
    exact, exact_grads = _oracle_grads(q, k, v, MASKS[name], SCORE_MODS[mod], dout)
    torch.testing.assert_close(out.double(), exact, rtol=1e-4, atol=1e-5)
    for got, want in zip(grads, exact_grads, strict=True):
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5)


def test_a_learned_bias_table_in_the_score_mod_gets_its_gradient():
    q, k, v = _inputs(dtype=torch.float64, grad=True)
    table = torch.randn(H, 2 * L - 1, dtype=torch.float64, generator=torch.Generator().manual_seed(3),
                        requires_grad=True)
    score_mod = lambda s, b, h, qi, ki: s + table[h, qi - ki + L - 1]
    block_mask = create_block_mask(MASKS["causal"], None, None, L, L, device="cpu")
    out = attnkit.flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, enable_gqa=True)
    dout = torch.randn(out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    grads = torch.autograd.grad(out, (q, k, v, table), dout)
    exact, exact_grads = _oracle_grads(q, k, v, MASKS["causal"], score_mod, dout, extra=(table,))
    torch.testing.assert_close(out, exact, rtol=1e-12, atol=1e-12)
    for got, want in zip(grads, exact_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_no_block_mask_scale_and_the_returned_forms_follow_torch():
    q, k, v = (t[:, :2] for t in _inputs())
    want, lse = torch_flex(q, k, v, scale=0.3, return_aux=AuxRequest(lse=True))
    torch.testing.assert_close(attnkit.flex_attention(q, k, v, scale=0.3), want, rtol=1e-5, atol=1e-5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        out, got_lse = attnkit.flex_attention(q, k, v, scale=0.3, return_lse=True)
    torch.testing.assert_close(got_lse, lse.lse, rtol=1e-5, atol=1e-5)
    out, aux = attnkit.flex_attention(q, k, v, return_aux=AuxRequest())
    assert aux.lse is None and out.shape == (B, 2, L, D)


def test_a_block_mask_is_converted_once_and_its_layouts_reused():
    q, k, v = (t[:, :2] for t in _inputs())
    block_mask = create_block_mask(MASKS["documents"], None, None, L, L, device="cpu")
    attnkit.flex_attention(q, k, v, block_mask=block_mask)
    mask = block_mask._cache_attnkit_mask.get_or_build("mask", lambda: None)
    attnkit.flex_attention(q, k, v, block_mask=block_mask)
    assert block_mask._cache_attnkit_mask.get_or_build("mask", lambda: None) is mask


def test_bad_calls_raise_attnkit_errors():
    q, k, v = _inputs()
    with pytest.raises(attnkit.ShapeError, match="enable_gqa=True"):
        attnkit.flex_attention(q, k, v)
    with pytest.raises(attnkit.ShapeError, match="multiple"):
        attnkit.flex_attention(q[:, :3], k, v, enable_gqa=True)
    with pytest.raises(attnkit.ArgumentError, match="not both"):
        attnkit.flex_attention(q, k, v, enable_gqa=True, return_lse=True, return_aux=AuxRequest(lse=True))
    with pytest.raises(attnkit.UnsupportedFeature, match="max_scores"):
        attnkit.flex_attention(q, k, v, enable_gqa=True, return_aux=AuxRequest(max_scores=True))
    with pytest.raises(attnkit.ShapeError, match="4-D"):
        attnkit.flex_attention(q[0], k[0], v[0])


def test_off_the_cpu_it_calls_torchs_compiled_kernel_with_every_argument(monkeypatch):
    seen = {}

    def kernel(compiled=True):
        return lambda *args, **kwargs: seen.update(compiled=compiled, args=args, kwargs=kwargs) or "torch's answer"
    monkeypatch.setattr(attnkit.kernels.flex, "kernel", kernel)
    q = torch.empty(1, 2, 8, 4, device="meta")
    options = {"BLOCK_M": 64}
    assert attnkit.flex_attention(q, q, q, scale=0.5, kernel_options=options) == "torch's answer"
    assert seen["compiled"] and seen["kwargs"]["scale"] == 0.5 and seen["kwargs"]["kernel_options"] is options


def test_a_transformers_model_with_flexattention_masks_trains_on_the_cpu_as_with_sdpa():
    """Against transformers' "sdpa" implementation in float64 (its "eager" one takes the softmax in float32)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    name = register_transformers()
    config = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).double()
    ids = torch.randint(0, 50, (2, 20), generator=torch.Generator().manual_seed(1))
    found = {}
    for impl in ("sdpa", name):
        model.set_attn_implementation(impl)
        model.zero_grad()
        loss = model(ids, labels=ids).loss
        loss.backward()
        found[impl] = (loss.detach(), [p.grad.clone() for p in model.parameters()])
    torch.testing.assert_close(found[name][0], found["sdpa"][0], rtol=1e-12, atol=1e-12)
    for got, want in zip(found[name][1], found["sdpa"][1], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_transformers_attention_refuses_what_it_cannot_honour():
    q = torch.randn(1, 2, 8, 4)
    with pytest.raises(attnkit.UnsupportedFeature, match="dropout"):
        transformers_attention(None, q, q, q, None, dropout=0.1)
    with pytest.raises(attnkit.UnsupportedFeature, match="register_transformers"):
        transformers_attention(None, q, q, q, torch.zeros(1, 1, 8, 8))


@pytest.mark.cuda
@pytest.mark.parametrize("mod", ["none", "soft-cap", "relative position"])  # captured tensors would be on the CPU
def test_on_cuda_it_is_torchs_compiled_flex_attention(mod):
    q, k, v = (t.cuda().requires_grad_() for t in _inputs(dtype=torch.bfloat16))
    block_mask = create_block_mask(MASKS["sliding window"], None, None, L, L, device="cuda")
    out = attnkit.flex_attention(q, k, v, score_mod=SCORE_MODS[mod], block_mask=block_mask, enable_gqa=True)
    want = torch.compile(torch_flex)(q, k, v, score_mod=SCORE_MODS[mod], block_mask=block_mask, enable_gqa=True)
    torch.testing.assert_close(out, want)
    out.sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


def test_a_block_mask_without_batch_and_heads_is_answered_as_the_compiled_kernel_answers_it():
    # B=None/H=None: the tiles of b = 0, h = 0 serve every batch and head; mask_mod sees the real b and h only in
    # partial tiles (full tiles are never asked), which is what torch's compiled kernel computes.
    def mod(b, h, i, j):
        return (i >= j) & ((b + h) % 2 == 0)

    bm = create_block_mask(mod, None, None, 256, 256, device="cpu", BLOCK_SIZE=128)
    q, k, v = rand_qkv(2, 2, 256, 256, 8, dtype=torch.float64, seed=4)
    i, j = torch.arange(256)[:, None], torch.arange(256)[None, :]
    b, h = torch.arange(2).view(2, 1, 1, 1), torch.arange(2).view(1, 2, 1, 1)
    tile_full = (i // 128 > j // 128)  # below the diagonal tiles: full at b = h = 0
    tile_partial = (i // 128 == j // 128)  # the diagonal tiles: partial
    allowed = tile_full | (tile_partial & mod(b, h, i, j))
    exact = dense_attention(q, k, v, mask=allowed)
    torch.testing.assert_close(attnkit.flex_attention(q, k, v, block_mask=bm), exact, rtol=0, atol=1e-12)
    assert not torch.equal(allowed, mod(b, h, i, j).expand(2, 2, 256, 256))  # torch's eager rule differs here
