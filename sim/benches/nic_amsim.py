"""amaranth.sim helpers for the NIC unit tests: packet sources and sinks on parsed-layout
streams with random idle / backpressure (fixed seeds). No cocotb needed."""

from __future__ import annotations

import random

from mcf.sim.amsim import send


async def drive(ctx, stream, beats: list[dict], rng: random.Random, idle: float = 0.0) -> None:
    """Send beats (dicts of payload fields) on ``stream``; idle cycles with probability idle."""
    layout = stream.payload.shape()
    await send(ctx, stream, (pack_fields(layout, beat) for beat in beats), rng, idle)


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


def sinks_process(sinks: list, taps: list = (), on_last=None):
    """One background process serving many streams at once (cheaper than one process each).

    ``sinks``: ``(stream, out, rng, ready)`` tuples — this process drives ``ready`` (1 with
    probability ``ready``, drawn from ``rng`` every cycle) and appends accepted beats (dicts)
    to ``out``. ``taps``: ``(stream, out)`` tuples — observed only (valid and ready sampled,
    nothing driven): every transferred beat is appended. ``on_last(ctx, index)`` is called after
    a ``last`` beat was accepted on ``sinks[index]`` (to keep a run deterministic, it should
    publish anything other processes read through ``ctx.set`` on a signal, not through Python
    state: the order in which processes run within one time step is not fixed)."""
    layouts = [s.payload.shape() for s, *_ in sinks]
    tap_layouts = [s.payload.shape() for s, _ in taps]
    sampled = [x for s, *_ in sinks for x in (s.valid, s.payload.as_value())]
    sampled += [x for s, _ in taps for x in (s.valid, s.ready, s.payload.as_value())]
    n = len(sinks)

    async def proc(ctx):
        while True:
            rs = []
            for stream, _, rng, ready in sinks:
                r = 1 if ready >= 1.0 else int(rng.random() < ready)
                ctx.set(stream.ready, r)
                rs.append(r)
            vals = (await ctx.tick().sample(*sampled))[2:]
            for j in range(n):
                if rs[j] and vals[2 * j]:
                    beat = unpack_fields(layouts[j], vals[2 * j + 1])
                    sinks[j][1].append(beat)
                    if on_last is not None and beat["last"]:
                        on_last(ctx, j)
            for j, (_, out) in enumerate(taps):
                v, r, raw = vals[2 * n + 3 * j: 2 * n + 3 * j + 3]
                if v and r:
                    out.append(unpack_fields(tap_layouts[j], raw))
    return proc


async def write_table(ctx, port, entries: dict[int, int]) -> None:
    """Write ``{address: value}`` through a table write port (``addr``, ``data``, ``en``: the
    router's ``route_wr``, the reduction engine's ``cfg_wr``), one entry per cycle."""
    for addr, value in entries.items():
        ctx.set(port.addr, addr)
        ctx.set(port.data.as_value(), value)
        ctx.set(port.en, 1)
        await ctx.tick()
    ctx.set(port.en, 0)


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
