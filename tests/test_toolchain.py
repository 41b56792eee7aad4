"""mcf.sim.toolchain and mcf.hdl.flat: Verilator bootstrap, build cache, failing benches."""

import os

import pytest
from amaranth import Module, Mux
from amaranth.lib import fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from mcf.abi import beat_layout
from mcf.hdl.flat import FlatTop
from mcf.sim import build, run, verilator_env

LAYOUT = beat_layout(64)


class Loop(wiring.Component):
    i: In(stream.Signature(LAYOUT))
    o: Out(stream.Signature(LAYOUT))
    level: Out(5)

    def elaborate(self, platform):
        m = Module()
        m.submodules.q = q = fifo.SyncFIFOBuffered(width=LAYOUT.size, depth=16)
        wiring.connect(m, wiring.flipped(self.i), q.w_stream)
        wiring.connect(m, q.r_stream, wiring.flipped(self.o))
        m.d.comb += self.level.eq(q.level)
        return m


def test_verilator_env():
    env = verilator_env()
    assert os.path.isdir(env["VERILATOR_ROOT"])
    assert env["MAKEFLAGS"] == "CFG_CXXFLAGS_PCH_I=-include"
    assert os.environ["PATH"].startswith(os.path.join(env["VERILATOR_ROOT"], "bin"))


def test_flat_names():
    top = FlatTop(Loop(), {"i": "s_axis", "o": "m_axis"})
    assert [s.name for s in top.ports] == [
        "s_axis_tvalid", "s_axis_tready", "s_axis_tdata", "s_axis_tkeep", "s_axis_tlast",
        "m_axis_tvalid", "m_axis_tready", "m_axis_tdata", "m_axis_tkeep", "m_axis_tlast",
        "level"]
    from amaranth.back import rtlil
    assert "s_axis_tdata" in rtlil.convert(top, name="loop", ports=top.ports)


class Sub(wiring.Component):
    """A subordinate with a nested, non-stream interface seen from the other side."""
    bus: In(wiring.Signature({"req": Out(8), "ack": In(1)}))

    def elaborate(self, platform):
        m = Module()
        m.d.comb += self.bus.ack.eq(self.bus.req.any())
        return m


def test_flat_nested_interface_directions():
    from amaranth.back import verilog

    top = FlatTop(Sub())
    assert [s.name for s in top.ports] == ["bus_req", "bus_ack"]
    text = verilog.convert(top, name="sub", ports=top.ports, emit_src=False)
    assert "input [7:0] bus_req" in text and "output bus_ack" in text


def test_build_is_cached_and_failures_propagate():
    built = build(FlatTop(Loop(), {"i": "s_axis", "o": "m_axis"}), "loopback_smoke")
    stamp = built.build_dir / "built.ok"
    mtime = stamp.stat().st_mtime_ns
    again = build(FlatTop(Loop(), {"i": "s_axis", "o": "m_axis"}), "loopback_smoke")
    assert again.build_dir == built.build_dir and stamp.stat().st_mtime_ns == mtime
    lens = [1, 8, 9, 64, 0 + 3]
    run(built, "mcf.sim.benches.loopback_smoke", params={"lens": lens, "expect_len": 3})
    with pytest.raises(AssertionError, match="1 of 1 cocotb tests failed"):
        run(built, "mcf.sim.benches.loopback_smoke", params={"lens": lens, "expect_len": 4})
    xml = run(built, "mcf.sim.benches.loopback_smoke",
              params={"lens": lens, "expect_len": 3, "tests": ["loopback"]})
    assert 'skipped="0"' in xml.read_text()
    # a test its ``tests`` parameter does not select is reported skipped, not passed; a run
    # where nothing ran is refused (its failing ``expect_len`` would fail it if the test ran)
    with pytest.raises(AssertionError, match="every cocotb test .* was skipped"):
        run(built, "mcf.sim.benches.loopback_smoke",
            params={"lens": lens, "expect_len": 4, "tests": ["other"]})
    xml = next(built.build_dir.glob(f"run-{os.getpid()}/results.xml"))
    assert '<skipped message="Test was skipped"' in xml.read_text()


