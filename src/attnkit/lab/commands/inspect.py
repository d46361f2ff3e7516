"""``attnkit list`` and ``attnkit explain``: what is registered, and which backend a call would take."""

from __future__ import annotations

import argparse

from ...errors import ArgumentError, did_you_mean
from .common import add_command
from .sizes import add_size_args

DTYPES = ("float32", "float64", "bfloat16", "float16")


def add_case_args(p: argparse.ArgumentParser) -> None:
    """The problem-size options shared by ``explain`` and ``bench``: the size vocabulary, dtype and mask."""
    add_size_args(p)
    p.add_argument("--dtype", default="float32", choices=DTYPES, help="dtype of q, k, v")
    p.add_argument("--mask", default=None, help='a mask expression, e.g. "causal() & sliding_window(128, 128)" '
                                                '(default: no mask)')


def case_from_args(args, backward: bool = False):
    """The :class:`~attnkit.lab.analysis.timing.Case` the size options describe."""
    from ..analysis.timing import Case

    return Case(args.batch, args.heads, args.q_len, args.kv_len, args.head_dim, args.dtype, args.mask, backward)


def _cmd_list(args) -> int:
    from ... import registry

    rows = [e for e in registry.entries() if args.family in (None, e.family)]
    if not rows:
        families = sorted({e.family for e in registry.entries()})
        raise ArgumentError(f"no mechanism in family {args.family!r}; {did_you_mean(args.family, families)}"
                            f"families: {', '.join(families)}")
    columns = ("name", "import_path", "family", "complexity")
    name_w, imp_w, fam_w, cx_w = (max(len(getattr(e, a)) for e in rows) for a in columns)
    print(f"{'name':<{name_w}}  {'import':<{imp_w}}  {'family':<{fam_w}}  {'complexity':<{cx_w}}  paper")
    for e in rows:
        print(f"{e.name:<{name_w}}  {e.import_path:<{imp_w}}  {e.family:<{fam_w}}  {e.complexity:<{cx_w}}  {e.paper}")
    print(f"\n{len(rows)} mechanisms")
    return 0


def _cmd_explain(args) -> int:
    import torch

    from ...core import explain
    from ...masks import parse

    mask = parse(args.mask) if args.mask else None  # before the tensors: a bad expression fails at once
    case = case_from_args(args)
    # Views of one row of D zeros (stride 0 but along D): any size is explained without allocating it; no value
    # is read, and the innermost stride is the 1 a real tensor has.
    zero = torch.zeros(case.head_dim, dtype=getattr(torch, args.dtype))
    q = zero.expand(case.batch, case.heads, case.q_len, case.head_dim)
    k = v = zero.expand(case.batch, case.heads, case.kv_len or case.q_len, case.head_dim)
    print(f"attention(q{tuple(q.shape)}, k{tuple(k.shape)}, v{tuple(v.shape)}, mask={args.mask or None})")
    print(explain(q, k, v, mask=mask, read_data=False))
    return 0


def add(sub) -> None:
    p = add_command(sub, "list", summary="every registered mechanism with its paper and complexity",
                    description="List the registered mechanisms: name (as the other commands take it), family, "
                                "time complexity in the sequence lengths, and the paper.",
                    examples=["attnkit list", "attnkit list --family sparse"])
    p.add_argument("--family", default=None, help="only this family (default: every family)")
    p.set_defaults(func=_cmd_list)
    p = add_command(sub, "explain", summary="which execution path attnkit.attention takes for given sizes, and why",
                    description="Print attnkit.explain() for q, k, v of the given sizes (zero-stride views: nothing "
                                "of that size is allocated, and no value is read): the execution path the "
                                "dispatcher picks, why every other path was refused or not preferred, and the "
                                "estimated FLOPs and extra memory. A block-sparse layout's density is left to run "
                                "time.",
                    examples=['attnkit explain --q-len 4096 --mask "sliding_window(128, 128)"',
                              'attnkit explain --q-len 1 --kv-len 4096 --mask "causal()"   # one decoding step'])
    add_case_args(p)
    p.set_defaults(func=_cmd_explain)
