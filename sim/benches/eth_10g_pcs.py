"""cocotb bench of the whole SFP+ link (flat top ``eth_10g_pcs``:
:class:`mcf.hdl.eth.tengig.TenGigLink`, 64-bit GT data, under ``FlatTop``) looped back at the
GT boundary: every ``tx_clk`` cycle the bench takes ``gt_txdata`` into a bit stream and drives
``gt_rxdata`` from it, starting ``offset`` bits in — the serial line, where it can lose bits (a
slip) or flip them. The node talks to itself (``local_id == peer_id``), so frames it sends
come back on ``m_axis``.

Tests (``tests`` param selects):

* ``loopback`` — block lock from an arbitrary bit offset; link frames of mixed lengths come back
  as :func:`mcf.abi.eth.link_beats`, bit-exact; the line loses 13 bits: lock is lost, regained
  (``lock_losses`` 1), frames flow again; ``pcs_status`` and ``status`` as expected.
* ``errors`` — random bit flips on the line while frames flow: every frame delivered is a sent
  one, bit-exact and in order; every lost one is counted (FCS or PHY error); then 40 sync-header
  errors within one BER window set ``hi_ber`` (``ber_count`` 40), a clean window clears it.
"""

from __future__ import annotations

import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge, SimTimeoutError, with_timeout

from mcf.abi.eth import ETH_STATUS, PCS_STATUS, link_beats
from mcf.sim.benches.eth_common import drive_link, link_frame
from mcf.sim.toolchain import bench_params, skip_unless_selected

NODE = 3
ACLK_NS = 5
GT_PS = 6206                       # 10.3125 GHz / 64 ≈ 161.13 MHz
WIDTH = 64
HISTORY = 66 * 48                  # line bits kept behind the receiver (to find the grid)


def _fields(raw: int, layout) -> dict[str, int]:
    return {name: (raw >> f.offset) & ((1 << f.width) - 1) for name, f in layout}


