"""``attnkit bench --models``: the whole-model rows of BENCHMARKS.md (:mod:`attnkit.lab.benchmarking.whole_models`).

A GPT-style model's training step with attnkit's attention against SDPA (causal, and a
causal window against the dense mask), ``attnkit.models.TransformerLM`` against the same
model in plain torch (a training step, and greedy generation with the KV cache), each
pair interleaved for ``--repeats`` rounds at 1 thread (``--threads`` to change it);
``--compiled`` adds every row with both sides under ``torch.compile``.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable


def argparse_type(parse: Callable[[str], object]) -> Callable[[str], object]:
    """An argparse type from a parser that raises ValueError: its message becomes argparse's one-line error."""
    def convert(text: str):
        try:
            return parse(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
    return convert


def _parsed(name: str):
    """The argparse type of :mod:`attnkit.lab.benchmarking.whole_models`'s ``name`` (imported only when parsing)."""
    return argparse_type(lambda text: getattr(importlib.import_module("attnkit.lab.benchmarking.whole_models"),
                                              name)(text))


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", type=_parsed("parse_rows"), default=None, metavar="ROWS",
                   help="whole-model rows instead of one attention call: all, or comma-separated causal, window, "
                        "lm, generate (the 'Whole models' section of BENCHMARKS.md; --repeats rounds)")
    p.add_argument("--model-sizes", type=_parsed("parse_sizes"), default=None, metavar="SIZES",
                   help="with --models: sizes over the defaults, e.g. length=256,batch=2 (names: batch, length, "
                        "window_length, window, width, heads, layers, vocab, prompt, new_tokens, gen_batch)")
    p.add_argument("--compiled", action="store_true", help="with --models: also every row under torch.compile")


def run_models(args) -> int:
    import torch

    from ..benchmarking import whole_models as wm
    from ..progress import announce, bars, duration

    torch.set_num_threads(args.threads or 1)
    sizes = args.model_sizes or wm.Sizes()
    seconds = wm.estimate_seconds(args.models, rounds=args.repeats, compiled=args.compiled, sizes=sizes)
    where = "on the CPU (a GPU takes less)" if args.device == "cpu" else "on a 2-core CPU; less on a GPU"
    announce(f"attnkit bench --models: {len(args.models)} rows x {args.repeats} rounds"
             f"{', eager then compiled' if args.compiled else ''}; {duration(seconds)} {where}, by the 1-thread "
             "times of BENCHMARKS.md (whole_models.estimate_seconds)")
    with bars(True, len(args.models) * (2 if args.compiled else 1), "models") as step:
        results = wm.run(sizes, args.models, rounds=args.repeats, compiled=args.compiled, log=step,
                         device=args.device)
    print(wm.report(argparse.Namespace(rounds=args.repeats, rows=args.models, sizes=sizes, compiled=args.compiled),
                    results))
    return 0
