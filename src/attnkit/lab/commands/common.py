"""What every subcommand shares: its help page (description, defaults, examples), number types, the plot extra.

Nothing here imports torch: ``attnkit --help`` and ``attnkit CMD --help`` build every
parser, and only a command that runs imports what it needs.
"""

from __future__ import annotations

import argparse
import importlib
import textwrap

from ...errors import ArgumentError

__all__ = ["HelpFormatter", "add_command", "paragraphs", "positive_int", "positive_float", "require_plot", "PLOT_EXTRA"]

PLOT_EXTRA = 'pip install "attnkit[plot]"'


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Each option's default after its help (except None, off switches and empty values), descriptions and
    examples as written."""

    def _get_help_string(self, action: argparse.Action) -> str:
        shown_already = "default:" in (action.help or "")
        if action.default is None or action.default is False or action.default in ((), "") or shown_already:
            return action.help or ""
        return super()._get_help_string(action)


def paragraphs(text: str, width: int = 88) -> str:
    """``text`` with each paragraph (separated by a blank line) filled to ``width`` columns."""
    return "\n\n".join(textwrap.fill(" ".join(par.split()), width) for par in text.split("\n\n"))


def add_command(sub, name: str, *, summary: str, description: str, examples: list[str]) -> argparse.ArgumentParser:
    """A subcommand whose help shows ``description``, every default and ``examples`` (each a command line,
    optionally followed by ``  # what it does``)."""
    epilog = "examples:\n" + "\n".join(f"  {line}" for line in examples)
    return sub.add_parser(name, help=summary, description=paragraphs(description), epilog=epilog,
                          formatter_class=HelpFormatter)


def positive_int(text: str) -> int:
    """An argparse type: an int >= 1 (a size, a count)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1; got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1; got {text!r}")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a finite float > 0 (seconds, a ratio)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number > 0; got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number > 0; got {text!r}")
    return value


def require_plot(command: str):
    """:mod:`attnkit.lab.viz` with matplotlib loaded, or an ArgumentError naming the pip command of the plot extra."""
    try:
        importlib.import_module("matplotlib")
    except ImportError:
        raise ArgumentError(f"attnkit {command} draws with matplotlib, which is not installed: {PLOT_EXTRA}") from None
    return importlib.import_module("attnkit.lab.viz")
