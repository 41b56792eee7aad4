"""cocotb bench of the HP-port multiplexer (:class:`mcf.hdl.mem.axi_mux.AxiPortMux`) with real
clients: two :class:`~mcf.hdl.mem.dma.DmaReader` and two :class:`~mcf.hdl.mem.dma.DmaWriter` on
one cocotbext-axi ``AxiRam`` (docs/node.md §4). Flat top: :func:`harness`.

Tests (param ``tests``):

* ``random_mix`` — every client runs ``n`` random descriptors at once (misaligned, multi-row,
  crossing 4 KiB); readers read a fixed random region, each writer writes its own region.
  AxiRam pauses on AR/R/AW/W/B (``pause``), backpressure on the read streams and idle cycles
  on the write streams (``bp``). Checks: read bytes bit-exact, the written regions byte for
  byte against a shadow copy (bytes outside every row unchanged), one ``desc_done`` per write
  descriptor with ``desc_err`` low, and the port's IDs (``{client, 0}``).
* ``rate`` — both readers stream ``rate_bytes`` at once, no pauses; R beats per cycle on the
  port from the first R beat to the last (``out``: JSON).
"""

from __future__ import annotations

import json
import logging
import random

import cocotb
from amaranth import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import Out
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, Combine, RisingEdge
from cocotbext.axi import (
    AxiStreamBus,
    AxiStreamFrame,
    AxiStreamSink,
    AxiStreamSource,
)

from mcf.hdl.mem.axi import AXI4Signature
from mcf.hdl.mem.axi_mux import AxiPortMux
from mcf.hdl.mem.dma import DmaReader, DmaWriter
from mcf.sim.benches.dma_desc import send_descriptor
from mcf.sim.ddr import ddr_ram
from mcf.sim.tb import pattern
from mcf.sim.toolchain import bench_params, skip_unless_selected

N_RD = N_WR = 2
MEM = 1 << 20
RD_BASE = 0x0_0000                  # readers read [RD_BASE, RD_BASE + REGION)
WR_BASE = 0x4_0000                  # writer w writes [WR_BASE + w·REGION, ... + REGION)
REGION = 0x2_0000


class MuxHarness(wiring.Component):
    """Readers ``rd{i}`` and writers ``wr{i}`` on one :class:`AxiPortMux` (clients in the
    order rd0, wr0, rd1, wr1)."""

    def __init__(self):
        self.readers = [DmaReader() for _ in range(N_RD)]
        self.writers = [DmaWriter() for _ in range(N_WR)]
        self.mux = AxiPortMux(N_RD + N_WR)
        members = {}
        for i, r in enumerate(self.readers):
            members[f"rd{i}_desc"] = r.signature.members["desc"]
            members[f"rd{i}"] = r.signature.members["o"]
        for i, w in enumerate(self.writers):
            members[f"wr{i}_desc"] = w.signature.members["desc"]
            members[f"wr{i}"] = w.signature.members["i"]
            members[f"wr{i}_done"] = w.signature.members["desc_done"]
            members[f"wr{i}_err"] = w.signature.members["desc_err"]
        members["m_axi"] = Out(AXI4Signature(id_width=self.mux.id_width))
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        m.submodules.mux = mux = self.mux
        clients = [c for pair in zip(self.readers, self.writers) for c in pair]
        for k, c in enumerate(clients):
            m.submodules[f"client{k}"] = c
            wiring.connect(m, c.bus, getattr(mux, f"s{k}"))
        wiring.connect(m, mux.m, wiring.flipped(self.m_axi))
        for i, r in enumerate(self.readers):
            wiring.connect(m, wiring.flipped(getattr(self, f"rd{i}_desc")), r.desc)
            wiring.connect(m, r.o, wiring.flipped(getattr(self, f"rd{i}")))
        for i, w in enumerate(self.writers):
            wiring.connect(m, wiring.flipped(getattr(self, f"wr{i}_desc")), w.desc)
            wiring.connect(m, wiring.flipped(getattr(self, f"wr{i}")), w.i)
            m.d.comb += [getattr(self, f"wr{i}_done").eq(w.desc_done),
                         getattr(self, f"wr{i}_err").eq(w.desc_err)]
        return m


def harness():
    from mcf.hdl.flat import FlatTop
    axis = {}
    for i in range(N_RD):
        axis |= {f"rd{i}_desc": f"s_axis_rd{i}_desc", f"rd{i}": f"m_axis_rd{i}"}
    for i in range(N_WR):
        axis |= {f"wr{i}_desc": f"s_axis_wr{i}_desc", f"wr{i}": f"s_axis_wr{i}"}
    return FlatTop(MuxHarness(), axis)