def test_resource_estimate():
    from mcf.sim.synth import K26, resources, utilization

    res = resources(FlatTop(Loop(), {"i": "s_axis", "o": "m_axis"}), "loopback_smoke")
    # a 16-deep, 73-bit FIFO with a registered output: flops for the output register and the
    # pointers, storage in LUTRAM, no DSP or block RAM
    assert res["FF"] >= 73 and res["LUTRAM"] > 0
    assert res["DSP"] == 0 and res["BRAM36"] == 0
    assert set(utilization(res)) == set(K26)


def test_resource_breakdown_by_part():
    """``resources_by_part``: every instance with the resources of its subtree — the top's are
    the sum of its own cells and its children's, and the FIFO's LUT-RAM is the FIFO's."""
    from mcf.sim.synth import RESOURCE_KEYS, resources_by_part

    top = FlatTop(Loop(), {"i": "s_axis", "o": "m_axis"})
    parts = resources_by_part(top, "loopback_parts", abc9=False)
    name = next(n for n in parts if "." not in n)
    kids = [n for n in parts if n.count(".") == 1]
    assert kids and all(set(parts[n]) == set(RESOURCE_KEYS) for n in parts)
    for k in RESOURCE_KEYS:
        assert parts[name][k] >= sum(parts[c][k] for c in kids)
    fifo = [n for n in parts if parts[n]["LUTRAM"] and all(
        not parts[c]["LUTRAM"] for c in parts if c.startswith(n + "."))]
    assert fifo and parts[name]["LUTRAM"] == sum(parts[n]["LUTRAM"] for n in fifo)


class Wrap(wiring.Component):
    """A 3-bit counter that wraps at ``limit``; formally ``count < limit`` always holds."""
    count: Out(3)

    def __init__(self, limit, claim):
        self._limit, self._claim = limit, claim
        super().__init__()

    def elaborate(self, platform):
        from amaranth.hdl import Assert

        m = Module()
        m.d.sync += self.count.eq(Mux(self.count == self._limit - 1, 0, self.count + 1))
        m.d.comb += Assert(self.count < self._claim)
        return m


def test_formal_check_proves_and_refutes():
    from mcf.sim.formal import check

    check(Wrap(5, 5), "wrap_ok", mode="prove", depth=4)
    with pytest.raises(AssertionError, match="FAIL"):
        check(Wrap(5, 4), "wrap_bad", mode="bmc", depth=8)


def test_zero_memory_inits_are_dropped_and_the_rest_kept():
    """Amaranth's Verilog spells out every word of a memory's initial contents; the toolchain
    drops the zero words (Verilator, ``--x-initial 0``, starts them at zero) and keeps the
    rest, and nothing outside an ``initial`` block."""
    from mcf.sim.toolchain import VERILATOR_ARGS, zero_inits_dropped

    text = "\n".join([
        "  reg [7:0] mem [3:0];", "  initial begin", "    mem[0] = 8'h00;", "    mem[1] = 8'h5a;",
        "    mem[2] = 8'h0;", "    \\a.b$3 [3] = 8'h00;", "    mem[3] = 8'h10;", "  end",
        "  always @* begin", "    r[0] = 8'h00;", "  end", ""])
    assert zero_inits_dropped(text).split("\n") == [
        "  reg [7:0] mem [3:0];", "  initial begin", "    mem[1] = 8'h5a;",
        "    mem[3] = 8'h10;", "  end", "  always @* begin", "    r[0] = 8'h00;", "  end", ""]
    assert "--x-initial" in VERILATOR_ARGS
    assert VERILATOR_ARGS[VERILATOR_ARGS.index("--x-initial") + 1] == "0"
