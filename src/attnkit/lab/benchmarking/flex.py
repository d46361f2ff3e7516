"""FlexAttention, compiled, as the comparison a torch user would pick for a sparse mask or a score modifier.

The attnkit mask's own predicate is the ``mask_mod`` and the modifier the
``score_mod``, so both sides compute the same function. The block mask is built
and the kernel compiled when the method is made; both durations are reported
next to the row (``notes``), never inside its time. On CPU, torch (2.5 - 2.13)
has no FlexAttention backward: the error torch raises is reported as the reason.
"""

from __future__ import annotations

import torch

from ...bias import apply_modifier
from ...kernels.flex import kernel
from ...masks.block_masks import mask_mod as as_mask_mod
from ..analysis.timing import time_once
from .side import Method, Unavailable

__all__ = ["flex_method"]


def _mods(mask, modifier, q_len: int, kv_len: int):
    mask_mod = None if mask is None else as_mask_mod(mask, q_len, kv_len)
    score_mod = None
    if modifier is not None:
        score_mod = lambda s, b, h, qi, ki: apply_modifier(modifier, s, b, h, qi, ki, q_len, kv_len)
    return mask_mod, score_mod


def flex_method(case, q, k, v, mask, modifier) -> Method:
    """Compiled FlexAttention on the case; raises :class:`Unavailable` with torch's reason when it cannot run."""
    try:
        from torch.nn.attention.flex_attention import create_block_mask
    except ImportError as err:
        raise Unavailable(f"torch {torch.__version__} has no FlexAttention") from err
    lq, lk = q.shape[2], k.shape[2]
    mask_mod, score_mod = _mods(mask, modifier, lq, lk)
    leaves = (q, k, v)
    if not case.backward:  # torch refuses CPU inputs that require grad even under no_grad
        q, k, v = (t.detach() for t in (q, k, v))
    build = lambda: None if mask_mod is None else create_block_mask(mask_mod, None, None, lq, lk, device=q.device)
    try:
        built, block_mask = time_once(build, q.device)
    except Exception as err:  # any failure of torch's mask builder is a reason to report
        raise Unavailable(f"create_block_mask failed: {type(err).__name__}: {_first_line(err)}") from err
    flex = kernel()  # compiled once per process, the kernel attnkit's flex path calls
    run = lambda: flex(q, k, v, score_mod=score_mod, block_mask=block_mask)

    def first_call():
        out = run()
        if case.backward:
            out.sum().backward()

    try:
        compiled, _ = time_once(first_call, q.device)
    except Exception as err:  # compile errors come in many types; all mean "not here"
        raise Unavailable(f"{type(err).__name__}: {_first_line(err)}") from err
    notes = {"block mask s": round(built, 2), "first call (compile) s": round(compiled, 2)}
    return Method("flex_attention (compiled)", run, leaves, notes)


def _first_line(err: Exception) -> str:
    text = str(err).strip().splitlines()
    return text[0][:160] if text else ""
