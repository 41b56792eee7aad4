"""Parts of the attention engine's PV side and hand-over (amaranth.sim) against Python models,
cycle by cycle: the accumulator bank's "reads as zero" flags and transparent read
(:class:`mcf.hdl.compute.attn_acc.AccBank`), the score-slot ring's order and counts
(:class:`mcf.hdl.compute.attn_ring.SlotRing`)."""

from __future__ import annotations

import numpy as np
from amaranth.sim import Simulator

from mcf.hdl.compute.attn_acc import AccBank
from mcf.hdl.compute.attn_ring import SlotRing, score_slot_layout


def _run(dut, tb):
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()


def test_acc_bank_zero_flags_and_transparent_read():
    words, width = 6, 40
    dut = AccBank(words, width)
    rng = np.random.default_rng(7)
    mem, flags = [0] * words, [1] * words
    checked = {"zero": 0, "word": 0, "bypass": 0}

    async def tb(ctx):
        nonlocal flags
        for _ in range(600):
            rd = int(rng.integers(words))
            wr_en = int(rng.random() < 0.5)
            wa = int(rng.integers(words)) if rng.random() < 0.7 else rd
            wd = int(rng.integers(1 << 40))
            zero = int(rng.integers(1 << words)) if rng.random() < 0.2 else 0
            for sig, val in ((dut.rd_addr, rd), (dut.wr_en, wr_en), (dut.wr_addr, wa),
                             (dut.wr_data, wd), (dut.zero, zero)):
                ctx.set(sig, val)
            new_flags = [0 if wr_en and wa == n else f | ((zero >> n) & 1)
                         for n, f in enumerate(flags)]
            bypass = wr_en and wa == rd
            nxt = 0 if new_flags[rd] else (wd if bypass else mem[rd])
            kind = "zero" if new_flags[rd] else ("bypass" if bypass else "word")
            if wr_en:
                mem[wa] = wd
            flags = new_flags
            await ctx.tick()
            got = ctx.get(dut.rd_data)
            assert got == nxt, f"read of word {rd}: got {got:#x}, expected {nxt:#x}"
            checked[kind] += 1

    _run(dut, tb)
    assert min(checked.values()) > 30, checked


def test_slot_ring_order_and_counts():
    heads, block, slots = 3, 32, 3
    dut = SlotRing(heads, block, slots)
    lay = score_slot_layout(heads, block)
    rng = np.random.default_rng(11)
    fifo, wp, rp = [], 0, 0
    seen = {"full": 0, "empty": 0, "both": 0}

    async def tb(ctx):
        nonlocal wp, rp
        for _ in range(500):
            assert ctx.get(dut.r.count) == len(fifo) == ctx.get(dut.w.count)
            assert (ctx.get(dut.w.slot), ctx.get(dut.r.slot)) == (wp, rp)
            if fifo:
                assert ctx.get(dut.r.head.as_value()) == fifo[0]
            pub = int(len(fifo) < slots and rng.random() < 0.5)
            rel = int(len(fifo) > 0 and rng.random() < 0.5)
            rec = lay.const({"nk": int(rng.integers(block + 1)),
                             "m": [int(x) for x in rng.integers(-2**31, 2**31, heads)]})
            ctx.set(dut.w.rec, rec)
            ctx.set(dut.w.pub, pub)
            ctx.set(dut.r.rel, rel)
            seen["full"] += len(fifo) == slots
            seen["empty"] += not fifo
            seen["both"] += pub and rel
            if rel:
                fifo.pop(0)
                rp = (rp + 1) % slots
            if pub:
                fifo.append(rec.as_bits())
                wp = (wp + 1) % slots
            await ctx.tick()

    _run(dut, tb)
    assert min(seen.values()) > 10, seen
