"""``attnkit record NAME``: run a registered mechanism's example, record its attention maps, draw them."""

from __future__ import annotations

import importlib
from pathlib import Path

import torch
from torch import nn

from .. import registry
from ..analysis.recorder import AttentionRecorder
from ..analysis.stats import summary
from ..errors import ArgumentError

FORMATS = ("png", "svg", "html")


def record_example(name: str, *, seed: int = 0) -> AttentionRecorder:
    """The maps of ``registry.get(name).example()``, named after its submodules (seeded for stochastic ones)."""
    try:
        entry = registry.get(name)
    except KeyError as err:
        raise ArgumentError(str(err.args[0])) from None
    if entry.example is None:
        raise ArgumentError(f"mechanism {name!r} has no example to run")
    torch.manual_seed(seed)  # before example(): some examples build their modules from the global generator
    fn, inputs = entry.example()
    with torch.no_grad(), AttentionRecorder(fn if isinstance(fn, nn.Module) else None) as rec:
        fn(*inputs)
    if not rec.maps:
        raise ArgumentError(f"mechanism {name!r} computes no attention map to record (no weights over keys)")
    return rec


def _cmd_record(args) -> int:
    rec = record_example(args.name, seed=args.seed)
    maps = rec.as_dict(sample=0)
    try:
        viz = importlib.import_module("attnkit.viz")
    except ImportError as err:
        raise ArgumentError(f"attnkit record needs attnkit.viz and its plotting extra: {err}") from None
    out = Path(args.out) if args.out is not None else Path("attnkit-maps") / args.name
    out.mkdir(parents=True, exist_ok=True)
    picture = out / f"{args.name}.{args.format}"
    title = f"{args.name}: {registry.get(args.name).paper}"
    if args.format == "html":
        viz.html_page(maps, title=title, path=picture)
    else:
        viz.head_grid(maps, title=title, path=picture)
    stats = out / "stats.md"
    stats.write_text(f"# {args.name}\n\n{summary(maps).to_markdown()}\n", encoding="utf-8")
    for path in (picture, stats):
        print(path)
    return 0


def add(sub) -> None:
    p = sub.add_parser("record", help="run a mechanism's example, record its attention maps and draw them")
    p.add_argument("name", help="a registered mechanism (see attnkit list)")
    p.add_argument("--out", default=None, help="output folder (default: attnkit-maps/NAME)")
    p.add_argument("--format", default="png", choices=FORMATS)
    p.add_argument("--seed", type=int, default=0, help="torch seed for stochastic mechanisms")
    p.set_defaults(func=_cmd_record)
