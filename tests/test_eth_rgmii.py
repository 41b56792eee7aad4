"""1G RGMII MAC (mcf.hdl.eth.rgmii): amaranth.sim unit tests of GmiiTx/GmiiRx framing, and the
runner of the cocotb + Verilator bench (sim/benches/eth_rgmii.py) against cocotbext-eth's
RgmiiPhy — one Verilator build for all its tests.

Line-rate figures: ``pytest tests/test_eth_rgmii.py -k rate -s``.
"""

from __future__ import annotations

import json
import random

from amaranth import Module
from amaranth.sim import Simulator

from mcf.abi.eth import IFG_BYTES, PREAMBLE, SFD
from mcf.hdl.eth.rgmii import GmiiRx, GmiiTx

BENCH = "mcf.sim.benches.eth_rgmii"


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


def _built():
    from mcf.hdl.eth.rgmii import RgmiiMac
    from mcf.hdl.flat import FlatTop
    from mcf.sim import build
    return build(FlatTop(RgmiiMac(), {"s_axis": "s_axis", "m_axis": "m_axis"}), "eth_rgmii")


def test_rgmii_bench():
    from mcf.sim import run
    run(_built(), BENCH, params={"seed": 1, "tests": ["lengths", "bad"]})


def test_rgmii_rate(tmp_path):
    from mcf.sim import run
    out = tmp_path / "rate.json"
    run(_built(), BENCH, params={"seed": 3, "tests": ["rate"], "rate_n": 30, "out": str(out)})
    result = json.loads(out.read_text())
    print("rgmii rate:", json.dumps(result))
    assert result["tx_64B"]["line_rate_fraction"] == 1.0
    assert result["tx_1500B"]["line_rate_fraction"] == 1.0
    assert result["rx_64B"]["delivered"] == result["rx_64B"]["frames"] == 30
