# amaranth: UnusedElaboratable=no
"""Ethernet encapsulation (mcf.hdl.eth.encap, mcf.abi.eth): amaranth.sim of the 64 → 8
unpacker, EthEncap, EthDecap, the 8 → 64 packer and EthCounters against the golden model
(encap / decap / link_beats / EthModel), bit for bit.

* ``test_loopback_lengths``: link frames with payloads 0..96 bytes and every 61st length up
  to MAX_PAYLOAD (``-m slow``: every length 0..MAX_PAYLOAD, ~40 min of amaranth.sim) through
  unpack → encap → decap → pack; the Ethernet bytes between encap and decap equal
  ``encap()``, the beats out equal ``link_beats()``, the counters equal ``EthModel``'s.
* ``test_bad_frames``: good frames interleaved with each drop class (PHY error, runt,
  oversize, bad FCS, wrong EtherType, foreign MAC, bad length) fed to the decapsulator: only
  the good frames come out, bit-exact, and each class is counted once per frame.
* ``test_overflow``: a stalled output fills the buffer; frames that arrive without room are
  dropped and counted, the rest delivered after the stall, in order.
"""

from __future__ import annotations

import random
import zlib

import pytest
from amaranth import Module
from amaranth.lib import wiring
from amaranth.sim import Simulator

from mcf.abi.eth import (
    ETH_STATUS,
    ETH_TYPE,
    MAX_FRAME,
    EthDrop,
    decap,
    encap,
    link_beats,
    mac_bytes,
)
from mcf.abi.framing import MAX_PAYLOAD
from mcf.golden.eth import EthModel
from mcf.hdl.eth.encap import EthCounters, EthDecap, EthEncap, Pack8to64, Unpack64to8
from mcf.sim.benches.eth_common import link_frame

LOCAL, PEER = 5, 17


def with_fcs(body: bytes) -> bytes:
    return body + (zlib.crc32(body) & 0xFFFFFFFF).to_bytes(4, "little")


class Loop(wiring.Component):
    """unpack → encap → decap → pack, counters on both event streams (one domain)."""

    def __init__(self):
        self.unpack, self.enc, self.dec, self.pack = (Unpack64to8(), EthEncap(), EthDecap(),
                                                      Pack8to64())
        self.cnt = EthCounters()
        super().__init__({})

    def elaborate(self, platform):
        m = Module()
        m.submodules += [self.unpack, self.enc, self.dec, self.pack, self.cnt]
        wiring.connect(m, self.unpack.o, self.enc.i)
        wiring.connect(m, self.dec.o, self.pack.i)
        m.d.comb += [self.dec.i.valid.eq(self.enc.o.valid & self.enc.o.ready),
                     self.dec.i.payload.data.eq(self.enc.o.payload.data),
                     self.dec.i.payload.last.eq(self.enc.o.payload.last),
                     self.enc.o.ready.eq(1),
                     self.enc.local_id.eq(PEER), self.enc.peer_id.eq(LOCAL),
                     self.dec.local_id.eq(LOCAL)]
        wiring.connect(m, self.enc.event, self.cnt.tx_event)
        wiring.connect(m, self.dec.event, self.cnt.rx_event)
        return m


def status_of(sim_ctx, st) -> dict:
    return {n: sim_ctx.get(st[n]) for n, _ in ETH_STATUS}


def run_loop(links: list[bytes]):
    dut = Loop()
    sim = Simulator(dut)
    sim.add_clock(8e-9)
    tap: list[bytes] = []
    out: list[tuple[int, int, int]] = []
    beats = [b for lk in links for b in link_beats(lk)]
    n_out = len(beats)
    result = {}

    async def bench(ctx):
        i, eo, po = dut.unpack.i, dut.enc.o, dut.pack.o
        ctx.set(po.ready, 1)
        k = 0
        cur = bytearray()
        idle = 0
        while len(out) < n_out and idle < 5000:
            if k < len(beats):
                d, kp, last = beats[k]
                ctx.set(i.valid, 1)
                ctx.set(i.payload, {"data": d, "keep": kp, "last": last})
            else:
                ctx.set(i.valid, 0)
            await ctx.delay(1e-10)
            if ctx.get(i.valid) and ctx.get(i.ready):
                k += 1
            if ctx.get(eo.valid):
                cur.append(ctx.get(eo.payload.data))
                if ctx.get(eo.payload.last):
                    tap.append(bytes(cur))
                    cur.clear()
            if ctx.get(po.valid):
                p = ctx.get(po.payload)
                out.append((p["data"], p["keep"], p["last"]))
                idle = 0
            idle += 1
            await ctx.tick()
        for _ in range(4):
            await ctx.tick()
        result.update(status_of(ctx, dut.cnt.status))

    sim.add_testbench(bench)
    sim.run()
    return tap, out, result


