"""The single ``mcf`` command line. Each subcommand lives in ``mcf.commands.<name>`` and adds
itself with ``register(subparsers)``; a subcommand's handler returns the exit status."""

from __future__ import annotations

import argparse
import importlib
import sys

SUBCOMMANDS = ("abi", "verilog", "plan", "bench", "tables", "build", "deploy", "model", "run",
               "demo")


class UsageError(Exception):
    """Bad arguments: reported as one line on stderr, exit status 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mcf", description=__doc__.splitlines()[0])
    subs = parser.add_subparsers(dest="command", required=True)
    for name in SUBCOMMANDS:
        importlib.import_module(f"mcf.commands.{name}").register(subs)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except UsageError as exc:
        print(f"mcf {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
