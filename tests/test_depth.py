"""Logic depth (mcf.sim.depth, `mcf bench depth`): a hand-made design with known chains of LUTs
between registers, a carry chain, a block RAM and a DSP in the middle of a path; and the walk's
cell models on hand-written netlists."""

from __future__ import annotations

import re

import pytest
from amaranth import Cat, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from mcf.sim.depth import (
    _Graph,
    depth,
    implied_clock_mhz,
    levels_for_clock,
    path_ns,
    registration,
    walk,
)
from mcf.sim.toolchain import ToolchainError

CHAIN = 4    # LUT levels of an XOR of 256 register bits (see Probe)
POST_MIN = 2  # at least ceil(log6 16) LUT levels after a RAM / DSP output (XOR of 16 bits)


class Probe(wiring.Component):
    """Register-to-register paths of known depth. A function of n inputs needs at least
    ceil(log6 n) levels of 6-input LUTs; a balanced tree of 2-input XORs covered two levels
    per LUT takes ceil(log4 n); for an XOR of n = 256 bits both are 4, so that path is exactly
    4 levels whatever the mapper does with the tree it is given. ABC keeps the worst depth
    minimal but may deepen other paths up to it (area recovery), so the XORs after the RAM
    and the DSP (16 bits) are only bounded: 2 to 4 levels."""

    def __init__(self):
        super().__init__({"seed": In(1024), "dst": Out(1), "sum": Out(16), "mem_out": Out(1),
                          "dsp_out": Out(1)})

    def elaborate(self, platform):
        m = Module()
        src = Signal(1024)
        m.d.sync += src.eq(self.seed)
        # 1. CHAIN levels: src[0:256] -> dst
        dst = Signal()
        m.d.sync += dst.eq(src[0:256].xor())
        m.d.comb += self.dst.eq(dst)
        # 2. a 16-bit adder: one LUT (propagate) and 4 CARRY4 on the path to its MSB
        a, b, s = Signal(16, name="a"), Signal(16, name="b"), Signal(16, name="s")
        m.d.sync += [a.eq(src[260:276]), b.eq(src[276:292]), s.eq(a + b)]
        m.d.comb += self.sum.eq(s)
        # 3. a block RAM: CHAIN levels into its read address, an XOR of 16 data bits after it
        m.submodules.mem = mem = Memory(shape=32, depth=1024, init=[])
        wr = mem.write_port()
        rd = mem.read_port(transparent_for=())
        m.d.comb += [rd.addr.eq(Cat(src[300:556].xor(), src[560:569])),
                     wr.addr.eq(src[570:580]), wr.data.eq(src[580:612]), wr.en.eq(src[612])]
        mem_out = Signal()
        m.d.sync += mem_out.eq(rd.data[:16].xor())
        m.d.comb += self.mem_out.eq(mem_out)
        # 4. a DSP multiplier: CHAIN levels into A, an XOR of 16 product bits after P
        ma, mb = Signal(16, name="ma"), Signal(16, name="mb")
        m.d.sync += [ma.eq(src[620:636]), mb.eq(src[636:652])]
        p = Signal(32)
        m.d.comb += p.eq(Cat(src[660:916].xor(), ma[1:]) * mb)
        dsp_out = Signal()
        m.d.sync += dsp_out.eq(p[8:24].xor())
        m.d.comb += self.dsp_out.eq(dsp_out)
        return m


@pytest.fixture(scope="module")
def probe():
    try:
        return depth(Probe(), "depth_probe", n_paths=1000)
    except ToolchainError as exc:
        if "not installed" not in str(exc):   # a failing yosys run fails the tests
            raise
        pytest.skip(str(exc))


def _ending(result, name):
    rows = [p for p in result["paths"] if re.match(rf"{re.escape(name)}(\[\d+\])? \(", p["end"])]
    assert rows, f"no path ends at {name}: {[p['end'] for p in result['paths']]}"
    return rows[0]


