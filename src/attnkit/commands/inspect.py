"""``attnkit list`` and ``attnkit explain``: what is registered, and which backend a call would take."""

from __future__ import annotations

import argparse

from .. import registry
from ..analysis.timing import Case
from ..attention import explain
from ..functional.mask_parse import parse


def add_case_args(p: argparse.ArgumentParser) -> None:
    """The problem-size options shared by ``explain`` and ``bench``."""
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--q-len", type=int, default=4096)
    p.add_argument("--kv-len", type=int, default=None, help="default: q-len")
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--dtype", default="float32", choices=["float32", "float64", "bfloat16", "float16"])
    p.add_argument("--mask", default=None, help='e.g. "causal() & sliding_window(128, 128)"')


def case_from_args(args, backward: bool = False) -> Case:
    """The :class:`~attnkit.analysis.timing.Case` the size options describe."""
    return Case(args.batch, args.heads, args.q_len, args.kv_len, args.head_dim, args.dtype, args.mask, backward)


def _cmd_list(args) -> int:
    rows = [e for e in registry.entries() if args.family in (None, e.family)]
    if not rows:
        families = sorted({e.family for e in registry.entries()})
        raise ValueError(f"no mechanism in family {args.family!r}; families: {', '.join(families)}")
    name_w, fam_w, cx_w = (max(len(getattr(e, a)) for e in rows) for a in ("name", "family", "complexity"))
    print(f"{'name':<{name_w}}  {'family':<{fam_w}}  {'complexity':<{cx_w}}  paper")
    for e in rows:
        print(f"{e.name:<{name_w}}  {e.family:<{fam_w}}  {e.complexity:<{cx_w}}  {e.paper}")
    print(f"\n{len(rows)} mechanisms")
    return 0


def _cmd_explain(args) -> int:
    q, k, v = case_from_args(args).inputs()
    print(f"attention(q{tuple(q.shape)}, k{tuple(k.shape)}, v{tuple(v.shape)}, mask={args.mask or None})")
    print(explain(q, k, v, mask=parse(args.mask) if args.mask else None))
    return 0


def add(sub) -> None:
    p = sub.add_parser("list", help="every registered mechanism with its paper and complexity")
    p.add_argument("--family", default=None)
    p.set_defaults(func=_cmd_list)
    p = sub.add_parser("explain", help="which backend attnkit.attention picks for given sizes, and why")
    add_case_args(p)
    p.set_defaults(func=_cmd_explain)
