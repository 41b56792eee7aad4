"""``mcf verilog [--out DIR]``: write the Verilog of every top in :mod:`mcf.hdl.tops`."""

from __future__ import annotations

from pathlib import Path


def run(args) -> int:
    from amaranth.back import verilog

    from mcf.hdl.tops import TOPS

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    names = args.only or sorted(TOPS)
    unknown = [n for n in names if n not in TOPS]
    if unknown:
        from ..cli import UsageError
        raise UsageError(f"unknown top(s) {', '.join(unknown)}; known: {', '.join(sorted(TOPS))}")
    for name in names:
        top = TOPS[name]()
        path = out / f"{name}.v"
        path.write_text(verilog.convert(top, name=name, ports=top.ports, emit_src=False))
        print(f"{path}  ({len(top.ports)} ports)")
    return 0


def register(subs) -> None:
    p = subs.add_parser("verilog", help="generate the Verilog of every top-level design")
    p.add_argument("--out", default="build/verilog", help="output folder (default %(default)s)")
    p.add_argument("--only", nargs="*", help="generate only these tops")
    p.set_defaults(handler=run)
