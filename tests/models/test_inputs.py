"""Model inputs across attnkit.models (RELIABILITY.md): empty batches, token-id dtypes, out-of-vocabulary ids,
float dtypes, caches and masks give defined outputs or attnkit errors, never IndexError/RuntimeError."""

from __future__ import annotations

import pytest
import torch

from attnkit.errors import ArgumentError, DTypeError, ShapeError
from attnkit.models import (
    HierarchicalAttentionNetwork,
    LogAnomalyDetector,
    Perceiver,
    PointerGenerator,
    PointerNetwork,
    Seq2Seq,
    SoftmaxSelfAttention,
    Transformer,
    TransformerEncoder,
    TransformerLM,
    VisionTransformer,
    _rnn,
    seq2seq,
)

S, T, V = 7, 5, 11  # source length, target length, vocabulary


def _ids(b, *shape, dtype=torch.long, high=V):
    return torch.randint(0, high, (b, *shape), generator=torch.Generator().manual_seed(b)).to(dtype)


# name -> (build, call(model, b, dtype of the ids) -> output, expected shapes of the tensors in the output)
TOKEN_MODELS = {
    "Transformer": (lambda: Transformer(V, 13, dim=12, num_heads=3),
                    lambda m, b, dt: m(_ids(b, S, dtype=dt), _ids(b, T, dtype=dt)), lambda b: [(b, T, 13)]),
    "TransformerLM": (lambda: TransformerLM(V, dim=12, num_heads=3),
                      lambda m, b, dt: m(_ids(b, S, dtype=dt)), lambda b: [(b, S, V)]),
    "Perceiver": (lambda: Perceiver(6, 4, vocab_size=V, num_latents=3, latent_dim=8, depth=1, latent_heads=2),
                  lambda m, b, dt: m(_ids(b, S, dtype=dt)), lambda b: [(b, 4)]),
    "Seq2Seq": (lambda: Seq2Seq(V, 13, embed_dim=6, hidden_dim=8, attention="coverage"),
                lambda m, b, dt: m(_ids(b, S, dtype=dt), _ids(b, T, dtype=dt)),
                lambda b: [(b, T, 13), (b, T, S), (b, T)]),
    "Seq2Seq.greedy_decode": (lambda: Seq2Seq(V, 13, embed_dim=6, hidden_dim=8, rnn="lstm", attention="local-p"),
                              lambda m, b, dt: m.greedy_decode(_ids(b, S, dtype=dt), max_len=3, bos=1),
                              lambda b: [(b, 3), (b, 3, S), (b,)]),
    "PointerGenerator": (lambda: PointerGenerator(V, embed_dim=6, hidden_dim=8),
                         lambda m, b, dt: m(_ids(b, S, dtype=dt), _ids(b, T, dtype=dt)),
                         lambda b: [(b, T, V), (b, T, S), (b, T), (b, T)]),
    "HierarchicalAttentionNetwork": (lambda: HierarchicalAttentionNetwork(V, 3, embed_dim=6, hidden_dim=8),
                                     lambda m, b, dt: m(_ids(b, 2, 4, dtype=dt)),
                                     lambda b: [(b, 3), (b, 2), (b, 2, 4)]),
    "LogAnomalyDetector": (lambda: LogAnomalyDetector(V, embed_dim=4, hidden_dim=6),
                           lambda m, b, dt: m(_ids(b, S, dtype=dt)), lambda b: [(b, S, V), (b, S), (b, S, S)]),
}


def _shapes(out):
    out = out if isinstance(out, tuple) else (out,)
    return [tuple(t.shape) for t in out if isinstance(t, torch.Tensor)]


@pytest.mark.parametrize("name", TOKEN_MODELS)
def test_empty_batch_gives_empty_outputs(name):
    """RELIABILITY row 16 (B = 0): empty outputs of the right shapes, not a reshape RuntimeError."""
    build, call, shapes = TOKEN_MODELS[name]
    torch.manual_seed(0)
    model = build().eval()
    with torch.no_grad():
        assert _shapes(call(model, 0, torch.long)) == shapes(0)
        assert _shapes(call(model, 2, torch.long)) == shapes(2)