class Line:
    """The serial line between ``gt_txdata`` and ``gt_rxdata``."""

    def __init__(self, dut, offset: int):
        self.dut = dut
        self.bits = 0
        self.base = 0            # stream bit index of self.bits' bit 0
        self.nbits = 0           # bits sent so far
        self.pos = offset        # next bit the receiver gets
        self.flip_rate = 0.0
        self.rng = random.Random(5)
        self.flips = 0
        self._grid = None

    async def run(self):
        d = self.dut
        while True:
            await RisingEdge(d.tx_clk)
            if self.nbits - self.pos >= WIDTH:
                rel = self.pos - self.base
                d.gt_rxdata.value = self.bits >> rel & ((1 << WIDTH) - 1)
                self.pos += WIDTH
            w = int(d.gt_txdata.value)
            if self.flip_rate and self.rng.random() < self.flip_rate:
                w ^= 1 << self.rng.randrange(WIDTH)
                self.flips += 1
            self.bits |= w << (self.nbits - self.base)
            self.nbits += WIDTH
            drop = self.pos - self.base - HISTORY
            if drop > 0:
                self.bits >>= drop
                self.base += drop

    def grid(self) -> int:
        """Where the TX blocks start on the line (stream bit index mod 66): the one offset at
        which every 66th bit pair held is a valid sync header (01 or 10)."""
        if self._grid is None:
            n = self.nbits - self.base
            for o in range(66):
                if all(self.bits >> (o + 66 * i) & 3 in (1, 2) for i in range((n - o) // 66)):
                    self._grid = (self.base + o) % 66
                    break
        return self._grid

    def flip_header(self) -> bool:
        """Flip the first sync-header bit of the next whole block not yet delivered, if the
        line holds one."""
        g = self.grid()
        start = self.pos + (g - self.pos) % 66
        if start + 66 > self.nbits:
            return False
        self.bits ^= 1 << (start - self.base)
        return True


class TB:
    def __init__(self, dut, offset: int):
        self.dut = dut
        self.out: list[tuple[int, int, int]] = []
        self.line = Line(dut, offset)
        dut.local_id.value = NODE
        dut.peer_id.value = NODE
        dut.m_axis_tready.value = 1
        dut.s_axis_tvalid.value = 0

    async def start(self):
        d = self.dut
        d.rst.value = 1
        cocotb.start_soon(Clock(d.clk, ACLK_NS, unit="ns").start())
        cocotb.start_soon(Clock(d.tx_clk, GT_PS, unit="ps").start())
        cocotb.start_soon(Clock(d.rx_clk, GT_PS, unit="ps").start())
        await ClockCycles(d.clk, 10)
        d.rst.value = 0
        cocotb.start_soon(self.line.run())
        cocotb.start_soon(self._collect())

    async def _collect(self):
        d = self.dut
        while True:
            await RisingEdge(d.clk)
            if d.m_axis_tvalid.value and d.m_axis_tready.value:
                self.out.append((int(d.m_axis_tdata.value), int(d.m_axis_tkeep.value),
                                 int(d.m_axis_tlast.value)))

    def pcs(self) -> dict[str, int]:
        return _fields(int(self.dut.pcs_status.value), PCS_STATUS)

    def status(self) -> dict[str, int]:
        return _fields(int(self.dut.status.value), ETH_STATUS)

    async def wait_pcs(self, cond, timeout_us: float):
        async def wait():
            while not cond(self.pcs()):
                await RisingEdge(self.dut.clk)
        await with_timeout(wait(), timeout_us, "us")

    async def send_links(self, links: list[bytes]):
        d = self.dut
        for lk in links:
            await drive_link(d, lk)
        d.s_axis_tvalid.value = 0

    async def round_trip(self, links: list[bytes], timeout_us: float = 200):
        before = len(self.out)
        await self.send_links(links)
        want = [b for lk in links for b in link_beats(lk)]

        async def wait():
            while len(self.out) < before + len(want):
                await RisingEdge(self.dut.clk)
        try:
            await with_timeout(wait(), timeout_us, "us")
        except SimTimeoutError:
            raise AssertionError(f"{len(self.out) - before} of {len(want)} beats back; "
                                 f"status {self.status()} pcs {self.pcs()}") from None
        assert self.out[before:] == want


@cocotb.test()
async def loopback(dut):
    p = bench_params()
    skip_unless_selected("loopback", p)
    rng = random.Random(p.get("seed", 1))
    tb = TB(dut, offset=rng.randrange(1, 66))
    await tb.start()
    await tb.wait_pcs(lambda s: s["block_lock"], 50)
    lens = [0, 1, 7, 8, 9, 27, 28, 100, 1500, 2048, 0, 0, 0]
    await tb.round_trip([link_frame(rng, n) for n in lens])
    tb.line.pos += 13                                   # the line loses 13 bits
    await tb.wait_pcs(lambda s: s["lock_losses"] == 1 and s["block_lock"], 100)
    await ClockCycles(dut.clk, 50)
    await tb.round_trip([link_frame(rng, n) for n in reversed(lens)])
    st, pcs = tb.status(), tb.pcs()
    assert st["tx_frames"] == st["rx_frames"] == 2 * len(lens), st
    assert pcs["lock_losses"] == 1 and not pcs["hi_ber"], pcs


@cocotb.test()
async def errors(dut):
    p = bench_params()
    skip_unless_selected("errors", p)
    rng = random.Random(p.get("seed", 2))
    tb = TB(dut, offset=rng.randrange(1, 66))
    await tb.start()
    await tb.wait_pcs(lambda s: s["block_lock"], 50)
    links = [link_frame(rng, rng.randrange(0, 400)) for _ in range(p.get("frames", 60))]
    tb.line.flip_rate = p.get("flip_rate", 0.01)
    await tb.send_links(links)
    await ClockCycles(dut.clk, 2000)
    tb.line.flip_rate = 0.0
    await ClockCycles(dut.clk, 500)
    got, cur = [], []
    for b in tb.out:
        cur.append(b)
        if b[2]:
            got.append(cur)
            cur = []
    beats = [link_beats(lk) for lk in links]
    k = 0
    for g in got:                                       # a subsequence, bit-exact, in order
        while beats[k] != g:
            k += 1
        k += 1
    st, pcs = tb.status(), tb.pcs()
    lost = len(links) - len(got)
    assert tb.line.flips > 0 and lost > 0, (tb.line.flips, lost)
    assert st["rx_frames"] == len(got)
    # a lost frame is a MAC drop, or its /S/ block was hit (an errored block, never a frame)
    drops = sum(st[n] for n in ("rx_fcs_errors", "rx_phy_errors", "rx_runts", "rx_oversize",
                                "rx_bad_length", "rx_wrong_ethertype", "rx_foreign_dst"))
    assert 0 < drops <= lost <= drops + pcs["errored_blocks"], (st, pcs, lost)
    # BER monitor: 40 bad sync headers, one every 5 blocks (12 per 64: lock holds) within one
    # window set hi_ber; a clean window clears it
    if not pcs["block_lock"]:
        await tb.wait_pcs(lambda s: s["block_lock"], 100)
    base = tb.pcs()["ber_count"]
    done = 0
    while done < 40:
        await ClockCycles(dut.tx_clk, 5)
        done += tb.line.flip_header()
    await tb.wait_pcs(lambda s: s["hi_ber"], 20)
    await ClockCycles(dut.clk, 20)
    pcs = tb.pcs()
    assert pcs["ber_count"] - base == 40 and pcs["block_lock"], pcs
    await tb.wait_pcs(lambda s: not s["hi_ber"], 400)
    await tb.round_trip([link_frame(rng, 64)])
