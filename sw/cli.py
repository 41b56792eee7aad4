"""The ``mcf`` command line: the ABI, the Verilog, MARS plans, benches, the system model,
board builds and deploys, and cluster runs, one subcommand each (``mcf <command> --help``).

Each subcommand lives in ``mcf.commands.<name>`` and adds itself with ``register(subparsers)``;
a subcommand's handler returns the exit status. Bad arguments give one line on stderr and exit
status 2, before any build or simulation starts (:class:`UsageError`)."""

from __future__ import annotations

import argparse
import importlib
import sys

SUBCOMMANDS = ("abi", "verilog", "plan", "bench", "tables", "build", "deploy", "model", "run",
               "demo")


class UsageError(Exception):
    """Bad arguments: reported as one line on stderr, exit status 2."""


def version() -> str:
    """The installed package's version (its metadata), or ``unknown`` when it is not
    installed."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version
    try:
        return dist_version("mcf")
    except PackageNotFoundError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    from .commands._checks import description
    parser = argparse.ArgumentParser(prog="mcf", description=description(__doc__))
    parser.add_argument("--version", action="version", version=f"mcf {version()}")
    subs = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
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
