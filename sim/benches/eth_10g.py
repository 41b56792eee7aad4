"""cocotb bench of the 10G XGMII MAC (flat top ``eth_10g``: :class:`mcf.hdl.eth.tengig.TenGigMac`
under ``FlatTop``) against cocotbext-eth's ``XgmiiSink`` (on ``xgmii_txd``/``xgmii_txc``) and
``XgmiiSource`` (driving ``xgmii_rxd``/``xgmii_rxc``, deficit idle count on, so frames start on
lane 0 and 4), 64 bits at 156.25 MHz (6.4 ns), with link frames on the aclk-side 64-bit ports
(aclk 200 MHz, unrelated).

Tests (``tests`` param selects):

* ``lengths`` — link frames with payloads ``lengths`` (default 0..40, every 97th to
  MAX_PAYLOAD, MAX_PAYLOAD): every frame on the TX side equals preamble + SFD +
  :func:`mcf.abi.eth.encap` byte for byte, no control character inside; the same link frames
  encapsulated for this node enter RX and leave ``m_axis`` as :func:`mcf.abi.eth.link_beats`;
  ``status`` equals :class:`mcf.abi.eth.EthModel`'s.
* ``bad`` — good frames around each fault class: an /E/ inside a frame, broken preamble, runt,
  oversize, bad FCS, wrong EtherType, foreign MAC, bad length — only good frames delivered,
  bit-exact; every counter equals the model's.
* ``rate`` — :func:`mcf.sim.benches.eth_common.line_rate` for each of ``sizes`` (link frame
  payload bytes; default 0 and 1,480: 64-byte frames and 1,500-byte Ethernet payloads),
  ``rate_n`` frames each way at once (full duplex; TX gaps of 9..15 bytes as the deficit idle
  count allows, starts on lanes 0 and 4): the raw measurements go to the ``out`` JSON file,
  keyed by size; the rates and checks are made by :mod:`mcf.sim.bench.eth`. ``local_id``
  (param) misconfigures the MAC's node id.
"""

from __future__ import annotations

import json
import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge, with_timeout
from cocotbext.eth import XgmiiFrame, XgmiiSink, XgmiiSource

from mcf.abi.eth import (
    ETH_STATUS,
    ETH_TYPE,
    MAX_PAYLOAD,
    PCS_CLOCK_HZ,
    PREAMBLE,
    SFD,
    XGMII_ERROR,
    XGMII_START,
    EthModel,
    encap,
    link_beats,
)
from mcf.sim.toolchain import bench_params, skip_unless_selected

from .eth_common import LOCAL, PEER, Collector, Line, line_rate, link_frame, status, with_fcs

__all__ = ["TB", "LINE", "link_frame", "with_fcs", "status"]

ACLK_NS = 5
XG_PS = 6400                       # 156.25 MHz
LINE = Line("xgmii", clock_hz=PCS_CLOCK_HZ, bytes_per_cycle=8, dic_cycle=8)
assert LINE.byte_ps * 8 == XG_PS


class TB:
    def __init__(self, dut, local: int = LOCAL):
        self.dut = dut
        self.col = Collector(dut)
        self.out, self.last_ps = self.col.out, self.col.last_ps
        self.rx_start_lanes: set[int] = set()
        self.sink = XgmiiSink(dut.xgmii_txd, dut.xgmii_txc, dut.tx_clk)
        self.source = XgmiiSource(dut.xgmii_rxd, dut.xgmii_rxc, dut.rx_clk)
        dut.local_id.value = local
        dut.peer_id.value = PEER
        dut.tx_ce.value = 1
        dut.xgmii_rx_valid.value = 1
        dut.m_axis_tready.value = 1
        dut.s_axis_tvalid.value = 0
        self.model_tx = EthModel(LOCAL, PEER)
        self.model_rx = EthModel(LOCAL, PEER)

    async def start(self):
        d = self.dut
        d.rst.value = 1
        cocotb.start_soon(Clock(d.clk, ACLK_NS, unit="ns").start())
        cocotb.start_soon(Clock(d.tx_clk, XG_PS, unit="ps").start())
        cocotb.start_soon(Clock(d.rx_clk, XG_PS, unit="ps").start())
        await ClockCycles(d.clk, 10)
        d.rst.value = 0
        await ClockCycles(d.clk, 20)
        cocotb.start_soon(self.col.run())

    async def watch_rx_starts(self):
        """Record the lanes /S/ arrives on at the RX port."""
        d = self.dut
        while True:
            await RisingEdge(d.rx_clk)
            data, ctrl = int(d.xgmii_rxd.value), int(d.xgmii_rxc.value)
            for lane in range(8):
                if ctrl >> lane & 1 and data >> 8 * lane & 0xFF == XGMII_START:
                    self.rx_start_lanes.add(lane)

    async def send_links(self, links: list[bytes]):
        d = self.dut
        for lk in links:
            self.model_tx.send(lk)
            for data, keep, last in link_beats(lk):
                d.s_axis_tdata.value = data
                d.s_axis_tkeep.value = keep
                d.s_axis_tlast.value = last
                d.s_axis_tvalid.value = 1
                while True:
                    await RisingEdge(d.clk)
                    if d.s_axis_tready.value:
                        break
        d.s_axis_tvalid.value = 0

    async def tx_frames(self, n: int) -> list[XgmiiFrame]:
        return [await self.sink.recv() for _ in range(n)]

    async def tx_recv(self) -> XgmiiFrame:
        return await self.sink.recv()

    async def rx_send(self, frame: bytes):
        await self.source.send(XgmiiFrame.from_raw_payload(frame))

    async def settle(self, expect_beats: int, timeout_us: float):
        async def wait():
            while len(self.out) < expect_beats:
                await RisingEdge(self.dut.clk)
            await ClockCycles(self.dut.clk, 200)
        await with_timeout(wait(), timeout_us, "us")

    def check_status(self):
        got = status(self.dut)
        want = {n: (self.model_tx if n.startswith("tx") else self.model_rx).status[n]
                for n, _ in ETH_STATUS}
        assert got == want, (got, want)