def check_loop(lengths, seed):
    rng = random.Random(seed)
    links = [link_frame(rng, n) for n in lengths]
    tap, out, status = run_loop(links)
    tx, rx = EthModel(PEER, LOCAL), EthModel(LOCAL, PEER)
    expect_tap = [tx.send(lk) for lk in links]
    assert tap == expect_tap
    for f in expect_tap:
        assert rx.receive(f) is not None
    assert out == [b for lk in links for b in link_beats(lk)]
    model = {n: tx.status[n] if n.startswith("tx") else rx.status[n] for n, _ in ETH_STATUS}
    assert status == model


def test_golden_roundtrip():
    rng = random.Random(1)
    for n in (0, 1, 25, 26, 27, 33, MAX_PAYLOAD):
        lk = link_frame(rng, n)
        f = encap(lk, PEER, LOCAL)
        assert len(f) == max(64, len(lk) + 18) and f[:6] == mac_bytes(LOCAL)
        assert decap(f, LOCAL) == (EthDrop.OK, lk)
        assert decap(f, PEER)[0] == EthDrop.FOREIGN
    assert len(encap(link_frame(rng, MAX_PAYLOAD), 0, 1)) == MAX_FRAME


def test_loopback_lengths():
    check_loop([*range(97), *range(97, MAX_PAYLOAD + 1, 61), MAX_PAYLOAD], seed=2)


@pytest.mark.slow
def test_loopback_every_length():
    check_loop(list(range(MAX_PAYLOAD + 1)), seed=3)


