"""The wire models of ``hdl/eth/wire.py`` in amaranth.sim: the line passes unchanged, and one
``inject`` pulse flips exactly one line bit of the next frame, where the docstrings say.

* :class:`RgmiiWire` between :class:`~mcf.hdl.eth.rgmii.GmiiTx` → :class:`RgmiiIo` (the
  simulation I/O path) and :class:`RgmiiIo` → :class:`~mcf.hdl.eth.rgmii.GmiiRx`, with
  125 MHz clocks and the 2-ns-delayed ``tx_clk``: the received bytes equal the sent ones, but
  for the frame after the pulse, which differs in bit ``bit`` of byte ``byte`` after the SFD.
* :class:`GtWire` on a 10GBASE-R-shaped line (66-bit blocks, bit 0 first, from a random bit
  offset, 64-bit words): the words come out one cycle later, the same but for one bit: payload
  bit ``bit`` of the second data block after the first control block that follows the pulse.
* Each model between two real MACs of its kind (``TenGigLink`` ↔ ``TenGigLink``, ``RgmiiMac``
  ↔ ``RgmiiMac``): the flipped frame is dropped as a bad FCS, every other one is delivered.
"""

from __future__ import annotations

import random

import pytest
from amaranth import ClockDomain, ClockSignal, Module
from amaranth.hdl import DomainRenamer
from amaranth.sim import Simulator

from mcf.abi.eth import SYNC_CTRL, SYNC_DATA, link_beats
from mcf.abi.meta import META
from mcf.abi.nic import crc32
from mcf.hdl.eth.rgmii import GmiiRx, GmiiTx, RgmiiIo, RgmiiMac
from mcf.hdl.eth.tengig import TenGigLink
from mcf.hdl.eth.wire import GtWire, RgmiiWire


def _frames(rng: random.Random, lengths):
    return [rng.randbytes(n) for n in lengths]


@pytest.mark.parametrize("byte, bit", [(20, 5), (1, 0), (37, 3)])
def test_rgmii_wire_flips_one_bit_of_the_next_frame(byte, bit):
    rng = random.Random(7 + byte + bit)
    frames = _frames(rng, [64, 80, 64, 70])
    m = Module()
    m.domains.eth_tx = ClockDomain("eth_tx")
    m.domains.eth90 = ClockDomain("eth90", reset_less=True)
    m.domains.eth_rx = ClockDomain("eth_rx", reset_less=True)
    gtx, grx = GmiiTx(), GmiiRx()
    m.submodules.gtx = DomainRenamer("eth_tx")(gtx)
    m.submodules.tx_io = tx_io = RgmiiIo()
    m.submodules.wire = wire = RgmiiWire(byte=byte, bit=bit)
    m.submodules.rx_io = rx_io = RgmiiIo()
    m.submodules.grx = DomainRenamer("eth_rx")(grx)
    m.d.comb += [tx_io.txd.eq(gtx.txd), tx_io.tx_en.eq(gtx.tx_en), tx_io.tx_er.eq(gtx.tx_er),
                 tx_io.tx_clk90.eq(ClockSignal("eth90")),
                 wire.txd.eq(tx_io.pins.txd), wire.tx_ctl.eq(tx_io.pins.tx_ctl),
                 wire.tx_clk.eq(tx_io.pins.tx_clk),
                 rx_io.pins.rxd.eq(wire.rxd), rx_io.pins.rx_ctl.eq(wire.rx_ctl),
                 ClockSignal("eth_rx").eq(wire.rx_clk),
                 grx.rxd.eq(rx_io.rxd), grx.rx_dv.eq(rx_io.rx_dv), grx.rx_er.eq(rx_io.rx_er),
                 grx.o.ready.eq(1)]
    sim = Simulator(m)
    sim.add_clock(8e-9, domain="eth_tx")
    sim.add_clock(8e-9, phase=6e-9, domain="eth90")   # eth_tx rises at 4 ns (period / 2)
    sim.add_clock(3.333e-9, domain="sync")
    got, errs = [[]], []
    ends, faults = [], []

    async def send(ctx):
        for k, f in enumerate(frames):
            for j, b in enumerate(f):
                ctx.set(gtx.i.valid, 1)
                ctx.set(gtx.i.payload, {"data": b, "last": j == len(f) - 1})
                await ctx.tick("eth_tx").until(gtx.i.ready)
            ctx.set(gtx.i.valid, 0)
            if k == 0:                                  # arm in the gap after frame 0
                ctx.set(wire.inject, 1)
                await ctx.tick("sync")
                ctx.set(wire.inject, 0)
            await ctx.tick("eth_tx").repeat(30)
        ends.append(True)
        await ctx.tick("eth_tx").repeat(40)
        faults.append(ctx.get(wire.faults))

    async def receive(ctx):
        async for _clk, _rst, valid, data, last, err in ctx.tick("eth_rx").sample(
                grx.o.valid, grx.o.payload.data, grx.o.payload.last, grx.o.payload.err):
            if valid:
                got[-1].append(data)
                errs.append(err)
                if last:
                    got.append([])
            if ends and len(got) > len(frames):
                break

    sim.add_testbench(send)
    sim.add_testbench(receive, background=True)
    sim.run_until(40e-6)
    assert len(got) == len(frames) + 1 and not any(errs)
    diffs = [(k, j, a ^ b) for k, f in enumerate(frames) for j, (a, b) in enumerate(zip(got[k], f))
             if a != b]
    assert diffs == [(1, byte, 1 << bit)] and faults == [1]
    for k, f in enumerate(frames):
        want = bytearray(f)
        if k == 1:
            want[byte] ^= 1 << bit
        assert bytes(got[k]) == bytes(want), k
    assert faults == [1]


