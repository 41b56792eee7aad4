"""cocotb bench of the 1G RGMII MAC (flat top ``eth_rgmii``: :class:`mcf.hdl.eth.rgmii.RgmiiMac`
under ``FlatTop``) against cocotbext-eth's ``RgmiiPhy`` (``RgmiiSink`` on the MAC's TX pins,
``RgmiiSource`` driving its RX pins, 125 MHz DDR), with link frames on the aclk-side 64-bit
ports (aclk 200 MHz, unrelated to the 125 MHz clocks).

Tests (``tests`` param selects):

* ``lengths`` — link frames with payloads ``lengths`` (default: 0..40 and every 97th to
  MAX_PAYLOAD, and MAX_PAYLOAD): sent on ``s_axis``, every frame on the TX pins equals
  preamble + SFD + :func:`mcf.abi.eth.encap` byte for byte with no ``tx_er``; the same link
  frames encapsulated for this node enter the RX pins and leave ``m_axis`` as
  :func:`mcf.abi.eth.link_beats`; ``status`` equals :class:`mcf.abi.eth.EthModel`'s.
* ``bad`` — good frames around each fault class: ``rx_er`` inside a frame, broken preamble,
  runt, oversize, bad FCS, wrong EtherType, foreign MAC, bad length — only good frames
  delivered, bit-exact; every counter equals the model's.
* ``rate`` — :func:`mcf.sim.benches.eth_common.line_rate` for each of ``sizes`` (link frame
  payload bytes; default 0 and 1,480: 64-byte frames and 1,500-byte Ethernet payloads),
  ``rate_n`` frames each way at once (full duplex): the raw measurements (frames checked,
  steady-state windows, counter changes) go to the ``out`` JSON file, keyed by size; the
  rates and the checks are made by :mod:`mcf.sim.bench.eth`. ``local_id`` (param) configures
  the MAC with another node id than the frames sent to it carry (a misconfiguration the
  bench must refuse).
"""

from __future__ import annotations

import json
import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge, Timer, with_timeout
from cocotbext.eth import GmiiFrame, RgmiiPhy

from mcf.abi.eth import (
    ETH_STATUS,
    ETH_TYPE,
    MAX_PAYLOAD,
    PREAMBLE,
    SFD,
    EthModel,
    encap,
    link_beats,
)
from mcf.sim.toolchain import bench_params, skip_unless_selected

from .eth_common import LOCAL, PEER, Collector, Line, line_rate, link_frame, status, with_fcs

ACLK_NS = 5
ETH_NS = 8
LINE = Line("rgmii", clock_hz=125e6, bytes_per_cycle=1, dic_cycle=1)


class TB:
    def __init__(self, dut, local: int = LOCAL):
        self.dut = dut
        self.col = Collector(dut)
        self.out, self.last_ps = self.col.out, self.col.last_ps
        self.phy = RgmiiPhy(dut.pins_txd, dut.pins_tx_ctl, dut.pins_tx_clk, dut.pins_rxd,
                            dut.pins_rx_ctl, dut.pins_rx_clk, speed=1000e6)
        dut.local_id.value = local
        dut.peer_id.value = PEER
        dut.m_axis_tready.value = 1
        dut.s_axis_tvalid.value = 0
        self.model_tx = EthModel(LOCAL, PEER)
        self.model_rx = EthModel(LOCAL, PEER)

    async def start(self):
        d = self.dut
        d.rst.value = 1
        cocotb.start_soon(Clock(d.clk, ACLK_NS, unit="ns").start())
        cocotb.start_soon(Clock(d.tx_clk_in, ETH_NS, unit="ns").start())
        await Timer(ETH_NS // 4, unit="ns")
        cocotb.start_soon(Clock(d.tx_clk90, ETH_NS, unit="ns").start())
        await ClockCycles(d.clk, 10)
        d.rst.value = 0
        await ClockCycles(d.clk, 20)
        cocotb.start_soon(self.col.run())

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

    async def tx_frames(self, n: int) -> list[GmiiFrame]:
        return [await self.phy.tx.recv() for _ in range(n)]

    async def tx_recv(self) -> GmiiFrame:
        return await self.phy.tx.recv()

    async def rx_send(self, frame: bytes):
        await self.phy.rx.send(GmiiFrame.from_raw_payload(frame))

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


def expect_tx(frame: GmiiFrame, link: bytes):
    assert bytes(frame.data) == PREAMBLE + bytes([SFD]) + encap(link, LOCAL, PEER)
    assert not any(frame.error or [])


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
    for lk in rx_links:
        f = encap(lk, PEER, LOCAL)
        assert tb.model_rx.receive(f) == lk
        await tb.phy.rx.send(GmiiFrame.from_raw_payload(f))
    frames = await with_timeout(tb.tx_frames(len(links)), 2000, "us")
    for fr, lk in zip(frames, links):
        expect_tx(fr, lk)
    await tb.settle(sum(len(link_beats(lk)) for lk in rx_links), 500)
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
        g = GmiiFrame.from_raw_payload(f) if raw is None else GmiiFrame(raw)
        if err_at is not None:
            g.error = [0] * len(g.data)
            g.error[len(PREAMBLE) + 1 + err_at] = 1
        if model:
            lk = m.receive(f, phy_error=err_at is not None)
            if lk is not None:
                good.append(lk)
        await tb.phy.rx.send(g)

    for rnd in range(p.get("rounds", 2)):
        await send(frame())
        f = frame()
        await send(f, err_at=rng.randrange(len(f)))                        # rx_er
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
    await tb.settle(sum(len(link_beats(lk)) for lk in good), 1000)
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
        result[str(link_len)] = await line_rate(tb, LINE, link_len, p.get("rate_n", 30), rng,
                                                aclk_ps=1000 * ACLK_NS)
    with open(p["out"], "w") as fh:
        json.dump(result, fh)
