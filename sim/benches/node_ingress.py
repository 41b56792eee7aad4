"""cocotb bench of the node's command-ring reader (mcf.hdl.node.ingress.CmdRingReader,
docs/node.md §2) against cocotbext-axi ``AxiRam`` as DDR.

A host model plays the PS driver: it writes random good and malformed :data:`mcf.abi.node.CMD`
entries into the ring in batches, waits for ``CONS`` when the ring is full and rings the
doorbell (``PROD``) once per batch; once it sends a doorbell that would overrun the ring. AR/R
pauses (random read latency) and backpressure on the record stream are random. The scoreboard
checks every good record arrives in order and bit-exact (golden: :func:`cmd_malformed`), the
bad ones are counted exactly, ``CONS`` ends at ``PROD`` and the overrun was ignored and counted.
A protocol monitor checks every AR (≤ 16 beats, full beat size, inside the ring, no 4 KiB
crossing).

Params: ``mode`` ("stress" or "rate"), ``seed``, ``n`` records, ``size`` (log2 ring entries),
``p_bad``, pause probabilities ``ar_pause``, ``r_pause``, ``bp``; ``latency`` (cycles from AR to
the first R beat, 0 = AxiRam's own); ``out`` (JSON) for the rate.
"""

from __future__ import annotations

import collections
import json
import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge

from mcf.abi.compute import status_values
from mcf.abi.node import (
    CMD,
    CMD_BYTES,
    INGRESS_STATUS,
    Queue,
    cmd_malformed,
)
from mcf.hdl.flat import AXIS_FIELD_NAMES
from mcf.sim import bench_params
from mcf.sim.benches.node_records import random_record
from mcf.sim.ddr import ddr_ram
from mcf.sim.tb import bernoulli

MEM = 1 << 20
BASE = 0x4F00          # 16-byte aligned, not burst aligned: bursts meet the 4 KiB boundary
INDEX = 1 << 16


def _axis_name(field: str) -> str:
    """The flat name :class:`mcf.hdl.flat.FlatTop` gives a field of the record stream."""
    return AXIS_FIELD_NAMES.get(field, f"t{field}")


class TB:
    def __init__(self, dut, seed, ar_pause=0.0, r_pause=0.0, bp=0.0, latency=0):
        self.dut = dut
        self.rng = random.Random(seed)
        cocotb.start_soon(Clock(dut.clk, 4, unit="ns").start())
        dut.rst.value = 1
        self.ram = ddr_ram(dut, "bus", dut.clk, dut.rst, size=MEM)
        if ar_pause:
            self.ram.read_if.ar_channel.set_pause_generator(bernoulli(ar_pause, self.rng))
        if r_pause:
            self.ram.read_if.r_channel.set_pause_generator(bernoulli(r_pause, self.rng))
        self.bp = bp
        self.cycle = 0
        self.latency = latency
        self.ar_stamps: collections.deque = collections.deque()
        ri = self.ram.read_if
        if latency:     # DDR-like: each burst answers ``latency`` cycles after its AR
            if ri._process_read_cr is not None:
                ri._process_read_cr.kill()
            ri._process_read = self._serve_reads    # what AxiRam restarts after a reset
            ri._process_read_cr = None
        self.got: list[tuple[int, int]] = []     # (cycle, record)
        self.size = 0
        dut.doorbell_tvalid.value = 0
        dut.o_tready.value = 0

    async def reset(self, size):
        self.size = size
        self.dut.base.value = BASE
        self.dut.size.value = size
        self.dut.rst.value = 1
        await ClockCycles(self.dut.clk, 3)
        self.dut.rst.value = 0
        cocotb.start_soon(self._monitor())
        cocotb.start_soon(self._sink())
        ri = self.ram.read_if
        if self.latency and ri._process_read_cr is None:
            ri._process_read_cr = cocotb.start_soon(self._serve_reads())
        await ClockCycles(self.dut.clk, 2)

    def status(self) -> dict[str, int]:
        return status_values(INGRESS_STATUS, self.dut.status.value)

    async def _monitor(self):
        d = self.dut
        while True:
            await RisingEdge(d.clk)
            self.cycle += 1
            if d.bus_arvalid.value and d.bus_arready.value:
                addr = int(d.bus_araddr.value)
                beats = int(d.bus_arlen.value) + 1
                assert int(d.bus_arsize.value) == 4 and addr % CMD_BYTES == 0
                assert beats <= 16
                assert addr // 4096 == (addr + beats * CMD_BYTES - 1) // 4096
                assert addr >= BASE and addr + beats * CMD_BYTES <= \
                    BASE + (CMD_BYTES << self.size), f"AR {addr:#x}+{beats} outside the ring"
                self.ar_stamps.append(self.cycle)

    async def _serve_reads(self):
        """AxiRam's memory and R rules, answered ``latency`` cycles after each AR handshake,
        pipelined (the next burst's wait overlaps this one's beats), in order."""
        ri = self.ram.read_if
        while True:
            ar = await ri.ar_channel.recv()
            while not self.ar_stamps:
                await RisingEdge(self.dut.clk)
            due = self.ar_stamps.popleft() + self.latency
            while self.cycle < due:
                await RisingEdge(self.dut.clk)
            addr, n = int(ar.araddr), int(ar.arlen) + 1
            for i in range(n):
                r = ri.r_channel._transaction_obj()
                r.rid, r.rlast, r.rresp = int(ar.arid), i == n - 1, 0
                r.rdata = int.from_bytes(self.ram.read(addr + i * CMD_BYTES, CMD_BYTES),
                                         "little")
                await ri.r_channel.send(r)

    async def _sink(self):
        d = self.dut
        ready = 0
        while True:
            await RisingEdge(d.clk)
            if ready and d.o_tvalid.value:
                self.got.append((self.cycle, sum(int(getattr(d, f"o_{_axis_name(name)}").value)
                                                 << fld.offset for name, fld in CMD)))
            ready = int(self.rng.random() >= self.bp)
            d.o_tready.value = ready

    async def doorbell(self, value):
        self.dut.doorbell_tvalid.value = 1
        self.dut.doorbell_tdata.value = value % INDEX
        await RisingEdge(self.dut.clk)
        self.dut.doorbell_tvalid.value = 0
        await RisingEdge(self.dut.clk)

    def cons(self) -> int:
        return int(self.dut.cons.value)

    async def push(self, records, batch=(1, 24), overrun_at=None):
        """The host driver: fill slots behind CONS, one doorbell per batch."""
        n_slots = 1 << self.size
        prod, i, overruns = int(self.dut.prod.value), 0, 0
        while i < len(records):
            n = min(self.rng.randint(*batch), len(records) - i)
            for _ in range(n):
                while (prod + 1 - self.cons()) % INDEX > n_slots:
                    if int(self.dut.prod.value) != prod:     # full: ring what is written
                        await self.doorbell(prod)
                    await RisingEdge(self.dut.clk)
                slot = prod % n_slots
                self.ram.write(BASE + slot * CMD_BYTES, records[i].to_bytes(CMD_BYTES, "little"))
                prod, i = (prod + 1) % INDEX, i + 1
            await ClockCycles(self.dut.clk, self.rng.randint(1, 8))
            await self.doorbell(prod)
            assert int(self.dut.prod.value) == prod
            if overrun_at is not None and i >= overrun_at and not overruns:
                before = self.status()["overruns"]
                await self.doorbell(prod + n_slots + 1)     # PROD ≥ CONS: > 2^SIZE ahead
                assert int(self.dut.prod.value) == prod, "an overrunning PROD was taken"
                assert self.status()["overruns"] == before + 1
                overruns = 1
        return prod, overruns


