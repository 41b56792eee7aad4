"""cocotb bench of the node's Ethernet MACs, one bench for both (a :class:`MacKind` says which),
with link frames on the aclk-side 64-bit ports (aclk 200 MHz, unrelated to the line clocks); the
``mac`` parameter (a :class:`MacKind`'s name: ``xgmii`` or ``rgmii``) says which MAC the build
holds:

* :data:`XGMII` — the 10G MAC (flat top ``eth_10g``: :class:`mcf.hdl.eth.tengig.TenGigMac` under
  ``FlatTop``) against cocotbext-eth's ``XgmiiSink`` (on ``xgmii_txd``/``xgmii_txc``) and
  ``XgmiiSource`` (driving ``xgmii_rxd``/``xgmii_rxc``, deficit idle count on, so frames start
  on lane 0 and 4), 64 bits at 156.25 MHz (6.4 ns);
* :data:`RGMII` — the 1G MAC (flat top ``eth_rgmii``: :class:`mcf.hdl.eth.rgmii.RgmiiMac` under
  ``FlatTop``) against cocotbext-eth's ``RgmiiPhy`` (``RgmiiSink`` on the MAC's TX pins,
  ``RgmiiSource`` driving its RX pins, 125 MHz DDR).

The runners: ``tests/test_eth_bench.py`` (``lengths`` and ``bad`` of both kinds) and
``mcf bench eth`` (:mod:`mcf.sim.perf.eth`, ``rate``).

Tests (``tests`` param selects):

* ``lengths`` — link frames with payloads ``lengths`` (default: 0..40 and every 97th to
  MAX_PAYLOAD, and MAX_PAYLOAD): sent on ``s_axis``, every frame on the TX side equals
  preamble + SFD + :func:`mcf.abi.eth.encap` byte for byte with no ``tx_er`` / control
  character inside; the same link frames encapsulated for this node enter RX and leave
  ``m_axis`` as :func:`mcf.abi.eth.link_beats`; ``status`` equals
  :class:`mcf.golden.eth.EthModel`'s. XGMII: TX and RX both meet start lanes 0 and 4.
* ``bad`` — good frames around each fault class: a PHY error inside a frame (``rx_er``; on
  XGMII an /E/), broken preamble, runt, oversize, bad FCS, wrong EtherType, foreign MAC, bad
  length — only good frames delivered, bit-exact; every counter equals the model's.
* ``rate`` — :func:`mcf.sim.benches.eth_common.line_rate` for each of ``sizes`` (link frame
  payload bytes; default 0 and 1,480: 64-byte frames and 1,500-byte Ethernet payloads),
  ``rate_n`` frames each way at once (full duplex; on XGMII TX gaps of 9..15 bytes as the
  deficit idle count allows, starts on lanes 0 and 4): the raw measurements (frames checked,
  steady-state windows, counter changes) go to the ``out`` JSON file, keyed by size; the
  rates and the checks are made by :mod:`mcf.sim.perf.eth`. ``local_id`` (param) configures
  the MAC with another node id than the frames sent to it carry (a misconfiguration the bench
  must refuse).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge, Timer, with_timeout
from cocotbext.eth import GmiiFrame, RgmiiPhy, XgmiiFrame, XgmiiSink, XgmiiSource

from mcf.abi.eth import (
    ETH_STATUS,
    ETH_TYPE,
    MAX_PAYLOAD,
    PCS_CLOCK_HZ,
    PREAMBLE,
    SFD,
    XGMII_ERROR,
    XGMII_START,
    encap,
    link_beats,
)
from mcf.golden.eth import EthModel
from mcf.sim.toolchain import bench_params, skip_unless_selected

from .eth_common import (
    LOCAL,
    PEER,
    Collector,
    Line,
    drive_link,
    line_rate,
    link_frame,
    status,
    with_fcs,
)

__all__ = ["MacKind", "XGMII", "RGMII", "KINDS", "TB"]

ACLK_NS = 5
_SFD_AT = len(PREAMBLE) + 1                 # frame byte 0 in a PHY model's frame data


class _XgmiiPhy:
    """``XgmiiSink`` on the MAC's TX, ``XgmiiSource`` into its RX, and the lanes /S/ arrives on
    at the RX port (``rx_start_lanes``, once :meth:`watch` runs)."""
    PS = 6400                               # 156.25 MHz

    def __init__(self, dut):
        self.dut = dut
        self.sink = XgmiiSink(dut.xgmii_txd, dut.xgmii_txc, dut.tx_clk)
        self.source = XgmiiSource(dut.xgmii_rxd, dut.xgmii_rxc, dut.rx_clk)
        self.rx_start_lanes: set[int] = set()
        dut.tx_ce.value = 1
        dut.xgmii_rx_valid.value = 1

    async def start_clocks(self):
        cocotb.start_soon(Clock(self.dut.tx_clk, self.PS, unit="ps").start())
        cocotb.start_soon(Clock(self.dut.rx_clk, self.PS, unit="ps").start())

    async def watch(self):
        """Record the lanes /S/ arrives on at the RX port."""
        d = self.dut
        while True:
            await RisingEdge(d.rx_clk)
            data, ctrl = int(d.xgmii_rxd.value), int(d.xgmii_rxc.value)
            for lane in range(8):
                if ctrl >> lane & 1 and data >> 8 * lane & 0xFF == XGMII_START:
                    self.rx_start_lanes.add(lane)

    async def recv(self) -> XgmiiFrame:
        return await self.sink.recv()

    @staticmethod
    def tx_flags(frame: XgmiiFrame) -> list[int]:
        return frame.ctrl or []

    @staticmethod
    def frame(f: bytes, err_at: int | None = None, raw: bytes | None = None) -> XgmiiFrame:
        """``f`` as the source sends it (``raw``: these bytes, preamble included, instead);
        ``err_at``: an /E/ in place of frame byte ``err_at``."""
        x = XgmiiFrame.from_raw_payload(f) if raw is None else XgmiiFrame(bytearray(raw))
        if err_at is not None:
            x.normalize()
            x.ctrl = [0] * len(x.data)
            x.data[_SFD_AT + err_at] = XGMII_ERROR
            x.ctrl[_SFD_AT + err_at] = 1
        return x

    async def send(self, frame: XgmiiFrame):
        await self.source.send(frame)


class _RgmiiPhy:
    """cocotbext-eth's ``RgmiiPhy`` at 1000 Mb/s on the MAC's pins."""
    NS = 8                                  # 125 MHz

    def __init__(self, dut):
        self.dut = dut
        self.phy = RgmiiPhy(dut.pins_txd, dut.pins_tx_ctl, dut.pins_tx_clk, dut.pins_rxd,
                            dut.pins_rx_ctl, dut.pins_rx_clk, speed=1000e6)

    async def start_clocks(self):
        cocotb.start_soon(Clock(self.dut.tx_clk_in, self.NS, unit="ns").start())
        await Timer(self.NS // 4, unit="ns")
        cocotb.start_soon(Clock(self.dut.tx_clk90, self.NS, unit="ns").start())

    async def recv(self) -> GmiiFrame:
        return await self.phy.tx.recv()

    @staticmethod
    def tx_flags(frame: GmiiFrame) -> list[int]:
        return frame.error or []

    @staticmethod
    def frame(f: bytes, err_at: int | None = None, raw: bytes | None = None) -> GmiiFrame:
        """``f`` as the PHY sends it (``raw``: these bytes, preamble included, instead);
        ``err_at``: ``rx_er`` with frame byte ``err_at``."""
        g = GmiiFrame.from_raw_payload(f) if raw is None else GmiiFrame(raw)
        if err_at is not None:
            g.error = [0] * len(g.data)
            g.error[_SFD_AT + err_at] = 1
        return g

    async def send(self, frame: GmiiFrame):
        await self.phy.rx.send(frame)


@dataclass(frozen=True)
class MacKind:
    """What differs between the two MACs' runs of the same tests."""
    name: str
    line: Line
    phy: type                               # _XgmiiPhy or _RgmiiPhy
    start_lanes: frozenset[int] | None      # the lanes TX and RX frames must start on
    tx_timeout_us: float                    # ``lengths``: every TX frame seen
    settle_us: float                        # ``lengths``: every RX beat out
    bad_settle_us: float                    # ``bad``: every good RX beat out
    rate_n: int                             # ``rate``: default frames each way


