"""amaranth.sim tests of the ping-pong buffer: the kernel reads one bank while the other fills,
the fill stalls while both banks are held, oversize blocks are truncated and counted."""

import numpy as np
from amaranth.sim import Simulator

from mcf.hdl.mem.pingpong import PingPongBuffer


def test_pingpong_blocks():
    depth = 8
    dut = PingPongBuffer(width=16, depth=depth)
    rng = np.random.default_rng(0)
    blocks = [list(rng.integers(0, 1 << 16, n)) for n in (8, 3, 1, 12, 5, 8, 2)]
    got = []
    stalls = [0]
    status = {}

    async def writer(ctx):
        for blk in blocks:
            for i, v in enumerate(blk):
                ctx.set(dut.w.payload, {"data": int(v), "last": int(i == len(blk) - 1)})
                ctx.set(dut.w.valid, 1)
                while True:
                    _, _, ready = await ctx.tick().sample(dut.w.ready)
                    if ready:
                        break
                    stalls[0] += 1
            ctx.set(dut.w.valid, 0)

    async def reader(ctx):
        while len(got) < len(blocks):
            await ctx.tick().until(dut.r_valid)
            n = ctx.get(dut.r_len)
            words = []
            for a in range(n):
                ctx.set(dut.r_addr, a)
                await ctx.tick()
                words.append(ctx.get(dut.r_data))
            await ctx.tick().repeat(int(rng.integers(1, 30)))   # a slow kernel
            ctx.set(dut.r_release, 1)
            await ctx.tick()
            ctx.set(dut.r_release, 0)
            got.append(words)
        status["overflow"] = ctx.get(dut.overflow)
        status["blocks"] = ctx.get(dut.blocks)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(writer)
    sim.add_testbench(reader)
    sim.run()
    assert got == [b[:depth] for b in blocks]
    assert stalls[0] > 0                       # the writer waited for a free bank
    assert status == {"overflow": 12 - depth, "blocks": len(blocks)}