@pytest.mark.parametrize("name", TOKEN_MODELS)
def test_int32_ids_equal_int64_ids(name):
    build, call, _ = TOKEN_MODELS[name]
    torch.manual_seed(0)
    model = build().eval()
    with torch.no_grad():
        for a, b in zip(call(model, 2, torch.long), call(model, 2, torch.int32), strict=True):
            if isinstance(a, torch.Tensor):
                torch.testing.assert_close(a, b, rtol=0, atol=0, check_dtype=False)


@pytest.mark.parametrize("dtype", [torch.int16, torch.int8, torch.uint8, torch.bool, torch.float32])
@pytest.mark.parametrize("name", TOKEN_MODELS)
def test_ids_of_another_dtype_raise_dtype_error(name, dtype):
    """Embeddings index with int64/int32 only: other dtypes are an attnkit DTypeError naming the dtype."""
    build, call, _ = TOKEN_MODELS[name]
    with pytest.raises(DTypeError, match=str(dtype).replace("torch.", "")):
        call(build(), 2, dtype)


@pytest.mark.parametrize("name", TOKEN_MODELS)
def test_negative_ids_raise_argument_error(name):
    """Negative ids would index the embedding from its end (or raise IndexError): an attnkit error instead."""
    build, call, _ = TOKEN_MODELS[name]
    with pytest.raises(ArgumentError, match=r"must lie in \[0, \d+\); got \[-"):
        call(_Negated(build()), 2, torch.long)


class _Negated:
    """Stands in for a model; every integer tensor argument reaches it as ``-1 - ids`` (all negative)."""

    def __init__(self, model):
        self.model = model

    def __getattr__(self, name):
        attr = getattr(self.model, name)
        return (lambda *a, **k: attr(*_negate(a), **k)) if callable(attr) else attr

    def __call__(self, *args, **kwargs):
        return self.model(*_negate(args), **kwargs)


def _negate(args):
    return tuple(-1 - a if isinstance(a, torch.Tensor) and not a.is_floating_point() else a for a in args)


@pytest.mark.parametrize(("build", "call"), [
    (lambda: VisionTransformer(8, 4, num_classes=3, dim=8, depth=1, num_heads=2),
     lambda m, dt: m(torch.zeros(2, 1, 8, 8, dtype=dt))),
    (lambda: Perceiver(1, 3, index_dims=2, num_latents=3, latent_dim=8, depth=1, latent_heads=2),
     lambda m, dt: m(torch.zeros(2, 4, 4, 1, dtype=dt))),
    (lambda: PointerNetwork(2, 6),
     lambda m, dt: m(torch.zeros(2, 5, 2, dtype=dt), torch.zeros(2, 3, dtype=torch.long))),
    (lambda: TransformerEncoder(12, 3, 1), lambda m, dt: m(torch.zeros(2, 5, 12, dtype=dt))),
    (lambda: SoftmaxSelfAttention(12, 3), lambda m, dt: m(torch.zeros(2, 5, 12, dtype=dt))),
])
def test_float_inputs_of_another_dtype_than_the_parameters_raise(build, call):
    """RELIABILITY row 14: no silent cast, and an attnkit DTypeError instead of torch's matmul RuntimeError."""
    model = build()
    with pytest.raises(DTypeError, match="float64"):
        call(model, torch.float64)
    call(model.double(), torch.float64)  # once the model is float64 too, it runs


def test_pointer_network_empty_batch_and_int32_targets():
    torch.manual_seed(0)
    m = PointerNetwork(2, 6, end_token=True)
    points = torch.rand(2, 5, 2)
    assert m(points[:0], torch.zeros(0, 3, dtype=torch.long)).shape == (0, 3, 6)
    assert m.greedy_decode(points[:0]).ids.shape == (0, 6)
    targets = torch.tensor([[3, 1, 5], [0, 2, 4]])
    assert torch.equal(m(points, targets), m(points, targets.int()))
    with pytest.raises(DTypeError, match="int16"):
        m(points, targets.short())