XGMII = MacKind("xgmii", Line("xgmii", clock_hz=PCS_CLOCK_HZ, bytes_per_cycle=8, dic_cycle=8),
                _XgmiiPhy, frozenset({0, 4}), tx_timeout_us=500, settle_us=200,
                bad_settle_us=500, rate_n=203)
RGMII = MacKind("rgmii", Line("rgmii", clock_hz=125e6, bytes_per_cycle=1, dic_cycle=1),
                _RgmiiPhy, None, tx_timeout_us=2000, settle_us=500, bad_settle_us=1000,
                rate_n=30)
assert XGMII.line.byte_ps * 8 == _XgmiiPhy.PS and RGMII.line.byte_ps == 1000 * _RgmiiPhy.NS
KINDS = {k.name: k for k in (XGMII, RGMII)}


class TB:
    """One MAC under test: its PHY model (``phy``), the ``m_axis`` beats (``out``, ``last_ps``)
    and the TX/RX models whose counters ``status`` must equal."""

    def __init__(self, dut, kind: MacKind, local: int = LOCAL):
        self.dut, self.kind = dut, kind
        self.col = Collector(dut)
        self.out, self.last_ps = self.col.out, self.col.last_ps
        self.phy = kind.phy(dut)
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
        await self.phy.start_clocks()
        await ClockCycles(d.clk, 10)
        d.rst.value = 0
        await ClockCycles(d.clk, 20)
        cocotb.start_soon(self.col.run())

    async def send_links(self, links: list[bytes]):
        d = self.dut
        for lk in links:
            self.model_tx.send(lk)
            await drive_link(d, lk)
        d.s_axis_tvalid.value = 0

    async def tx_frames(self, n: int) -> list:
        return [await self.phy.recv() for _ in range(n)]

    async def tx_recv(self):
        return await self.phy.recv()

    async def rx_send(self, frame: bytes):
        await self.phy.send(self.phy.frame(frame))

    async def settle(self, expect_beats: int, timeout_us: float):
        async def wait():
            while len(self.out) < expect_beats:
                await RisingEdge(self.dut.clk)
            await ClockCycles(self.dut.clk, 200)
        await with_timeout(wait(), timeout_us, "us")

    def expect_tx(self, frame, link: bytes):
        assert bytes(frame.data) == PREAMBLE + bytes([SFD]) + encap(link, LOCAL, PEER)
        assert not any(self.phy.tx_flags(frame))

    def check_status(self):
        got = status(self.dut)
        want = {n: (self.model_tx if n.startswith("tx") else self.model_rx).status[n]
                for n, _ in ETH_STATUS}
        assert got == want, (got, want)


