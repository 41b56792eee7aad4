"""RegisterSlice (hdl/stream/register_slice.py), both modes: amaranth.sim with random valid and
ready — every word through exactly once and in order, the stream rules on the output, the
latency (1 cycle full slice, 0 ready slice), full rate with ready held high, and which outputs
are registers."""

from __future__ import annotations

import random

import pytest
from amaranth.hdl import Fragment
from amaranth.lib import data
from amaranth.sim import Simulator

from mcf.hdl.stream import RegisterSlice

LAYOUT = data.StructLayout({"word": 16, "last": 1})


def run(words, *, p_valid, p_ready, seed, forward=True, cycles=None):
    """Push ``words`` through a slice; returns (received words, transfer cycles in and out,
    stream-rule violations on ``o``, cycles with ``o.valid`` and ``o.ready`` both high)."""
    dut = RegisterSlice(LAYOUT, forward=forward)
    log = {"in": [], "out": [], "got": [], "violations": 0}
    sim = Simulator(dut)
    sim.add_clock(1e-8)

    async def producer(ctx):
        rng = random.Random(seed)
        cycle = 0
        for w in words:
            while rng.random() >= p_valid:
                ctx.set(dut.i.valid, 0)
                await ctx.tick()
                cycle += 1
            ctx.set(dut.i.payload, {"word": w, "last": w & 1})
            ctx.set(dut.i.valid, 1)
            while True:
                ready = ctx.get(dut.i.ready)
                await ctx.tick()
                cycle += 1
                if ready:
                    log["in"].append(cycle)
                    break
        ctx.set(dut.i.valid, 0)

    async def consumer(ctx):
        rng = random.Random(seed + 1)
        held = None
        cycle = 0
        while len(log["got"]) < len(words) and cycle < (cycles or 40 * len(words) + 100):
            ready = int(rng.random() < p_ready)
            ctx.set(dut.o.ready, ready)
            valid = ctx.get(dut.o.valid)
            payload = ctx.get(dut.o.payload.as_value())
            if held is not None and (not valid or payload != held):
                log["violations"] += 1           # valid dropped or payload changed unsent
            await ctx.tick()
            cycle += 1
            if valid and ready:
                log["got"].append(payload & 0xFFFF)
                log["out"].append(cycle)
                held = None
            elif valid:
                held = payload

    sim.add_testbench(producer)
    sim.add_testbench(consumer)
    sim.run()
    return log


@pytest.mark.parametrize("forward", [True, False])
@pytest.mark.parametrize("seed,p_valid,p_ready", [(1, 0.5, 0.5), (2, 0.9, 0.3), (3, 0.3, 0.9),
                                                  (4, 1.0, 0.5), (5, 0.7, 0.7)])
def test_every_word_once_in_order_under_random_flow(seed, p_valid, p_ready, forward):
    words = random.Random(seed * 11).sample(range(1 << 16), 300)
    log = run(words, p_valid=p_valid, p_ready=p_ready, seed=seed, forward=forward)
    assert log["got"] == words
    assert log["violations"] == 0
    # full slice: a word leaves at least one edge after it was taken (latency 1, never 0)
    lat = 1 if forward else 0
    assert all(o >= i + lat for i, o in zip(log["in"], log["out"], strict=True))
    assert any(o > i for i, o in zip(log["in"], log["out"], strict=True))   # the skid is used


@pytest.mark.parametrize("forward", [True, False])
def test_full_rate_and_latency_with_ready_high(forward):
    words = list(range(100, 164))
    log = run(words, p_valid=1.0, p_ready=1.0, seed=9, forward=forward)
    assert log["got"] == words
    assert log["in"] == list(range(1, 65))          # one word taken every cycle
    lat = 1 if forward else 0                       # and out 1 (0) cycles later, no bubble
    assert log["out"] == list(range(1 + lat, 65 + lat))


def _after_offer(dut, steps) -> list:
    """Simulate ``dut`` with the beat ``{word 0x1234, last 0}`` offered on ``i`` and ``o.ready``
    low, then ``await steps(ctx, seen)``; returns ``seen``, what ``steps`` recorded."""
    seen: list = []
    sim = Simulator(dut)
    sim.add_clock(1e-8)

    async def proc(ctx):
        ctx.set(dut.i.payload, {"word": 0x1234, "last": 0})
        ctx.set(dut.i.valid, 1)
        ctx.set(dut.o.ready, 0)
        await steps(ctx, seen)

    sim.add_testbench(proc)
    sim.run()
    return seen


def test_outputs_are_registers():
    """``o.valid``, ``o.payload`` and ``i.ready`` hold their value when the inputs change
    between edges: nothing passes through combinationally."""
    dut = RegisterSlice(LAYOUT)

    async def steps(ctx, seen):
        seen.append((ctx.get(dut.o.valid), ctx.get(dut.i.ready)))      # (0, 1): before an edge
        await ctx.tick()                                                # word 0x1234 in main
        ctx.set(dut.i.payload, {"word": 0x5678, "last": 1})
        seen.append((ctx.get(dut.o.valid), ctx.get(dut.i.ready)))      # (1, 1)
        await ctx.tick()                                                # 0x5678 in the skid
        ctx.set(dut.o.ready, 1)
        seen.append((ctx.get(dut.o.valid), ctx.get(dut.i.ready)))      # ready low, not o.ready
        seen.append(ctx.get(dut.o.payload.word))
        ctx.set(dut.i.valid, 0)
        await ctx.tick()
        seen.append(ctx.get(dut.o.payload.word))
        seen.append(ctx.get(dut.i.ready))

    seen = _after_offer(dut, steps)
    assert seen == [(0, 1), (1, 1), (1, 0), 0x1234, 0x5678, 1]
    Fragment.get(dut, None)


def test_ready_slice_passes_data_through_and_registers_ready():
    """Ready slice: ``o`` follows ``i`` in the same cycle while the skid is empty; a stall
    parks the beat and ``i.ready`` falls at the next edge, not in the cycle ``o.ready`` falls."""
    dut = RegisterSlice(LAYOUT, forward=False)

    def look(ctx):
        return ctx.get(dut.o.valid), ctx.get(dut.o.payload.word), ctx.get(dut.i.ready)

    async def steps(ctx, seen):
        seen.append(look(ctx))
        await ctx.tick()                                                # 0x1234 parked
        ctx.set(dut.i.payload, {"word": 0x5678, "last": 1})
        seen.append(look(ctx))
        ctx.set(dut.o.ready, 1)
        await ctx.tick()                                                # 0x1234 sent
        seen.append(look(ctx))

    seen = _after_offer(dut, steps)
    assert seen == [(1, 0x1234, 1), (1, 0x1234, 0), (1, 0x5678, 1)]
