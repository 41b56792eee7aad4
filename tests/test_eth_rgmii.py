"""1G RGMII MAC (mcf.hdl.eth.rgmii): amaranth.sim unit tests of GmiiTx/GmiiRx framing.

The MAC bench against cocotbext-eth's RgmiiPhy (sim/benches/eth_mac.py) and the line-rate
figures (``mcf bench eth``): tests/test_eth_bench.py.
"""

from __future__ import annotations

import random

from amaranth import Module
from amaranth.sim import Simulator

from mcf.abi.eth import IFG_BYTES, PREAMBLE, SFD
from mcf.hdl.eth.rgmii import GmiiRx, GmiiTx


def test_gmii_tx_rx():
    """GmiiTx → GmiiRx back to back: preamble/SFD/IFG on the wire, frames out unchanged, and
    an underrun marks the frame (tx_er, frame_err)."""
    rng = random.Random(1)
    frames = [rng.randbytes(n) for n in (64, 65, 100, 64)]
    tx, rx = GmiiTx(), GmiiRx()
    m = Module()
    m.submodules += [tx, rx]
    m.d.comb += [rx.rxd.eq(tx.txd), rx.rx_dv.eq(tx.tx_en), rx.rx_er.eq(tx.tx_er)]
    sim = Simulator(m)
    sim.add_clock(8e-9)
    wire: list[tuple[int, int, int]] = []
    got: list[tuple[bytes, bool]] = []

    async def bench(ctx):
        cur, err = bytearray(), False
        queue = [(f, j) for f in frames for j in range(len(f))]
        k = 0
        hole_at, holes = sum(map(len, frames[:3])) + 20, 2   # an underrun inside the 4th frame
        for _ in range(800):
            hole = k == hole_at and holes > 0
            holes -= hole
            if k < len(queue) and not hole:
                f, j = queue[k]
                ctx.set(tx.i.valid, 1)
                ctx.set(tx.i.payload, {"data": f[j], "last": int(j == len(f) - 1)})
            else:
                ctx.set(tx.i.valid, 0)
            await ctx.delay(1e-10)
            if ctx.get(tx.i.valid) and ctx.get(tx.i.ready):
                k += 1
            wire.append((ctx.get(tx.tx_en), ctx.get(tx.txd), ctx.get(tx.tx_er)))
            if ctx.get(rx.o.valid):
                cur.append(ctx.get(rx.o.payload.data))
                err |= bool(ctx.get(rx.o.payload.err))
                if ctx.get(rx.o.payload.last):
                    got.append((bytes(cur), err))
                    cur, err = bytearray(), False
            await ctx.tick()

    sim.add_testbench(bench)
    sim.run()
    # wire: each frame is 7 x 0x55, 0xD5, the bytes, then >= 12 idle cycles
    bursts, cur, idle = [], [], 0
    gaps = []
    for en, d, _ in wire:
        if en:
            if not cur and bursts:
                gaps.append(idle)
            cur.append(d)
            idle = 0
        else:
            if cur:
                bursts.append(bytes(cur))
                cur = []
            idle += 1
    assert len(bursts) == 4
    for b, f in zip(bursts[:3], frames[:3]):
        assert b == PREAMBLE + bytes([SFD]) + f
    assert gaps == [IFG_BYTES] * 3
    assert [g for g, _ in got[:3]] == frames[:3] and not any(e for _, e in got[:3])
    assert got[3][1] and len(got[3][0]) == len(frames[3]) + 2   # two error bytes inside

