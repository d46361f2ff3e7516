"""attnkit.runtime: the low-precision math mode (which dtype the fused kernels compute bfloat16/float16 in).

The kernels' results in each mode are tested in tests/kernels/test_low_precision.py.
"""

from __future__ import annotations

import pytest
import torch

from attnkit import runtime
from attnkit.errors import ArgumentError


def test_auto_follows_the_cpu_and_other_dtypes_are_left_alone(mode):
    cpu = torch.device("cpu")
    for dtype in (torch.bfloat16, torch.float16):
        expected = dtype if runtime.native_low_precision(dtype) else torch.float32
        assert runtime.low_precision_math(dtype, cpu) == expected
    mode("float32")
    assert runtime.low_precision_math(torch.bfloat16, cpu) == torch.float32
    assert runtime.low_precision_math(torch.float64, cpu) == torch.float64
    mode("native")
    assert runtime.low_precision_math(torch.bfloat16, cpu) == torch.bfloat16
    with pytest.raises(ArgumentError, match="mode must be one of"):
        runtime.set_low_precision_math("fast")