def test_chain_levels_and_names(probe):
    assert probe["max_lut_levels"] == CHAIN
    ends = [p["end"] for p in probe["paths"] if p["lut_levels"] == CHAIN]
    assert "dst (D)" in ends
    worst = _ending(probe, "dst")
    assert worst["end_kind"] == "ff"
    assert worst["start"].startswith("src[") and worst["start_kind"] == "ff"
    assert worst["lut_levels"] == CHAIN and worst["carry4"] == 0
    assert int(worst["start"][4:-1]) < 256


def test_carry_chain(probe):
    row = _ending(probe, "s")
    assert (row["lut_levels"], row["carry4"]) == (1, 4)
    assert row["start"][:2] in ("a[", "b[")


def test_block_ram_cuts_the_path(probe):
    assert probe["cells"].get("RAMB36E2", 0) + probe["cells"].get("RAMB18E2", 0) >= 1
    into = [p for p in probe["paths"] if p["end_kind"] == "bram"]
    assert into and max(p["lut_levels"] for p in into) == CHAIN
    assert into[0]["start"].startswith("src[") and 300 <= int(into[0]["start"][4:-1]) < 556
    out = _ending(probe, "mem_out")
    assert out["start_kind"] == "bram" and POST_MIN <= out["lut_levels"] <= CHAIN
    # a path through the RAM would be CHAIN + POST_MIN deep
    assert probe["max_lut_levels"] == CHAIN
    bram = probe["registration"]["bram"]
    assert bram["unregistered_read_ports"] >= 1
    assert max(n["lut_levels_out"] for n in bram["names"]) == out["lut_levels"]


def test_dsp_cuts_the_path(probe):
    assert probe["cells"].get("DSP48E2", 0) >= 1
    into = [p for p in probe["paths"] if p["end_kind"] == "dsp"]
    assert into and max(p["lut_levels"] for p in into) == CHAIN
    assert 660 <= int(into[0]["start"][4:-1]) < 916
    out = _ending(probe, "dsp_out")
    assert out["start_kind"] == "dsp" and POST_MIN <= out["lut_levels"] <= CHAIN
    dsp = probe["registration"]["dsp"]
    # A comes from logic, P goes into logic: neither register can be in the DSP
    assert dsp["unregistered"]["AREG"] >= 1 and dsp["unregistered"]["PREG"] >= 1
    assert probe["registration"]["max_lut_levels_before_unregistered_input"] == CHAIN
    assert probe["registration"]["max_lut_levels_after_unregistered_output"] >= POST_MIN


# --- the walk on hand-written netlists ------------------------------------------------------

def _ff(d, q):
    return {"type": "$_DFF_P_", "port_directions": {"C": "input", "D": "input", "Q": "output"},
            "connections": {"C": [2], "D": [d], "Q": [q]}}


def _lut(ins, y):
    return {"type": "$lut", "port_directions": {"A": "input", "Y": "output"},
            "connections": {"A": ins, "Y": [y]}}


def _module(cells, nets):
    return {"ports": {"clk": {"direction": "input", "bits": [2]}}, "cells": cells,
            "netnames": {n: {"hide_name": 0, "bits": b} for n, b in nets.items()}}


def test_lutram_read_is_one_level_and_contents_start():
    ram = {"type": "RAM64M", "port_directions": {
        "ADDRA": "input", "ADDRD": "input", "DIA": "input", "WE": "input", "WCLK": "input",
        "DOA": "output"},
        "connections": {"ADDRA": [20, 21], "ADDRD": [22], "DIA": [23], "WE": [24],
                        "WCLK": [2], "DOA": [30]}}
    cells = {"r0": _ff(9, 10), "l0": _lut([10], 20), "l1": _lut([20], 21),
             "ram": ram, "l2": _lut([30], 31), "r1": _ff(31, 40),
             "r2": _ff(9, 22)}
    module = _module(cells, {"a": [10], "o": [40], "w": [22]})
    out = walk({"modules": {"t": module}}, "t")
    end = [p for p in out["paths"] if p["end"] == "o (D)"][0]
    # a -> l0 -> l1 -> ADDRA -> (1 LUT level) -> l2 -> o: 4 levels; write address ADDRD
    # does not reach DOA
    assert end["lut_levels"] == 4 and end["start"] == "a"
    assert out["max_lut_levels"] == 4


