"""``attnkit bench --models``: the whole-model rows of BENCHMARKS.md, from ``benchmarks/whole_models.py``.

A GPT-style model's training step with attnkit's attention against SDPA (causal, and a
causal window against the dense mask), ``attnkit.models.TransformerLM`` against the same
model in plain torch (a training step, and greedy generation with the KV cache), each
pair interleaved for ``--repeats`` rounds at 1 thread (``--threads`` to change it);
``--compiled`` adds every row with both sides under ``torch.compile``. The rows' code lives
in the source checkout's ``benchmarks/`` (not in the installed package).
"""

from __future__ import annotations

import argparse
import sys


def _whole_models():
    from .bench import source_module

    try:
        return source_module("whole_models")
    except LookupError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _parsed(what: str):
    def convert(text: str):
        try:
            return getattr(_whole_models(), what)(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
    return convert


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

    wm = _whole_models()
    torch.set_num_threads(args.threads or 1)
    sizes = args.model_sizes or wm.Sizes()
    results = wm.run(sizes, args.models, rounds=args.repeats, compiled=args.compiled,
                     log=lambda line: print(line, file=sys.stderr))
    print(wm.report(argparse.Namespace(rounds=args.repeats, rows=args.models, sizes=sizes, compiled=args.compiled),
                    results))
    return 0