def expect_tx(frame: XgmiiFrame, link: bytes):
    assert bytes(frame.data) == PREAMBLE + bytes([SFD]) + encap(link, LOCAL, PEER)
    assert not any(frame.ctrl or [])


@cocotb.test()
async def lengths(dut):
    p = bench_params()
    skip_unless_selected("lengths", p)
    rng = random.Random(p.get("seed", 1))
    lens = p.get("lengths") or [*range(41), *range(41, MAX_PAYLOAD, 97), MAX_PAYLOAD]
    links = [link_frame(rng, n) for n in lens]
    tb = TB(dut)
    await tb.start()
    cocotb.start_soon(tb.send_links(links))
    rx_links = [link_frame(rng, n) for n in reversed(lens)]
    cocotb.start_soon(tb.watch_rx_starts())
    for lk in rx_links:
        f = encap(lk, PEER, LOCAL)
        assert tb.model_rx.receive(f) == lk
        await tb.source.send(XgmiiFrame.from_raw_payload(f))
    frames = await with_timeout(tb.tx_frames(len(links)), 500, "us")
    for fr, lk in zip(frames, links):
        expect_tx(fr, lk)
    assert {fr.start_lane for fr in frames} == {0, 4}
    await tb.settle(sum(len(link_beats(lk)) for lk in rx_links), 200)
    assert tb.rx_start_lanes == {0, 4}                      # RX met both start lanes
    assert tb.out == [b for lk in rx_links for b in link_beats(lk)]
    tb.check_status()


@cocotb.test()
async def bad(dut):
    p = bench_params()
    skip_unless_selected("bad", p)
    rng = random.Random(p.get("seed", 2))
    tb = TB(dut)
    await tb.start()
    good: list[bytes] = []
    m = tb.model_rx

    def frame(n=None, dst=LOCAL):
        return encap(link_frame(rng, rng.randrange(0, 300) if n is None else n), PEER, dst)

    async def send(f: bytes, model=True, err_at=None, raw=None):
        x = XgmiiFrame.from_raw_payload(f) if raw is None else XgmiiFrame(bytearray(raw))
        if err_at is not None:
            x.normalize()
            x.ctrl = [0] * len(x.data)
            x.data[len(PREAMBLE) + 1 + err_at] = XGMII_ERROR
            x.ctrl[len(PREAMBLE) + 1 + err_at] = 1
        if model:
            lk = m.receive(f, phy_error=err_at is not None)
            if lk is not None:
                good.append(lk)
        await tb.source.send(x)

    for rnd in range(p.get("rounds", 2)):
        await send(frame())
        f = frame()
        await send(f, err_at=rng.randrange(len(f)))                        # /E/ inside
        await send(frame(), model=False, raw=bytes([0x55] * 3 + [0x17]) + bytes(64))
        m.status["rx_phy_errors"] += 1                                      # broken preamble
        await send(with_fcs(frame()[:30 + rnd]))                            # runt
        await send(frame(0))
        big = encap(link_frame(rng, MAX_PAYLOAD), PEER, LOCAL)
        await send(with_fcs(big[:-4] + rng.randbytes(5 + rnd)))              # oversize
        f = bytearray(frame())
        f[rng.randrange(len(f))] ^= 1 << rng.randrange(8)
        await send(bytes(f))                                                # bad FCS
        f = bytearray(frame()[:-4])
        f[12:14] = (ETH_TYPE ^ (1 << rnd)).to_bytes(2, "big")
        await send(with_fcs(bytes(f)))                                      # EtherType
        await send(frame(dst=LOCAL ^ 1))                                    # foreign MAC
        await send(with_fcs(frame(120)[:-4][:-3]))                          # bad length
        await send(frame(MAX_PAYLOAD))
    await tb.settle(sum(len(link_beats(lk)) for lk in good), 500)
    assert tb.out == [b for lk in good for b in link_beats(lk)]
    st = status(dut)
    for name in ("rx_phy_errors", "rx_runts", "rx_oversize", "rx_fcs_errors",
                 "rx_wrong_ethertype", "rx_foreign_dst", "rx_bad_length"):
        assert st[name] > 0, name
    tb.check_status()


@cocotb.test()
async def rate(dut):
    p = bench_params()
    skip_unless_selected("rate", p)
    rng = random.Random(p.get("seed", 3))
    tb = TB(dut, local=p.get("local_id", LOCAL))
    await tb.start()
    result = {}
    for link_len in p.get("sizes", [0, 1480]):
        result[str(link_len)] = await line_rate(tb, LINE, link_len, p.get("rate_n", 203), rng,
                                                aclk_ps=1000 * ACLK_NS)
    with open(p["out"], "w") as fh:
        json.dump(result, fh)
