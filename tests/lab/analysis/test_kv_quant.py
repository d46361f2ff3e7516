"""The quantized-cache error report: its numbers recomputed densely (float64 oracle, own dequantization)."""

from __future__ import annotations

import pytest
import torch

from attnkit import masks
from attnkit.errors import ArgumentError, DTypeError
from attnkit.functional.quantize import KVFormat
from attnkit.lab.analysis.kv_quant import kv_quant_error
from attnkit.models import TransformerLM
from attnkit.models.self_attention import SoftmaxSelfAttention
from tests.oracle import dense_attention


def _model(**options):
    torch.manual_seed(0)
    return TransformerLM(40, dim=32, num_heads=4, num_layers=3, dropout=0.0, positional="rotary", norm_first=True,
                         max_len=None, **options).eval()


def _recomputed(model, tokens, fmt):
    """(layers, heads, positions) RMS errors: each layer's input captured, attended densely in float64 twice."""
    inputs = []
    layers = [m for m in model.modules() if isinstance(m, SoftmaxSelfAttention)]
    hooks = [m.register_forward_pre_hook(lambda m, a: inputs.append(a[0])) for m in layers]
    with torch.no_grad():
        model(tokens)
    for h in hooks:
        h.remove()
    errors, relatives = [], []
    for layer, x in zip(layers, inputs, strict=True):
        with torch.no_grad():
            q, k, v = layer._project(x, x, x)
            q, k = layer._position(q, k, 0, 0)
        n = x.shape[1]
        allowed = masks.causal().materialize(n, n)
        if layer.pattern is not None:
            allowed = allowed & layer.pattern.materialize(n, n)
        full = dense_attention(q.double(), k.double(), v.double(), mask=allowed)
        (kc, ks), (vc, vs) = fmt.quantize(k), fmt.quantize(v)
        deq = dense_attention(q.double(), kc.double() * ks.double()[..., None], vc.double() * vs.double()[..., None],
                              mask=allowed)
        err = ((deq - full) ** 2).mean(dim=(0, 3)).sqrt()
        errors.append(err)
        relatives.append(err / (full ** 2).mean(dim=(0, 3)).sqrt())
    return torch.stack(errors), torch.stack(relatives)


@pytest.mark.parametrize("options", [{}, {"attention_mask": masks.sliding_window(5, 0)}], ids=["causal", "window"])
def test_the_report_is_reproduced_by_a_dense_recomputation(options):
    model, tokens = _model(**options), torch.randint(0, 40, (2, 16), generator=torch.Generator().manual_seed(1))
    fmt = KVFormat("float8_e4m3")
    report = kv_quant_error(model, tokens, fmt, budget=0.02)
    error, relative = _recomputed(model, tokens, fmt)
    assert report.error.shape == (3, 4, 16) and bool((report.error > 0).any())
    torch.testing.assert_close(report.error, error, rtol=1e-3, atol=1e-6)
    torch.testing.assert_close(report.relative, relative, rtol=1e-3, atol=1e-6)
    torch.testing.assert_close(report.layer_error, relative.mean(dim=(1, 2)), rtol=1e-3, atol=1e-7)
    assert report.keep == tuple(i for i in range(3) if relative[i].mean() > 0.02)


def test_the_layers_kept_are_those_over_the_budget():
    model, tokens = _model(), torch.randint(0, 40, (1, 12), generator=torch.Generator().manual_seed(2))
    int4, int8 = (kv_quant_error(model, tokens, kind) for kind in ("int4", "int8"))
    assert bool((int4.layer_error > int8.layer_error).all())  # 4 bits lose more than 8
    worst = int(int4.layer_error.argmax())
    middle = float(int4.layer_error.sort().values[1])
    assert worst in int4.keep_for(middle) and len(int4.keep_for(middle)) == 1
    assert int4.keep_for(0.0) == (0, 1, 2) and int4.keep_for(float(int4.layer_error.max())) == ()
    assert "keep at full precision" in str(kv_quant_error(model, tokens, "int4", budget=middle))


def test_bad_arguments_name_them():
    model, tokens = _model(), torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(ArgumentError, match="budget"):
        kv_quant_error(model, tokens, "int8", budget=-1)
    with pytest.raises(DTypeError, match="kv_format"):
        kv_quant_error(model, tokens, None)
    with pytest.raises(ArgumentError, match="no softmax self-attention layer"):
        kv_quant_error(torch.nn.Linear(2, 2), tokens, "int8")