def test_combinational_loop_is_an_error():
    cells = {"l0": _lut([11], 10), "l1": _lut([10], 11)}
    with pytest.raises(ToolchainError, match="loop"):
        _Graph(_module(cells, {"x": [10]}), "t").arrivals()


def test_registration_defaults_and_unused_ports():
    dsp = {"type": "DSP48E2", "parameters": {"AREG": "0" * 32},
           "port_directions": {"A": "input", "CLK": "input", "P": "output"},
           "connections": {"A": [10], "CLK": [2], "P": [20]}}
    ram = {"type": "RAMB36E2", "parameters": {},        # DOA_REG/DOB_REG default 1
           "port_directions": {"DOUTADOUT": "output", "DOUTBDOUT": "output"},
           "connections": {"DOUTADOUT": [30], "DOUTBDOUT": [31]}}
    ram0 = {"type": "RAMB18E2", "parameters": {"DOA_REG": "0" * 32, "DOB_REG": "0" * 32},
            "port_directions": {"DOUTADOUT": "output", "DOUTBDOUT": "output"},
            "connections": {"DOUTADOUT": [32], "DOUTBDOUT": [33]}}
    cells = {"r": _ff(9, 10), "d": dsp, "b": ram, "x": _ff(20, 40), "y": _ff(30, 41),
             "b0": ram0, "z": _ff(32, 42), "l": _lut([33], 34), "w": _ff(34, 43)}
    rep = registration(_module(cells, {}))
    assert rep["dsp"]["unregistered"] == {"AREG": 1, "BREG": 0, "MREG": 0, "PREG": 0}
    assert rep["dsp"]["no_register"] == 0
    # b: port A used, registered by default, port B unused; b0: A straight into z, B via a LUT
    assert rep["bram"]["read_ports"] == 3 and rep["bram"]["unregistered_read_ports"] == 2
    assert rep["bram"]["unregistered_into_flip_flops"] == 1
    assert sorted(n["lut_levels_out"] for n in rep["bram"]["names"]) == [0, 1]


def test_delay_model_arithmetic():
    assert path_ns(8) == pytest.approx(8 * 0.45 + 0.5)
    slow, fast = implied_clock_mhz(8)
    assert slow == pytest.approx(1000 / 4.1, abs=0.1) and fast == pytest.approx(1000 / 2.9,
                                                                               abs=0.1)
    assert levels_for_clock(300) == [6, 9]


def test_same_dsp_and_ram_cells_as_the_resource_estimate(probe):
    """The depth flow stops synth_xilinx before map_cells: its DSP and RAM cells are the ones
    mcf.sim.synth.resources counts."""
    from mcf.sim.synth import resources
    res = resources(Probe(), "depth_probe")
    cells = probe["cells"]
    assert cells.get("DSP48E2", 0) == res["DSP"] >= 1
    assert cells.get("RAMB36E2", 0) + (cells.get("RAMB18E2", 0) + 1) // 2 == res["BRAM36"] >= 1


@pytest.mark.slow
def test_node_depth_bench():
    """`mcf bench depth` on the kr260 node top (minutes: a full synthesis, cached after)."""
    from mcf.hdl.tops import TOPS
    from mcf.sim.perf.depth import TARGET_LEVELS, collect, render
    from mcf.sim.synth import resources

    out = collect(only=["mcf_node_kr260"])
    node = out["mcf_node_kr260"]
    assert node["max_lut_levels"] == node["paths"][0]["lut_levels"] > 0
    assert len(node["paths"]) == 10 and out["target_max_lut_levels"] == TARGET_LEVELS
    assert out["node_meets_target"] == (node["max_lut_levels"] <= TARGET_LEVELS)
    res = resources(TOPS["mcf_node"](), "mcf_node", uram=True, abc9=False)
    assert node["registration"]["dsp"]["cells"] == res["DSP"]
    assert "mcf_node_kr260" in render(out)
