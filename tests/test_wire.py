"""The split wire of the simulated cluster (sim/wire.py): capture + replay, with the host copying
one window per window, is the same wire as ``WireDelay`` of the lookahead, cycle for cycle; the
MAC buffer never stalls the wire, drops whole frames only, and loses none it had room for."""

from __future__ import annotations

import random

from amaranth import Module
from amaranth.sim import Simulator

from mcf.sim.wire import (
    MacRxBuffer,
    WindowTimer,
    WireCapture,
    WireDelay,
    WireReplay,
    lookahead,
    window_for,
)


def test_window_for():
    assert window_for(64) == 31
    assert window_for(600) == 31
    assert window_for(6) == 2
    for bad in (3, 2):
        try:
            window_for(bad)
        except ValueError:
            continue
        raise AssertionError(f"latency {bad} accepted")


def test_split_wire_is_the_delay():
    w = 5
    m = Module()
    m.submodules.timer = timer = WindowTimer(w)
    m.submodules.delay = delay = WireDelay(lookahead(w))
    m.submodules.cap = cap = WireCapture(w)
    m.submodules.rep = rep = WireReplay(w)
    m.d.comb += [cap.tick.eq(timer.tick), rep.tick.eq(timer.tick),
                 cap.i.valid.eq(delay.i.valid), cap.i.payload.eq(delay.i.payload)]
    rng = random.Random(3)
    seen = {"delay": [], "replay": []}

    async def source(ctx):
        for _ in range(40 * w):
            ctx.set(delay.i.valid, rng.random() < 0.6)
            ctx.set(delay.i.payload.data, rng.getrandbits(64))
            ctx.set(delay.i.payload.keep, rng.getrandbits(8))
            ctx.set(delay.i.payload.last, rng.random() < 0.2)
            await ctx.tick()

    async def host(ctx):                 # once per window, as mcf.sim.benches.grid does
        await ctx.tick()
        while True:
            await ctx.changed(timer.win)
            await ctx.delay(1e-9)        # mid-cycle, as the grid acts on the falling edge
            ctx.set(rep.window, ctx.get(cap.window))

    async def sink(ctx):
        for _ in range(40 * w):
            await ctx.tick()
            for name, port in (("delay", delay.o), ("replay", rep.o)):
                v = ctx.get(port.valid)
                seen[name].append((v, ctx.get(port.payload.as_value()) if v else None))

    sim = Simulator(m)
    sim.add_clock(10e-9)
    sim.add_testbench(source)
    sim.add_testbench(host, background=True)
    sim.add_testbench(sink)
    sim.run()
    assert sum(v for v, _ in seen["delay"]) > 50
    assert seen["delay"] == seen["replay"]


def test_mac_buffer_drops_whole_frames():
    m = Module()
    m.submodules.buf = buf = MacRxBuffer(depth_bytes=1 << 12)
    frames = [[random.Random(k).getrandbits(64) for _ in range(n)]
              for k, n in enumerate([200, 200, 100, 259, 30, 5])]
    late = [random.Random(99).getrandbits(64) for _ in range(259)]
    got, stall, out = [], {"on": True}, {}

    async def send(ctx, f):              # back to back, never waiting
        for j, word in enumerate(f):
            assert ctx.get(buf.i.ready)
            ctx.set(buf.i.valid, 1)
            ctx.set(buf.i.payload.data, word)
            ctx.set(buf.i.payload.keep, 0xFF)
            ctx.set(buf.i.payload.last, j == len(f) - 1)
            await ctx.tick()
        ctx.set(buf.i.valid, 0)

    async def wire(ctx):
        for f in frames:
            await send(ctx, f)
        out["dropped"] = ctx.get(buf.dropped)
        stall["on"] = False
        await ctx.tick().repeat(600)
        await send(ctx, late)

    async def reader(ctx):
        cur = []
        for _ in range(3000):
            ctx.set(buf.o.ready, not stall["on"])
            await ctx.tick()
            if ctx.get(buf.o.valid) and not stall["on"]:
                cur.append(ctx.get(buf.o.payload.data))
                if ctx.get(buf.o.payload.last):
                    got.append(cur)
                    cur = []

    sim = Simulator(m)
    sim.add_clock(10e-9)
    sim.add_testbench(wire)
    sim.add_testbench(reader)
    sim.run()
    # 512 beats, room checked against a longest frame (259 beats): two frames of 200 fit, the
    # next four are dropped whole while nothing drains; once drained a longest frame fits
    assert out["dropped"] == 4
    assert got == frames[:2] + [late]


def test_mac_buffer_counts_drops():
    m = Module()
    m.submodules.buf = buf = MacRxBuffer(depth_bytes=1 << 12)
    counted = {}

    async def wire(ctx):
        for _k in range(4):
            for j in range(200):
                ctx.set(buf.i.valid, 1)
                ctx.set(buf.i.payload.keep, 0xFF)
                ctx.set(buf.i.payload.last, j == 199)
                await ctx.tick()
        ctx.set(buf.i.valid, 0)
        await ctx.tick()
        counted["dropped"] = ctx.get(buf.dropped)

    sim = Simulator(m)
    sim.add_clock(10e-9)
    sim.add_testbench(wire)
    sim.run()
    assert counted["dropped"] == 2
