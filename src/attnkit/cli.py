"""``attnkit`` command line (also ``python -m attnkit``); each subcommand lives in :mod:`attnkit.commands`."""

from __future__ import annotations

import argparse
import sys

from .commands import bench, inspect, measure, plots, record, tour

COMMAND_MODULES = (inspect, bench, measure, plots, record, tour)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attnkit", description="attention mechanisms on one exact, fast core")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in COMMAND_MODULES:
        module.add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, TypeError) as err:
        print(f"attnkit: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
