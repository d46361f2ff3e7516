"""bfloat16/float16 on the fused kernels: computed natively or in float32 (attnkit.runtime.low_precision_math).

Both modes are forced in turn and compared with the float64 reference within the
dtype's tolerance; "float32" must also agree with attnkit run on float32 copies of
the inputs (the same computation, rounded once), forward and backward.
"""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit import masks
from attnkit.bias import ALiBi
from tests.helpers import assert_close_to_oracle, rand_qkv


@pytest.mark.parametrize("name", ["native", "float32"])
@pytest.mark.parametrize("kwargs", [{}, {"mask": masks.causal()}, {"bias": ALiBi(3)}], ids=["none", "causal", "alibi"])
def test_both_modes_match_the_float64_reference(mode, name, kwargs):
    mode(name)
    q, k, v = rand_qkv(2, 3, 37, 41, 16, dtype=torch.bfloat16, seed=3)
    got = attnkit.attention(q, k, v, **kwargs)
    assert got.dtype == torch.bfloat16
    assert_close_to_oracle(got, q, k, v, **kwargs)


@pytest.mark.parametrize("kwargs", [{}, {"mask": masks.padding([30, 41])}, {"bias": ALiBi(3)}],
                         ids=["none", "padding", "alibi"])
def test_float32_mode_is_the_float32_computation_rounded_once(mode, kwargs):
    mode("float32")
    q, k, v = rand_qkv(2, 3, 37, 41, 16, dtype=torch.bfloat16, seed=4, requires_grad=True)
    out = attnkit.attention(q, k, v, **kwargs)
    out.float().square().sum().backward()
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    ref = attnkit.attention(q32, k32, v32, **kwargs)
    assert torch.equal(out, ref.to(torch.bfloat16))
    ref.to(torch.bfloat16).float().square().sum().backward()
    for mine, theirs in ((q, q32), (k, k32), (v, v32)):
        assert mine.grad.dtype == torch.bfloat16
        torch.testing.assert_close(mine.grad, theirs.grad.to(torch.bfloat16), rtol=0, atol=0)
