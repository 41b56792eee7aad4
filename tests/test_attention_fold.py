"""QueryFold (per-channel-K format: a group header folded into a query head) bit-exact against
:func:`mcf.abi.kv.fold_query`, with backpressure (amaranth.sim)."""

from __future__ import annotations

import numpy as np
from amaranth.sim import Simulator

from mcf.abi.kv_channel import fold_query
from mcf.hdl.compute.attn_fold import QueryFold

D, L = 32, 8
NB = D // L


def _word(values, width):
    return sum((int(v) & ((1 << width) - 1)) << (width * i) for i, v in enumerate(values))


def _lanes(word, width, n):
    out = []
    for i in range(n):
        x = (word >> (width * i)) & ((1 << width) - 1)
        out.append(x - (1 << width) if x >> (width - 1) else x)
    return out


def test_fold_query_exact_with_backpressure():
    rng = np.random.default_rng(41)
    heads = []
    for k in range(24):
        q = rng.integers(-128, 128, D)
        s = rng.integers(1, 1 << 16, D) if k % 3 else rng.integers(1, 300, D)
        if k % 5 == 1:
            s[rng.integers(0, D, 2)] = 65535            # outlier channels
        if k == 4:
            q[:] = 0                                     # all-zero query: q' = 0, (0, 0)
        if k == 7:
            q[:] = -128
            s[:] = 65535                                 # largest |p|
        m, e = int(rng.integers(1 << 15, 1 << 16)), int(rng.integers(-40, 20))
        if k == 9:
            e = 127                                      # e' saturates
        heads.append((q, s, m, e))
    dut = QueryFold(D, L)
    got = []

    async def producer(ctx):
        for q, s, m, e in heads:
            for c in range(NB):
                ctx.set(dut.i.valid, 1)
                ctx.set(dut.i.payload, {"q": _word(q[c * L:(c + 1) * L], 8),
                                        "s": _word(s[c * L:(c + 1) * L], 16),
                                        "scale_m": m, "scale_e": e & 0xff})
                await ctx.tick().until(dut.i.ready)
            ctx.set(dut.i.valid, 0)
            if rng.random() < 0.3:
                await ctx.tick()

    async def consumer(ctx):
        cur = []
        while len(got) < len(heads):
            ready = rng.random() < 0.7
            ctx.set(dut.o.ready, int(ready))
            _, _, valid, q, c, m, e = await ctx.tick().sample(
                dut.o.valid, dut.o.payload.q, dut.o.payload.c, dut.o.payload.scale_m,
                dut.o.payload.scale_e)
            if valid and ready:
                assert c == len(cur)
                cur.append((_lanes(q, 8, L), m, e - 256 if e >> 7 else e))
                if len(cur) == NB:
                    got.append(([x for beat in cur for x in beat[0]], cur[0][1], cur[0][2]))
                    assert all(b[1:] == cur[0][1:] for b in cur)
                    cur = []

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(producer, background=True)
    sim.add_testbench(consumer)
    sim.run()
    for (q, s, m, e), (qf, mf, ef) in zip(heads, got):
        q_ref, sc_ref = fold_query(q[None, :], np.array([[m, e]]), s)
        assert qf == [int(x) for x in q_ref[0]]
        assert (mf, ef) == (int(sc_ref[0, 0]), int(sc_ref[0, 1]))
