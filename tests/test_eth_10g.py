"""10G MAC (mcf.hdl.eth.xgmii) in amaranth.sim: EthEncap64 → XgmiiTx against the golden XGMII
transmitter (every word, deficit idle count, lane-4 starts), XgmiiRx → XgmiiDecap back to link
beats; and the runner of the cocotb + Verilator PCS loopback bench (sim/benches/eth_10g_pcs.py).

The MAC bench against cocotbext-eth XgmiiSource/XgmiiSink (sim/benches/eth_mac.py) and the rate
figures (``mcf bench eth``): tests/test_eth_bench.py.
"""

from __future__ import annotations

import random

import pytest
from amaranth import Module
from amaranth.lib import wiring
from amaranth.sim import Simulator

from mcf.abi.eth import ETH_TYPE, EthDrop, encap, link_beats, mac_bytes
from mcf.golden.eth10g import IDLE_WORD, xgmii_tx
from mcf.hdl.eth.rgmii import FrameGate
from mcf.hdl.eth.xgmii import EthEncap64, XgmiiDecap, XgmiiRx, XgmiiTx
from mcf.sim.benches.eth_common import link_frame

LOCAL, PEER = 5, 12


def _strip_idle(words):
    k = 0
    while k < len(words) and words[k] == IDLE_WORD:
        k += 1
    return words[k:]


def test_mac_loopback_vs_golden():
    """Link frames of mixed lengths back to back: the XGMII words equal
    ``mcf.golden.eth10g.xgmii_tx`` of their Ethernet frames word for word (padding, FCS, /T/
    on every lane, gaps with the deficit idle count, starts on lane 0 and 4); looped into
    XgmiiRx → XgmiiDecap they come out as ``link_beats``, one event each."""
    rng = random.Random(21)
    lens = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 21, 25, 26, 27, 28, 29, 30, 31, 32, 33, 40, 41, 100,
            257, 0, 0, 0, 0]
    links = [link_frame(rng, n) for n in lens]
    frames = [encap(lk, LOCAL, PEER) for lk in links]
    bodies = [mac_bytes(PEER) + mac_bytes(LOCAL) + ETH_TYPE.to_bytes(2, "big") + lk
              for lk in links]
    enc, tx, rx, dec = EthEncap64(), XgmiiTx(), XgmiiRx(), XgmiiDecap()
    gate = FrameGate()              # whole frames to the transmitter, as in TenGigMac
    m = Module()
    m.submodules += [enc, gate, tx, rx, dec]
    wiring.connect(m, enc.o, gate.i)
    wiring.connect(m, gate.o, tx.i)
    m.d.comb += [rx.rxd.eq(tx.txd), rx.rxc.eq(tx.txc), rx.valid.eq(1),
                 rx.o.ready.eq(1), dec.i.valid.eq(rx.o.valid), dec.i.payload.eq(rx.o.payload),
                 enc.local_id.eq(LOCAL), enc.peer_id.eq(PEER), dec.local_id.eq(PEER)]
    sim = Simulator(m)
    sim.add_clock(6.4e-9)
    words, beats, tx_ev, rx_ev = [], [], [], []

    async def feed(ctx):
        for lk in links:
            for d, k, last in link_beats(lk):
                ctx.set(enc.i.valid, 1)
                ctx.set(enc.i.payload, {"data": d, "keep": k, "last": last})
                await ctx.tick().until(enc.i.ready)
        ctx.set(enc.i.valid, 0)

    async def watch(ctx):
        ctx.set(dec.o.ready, 1)
        for _ in range(sum(len(f) for f in frames) // 8 + 30 * len(frames) + 40):
            await ctx.tick()
            words.append((ctx.get(tx.txd), ctx.get(tx.txc)))
            if ctx.get(tx.event.valid):
                tx_ev.append(ctx.get(tx.event.payload.bytes))
            if ctx.get(dec.event.valid):
                rx_ev.append((ctx.get(dec.event.payload.cause), ctx.get(dec.event.payload.bytes)))
            if ctx.get(dec.o.valid):
                p = ctx.get(dec.o.payload)
                beats.append((p.data, p.keep, p.last))

    sim.add_testbench(feed, background=True)
    sim.add_testbench(watch)
    sim.run()
    want, starts = xgmii_tx(bodies)
    got = _strip_idle(words)
    want = _strip_idle(want)
    assert got[:len(want)] == want
    assert any(s % 8 == 4 for s in starts) and any(s % 8 == 0 for s in starts)
    assert tx_ev == [len(f) for f in frames]
    assert rx_ev == [(EthDrop.OK, len(f)) for f in frames]
    # the decapsulator's beats (sampled one cycle late: FWFT output, ready high)
    assert beats == [b for lk in links for b in link_beats(lk)]


@pytest.mark.slow
def test_10g_pcs_loopback():
    """TenGigLink looped back at the GT boundary (its own Verilator build, ~19k lines of
    Verilog: slow): lock, slip and relock, bit errors, hi_ber."""
    from mcf.hdl.eth.tengig import TenGigLink
    from mcf.hdl.flat import FlatTop
    from mcf.sim import build, run
    built = build(FlatTop(TenGigLink(64), {"s_axis": "s_axis", "m_axis": "m_axis"}),
                  "eth_10g_pcs")
    run(built, "mcf.sim.benches.eth_10g_pcs", params={"seed": 1})
