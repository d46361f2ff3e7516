"""Random problems for every linear-recurrence function and a float64 oracle that shares no code with them.

The oracle is the papers' recurrence written token by token with explicit matrices::

    S_t = (I - beta_t k_t k_t^T) diag(alpha_t) S_{t-1} + beta_t k_t v_t^T     (delta rule)
    S_t = diag(alpha_t) S_{t-1} + k_t v_t^T                                  (no delta rule)
    o_t = S_t^T q_t

Each :class:`Case` holds the leaf tensors (for gradients), how to call the library function in a
form, and the oracle's answer; sizes are distinct (b=2, h=3, n=13, dk=5, dv=7) so swapped axes fail.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from attnkit.functional.recurrences import (
    delta_rule,
    gated_delta_rule,
    gated_linear_attention,
    kimi_delta_attention,
    retention,
    ssd,
)

B, H, N, DK, DV = 2, 3, 13, 5, 7
NAMES = ("retention", "gla", "ssd", "delta", "gated_delta", "kda")


def oracle(q, k, v, alpha, beta, state):
    """``(out (b, h, n, dv), final state)`` of the recurrence above; ``alpha`` ``(b, h, n, dk)``, ``beta``
    ``(b, h, n)`` or None, ``state`` ``(b, h, dk, dv)``; every product an explicit float64 matrix."""
    b, h, n, dk = q.shape
    eye = torch.eye(dk, dtype=torch.float64)
    out = torch.zeros(b, h, n, v.shape[-1], dtype=torch.float64)
    s = state.double().clone()
    for t in range(n):
        kt, vt = k[:, :, t].double(), v[:, :, t].double()
        decayed = torch.diag_embed(alpha[:, :, t].double()) @ s
        if beta is None:
            s = decayed + kt[..., :, None] * vt[..., None, :]
        else:
            bt = beta[:, :, t].double()[..., None, None]
            s = (eye - bt * kt[..., :, None] * kt[..., None, :]) @ decayed + bt * kt[..., :, None] * vt[..., None, :]
        out[:, :, t] = (q[:, :, t].double()[..., None, :] @ s)[..., 0, :]
    return out, s


def qkv(seed=0, b=B, h=H, n=11, dk=DK, dv=DV):
    """Float64 ``q, k`` ``(b, h, n, dk)`` and ``v`` ``(b, h, n, dv)``."""
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(b, h, n, d, generator=g, dtype=torch.float64) for d in (dk, dk, dv))


def unit(x):
    return x / (x.pow(2).sum(-1, keepdim=True) + 1e-6).sqrt()


@dataclass
class Case:
    leaves: list[torch.Tensor]  # the function's tensors in order, then the initial state (if any)
    call: Callable  # call(form, tensors=leaves, **options) -> (out, state)
    expected: Callable  # () -> (out, state) from the oracle


def _caller(fn, leaves, initial: bool, **fixed):
    """``call(form, tensors=None, **options)``: ``fn`` on ``tensors`` (default ``leaves``), the last one the initial
    state when ``initial``."""
    def call(form, tensors=None, **kw):
        ts = leaves if tensors is None else tensors
        args, state = (ts[:-1], ts[-1]) if initial else (ts, None)
        return fn(*args, form=form, initial_state=state, **fixed, **kw)
    return call


def make(name: str, *, seed: int = 0, dtype=torch.float64, b=B, h=H, n=N, dk=DK, dv=DV, initial=True,
         grad=False, beta_max: float = 1.0) -> Case:
    """A random problem of family ``name``; the delta rule's ``beta`` in ``[0, beta_max]`` (2: negative eigenvalues)."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    q, k, v = rnd(b, h, n, dk), rnd(b, h, n, dk), rnd(b, h, n, dv)
    s0 = rnd(b, h, dk, dv) if initial else None
    if name == "retention":
        gamma = torch.tensor([0.9, 0.5, 0.99, 0.7][:h], dtype=torch.float64)
        extra, alpha, beta = [gamma], gamma[:, None, None].expand(b, h, n, dk), None
    elif name in ("gla", "kda"):
        logs = F.logsigmoid(rnd(b, h, n, dk) + 1)
        extra, alpha = [logs], logs.exp()
        beta = None if name == "gla" else beta_max * torch.sigmoid(rnd(b, h, n))
        extra += [] if beta is None else [beta]
    elif name == "gated_delta":
        logs, beta = F.logsigmoid(rnd(b, h, n) + 1), beta_max * torch.sigmoid(rnd(b, h, n))
        extra, alpha = [logs, beta], logs.exp()[..., None].expand(b, h, n, dk)
    elif name == "delta":
        beta = beta_max * torch.sigmoid(rnd(b, h, n))
        extra, alpha = [beta], torch.ones(b, h, n, dk, dtype=torch.float64)
    else:
        return _ssd_case(rnd, b, h, n, dk, dv, s0, dtype, grad)
    leaves = [t.to(dtype).requires_grad_(grad) for t in (q, k, v, *extra)]
    s0 = None if s0 is None else s0.requires_grad_(grad)
    fn = {"retention": retention, "gla": gated_linear_attention, "delta": delta_rule, "gated_delta": gated_delta_rule,
          "kda": kimi_delta_attention}[name]
    delta = beta is not None
    all_leaves = leaves + ([] if s0 is None else [s0])
    call = _caller(fn, all_leaves, s0 is not None, **({"normalize_qk": True} if delta else {}))

    def expected():
        qq, kk = (unit(q), unit(k)) if delta else (q, k)
        return oracle(qq * dk ** -0.5, kk, v, alpha, beta, torch.zeros(b, h, dk, dv) if s0 is None else s0.detach())
    return Case(all_leaves, call, expected)


def _ssd_case(rnd, b, h, n, dk, dv, s0, dtype, grad):
    groups = 1 if h % 2 else 2
    x, dt = rnd(b, h, n, dv), F.softplus(rnd(b, h, n))
    a, d = -torch.rand(h, dtype=torch.float64) - 0.1, rnd(h)
    bb, cc = rnd(b, groups, n, dk), rnd(b, groups, n, dk)
    leaves = [t.to(dtype).requires_grad_(grad) for t in (x, dt, a, bb, cc, d)]
    s0 = None if s0 is None else s0.requires_grad_(grad)
    all_leaves = leaves + ([] if s0 is None else [s0])
    call = _caller(lambda x_, dt_, a_, b_, c_, d_, **kw: ssd(x_, dt_, a_, b_, c_, D=d_, **kw), all_leaves,
                   s0 is not None)

    def expected():
        per_head = h // groups
        heads = lambda t: t.repeat_interleave(per_head, 1)
        alpha = torch.exp(dt * a[:, None])[..., None].expand(b, h, n, dk)
        out, state = oracle(heads(cc), heads(bb), x * dt[..., None], alpha, None,
                            torch.zeros(b, h, dk, dv) if s0 is None else s0.detach())
        return out + x * d[:, None, None], state
    return Case(all_leaves, call, expected)