def _line(rng: random.Random, offset: int):
    """A 10GBASE-R-shaped bit stream: ``offset`` random bits, then 66-bit blocks (idle control
    blocks, frames of a start control block, data blocks and a terminate control block); returns
    the stream (int), its length, and per block (start bit, header)."""
    bits, n, blocks = rng.getrandbits(offset), offset, []

    def block(header):
        nonlocal bits, n
        blocks.append((n, header))
        bits |= (header | rng.getrandbits(64) << 2) << n
        n += 66

    for _ in range(400):                                # idle: the model locks
        block(SYNC_CTRL)
    for _ in range(4):
        block(SYNC_CTRL)
        for _ in range(rng.randrange(8, 20)):
            block(SYNC_DATA)
        block(SYNC_CTRL)
        for _ in range(rng.randrange(1, 4)):
            block(SYNC_CTRL)
    return bits, n, blocks


@pytest.mark.parametrize("offset, bit", [(0, 0), (37, 3), (63, 5), (64 + 13, 1)])
def test_gt_wire_flips_one_payload_bit_of_the_next_frame(offset, bit):
    rng = random.Random(100 + offset)
    bits, nbits, blocks = _line(rng, offset)
    words = [bits >> (64 * j) & (2**64 - 1) for j in range(nbits // 64)]
    # arm after the model locked, amid the first frame's data blocks (8 at least): the next
    # control block is that frame's terminate, so the second frame is hit
    frame_starts = [j for j, (s, h) in enumerate(blocks) if h == SYNC_CTRL and j + 1 < len(blocks)
                    and blocks[j + 1][1] == SYNC_DATA]
    arm_word = blocks[frame_starts[0] + 6][0] // 64
    dut = GtWire(bit=bit)
    sim = Simulator(dut)
    sim.add_clock(6.206e-9, domain="sync")
    out, status = [], []

    async def bench(ctx):
        for j, w in enumerate(words):
            ctx.set(dut.i, w)
            ctx.set(dut.inject, j == arm_word - 4)
            await ctx.tick("sync")          # ``inject`` is in ``sync``; ``clk`` is driven here
            ctx.set(dut.clk, 1)
            await ctx.delay(1e-9)
            out.append(ctx.get(dut.o))
            ctx.set(dut.clk, 0)
            await ctx.delay(1e-9)
        status.append((ctx.get(dut.block_lock), ctx.get(dut.faults)))

    sim.add_testbench(bench)
    sim.run()
    diff = [(j, a ^ b) for j, (a, b) in enumerate(zip(out[1:], words[:-1], strict=True))
            if a != b]
    assert len(diff) == 1 and bin(diff[0][1]).count("1") == 1, (diff, status)
    flipped = 64 * diff[0][0] + diff[0][1].bit_length() - 1
    hit_block = frame_starts[1] + 2
    assert [h for _, h in blocks[hit_block - 2: hit_block + 1]] == [SYNC_CTRL, SYNC_DATA, SYNC_DATA]
    assert flipped == blocks[hit_block][0] + 2 + bit
    assert status == [(1, 1)]


def _link_frame(rng: random.Random, length: int) -> bytes:
    meta = rng.getrandbits(META.size) & ~(((1 << META["length"].width) - 1)
                                          << META["length"].offset)
    body = rng.randbytes(8) + (meta | length << META["length"].offset).to_bytes(8, "little")
    body += rng.randbytes(length)
    return body + crc32(body).to_bytes(4, "little")


@pytest.mark.parametrize("kind", ["10g", "rgmii"])
def test_a_wire_fault_between_two_macs_is_an_fcs_drop(kind):
    """Two MACs of one kind (node 1 → node 2) joined by the wire model, link frames of mixed
    lengths: one ``inject`` pulse after the first frame, and the receiving MAC drops exactly the
    second frame as a bad FCS (``rx_fcs_errors`` 1); every other frame arrives bit-exact."""
    rng = random.Random(11)
    links = [_link_frame(rng, n) for n in (40, 100, 64, 8, 200)]
    m = Module()
    if kind == "10g":
        a, b, wire = TenGigLink(), TenGigLink(), GtWire()
        m.submodules.a = DomainRenamer({"xg_tx": "a_tx", "xg_rx": "a_rx"})(a)
        m.submodules.b = DomainRenamer({"xg_tx": "b_tx", "xg_rx": "b_rx"})(b)
        m.domains.line = ClockDomain("line", reset_less=True)
        line = ClockSignal("line")
        m.d.comb += [a.tx_clk.eq(line), a.rx_clk.eq(line), b.tx_clk.eq(line),
                     b.rx_clk.eq(line), wire.clk.eq(line), wire.i.eq(a.gt_txdata),
                     b.gt_rxdata.eq(wire.o)]
        clocks = [("line", 6.206e-9, None)]
    else:
        a, b, wire = RgmiiMac(), RgmiiMac(), RgmiiWire()
        m.submodules.a = DomainRenamer({"eth_tx": "a_tx", "eth_rx": "a_rx"})(a)
        m.submodules.b = DomainRenamer({"eth_tx": "b_tx", "eth_rx": "b_rx"})(b)
        m.domains.line = ClockDomain("line", reset_less=True)
        m.domains.line90 = ClockDomain("line90", reset_less=True)
        m.d.comb += [a.tx_clk_in.eq(ClockSignal("line")), a.tx_clk90.eq(ClockSignal("line90")),
                     b.tx_clk_in.eq(ClockSignal("line")), b.tx_clk90.eq(ClockSignal("line90")),
                     wire.txd.eq(a.pins.txd), wire.tx_ctl.eq(a.pins.tx_ctl),
                     wire.tx_clk.eq(a.pins.tx_clk), b.pins.rxd.eq(wire.rxd),
                     b.pins.rx_ctl.eq(wire.rx_ctl), b.pins.rx_clk.eq(wire.rx_clk)]
        clocks = [("line", 8e-9, None), ("line90", 8e-9, 6e-9)]
    m.submodules.wire = wire
    m.d.comb += [a.local_id.eq(1), a.peer_id.eq(2), b.local_id.eq(2), b.peer_id.eq(1)]
    sim = Simulator(m)
    sim.add_clock(3.334e-9, domain="sync")
    for dom, period, phase in clocks:
        sim.add_clock(period, phase=phase, domain=dom)
    got, status = [[]], []

    async def send(ctx):
        await ctx.tick().repeat(4000 if kind == "10g" else 20)  # 10G: block lock first
        for k, lk in enumerate(links):
            for d, keep, last in link_beats(lk):
                ctx.set(a.s_axis.valid, 1)
                ctx.set(a.s_axis.payload, {"data": d, "keep": keep, "last": last})
                await ctx.tick().until(a.s_axis.ready)
            ctx.set(a.s_axis.valid, 0)
            await ctx.tick().repeat(200)
            if k == 0:
                ctx.set(wire.inject, 1)
                await ctx.tick()
                ctx.set(wire.inject, 0)
        await ctx.tick().repeat(2000)              # the last frame: 2 µs on RGMII
        status.append(ctx.get(b.status))

    async def receive(ctx):
        ctx.set(b.m_axis.ready, 1)
        async for _c, _r, valid, beat in ctx.tick().sample(b.m_axis.valid, b.m_axis.payload):
            if valid:
                got[-1].append((beat.data, beat.keep, beat.last))
                if beat.last:
                    got.append([])

    sim.add_testbench(send)
    sim.add_testbench(receive, background=True)
    sim.run()
    assert got[:-1] == [link_beats(lk) for k, lk in enumerate(links) if k != 1]
    st = status[0]
    assert (st.rx_frames, st.rx_fcs_errors, st.rx_phy_errors) == (len(links) - 1, 1, 0)
