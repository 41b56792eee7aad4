"""``mcf build --board kr260 [--out DIR] [--vivado PATH] [--jobs N] [--name TOP] [--json [PATH]]``:
the Vivado flow of a PYNQ overlay.

Writes, into ``--out`` (default ``build/<board>``): ``<name>.v`` and ``mcf_eth.v`` (the node top
and the MAC wrapper, through the same code path as ``mcf verilog``), ``<board>.xdc`` (the board
pins the block design uses, generated from the board's pin table), ``mcf_eth_timing.xdc`` (the
MAC wrapper's asynchronous clock groups) and ``<name>.tcl``
(project, block design, synthesis → implementation → bitstream, then ``<name>.bit`` +
``<name>.hwh`` copied side by side). Runs Vivado when it is found (``--vivado`` or ``vivado`` on
``PATH``), else prints the exact command and exits 0. docs/board.md.

After a Vivado run the script's ``<name>.timing.json`` (the routed design's worst setup and hold
slack, and ``aclk``'s period and intra-clock setup slack) is read back: ``--json`` prints one
object with the files, the command, Vivado's exit status and ``timing`` (with ``aclk_achieved_mhz``
= 1000 / (period − aclk WNS), the clock the routed design would meet; ``null`` without Vivado),
or writes it to PATH.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

__all__ = ["BOARDS", "verilog_ports", "vivado_command", "read_timing", "register"]

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


def read_timing(path: Path) -> dict | None:
    """``<name>.timing.json`` as the script wrote it, with the clock it implies: ``met`` (WNS
    and WHS ≥ 0), ``aclk_target_mhz`` (1000 / period) and ``aclk_achieved_mhz`` (1000 /
    (period − aclk WNS)); None when the file is missing or not the script's JSON."""
    try:
        t = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    keys = ("wns_ns", "whs_ns", "aclk_period_ns", "aclk_wns_ns")
    if not isinstance(t, dict) or not all(k in t for k in keys):
        return None
    wns, whs, period, aclk_wns = (t[k] for k in keys)
    num = all(isinstance(v, (int, float)) for v in (period, aclk_wns)) and period - aclk_wns > 0
    return {**{k: t[k] for k in keys},
            "met": isinstance(wns, (int, float)) and isinstance(whs, (int, float))
            and wns >= 0 and whs >= 0,
            "aclk_target_mhz": round(1000 / period, 3) if num and period > 0 else None,
            "aclk_achieved_mhz": round(1000 / (period - aclk_wns), 3) if num else None,
            "report": str(path.with_suffix(".rpt"))}


def run(args) -> int:
    from ..cli import UsageError
    from ._checks import writable_dir, writable_file

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
    from mcf.hdl.platform.kr260 import top_interfaces
    try:
        top_interfaces(_flat_ports(TOPS[args.name]))
    except ValueError as exc:
        raise UsageError(f"top {args.name} is not a node top: {exc}") from None
    out = writable_dir("--out", args.out or f"build/{args.board}")
    if args.json not in (None, "-"):
        writable_file("--json", args.json)
    # with --json printing, stdout holds the one JSON object: the human lines go to stderr
    with contextlib.redirect_stdout(sys.stderr if args.json == "-" else sys.stdout):
        result = run_flow(args, out, vivado)
    if args.json == "-":
        print(json.dumps(result, indent=1))
    elif args.json is not None:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return result["rc"]


def run_flow(args, out: Path, vivado: str | None) -> dict:
    """Write the files and run Vivado when found; returns the ``--json`` object (``rc``: the
    command's exit status)."""
    from mcf.hdl.platform.kr260 import (
        ETH_BOARD_PORTS,
        eth_timing_xdc,
        kr260_xdc,
        top_interfaces,
        vivado_tcl,
    )

    from ..cli import UsageError
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
    bit, hwh = out / f"{args.name}.bit", out / f"{args.name}.hwh"
    result = {"board": args.board, "top": args.name, "out": str(out),
              "files": [str(p) for p in (v_path, out / f"{ETH_TOP}.v", xdc_path, timing_path,
                                         tcl_path)],
              "command": cmd, "vivado_found": vivado is not None, "vivado_rc": None,
              "timing": None, "bit": None, "hwh": None, "rc": 0}
    if vivado is None:
        print("Vivado not found (--vivado or PATH); to build the bitstream run:")
        print(f"  cd {shlex.quote(str(out))} && {shlex.join(cmd)}")
        return result
    print(f"running: cd {shlex.quote(str(out))} && {shlex.join(cmd)}")
    bit.unlink(missing_ok=True)                 # what is there after the run is this run's
    (out / f"{args.name}.timing.json").unlink(missing_ok=True)
    rc = subprocess.run(cmd, cwd=out).returncode
    timing = read_timing(out / f"{args.name}.timing.json")
    result.update(vivado_rc=rc, timing=timing)
    if timing is not None:
        print(f"timing: WNS {timing['wns_ns']} ns, WHS {timing['whs_ns']} ns; aclk "
              f"{timing['aclk_target_mhz']} MHz wanted, {timing['aclk_achieved_mhz']} MHz met "
              f"(aclk WNS {timing['aclk_wns_ns']} ns)")
    if rc != 0:
        print(f"mcf build: vivado exited {rc}; see {out / 'vivado.log'}")
        result["rc"] = 1
        return result
    result.update(bit=str(bit), hwh=str(hwh))
    print(f"{bit}\n{hwh}")
    return result


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
    p.add_argument("--json", nargs="?", const="-", default=None, metavar="PATH",
                   help="one JSON object (files, Vivado's status, timing): printed, or written "
                        "to PATH")
    p.set_defaults(handler=run)