def run_decap(frames: list[tuple[bytes, bool]], *, stall_until: int = 0):
    """Feeds ``(frame, phy_error)`` back to back (12 idle cycles between) into EthDecap +
    Pack8to64; output ready held low for ``stall_until`` cycles."""
    dec, pack, cnt = EthDecap(), Pack8to64(), EthCounters()
    m = Module()
    m.submodules += [dec, pack, cnt]
    wiring.connect(m, dec.o, pack.i)
    wiring.connect(m, dec.event, cnt.rx_event)
    m.d.comb += dec.local_id.eq(LOCAL)
    sim = Simulator(m)
    sim.add_clock(8e-9)
    out = []
    result = {}

    async def feeder(ctx):
        for f, err in frames:
            for j, b in enumerate(f):
                ctx.set(dec.i.valid, 1)
                ctx.set(dec.i.payload, {"data": b, "last": int(j == len(f) - 1),
                                        "err": int(err and j == len(f) // 2)})
                await ctx.tick()
            ctx.set(dec.i.valid, 0)
            await ctx.tick().repeat(12)

    async def sink(ctx):
        cyc = 0
        idle = 0
        while idle < 12000:
            ctx.set(pack.o.ready, int(cyc >= stall_until))
            await ctx.delay(1e-10)
            if ctx.get(pack.o.valid) and ctx.get(pack.o.ready):
                p = ctx.get(pack.o.payload)
                out.append((p["data"], p["keep"], p["last"]))
                idle = 0
            idle += 1
            cyc += 1
            await ctx.tick()
        result.update(status_of(ctx, cnt.status))

    sim.add_process(feeder)
    sim.add_testbench(sink)
    sim.run()
    return out, result


def test_bad_frames():
    rng = random.Random(4)
    model = EthModel(LOCAL, PEER)
    frames, good = [], []

    def add(f, err=False):
        frames.append((f, err))
        lk = model.receive(f, phy_error=err)
        if lk is not None:
            good.append(lk)

    def good_frame(n=None):
        return encap(link_frame(rng, rng.randrange(0, 200) if n is None else n), PEER, LOCAL)

    for rnd in range(3):
        add(good_frame())
        add(good_frame(), err=True)                                      # PHY error
        add(with_fcs(good_frame()[:40 + rnd]))                           # runt
        add(good_frame())
        big = encap(link_frame(rng, MAX_PAYLOAD), PEER, LOCAL)
        add(with_fcs(big[:-4] + rng.randbytes(1 + rnd)))                 # oversize
        f = bytearray(good_frame())
        f[rng.randrange(len(f))] ^= 1 << rng.randrange(8)
        add(bytes(f))                                                    # bad FCS
        f = bytearray(good_frame()[:-4])
        f[12:14] = (ETH_TYPE + 1 + rnd).to_bytes(2, "big")
        add(with_fcs(bytes(f)))                                          # EtherType
        add(encap(link_frame(rng, 40), PEER, LOCAL ^ (1 + rnd)))         # foreign MAC
        add(good_frame(MAX_PAYLOAD))
        f = good_frame(100)[:-4]
        add(with_fcs(f[:-1 - rnd]))                                      # bad length (short)
        add(with_fcs(good_frame(3)[:-4] + bytes(8)))                     # bad length (long)
        add(good_frame(0))
    out, status = run_decap(frames)
    assert out == [b for lk in good for b in link_beats(lk)]
    assert {n: status[n] for n, _ in ETH_STATUS if n.startswith("rx")} == \
        {n: model.status[n] for n, _ in ETH_STATUS if n.startswith("rx")}
    for name in ("rx_phy_errors", "rx_runts", "rx_oversize", "rx_fcs_errors",
                 "rx_wrong_ethertype", "rx_foreign_dst"):
        assert status[name] == 3, name
    assert status["rx_bad_length"] == 6 and status["rx_frames"] == 12


def test_overflow():
    rng = random.Random(5)
    lks = [link_frame(rng, MAX_PAYLOAD - 8 * k) for k in range(5)]
    frames = [(encap(lk, PEER, LOCAL), False) for lk in lks]
    out, status = run_decap(frames, stall_until=5 * 2200)
    # buffer 4096 bytes: the first frame fits, the second fills the buffer part way through,
    # frames 3..5 find it full while the output is stalled
    delivered = [lks[0]]
    assert status["rx_overflow"] == 4 and status["rx_frames"] == 1
    assert out == [b for lk in delivered for b in link_beats(lk)]


def test_abi_registers_and_sizes():
    from mcf.abi.csrmap import COUNTER_BITS
    from mcf.abi.eth import MAX_LINK_FRAME, MIN_FRAME, eth_registers, mac_of
    from mcf.abi.regs import RegisterMap
    regs = eth_registers(1)
    assert regs[0].name == "ETH1_CFG" and regs[0].fields[0].name == "peer_id"
    assert [r.name for r in regs[1:]] == [f"eth1_{n}" for n, _ in ETH_STATUS]
    assert ETH_STATUS.size == len(regs[1:]) * COUNTER_BITS
    rm = RegisterMap("t", 1)
    rm.extend(regs)
    assert MIN_FRAME == 64 and MAX_LINK_FRAME == 2068 and MAX_FRAME == 2086
    assert mac_of(0) >> 40 & 0x03 == 0x02          # locally administered, unicast
    assert len({mac_of(n) for n in range(32)}) == 32


def test_decap_buffers_hold_a_largest_link_frame():
    """Both decapsulators take a power-of-2 buffer that holds a largest link frame
    (:class:`mcf.hdl.eth.encap.FrameDecap`): bytes for the 8-bit one, 8-byte words for XGMII."""
    from mcf.abi.eth import MAX_LINK_FRAME
    from mcf.hdl.eth.xgmii import XgmiiDecap

    small = 1 << (MAX_LINK_FRAME - 1).bit_length() - 1           # largest power of 2 below
    assert EthDecap(depth=2 * small).signature.members.keys() == \
        XgmiiDecap(depth=2 * small // 8).signature.members.keys() == \
        {"i", "o", "local_id", "event"}
    for bad in (small, 3 * small):
        with pytest.raises(ValueError, match="power of 2 holding a largest link frame"):
            EthDecap(depth=bad)
    for bad in (small // 8, 3 * small // 8):
        with pytest.raises(ValueError, match="power of 2 holding a largest link frame"):
            XgmiiDecap(depth=bad)
