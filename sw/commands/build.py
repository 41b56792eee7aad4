"""``mcf build --board kr260 [--out DIR] [--vivado PATH] [--jobs N] [--name TOP]``: the Vivado
flow of a PYNQ overlay.

Writes, into ``--out`` (default ``build/<board>``): ``<name>.v`` and ``mcf_eth.v`` (the node top
and the MAC wrapper, through the same code path as ``mcf verilog``), ``<board>.xdc`` (the board
pins the block design uses, generated from the board's pin table), ``mcf_eth_timing.xdc`` (the
MAC wrapper's asynchronous clock groups) and ``<name>.tcl``
(project, block design, synthesis → implementation → bitstream, then ``<name>.bit`` +
``<name>.hwh`` copied side by side). Runs Vivado when it is found (``--vivado`` or ``vivado`` on
``PATH``), else prints the exact command and exits 0. docs/board.md.
"""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
import subprocess
from pathlib import Path

__all__ = ["BOARDS", "verilog_ports", "vivado_command", "register"]

BOARDS = ("kr260",)
ETH_TOP = "mcf_eth"
"""The MAC wrapper top built beside the node (:mod:`mcf.hdl.tops`, docs/eth.md)."""

_PORT = re.compile(r"^\s*(?:input|output|inout)\b(?:\s*(?:wire|reg))?\s*(?:\[[^\]]+\])?"
                   r"\s*(\w+)\s*;", re.M)


def verilog_ports(text: str, module: str | None = None) -> list[str]:
    """The port names declared in Verilog (``input [..] name;`` style, as Amaranth writes
    them): of ``module`` alone when it is given (the top, not its submodules), else of every
    module in ``text``."""
    if module is not None:
        start = re.search(rf"^module {re.escape(module)}\s*\(", text, re.M)
        if start is not None:
            end = text.find("\nendmodule", start.end())
            text = text[start.start():None if end < 0 else end]
    return _PORT.findall(text)


def _flat_ports(factory) -> list[str]:
    """The port names of the top ``factory`` makes, read from the constructed top (a second,
    not the conversion's minute); the top is never elaborated, so Amaranth's warning about
    unused elaboratables is silenced while it is collected."""
    import gc
    import warnings

    from amaranth.hdl import UnusedElaboratable

    top = factory()
    names = [s.name for s in top.ports]
    del top
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)
        gc.collect()
    return names


def vivado_command(vivado: str, tcl: Path) -> list[str]:
    """The batch command that runs ``tcl`` (from its own folder)."""
    return [vivado, "-mode", "batch", "-nojournal", "-log", "vivado.log", "-source", tcl.name]


def run(args) -> int:
    from ..cli import UsageError
    from ._checks import writable_dir

    if args.board not in BOARDS:
        raise UsageError(f"unknown board {args.board!r}; known: {', '.join(BOARDS)}")
    if args.jobs < 1:
        raise UsageError(f"--jobs must be at least 1, not {args.jobs}")
    vivado = None
    if args.vivado is not None:
        path = Path(args.vivado)
        if not (path.is_file() and shutil.which(str(path))):
            raise UsageError(f"--vivado {args.vivado}: not an executable file")
        vivado = str(path.resolve())
    from mcf.hdl.tops import TOPS
    if args.name not in TOPS:
        raise UsageError(f"unknown top {args.name!r}; known: {', '.join(sorted(TOPS))}")
    out = writable_dir("--out", args.out or f"build/{args.board}")

    from mcf.hdl.platform.kr260 import (
        ETH_BOARD_PORTS,
        eth_timing_xdc,
        kr260_xdc,
        top_interfaces,
        vivado_tcl,
    )

    flat_ports = _flat_ports(TOPS[args.name])
    try:
        top_interfaces(flat_ports)
    except ValueError as exc:
        raise UsageError(f"top {args.name} is not a node top: {exc}") from None

    from . import verilog
    verilog.run(argparse.Namespace(out=str(out), only=[args.name, ETH_TOP], quiet=args.quiet),
                prog="mcf build")
    v_path = out / f"{args.name}.v"
    ports = verilog_ports(v_path.read_text(), args.name)
    try:
        top_interfaces(ports)
    except ValueError as exc:
        raise UsageError(f"top {args.name} is not a node top: {exc}") from None
    xdc_path = out / f"{args.board}.xdc"
    xdc_path.write_text(kr260_xdc(ports=ETH_BOARD_PORTS))
    print(xdc_path)
    timing_path = out / f"{ETH_TOP}_timing.xdc"
    timing_path.write_text(eth_timing_xdc())
    print(timing_path)
    tcl_path = out / f"{args.name}.tcl"
    tcl_path.write_text(vivado_tcl(name=args.name, top=args.name, verilog=v_path.name,
                                   xdc=xdc_path.name, ports=ports, jobs=args.jobs,
                                   eth=ETH_TOP, eth_verilog=f"{ETH_TOP}.v",
                                   timing_xdc=timing_path.name))
    print(tcl_path)

    vivado = vivado or shutil.which("vivado")
    cmd = vivado_command(vivado or "vivado", tcl_path)
    if vivado is None:
        print("Vivado not found (--vivado or PATH); to build the bitstream run:")
        print(f"  cd {shlex.quote(str(out))} && {shlex.join(cmd)}")
        return 0
    print(f"running: cd {shlex.quote(str(out))} && {shlex.join(cmd)}")
    rc = subprocess.run(cmd, cwd=out).returncode
    if rc != 0:
        print(f"mcf build: vivado exited {rc}; see {out / 'vivado.log'}")
        return 1
    print(f"{out / (args.name + '.bit')}\n{out / (args.name + '.hwh')}")
    return 0


def register(subs) -> None:
    from ._checks import description
    p = subs.add_parser("build", help="Verilog + XDC + Vivado Tcl of a board overlay; "
                        "runs Vivado when found", description=description(__doc__))
    p.add_argument("--board", required=True, help=f"target board ({', '.join(BOARDS)})")
    p.add_argument("--out", default=None, help="output folder (default build/<board>)")
    p.add_argument("--vivado", default=None, help="path of the vivado executable "
                   "(default: vivado on PATH)")
    p.add_argument("--jobs", type=int, default=2, help="Vivado run jobs (default %(default)s)")
    p.add_argument("--name", default="mcf_node", help="top to build (default %(default)s)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(handler=run)
