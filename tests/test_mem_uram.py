"""UramColumns (mcf.hdl.mem.uram): the same read data, cycle for cycle, as one Memory with a
write port and a non-transparent read port, under random writes and reads."""

from __future__ import annotations

import random

import pytest
from amaranth import Module
from amaranth.lib import memory
from amaranth.sim import Simulator

from mcf.hdl.mem.uram import URAM_WIDTH, UramColumns


@pytest.mark.parametrize("width,depth", [(2 * URAM_WIDTH + 16, 40), (URAM_WIDTH, 16), (20, 8)])
def test_same_as_one_memory(width, depth):
    m = Module()
    m.submodules.dut = dut = UramColumns(width, depth)
    m.submodules.ref = ref = memory.Memory(shape=width, depth=depth, init=[])
    wp, rp = ref.write_port(), ref.read_port(transparent_for=())
    m.d.comb += [wp.addr.eq(dut.w.addr), wp.en.eq(dut.w.en), wp.data.eq(dut.w.data),
                 rp.addr.eq(dut.r.addr), rp.en.eq(dut.r.en)]
    rng = random.Random(width)
    checked = 0

    async def bench(ctx):
        nonlocal checked
        for _ in range(600):
            ctx.set(dut.w.addr, rng.randrange(depth))
            ctx.set(dut.w.data, rng.getrandbits(width))
            ctx.set(dut.w.en, rng.random() < 0.5)
            ctx.set(dut.r.addr, rng.randrange(depth))
            ctx.set(dut.r.en, rng.random() < 0.8)
            await ctx.tick()
            assert ctx.get(dut.r.data) == ctx.get(rp.data)
            checked += ctx.get(rp.data) != 0

    sim = Simulator(m)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert checked > 200