async def stress(tb, p):
    queue = Queue(p.get("queue", 0))
    records = [random_record(tb.rng, queue, p.get("p_bad", 0.25))
               for _ in range(p.get("n", 400))]
    prod, overruns = await tb.push(records, overrun_at=len(records) // 2)
    good = [r for r in records if not cmd_malformed(r, queue)]
    for _ in range(200_000):
        if len(tb.got) >= len(good) and tb.cons() == prod:
            break
        await RisingEdge(tb.dut.clk)
    await ClockCycles(tb.dut.clk, 30)
    got = [r for _, r in tb.got]
    assert len(got) == len(good), f"{len(got)} records arrived, {len(good)} expected"
    for k, (a, b) in enumerate(zip(got, good)):
        assert a == b, f"record {k}: got {a:#034x}, want {b:#034x}"
    st = tb.status()
    assert st["records"] == len(good)
    assert st["bad_records"] == len(records) - len(good)
    assert st["read_errors"] == 0
    assert st["overruns"] == overruns == 1
    assert tb.cons() == prod == int(tb.dut.prod.value)
    tb.dut._log.info("stress: %d records (%d bad), %d bursts, %d cycles", len(records),
                     st["bad_records"], st["bursts"], tb.cycle)


async def rate(tb, p):
    """Sustained records per cycle, no backpressure and no bus pauses: a full ring of good
    records behind one doorbell, from the first record out to the last."""
    queue = Queue(p.get("queue", 0))
    n = 1 << tb.size
    records = [random_record(tb.rng, queue, 0.0) for _ in range(n)]
    for i, r in enumerate(records):
        tb.ram.write(BASE + i * CMD_BYTES, r.to_bytes(CMD_BYTES, "little"))
    t0 = tb.cycle
    await tb.doorbell(n)
    while len(tb.got) < n:
        await RisingEdge(tb.dut.clk)
        assert tb.cycle - t0 < 100 * n, "ingress hung"
    assert [r for _, r in tb.got] == records
    st = tb.status()
    assert st["records"] == n and st["bad_records"] == 0 and st["read_errors"] == 0
    first, last = tb.got[0][0], tb.got[-1][0]
    result = {"records": n, "first_latency_cycles": first - t0,
              "sustained_cycles": last - first, "records_per_cycle": (n - 1) / (last - first),
              "bursts": st["bursts"], "read_latency": tb.latency}
    tb.dut._log.info("rate: %s", result)
    if p.get("out"):
        with open(p["out"], "w") as f:
            json.dump(result, f)


@cocotb.test()
async def ingress(dut):
    p = bench_params()
    mode = p.get("mode", "stress")
    pauses = (p.get("ar_pause", 0.0), p.get("r_pause", 0.0), p.get("bp", 0.0)) \
        if mode == "stress" else (0.0, 0.0, 0.0)
    tb = TB(dut, p.get("seed", 1), *pauses, latency=p.get("latency", 0))
    await tb.reset(p.get("size", 5))
    await (stress if mode == "stress" else rate)(tb, p)