def test_softmax_self_attention_checks_x_and_key_keep_mask():
    attn = SoftmaxSelfAttention(12, 3, causal=True)
    x = torch.randn(2, 5, 12)
    with pytest.raises(ShapeError, match=r"dim=12.*\(2, 5, 10\)"):
        attn(x[..., :10])
    with pytest.raises(ShapeError, match=r"\(5, 12\)"):
        attn(x[0])
    with pytest.raises(ShapeError, match=r"key_keep_mask must have shape \(batch, n\) = \(2, 5\); got \(2, 4\)"):
        attn(x, key_keep_mask=torch.ones(2, 4, dtype=torch.bool))
    cache = attn.new_cache(2, 9)
    attn(x[:, :3], cache=cache)
    with pytest.raises(ShapeError, match=r"\(2, 5\); got \(2, 2\)"):  # cached 3 + new 2 keys
        attn(x[:, 3:], cache=cache, key_keep_mask=torch.ones(2, 2, dtype=torch.bool))
    with pytest.raises(DTypeError, match="key_keep_mask"):
        attn(x, key_keep_mask=torch.ones(2, 5))


@pytest.mark.parametrize("bad", [[1, 2], (), "cache"])
def test_caches_are_checked_before_use(bad):
    lm = TransformerLM(V, dim=12, num_heads=3, num_layers=2).eval()
    model = Transformer(V, dim=12, num_heads=3).eval()
    tokens = _ids(2, 3)
    with pytest.raises(ArgumentError, match="caches must be a list of 2 KVCache"):  # was TypeError / IndexError
        lm(tokens, caches=bad)
    with pytest.raises(ArgumentError, match="caches must be a list of 2 KVCache"):
        model.decode(tokens, model.encode(tokens), caches=bad)
    caches = lm.body.new_caches(2, 8)
    lm(tokens, caches=caches)  # both layers' caches now hold 3 positions
    with pytest.raises(ArgumentError, match="different lengths"):
        lm(tokens, caches=caches[:1] + lm.body.new_caches(2, 8)[1:])


def test_source_lengths_of_a_float_dtype_name_the_dtype():
    m = Seq2Seq(V, 13, embed_dim=6, hidden_dim=8)
    with pytest.raises(DTypeError, match=r"lengths.*float32"):  # was a ShapeError saying the shape (2,) is wrong
        m(_ids(2, S), _ids(2, T), src_lengths=torch.tensor([3.0, 4.0]))
    with pytest.raises(ShapeError, match=r"lengths must have shape \(batch,\) = \(2,\)"):
        m(_ids(2, S), _ids(2, T), src_lengths=torch.tensor([3, 4, 5]))


def test_rnn_helpers_live_in_one_module_and_stay_importable_from_seq2seq():
    for name in ("check_tokens", "source_mask", "make_rnn", "encode_padded"):
        assert getattr(seq2seq, name) is getattr(_rnn, name)
        assert name in seq2seq.__all__



def test_losses_skip_the_tasks_ignore_index_and_check_targets():
    """Targets padded with -100 (attnkit.lab.tasks.IGNORE_INDEX) are not scored: Seq2Seq.loss used to average them
    in as zero loss (plus their coverage loss) and PointerGenerator.loss raised a gather RuntimeError."""
    torch.manual_seed(0)
    src, tgt_in = _ids(2, S), _ids(2, T)
    target = _ids(2, T).masked_fill(torch.tensor([[False] * 3 + [True] * 2, [False] + [True] * 4]), -100)
    kept = target != -100
    full = target.masked_fill(~kept, 0)
    s2s = Seq2Seq(V, 13, embed_dim=6, hidden_dim=8, attention="coverage")
    pg = PointerGenerator(V, embed_dim=6, hidden_dim=8)
    for model, loss in ((s2s, Seq2Seq.loss), (pg, PointerGenerator.loss)):
        out = model(src, tgt_in)
        want = loss(out, full, mask=kept)  # the scored tokens only, by an explicit mask
        torch.testing.assert_close(loss(out, target), want)
        torch.testing.assert_close(loss(out, target, mask=torch.ones(2, T, dtype=torch.bool)), want)
        with pytest.raises(ArgumentError, match=r"target ids must lie in \[0, \d+\) or be -100"):
            loss(out, full + 13)
        with pytest.raises(ShapeError, match="target"):
            loss(out, full[:, :2])
        with pytest.raises(DTypeError, match="target"):
            loss(out, full.float())
