"""``mcf verilog [--out DIR] [--only TOP ...]``: write the Verilog of every top in
:mod:`mcf.hdl.tops` (or of the tops named), one ``DIR/<top>.v`` each."""

from __future__ import annotations

from pathlib import Path

from ..cli import UsageError
from ._checks import Progress, description, writable_dir


def check(args) -> list[str]:
    """The tops to write, ``--only`` and ``--out`` checked (before any conversion)."""
    from mcf.hdl.tops import TOPS

    if args.only is not None and not args.only:
        raise UsageError(f"--only needs at least one top name; known: {', '.join(sorted(TOPS))}")
    names = args.only or sorted(TOPS)
    unknown = [n for n in names if n not in TOPS]
    if unknown:
        raise UsageError(f"unknown top(s) {', '.join(unknown)}; known: {', '.join(sorted(TOPS))}")
    writable_dir("--out", args.out)
    return list(dict.fromkeys(names))


def run(args, *, prog: str = "mcf verilog") -> int:
    from mcf.hdl.convert import verilog_text
    from mcf.hdl.tops import TOPS

    from .build import verilog_ports

    names = check(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with Progress(prog, len(names), "converting to Verilog", "top",
                  enabled=not getattr(args, "quiet", False)) as bar:
        for name in names:
            bar.step(name)
            path = out / f"{name}.v"
            text = verilog_text(name, TOPS[name], top_description(name))
            path.write_text(text)
            print(f"{path}  ({len(verilog_ports(text, name))} ports)")
    return 0


def top_description(name: str) -> str:
    """The :func:`mcf.hdl.convert.verilog_text` description of ``TOPS[name]`` (shared by
    every caller that converts a listed top)."""
    return f"mcf.hdl.tops.TOPS[{name!r}]"


def register(subs) -> None:
    p = subs.add_parser("verilog", help="generate the Verilog of every top-level design",
                        description=description(__doc__))
    p.add_argument("--out", default="build/verilog", help="output folder (default %(default)s)")
    p.add_argument("--only", nargs="*", metavar="TOP",
                   help="generate only these tops (at least one name)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(handler=run)
