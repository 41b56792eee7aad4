"""amaranth.sim tests of the vector unit's sequential divider and integer square root."""

import math

import numpy as np
from amaranth.sim import Simulator

from mcf.hdl.compute.vector_math import VectorDivider, VectorSqrt


def _run(dut, cases, setup, read):
    out = []
    sim = Simulator(dut)
    sim.add_clock(1e-8)

    async def tb(ctx):
        for c in cases:
            setup(ctx, c)
            ctx.set(dut.start, 1)
            await ctx.tick()
            ctx.set(dut.start, 0)
            await ctx.tick().until(dut.done)
            out.append(read(ctx))
    sim.add_testbench(tb)
    sim.run()
    return out


def test_divider():
    rng = np.random.default_rng(0)
    cases = [(1 << 31, 1 << 15), (1 << 31, (1 << 16) - 1), ((1 << 72) - 1, 1), (5, 7),
             ((1 << 48), 256), (0, 3)]
    cases += [(int(rng.integers(0, 1 << 62)) << 10, int(rng.integers(1, 1 << 40)))
              for _ in range(20)]
    dut = VectorDivider(72, 40)

    def setup(ctx, c):
        ctx.set(dut.n, c[0])
        ctx.set(dut.d, c[1])
    got = _run(dut, cases, setup, lambda ctx: (ctx.get(dut.q), ctx.get(dut.q_len)))
    # q_len (kept beside q, read by the RMSNorm normalisation) is q's bit length
    assert got == [(n // d, (n // d).bit_length()) for n, d in cases]


def test_sqrt():
    rng = np.random.default_rng(1)
    cases = [0, 1, 2, 3, 4, 15, 16, 17, (1 << 80) - 1, (1 << 40) ** 2 - 1, (1 << 39) ** 2]
    cases += [int(rng.integers(0, 1 << 62)) << int(rng.integers(0, 18)) for _ in range(20)]
    dut = VectorSqrt(80)

    def setup(ctx, c):
        ctx.set(dut.x, c)
    got = _run(dut, cases, setup, lambda ctx: ctx.get(dut.root))
    assert got == [math.isqrt(c) for c in cases]
