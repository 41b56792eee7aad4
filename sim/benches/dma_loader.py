"""cocotb bench of the DMA loader against cocotbext-axi ``AxiRam``.

The RAM's read side is served by ``TB._serve_reads``, which keeps AxiRam's memory and response
rules but answers each AR ``latency`` + random(0..``jitter``) cycles after its handshake
(pipelined, so several bursts overlap like DDR; in order, as AXI requires for one ID) plus
random pauses on AR/R; error injection uses AxiRam's own
mechanism (an access that raises → SLVERR). A protocol monitor checks every AR/AW: at most 256
beats, no 4 KiB crossing, full beat size.

Params: ``tests`` selects tests; ``seed``; ``latency``; ``jitter``; ``n``; pause probabilities
``ar_pause``, ``r_pause``, ``bp`` (read stream), ``idle`` (write stream); ``out`` for
measurements.
"""

from __future__ import annotations

import collections
import json
import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge
from cocotbext.axi import (
    AxiStreamBus,
    AxiStreamFrame,
    AxiStreamSink,
    AxiStreamSource,
)
from cocotbext.axi.constants import AxiResp

from mcf.abi.compute import DMA_STATUS, status_values
from mcf.sim import bench_params
from mcf.sim.benches.dma_desc import send_descriptor
from mcf.sim.ddr import ddr_ram
from mcf.sim.tb import bernoulli

MEM = 1 << 20


def st(dut) -> dict[str, int]:
    """The loader's status word (:data:`mcf.abi.compute.DMA_STATUS`) by field."""
    return status_values(DMA_STATUS, dut.status.value)