class TB:
    def __init__(self, dut, rng, pause=0.0, bp=0.0):
        self.dut = dut
        cocotb.start_soon(Clock(dut.clk, 4, unit="ns").start())
        dut.rst.value = 1
        self.ram = ddr_ram(dut, "m_axi", dut.clk, dut.rst, size=MEM, pause=pause, rng=rng)
        self.rd = []
        for i in range(N_RD):
            s = AxiStreamSink(AxiStreamBus.from_prefix(dut, f"m_axis_rd{i}"), dut.clk, dut.rst)
            s.log.setLevel(logging.WARNING)
            if bp:
                s.set_pause_generator(pattern(bp, rng))
            self.rd.append(s)
        self.wr = []
        for i in range(N_WR):
            s = AxiStreamSource(AxiStreamBus.from_prefix(dut, f"s_axis_wr{i}"), dut.clk,
                                dut.rst)
            s.log.setLevel(logging.WARNING)
            if bp:
                s.set_pause_generator(pattern(bp, rng))
            self.wr.append(s)
            getattr(dut, f"s_axis_wr{i}_desc_tvalid").value = 0
        for i in range(N_RD):
            getattr(dut, f"s_axis_rd{i}_desc_tvalid").value = 0
        self.done = [[] for _ in range(N_WR)]
        self.cycle = 0
        self.r_beats = []               # (cycle, rid)
        self.ids = set()

    async def reset(self):
        self.dut.rst.value = 1
        await ClockCycles(self.dut.clk, 3)
        self.dut.rst.value = 0
        cocotb.start_soon(self._monitor())
        await ClockCycles(self.dut.clk, 2)

    async def _monitor(self):
        d = self.dut
        while True:
            await RisingEdge(d.clk)
            self.cycle += 1
            for i in range(N_WR):
                if getattr(d, f"wr{i}_done").value:
                    self.done[i].append(int(getattr(d, f"wr{i}_err").value))
            if d.m_axi_rvalid.value and d.m_axi_rready.value:
                self.r_beats.append((self.cycle, int(d.m_axi_rid.value)))
            for ch in ("ar", "aw"):
                if getattr(d, f"m_axi_{ch}valid").value and getattr(d, f"m_axi_{ch}ready").value:
                    self.ids.add((ch, int(getattr(d, f"m_axi_{ch}id").value)))


def _cases(rng, n, limit):
    out = []
    for _ in range(n):
        count = rng.choice([1, 1, 2, 3])
        length = rng.choice([rng.randint(1, 64), rng.randint(1, 6000)])
        stride = rng.randint(length, length + 300) if count > 1 else 0
        addr = rng.randint(0, limit - length - stride * count - 1)
        out.append((addr, length, stride, count))
    return out


async def _reader(tb, i, mem, cases):
    for addr, length, stride, count in cases:
        await send_descriptor(tb.dut, f"s_axis_rd{i}_desc", RD_BASE + addr, length, stride,
                              count)
        fr = await tb.rd[i].recv()
        want = b"".join(mem[addr + k * stride: addr + k * stride + length] for k in range(count))
        assert bytes(fr.tdata) == want, f"reader {i}: {addr:#x}+{length}x{count} mismatch"


async def _writer(tb, i, rng, shadow, cases):
    base = WR_BASE + i * REGION
    for addr, length, stride, count in cases:
        rows = [bytes(rng.getrandbits(8) for _ in range(length)) for _ in range(count)]
        await send_descriptor(tb.dut, f"s_axis_wr{i}_desc", base + addr, length, stride, count)
        data = b"".join(r + bytes(-len(r) % 16) for r in rows)
        await tb.wr[i].send(AxiStreamFrame(data))
        for k, r in enumerate(rows):
            shadow[addr + k * stride: addr + k * stride + length] = r
    while len(tb.done[i]) < len(cases):
        await RisingEdge(tb.dut.clk)


@cocotb.test()
async def random_mix(dut):
    p = bench_params()
    skip_unless_selected("random_mix", p)
    rng = random.Random(p.get("seed", 1))
    tb = TB(dut, rng, p.get("pause", 0.0), p.get("bp", 0.0))
    await tb.reset()
    mem = bytes(rng.getrandbits(8) for _ in range(REGION))
    tb.ram.write(RD_BASE, mem)
    fill = bytes([0x5A]) * (N_WR * REGION)
    tb.ram.write(WR_BASE, fill)
    n = p.get("n", 10)
    shadows = [bytearray(fill[:REGION]) for _ in range(N_WR)]
    tasks = [cocotb.start_soon(_reader(tb, i, mem, _cases(rng, n, REGION)))
             for i in range(N_RD)]
    tasks += [cocotb.start_soon(_writer(tb, i, random.Random(rng.random()), shadows[i],
                                        _cases(rng, n, REGION))) for i in range(N_WR)]
    await Combine(*tasks)
    for i in range(N_WR):
        got = tb.ram.read(WR_BASE + i * REGION, REGION)
        assert got == bytes(shadows[i]), f"writer {i}: memory differs"
        assert tb.done[i] == [0] * n, f"writer {i}: desc_done/desc_err {tb.done[i]}"
    # client k = (rd0, wr0, rd1, wr1)[k] carries ID {k, 0}
    assert tb.ids == {("ar", 0 << 1), ("ar", 2 << 1), ("aw", 1 << 1), ("aw", 3 << 1)}


@cocotb.test()
async def rate(dut):
    p = bench_params()
    skip_unless_selected("rate", p)
    rng = random.Random(p.get("seed", 1))
    tb = TB(dut, rng)
    await tb.reset()
    size = p.get("rate_bytes", 1 << 16)
    mem = bytes(rng.getrandbits(8) for _ in range(2 * size))
    tb.ram.write(RD_BASE, mem)
    cases = [[(k * size, size, 0, 1)] for k in range(N_RD)]
    await Combine(*[cocotb.start_soon(_reader(tb, i, mem, cases[i])) for i in range(N_RD)])
    beats = len(tb.r_beats)
    cycles = tb.r_beats[-1][0] - tb.r_beats[0][0] + 1
    per_client = {rid >> 1: sum(1 for _, r in tb.r_beats if r == rid)
                  for rid in {r for _, r in tb.r_beats}}
    result = {"bytes_per_reader": size, "r_beats": beats, "cycles": cycles,
              "r_beats_per_cycle": round(beats / cycles, 4), "beats_by_client": per_client}
    dut._log.info("axi mux rate: %s", result)
    assert beats == N_RD * size // 16
    if p.get("out"):
        with open(p["out"], "w") as fh:
            json.dump(result, fh)

