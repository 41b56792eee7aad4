"""``mcf verilog [--out DIR]``: write the Verilog of every top in :mod:`mcf.hdl.tops`."""

from __future__ import annotations

from pathlib import Path


def run(args) -> int:
    from mcf.hdl.convert import verilog_text
    from mcf.hdl.tops import TOPS

    from .build import verilog_ports

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    names = args.only or sorted(TOPS)
    unknown = [n for n in names if n not in TOPS]
    if unknown:
        from ..cli import UsageError
        raise UsageError(f"unknown top(s) {', '.join(unknown)}; known: {', '.join(sorted(TOPS))}")
    for name in names:
        path = out / f"{name}.v"
        text = verilog_text(name, TOPS[name], top_description(name))
        path.write_text(text)
        print(f"{path}  ({len(verilog_ports(text))} ports)")
    return 0


def top_description(name: str) -> str:
    """The :func:`mcf.hdl.convert.verilog_text` description of ``TOPS[name]`` (shared by
    every caller that converts a listed top)."""
    return f"mcf.hdl.tops.TOPS[{name!r}]"


def register(subs) -> None:
    p = subs.add_parser("verilog", help="generate the Verilog of every top-level design")
    p.add_argument("--out", default="build/verilog", help="output folder (default %(default)s)")
    p.add_argument("--only", nargs="*", help="generate only these tops")
    p.set_defaults(handler=run)