class TB:
    def __init__(self, dut, seed, latency, ar_pause=0.0, r_pause=0.0, bp=0.0, idle=0.0,
                 jitter=0):
        self.dut = dut
        self.rng = random.Random(seed)
        cocotb.start_soon(Clock(dut.clk, 4, unit="ns").start())
        dut.rst.value = 1
        self.ram = ddr_ram(dut, "m_axi", dut.clk, dut.rst, size=MEM)
        self.bad_read: set[int] = set()     # beat addresses answering SLVERR
        self.decerr_read: set[int] = set()  # beat addresses answering DECERR
        self.bad_write: set[int] = set()
        self.latency = latency
        self.jitter = jitter
        self.cycle = 0
        self.ar_stamps: collections.deque = collections.deque()
        self.max_outstanding = 0
        self.inflight = 0
        self.bursts = []
        ri = self.ram.read_if
        ri.ar_channel.queue_occupancy_limit = 64
        ri.r_channel.queue_occupancy_limit = 4
        if ri._process_read_cr is not None:
            ri._process_read_cr.kill()
        ri._process_read = self._serve_reads
        ri._process_read_cr = None
        wi = self.ram.write_if
        orig_write = wi._write

        async def write(address, data):
            if address in self.bad_write:
                raise OSError("injected write error")
            await orig_write(address, data)
        wi._write = write
        if ar_pause:
            ri.ar_channel.set_pause_generator(bernoulli(ar_pause, self.rng))
        if r_pause:
            ri.r_channel.set_pause_generator(bernoulli(r_pause, self.rng))
        self.rd = AxiStreamSink(AxiStreamBus.from_prefix(dut, "m_axis_rd"), dut.clk, dut.rst)
        self.wr = AxiStreamSource(AxiStreamBus.from_prefix(dut, "s_axis_wr"), dut.clk, dut.rst)
        if bp:
            self.rd.set_pause_generator(bernoulli(bp, self.rng))
        if idle:
            self.wr.set_pause_generator(bernoulli(idle, self.rng))
        for d in ("rd_desc", "wr_desc"):
            getattr(dut, f"s_axis_{d}_tvalid").value = 0
        self.done: list[int] = []           # wr_err of every wr_done pulse
        cocotb.start_soon(self._monitor())

    async def reset(self):
        self.dut.rst.value = 1
        await ClockCycles(self.dut.clk, 3)
        self.dut.rst.value = 0
        ri = self.ram.read_if
        if ri._process_read_cr is None:
            ri._process_read_cr = cocotb.start_soon(self._serve_reads())
        await ClockCycles(self.dut.clk, 2)

    async def _monitor(self):
        d = self.dut
        bb = len(d.m_axi_rdata) // 8
        while True:
            await RisingEdge(d.clk)
            self.cycle += 1
            for ch in ("ar", "aw"):
                if getattr(d, f"m_axi_{ch}valid").value and getattr(d, f"m_axi_{ch}ready").value:
                    addr = int(getattr(d, f"m_axi_{ch}addr").value)
                    beats = int(getattr(d, f"m_axi_{ch}len").value) + 1
                    assert int(getattr(d, f"m_axi_{ch}size").value) == bb.bit_length() - 1
                    assert addr % bb == 0, f"unaligned {ch}addr {addr:#x}"
                    assert beats <= 256
                    assert addr // 4096 == (addr + beats * bb - 1) // 4096, \
                        f"{ch} burst {addr:#x}+{beats} crosses 4 KiB"
                    self.bursts.append((ch, addr, beats))
                    if ch == "ar":
                        self.ar_stamps.append(self.cycle)
                        self.inflight += 1
                        self.max_outstanding = max(self.max_outstanding, self.inflight)
            if d.m_axi_rvalid.value and d.m_axi_rready.value and d.m_axi_rlast.value:
                self.inflight -= 1
            if d.wr_done.value:
                self.done.append(int(d.wr_err.value))

    async def _serve_reads(self):
        ri = self.ram.read_if
        bb = ri.byte_lanes
        while True:
            ar = await ri.ar_channel.recv()
            while not self.ar_stamps:
                await RisingEdge(self.dut.clk)
            stamp = self.ar_stamps.popleft()
            due = stamp + self.latency + self.rng.randint(0, self.jitter)
            while self.cycle < due:
                await RisingEdge(self.dut.clk)
            addr, n = int(ar.araddr), int(ar.arlen) + 1
            for i in range(n):
                a = addr + i * bb
                r = ri.r_channel._transaction_obj()
                r.rid = int(ar.arid)
                r.rlast = i == n - 1
                if a in self.bad_read or a in self.decerr_read:
                    r.rresp = AxiResp.SLVERR if a in self.bad_read else AxiResp.DECERR
                    r.rdata = 0
                else:
                    r.rresp = AxiResp.OKAY
                    r.rdata = int.from_bytes(self.ram.read(a % MEM, bb), "little")
                await ri.r_channel.send(r)

    async def desc(self, which, addr, length, stride=0, count=1):
        await send_descriptor(self.dut, f"s_axis_{which}_desc", addr, length, stride, count)

    async def read(self, addr, length, stride=0, count=1):
        await self.desc("rd", addr, length, stride, count)
        fr = await self.rd.recv()
        return bytes(fr.tdata)

    async def write(self, addr, length, payload_rows, stride=0):
        """One write descriptor; returns when ``wr_busy`` drops, after checking that exactly
        one ``wr_done`` pulse came, no earlier than the last B response; its ``wr_err``."""
        bb = len(self.dut.m_axi_wdata) // 8
        before = len(self.done)
        await self.desc("wr", addr, length, stride, len(payload_rows))
        data = b""
        for row in payload_rows:
            data += row + bytes((-len(row)) % bb)
        await self.wr.send(AxiStreamFrame(data))
        await self.wr.wait()
        while True:
            await RisingEdge(self.dut.clk)
            if not self.dut.wr_busy.value and self.wr.idle():
                break
            assert len(self.done) == before, "wr_done before the last B response"
        await RisingEdge(self.dut.clk)
        assert len(self.done) == before + 1, "one wr_done per descriptor"
        return self.done[-1]


def expected_rows(mem: bytes, addr, length, stride, count):
    return b"".join(mem[addr + i * stride: addr + i * stride + length] for i in range(count))


async def run_reads(tb, n):
    rng = tb.rng
    mem = bytes(rng.getrandbits(8) for _ in range(1 << 16))
    tb.ram.write(0, mem)
    cases = [(4096 - 5, 37, 0, 1), (4096 * 3 - 16, 32, 0, 1), (7, 1, 0, 1), (0, 16 * 256, 0, 1),
             (4096 - 16 * 10, 16 * 300, 0, 1), (3, 8195, 0, 1), (100, 50, 4000, 3)]
    for _ in range(n):
        count = rng.choice([1, 1, 2, 3])
        length = rng.choice([rng.randint(1, 64), rng.randint(1, 5000)])
        stride = rng.randint(length, length + 300) if count > 1 else 0
        addr = rng.randint(0, (1 << 16) - length - stride * count - 1)
        cases.append((addr, length, stride, count))
    descs = st(tb.dut)["rd_descs"]
    for c in cases:
        got = await tb.read(*c)
        assert got == expected_rows(mem, *c), f"read {c} mismatch"
    assert st(tb.dut)["rd_errors"] == 0
    assert st(tb.dut)["rd_descs"] == descs + len(cases)


