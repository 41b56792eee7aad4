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
* ``rate`` — back-to-back minimum-size (64-byte) and 1518-byte frames both ways: TX frame
  starts (``RgmiiSink``'s ``sim_time_start``) are exactly (8 + n + 12) × 8 ns apart (line
  rate); RX delivers every one of a run of minimum-size frames sent with a 12-byte gap. The
  figures go to the ``out`` JSON file.
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
    IFG_BYTES,
    MAX_PAYLOAD,
    PREAMBLE,
    SFD,
    EthModel,
    encap,
    link_beats,
)
from mcf.abi.meta import META
from mcf.abi.nic import crc32
from mcf.sim.toolchain import bench_params

LOCAL, PEER = 3, 9
ACLK_NS = 5
ETH_NS = 8


def link_frame(rng: random.Random, length: int) -> bytes:
    meta = rng.getrandbits(META.size) & ~(((1 << META["length"].width) - 1)
                                          << META["length"].offset)
    meta |= length << META["length"].offset
    body = rng.randbytes(8) + meta.to_bytes(8, "little") + rng.randbytes(length)
    return body + crc32(body).to_bytes(4, "little")


def with_fcs(body: bytes) -> bytes:
    return body + crc32(body).to_bytes(4, "little")


def status(dut) -> dict[str, int]:
    raw = int(dut.status.value)
    return {name: (raw >> f.offset) & ((1 << f.width) - 1) for name, f in ETH_STATUS}


class TB:
    def __init__(self, dut):
        self.dut = dut
        self.out: list[tuple[int, int, int]] = []
        self.phy = RgmiiPhy(dut.pins_txd, dut.pins_tx_ctl, dut.pins_tx_clk, dut.pins_rxd,
                            dut.pins_rx_ctl, dut.pins_rx_clk, speed=1000e6)
        dut.local_id.value = LOCAL
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
        cocotb.start_soon(self._collect())

    async def _collect(self):
        d = self.dut
        while True:
            await RisingEdge(d.clk)
            if d.m_axis_tvalid.value and d.m_axis_tready.value:
                self.out.append((int(d.m_axis_tdata.value), int(d.m_axis_tkeep.value),
                                 int(d.m_axis_tlast.value)))

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
    if "lengths" not in p.get("tests", ["lengths"]):
        return
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
    if "bad" not in p.get("tests", ["bad"]):
        return
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
    if "rate" not in p.get("tests", ["rate"]):
        return
    rng = random.Random(p.get("seed", 3))
    tb = TB(dut)
    await tb.start()
    result = {}
    n = p.get("rate_n", 30)
    for name, link_len in (("64B", 0), ("1500B", 1500 - 20)):
        links = [link_frame(rng, link_len) for _ in range(n)]
        cocotb.start_soon(tb.send_links(links))
        frames = await with_timeout(tb.tx_frames(n), 200 * n, "us")
        for fr, lk in zip(frames, links):
            expect_tx(fr, lk)
        size = len(encap(links[0], LOCAL, PEER))
        starts = [fr.sim_time_start for fr in frames]
        gaps = [b - a for a, b in zip(starts[1:], starts[2:])]      # steady state
        period_ps = 1000 * ETH_NS * (len(PREAMBLE) + 1 + size + IFG_BYTES)
        assert set(gaps) == {period_ps}, (name, sorted(set(gaps)))
        eth_payload = size - 18
        result[f"tx_{name}"] = {
            "frame_bytes": size, "frame_period_ns": period_ps / 1000,
            "line_rate_fraction": period_ps / (sum(gaps) / len(gaps)),
            "payload_gbps": eth_payload * 8 / (sum(gaps) / len(gaps) / 1000)}
    # RX: a run of minimum-size frames, back to back with a 12-byte gap
    before = len(tb.out)
    frames_before = status(dut)["rx_frames"]
    links = [link_frame(rng, 0) for _ in range(n)]
    for lk in links:
        f = encap(lk, PEER, LOCAL)
        assert tb.model_rx.receive(f) == lk
        await tb.phy.rx.send(GmiiFrame.from_raw_payload(f))
    await tb.settle(before + sum(len(link_beats(lk)) for lk in links), 200 * n)
    assert tb.out[before:] == [b for lk in links for b in link_beats(lk)]
    result["rx_64B"] = {"frames": n, "delivered": status(dut)["rx_frames"] - frames_before}
    tb.check_status()
    if p.get("out"):
        with open(p["out"], "w") as fh:
            json.dump(result, fh)
