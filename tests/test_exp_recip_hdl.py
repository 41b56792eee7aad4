"""HDL exp2 / reciprocal units against the ABI golden functions, exhaustively (amaranth.sim)."""

from __future__ import annotations

import numpy as np
from amaranth.sim import Simulator

from mcf.abi.softmax import EXP_FRAC, RECIP_IN_BITS, SCORE_FRAC, exp2_neg, recip_mant
from mcf.hdl.compute.exp2 import Exp2Neg
from mcf.hdl.compute.recip import Recip


def _stream_through(dut, inp, out, values, latency):
    got = []

    async def tb(ctx):
        for n in range(len(values) + latency):
            if n < len(values):
                ctx.set(inp, int(values[n]))
            await ctx.tick()
            if n + 1 >= latency:
                got.append(ctx.get(out))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    return np.array(got[:len(values)], dtype=np.int64)


def test_exp2_hdl_exhaustive_16bit_and_large():
    dut = Exp2Neg(33)
    d = np.concatenate([np.arange(1 << 16), [(EXP_FRAC + 1) << SCORE_FRAC, (1 << 32) - 1,
                                              (1 << 31), 12345678]]).astype(np.int64)
    got = _stream_through(dut, dut.d, dut.p, d, Exp2Neg.LATENCY)
    assert np.array_equal(got, exp2_neg(d))


def test_recip_hdl_exhaustive():
    dut = Recip()
    x = np.arange(1 << (RECIP_IN_BITS - 1), 1 << RECIP_IN_BITS, dtype=np.int64)
    got = _stream_through(dut, dut.x, dut.r, x, Recip.LATENCY)
    assert np.array_equal(got, recip_mant(x))