@cocotb.test()
async def dma(dut):
    p = bench_params()
    tests = p.get("tests", ["read", "write", "error", "reject"])
    tb = TB(dut, p.get("seed", 1), p.get("latency", 20), p.get("ar_pause", 0.2),
            p.get("r_pause", 0.2), p.get("bp", 0.3), p.get("idle", 0.2), p.get("jitter", 0))
    await tb.reset()
    if "read" in tests:
        await run_reads(tb, p.get("n", 20))
        assert tb.max_outstanding > 1, "reads were never overlapped"
    if "write" in tests:
        rng = tb.rng
        base = 1 << 17
        tb.ram.write(base, bytes(1 << 16))
        shadow = bytearray(1 << 16)
        cases = [(4096 - 3, 40, 0, 1), (5, 1, 0, 1), (0, 4096 * 2 + 16, 0, 1),
                 (17, 300, 1000, 3)]
        for _ in range(p.get("n", 20)):
            count = rng.choice([1, 2])
            length = rng.randint(1, 3000)
            stride = rng.randint(length, length + 100) if count > 1 else 0
            addr = rng.randint(0, (1 << 16) - length - stride * count - 1)
            cases.append((addr, length, stride, count))
        for addr, length, stride, count in cases:
            rows = [bytes(rng.getrandbits(8) for _ in range(length)) for _ in range(count)]
            assert await tb.write(base + addr, length, rows, stride) == 0
            for i, row in enumerate(rows):
                shadow[addr + i * stride: addr + i * stride + length] = row
            assert tb.ram.read(base, 1 << 16) == bytes(shadow), f"write {addr},{length} bad"
        assert st(dut)["wr_errors"] == 0
    if "error" in tests:
        bb = len(dut.m_axi_rdata) // 8
        tb.bad_read = {0x3000 + bb * i for i in range(3)}
        got = await tb.read(0x3000 - 40, 200)
        assert len(got) == 200
        assert st(dut)["rd_errors"] == 3
        assert st(dut)["rd_last_resp"] == AxiResp.SLVERR
        tb.bad_read = set()
        got = await tb.read(0x3000 - 40, 200)   # the loader keeps working afterwards
        assert got == tb.ram.read(0x3000 - 40, 200)
        assert st(dut)["rd_errors"] == 3
        tb.decerr_read = {0x5000}
        got = await tb.read(0x5000 + 3, 10)
        good = tb.ram.read(0x5000 + 3, 10)
        want = bytes(0 if 0x5000 + 3 + i < 0x5000 + bb else good[i] for i in range(10))
        assert got == want                        # the errored beat reads as zeros
        assert st(dut)["rd_errors"] == 4
        assert st(dut)["rd_last_resp"] == AxiResp.DECERR
        tb.decerr_read = set()
        tb.bad_write = {0x8000}
        assert await tb.write(0x8000 - 8, 64, [bytes(range(64))]) == 1   # wr_err with done
        assert st(dut)["wr_errors"] == 1
        tb.bad_write = set()
        assert await tb.write(0x8000 - 8, 64, [bytes(range(64))]) == 0   # error not sticky
        assert st(dut)["wr_last_resp"] == AxiResp.SLVERR
    if "reject" in tests:
        before = st(dut)["rd_rejects"]
        await tb.desc("rd", 0x100, 0, 0, 1)
        await tb.desc("rd", 0x100, 16, 0, 0)
        await ClockCycles(dut.clk, 4)
        assert st(dut)["rd_rejects"] == before + 2
        assert await tb.read(0x40, 33) == tb.ram.read(0x40, 33)
    if "efficiency" in tests:
        bb = len(dut.m_axi_rdata) // 8
        results = []
        for length in p.get("lengths", [1 << 16]):
            data = bytes(tb.rng.getrandbits(8) for _ in range(length))
            tb.ram.write(0, data)
            before = st(dut)
            await tb.desc("rd", 0, length)
            t0 = tb.cycle
            fr = await tb.rd.recv()
            t1 = tb.cycle
            after = st(dut)
            results.append({"bytes": length, "beats": after["rd_beats"] - before["rd_beats"],
                            "cycles": t1 - t0, "latency": tb.latency, "beat_bytes": bb,
                            "match": bytes(fr.tdata) == data,
                            "rd_errors": after["rd_errors"] - before["rd_errors"],
                            "rd_rejects": after["rd_rejects"] - before["rd_rejects"]})
        if p.get("out"):
            with open(p["out"], "w") as f:
                json.dump(results, f)
        for r in results:
            assert r["match"] and not r["rd_errors"] and not r["rd_rejects"], r