async def _started(dut, test: str, seed: int) -> tuple[dict, random.Random, TB]:
    """The bench's parameters, the test's ``rng`` (``seed`` unless the ``seed`` parameter) and a
    started :class:`TB` of the ``mac`` parameter's MAC; skipped unless ``tests`` names
    ``test``."""
    p = bench_params()
    skip_unless_selected(test, p)
    tb = TB(dut, KINDS[p["mac"]], local=p.get("local_id", LOCAL))
    await tb.start()
    return p, random.Random(p.get("seed", seed)), tb


@cocotb.test()
async def lengths(dut):
    p, rng, tb = await _started(dut, "lengths", 1)
    kind = tb.kind
    lens = p.get("lengths") or [*range(41), *range(41, MAX_PAYLOAD, 97), MAX_PAYLOAD]
    links = [link_frame(rng, n) for n in lens]
    cocotb.start_soon(tb.send_links(links))
    rx_links = [link_frame(rng, n) for n in reversed(lens)]
    if kind.start_lanes is not None:
        cocotb.start_soon(tb.phy.watch())
    for lk in rx_links:
        f = encap(lk, PEER, LOCAL)
        assert tb.model_rx.receive(f) == lk
        await tb.rx_send(f)
    frames = await with_timeout(tb.tx_frames(len(links)), kind.tx_timeout_us, "us")
    for fr, lk in zip(frames, links):
        tb.expect_tx(fr, lk)
    if kind.start_lanes is not None:
        assert {fr.start_lane for fr in frames} == kind.start_lanes
    await tb.settle(sum(len(link_beats(lk)) for lk in rx_links), kind.settle_us)
    if kind.start_lanes is not None:
        assert tb.phy.rx_start_lanes == kind.start_lanes        # RX met every start lane
    assert tb.out == [b for lk in rx_links for b in link_beats(lk)]
    tb.check_status()


@cocotb.test()
async def bad(dut):
    p, rng, tb = await _started(dut, "bad", 2)
    good: list[bytes] = []
    m = tb.model_rx

    def frame(n=None, dst=LOCAL):
        return encap(link_frame(rng, rng.randrange(0, 300) if n is None else n), PEER, dst)

    async def send(f: bytes, model=True, err_at=None, raw=None):
        x = tb.phy.frame(f, err_at=err_at, raw=raw)
        if model:
            lk = m.receive(f, phy_error=err_at is not None)
            if lk is not None:
                good.append(lk)
        await tb.phy.send(x)

    for rnd in range(p.get("rounds", 2)):
        await send(frame())
        f = frame()
        await send(f, err_at=rng.randrange(len(f)))                        # PHY error inside
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
    await tb.settle(sum(len(link_beats(lk)) for lk in good), tb.kind.bad_settle_us)
    assert tb.out == [b for lk in good for b in link_beats(lk)]
    st = status(dut)
    for name in ("rx_phy_errors", "rx_runts", "rx_oversize", "rx_fcs_errors",
                 "rx_wrong_ethertype", "rx_foreign_dst", "rx_bad_length"):
        assert st[name] > 0, name
    tb.check_status()


@cocotb.test()
async def rate(dut):
    p, rng, tb = await _started(dut, "rate", 3)
    result = {}
    for link_len in p.get("sizes", [0, 1480]):
        result[str(link_len)] = await line_rate(tb, tb.kind.line, link_len,
                                                p.get("rate_n", tb.kind.rate_n), rng,
                                                aclk_ps=1000 * ACLK_NS)
    with open(p["out"], "w") as fh:
        json.dump(result, fh)
