# amaranth: UnusedElaboratable=no
"""amaranth.sim tests of the packed DSP cascades the tiled prefill's arrays share (issue #33,
mcf.hdl.compute.tile_cascade.PackedCascades, the slice model): every step's packed sum, the
last slice's accumulation over groups of steps, a stall in the middle, signed and unsigned B,
against the integer formula ``Σ_j (a[j][2p+1]·2^shift + a[j][2p])·b[j]`` wrapped to 48 bits;
the latency ``lanes + 2``."""

from __future__ import annotations

import numpy as np
import pytest
from amaranth import signed, unsigned
from amaranth.sim import Simulator

from mcf.hdl.compute.tile_cascade import PackedCascades


def wrap48(x: int) -> int:
    x &= (1 << 48) - 1
    return x - (1 << 48) if x >> 47 else x


@pytest.mark.parametrize("lanes,pairs,b_signed", [(4, 3, True), (3, 2, False), (1, 1, True)])
def test_packed_sums(lanes, pairs, b_signed):
    """Steps of random INT4 ``a`` and 8-bit ``b`` in groups of 3 (``acc`` low on a group's first
    step), ``ce`` low for two cycles mid-run: each step's running group sum appears on ``sums``
    ``lanes + 2`` cycles (of ``ce``) after its inputs."""
    rng = np.random.default_rng(70 + lanes * 10 + pairs)
    shift, steps, group = 19, 10, 3
    bshape = signed(8) if b_signed else unsigned(8)
    a = rng.integers(-8, 8, size=(steps, lanes, 2 * pairs))
    b = rng.integers(-128, 128, size=(steps, lanes)) if b_signed else \
        rng.integers(0, 256, size=(steps, lanes))
    want, run = [], [0] * pairs
    for t in range(steps):
        for p in range(pairs):
            s = sum((int(a[t, j, 2 * p + 1]) * 2 ** shift + int(a[t, j, 2 * p])) * int(b[t, j])
                    for j in range(lanes))
            run[p] = wrap48((run[p] if t % group else 0) + s)
        want.append(list(run))
    dut = PackedCascades(lanes=lanes, pairs=pairs, a_shape=signed(4), b_shape=bshape,
                         shift=shift)
    got = []
    lat = lanes + 2

    async def bench(ctx):
        t_in = 0                      # steps presented so far (one per cycle with ce)
        for cyc in range(steps + lat + 4):
            stall = cyc in (5, 6)
            ctx.set(dut.ce, 0 if stall else 1)
            if stall:
                ctx.set(dut.ce_p, 0)          # ce_p is not gated by ce: the caller's
            if not stall:
                if t_in < steps:
                    for j in range(lanes):
                        for n in range(2 * pairs):
                            ctx.set(dut.a[j][n], int(a[t_in, j, n]))
                        ctx.set(dut.b[j], int(b[t_in, j]))
                # the last slices' P for the step presented lanes + 1 cycles ago
                s_p = t_in - (lanes + 1)
                ctx.set(dut.ce_p, 1 if 0 <= s_p < steps else 0)
                ctx.set(dut.acc, 1 if s_p % group else 0)
            await ctx.tick()
            if not stall:
                t_in += 1
                done = t_in - lat         # the step whose sum is on ``sums`` now
                if 0 <= done < steps:
                    got.append([ctx.get(dut.sums[p]) for p in range(pairs)])

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert got == want


def test_refuses_unknown_dsp():
    with pytest.raises(ValueError):
        PackedCascades(lanes=2, pairs=1, a_shape=signed(4), b_shape=signed(8), shift=19,
                       dsp="fabric")
