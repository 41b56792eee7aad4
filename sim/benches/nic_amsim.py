"""amaranth.sim helpers for the NIC unit tests: packet sources and sinks on parsed-layout
streams with random idle / backpressure (fixed seeds). No cocotb needed."""

from __future__ import annotations

import random


async def drive(ctx, stream, beats: list[dict], rng: random.Random, idle: float = 0.0) -> None:
    """Send beats (dicts of payload fields) on ``stream``; idle cycles with probability idle."""
    layout = stream.payload.shape()
    for beat in beats:
        while idle and rng.random() < idle:
            ctx.set(stream.valid, 0)
            await ctx.tick()
        ctx.set(stream.payload.as_value(), pack_fields(layout, beat))
        ctx.set(stream.valid, 1)
        await ctx.tick().until(stream.ready)
    ctx.set(stream.valid, 0)


def sink_process(stream, out: list, rng: random.Random, ready: float = 1.0):
    """A background process collecting beats from ``stream`` into ``out`` (dicts)."""
    layout = stream.payload.shape()

    async def proc(ctx):
        while True:
            r = 1 if ready >= 1.0 else int(rng.random() < ready)
            ctx.set(stream.ready, r)
            _, _, valid, raw = await ctx.tick().sample(stream.valid,
                                                       stream.payload.as_value())
            if valid and r:
                out.append(unpack_fields(layout, raw))
    return proc


def pack_fields(layout, fields: dict) -> int:
    return sum((int(fields[name]) & ((1 << f.width) - 1)) << f.offset for name, f in layout)


def unpack_fields(layout, raw: int) -> dict:
    return {name: (raw >> f.offset) & ((1 << f.width) - 1) for name, f in layout}


def split_packets(beats: list[dict]) -> list[list[dict]]:
    pkts, cur = [], []
    for b in beats:
        cur.append(b)
        if b["last"]:
            pkts.append(cur)
            cur = []
    assert not cur, "stream ended inside a packet"
    return pkts
