"""``attnkit`` command line (also ``python -m attnkit``); each subcommand lives in :mod:`attnkit.lab.commands`.

The contract every subcommand keeps: its ``--help`` shows a description, each option's
default and examples; a user error is one line on stderr, ``attnkit: error: ...``, and
exit status 2 (an unknown name suggests the close ones); building the parsers imports
no torch, so ``attnkit --help`` and ``attnkit --version`` answer at once.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn

from .. import __version__
from ..errors import did_you_mean
from .commands import bench, inspect, measure, plots, record, tour
from .commands.common import HelpFormatter, paragraphs

COMMAND_MODULES = (inspect, bench, measure, plots, record, tour)
USER_ERRORS = (ValueError, TypeError, LookupError, ImportError)  # attnkit's errors subclass the first two


class Parser(argparse.ArgumentParser):
    """An argparse parser whose errors are one line, ``attnkit: error: ...`` (exit 2), with did-you-mean."""

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix("attnkit").strip()
        report(f"{command + ': ' if command else ''}{message} (see {self.prog} --help)")
        self.exit(2)

    def _check_value(self, action: argparse.Action, value) -> None:
        if action.choices is not None and value not in action.choices:
            known = [str(c) for c in action.choices]
            raise argparse.ArgumentError(action, f"invalid choice {value!r}; {did_you_mean(str(value), known)}"
                                                 f"choose from {', '.join(known)}")


def report(message) -> None:
    """Print ``attnkit: error: <message>`` as one line on stderr."""
    print("attnkit: error: " + " ".join(str(message).split()), file=sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="attnkit", formatter_class=HelpFormatter,
                    description=paragraphs("Attention mechanisms on one exact, fast core: list them, see which "
                                           "kernel a call takes, count and measure their cost, draw their maps and "
                                           "masks, run the tour."),
                    epilog="examples:\n  attnkit list\n  attnkit explain --q-len 4096 --mask \"causal()\"\n"
                           "  attnkit cost longformer --q-len 4096\n\nattnkit COMMAND --help describes each command.")
    parser.add_argument("--version", action="version", version=f"attnkit {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMAND_MODULES:
        module.add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except USER_ERRORS as err:
        report(err.args[0] if isinstance(err, KeyError) and err.args else err)
        return 2
    except BrokenPipeError:  # the reader left (attnkit explain | head): stop quietly, as Unix tools do
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115  (so the interpreter's final flush fails no more)
        return 0


if __name__ == "__main__":
    sys.exit(main())
