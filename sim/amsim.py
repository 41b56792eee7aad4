"""amaranth.sim helpers shared by the unit tests, the cocotb-free benchmarks (``mcf.sim.perf``)
and the ABI tests (no cocotb): stream sources with random idle cycles and sinks with random
backpressure (fixed seeds; ``rng`` is a ``random.Random`` or a numpy ``Generator``), payloads
packed and unpacked by layout, table writes, node records run one at a time to their
``done``, a packet as the parsers hand it on
(:func:`mcf.abi.framing.parsed_layout` beats) and the packetizer / parser harnesses. Beats are
raw integers or dicts of layout fields, so tests compare bit for bit against the golden models
(:mod:`mcf.golden.packet`, :mod:`mcf.golden.nic`)."""

from __future__ import annotations

import random
from collections.abc import Iterable

from amaranth.lib import data

from mcf.abi.framing import parsed_layout
from mcf.abi.meta import Meta
from mcf.abi.node import CMD

__all__ = ["send", "run_records", "pack_fields", "unpack_fields", "parsed_beats", "drive",
           "sink_process", "sinks_process", "write_table", "split_packets", "Sink",
           "run_packetizer", "run_parser", "expected_parsed"]


def _value(stream):
    """The payload of ``stream`` as a plain value (a layout view's bits or the signal itself)."""
    p = stream.payload
    return p.as_value() if isinstance(p, data.View) else p


async def send(ctx, stream, words: Iterable[int], rng=None, idle: float = 0.0) -> None:
    """Send ``words`` (payload bits, cut to the payload's width) on ``stream`` in order, each
    held until taken; before each word ``valid`` drops for a cycle with probability ``idle``
    (again and again; ``rng`` defaults to ``random.Random(0)``); ``valid`` is low after the last
    word."""
    rng = rng or random.Random(0)
    value = _value(stream)
    mask = (1 << len(value)) - 1
    for bits in words:
        while idle and rng.random() < idle:
            ctx.set(stream.valid, 0)
            await ctx.tick()
        ctx.set(value, bits & mask)
        ctx.set(stream.valid, 1)
        await ctx.tick().until(stream.ready)
    ctx.set(stream.valid, 0)


async def run_records(ctx, port, done, args: Iterable[int], limit: int) -> list[int]:
    """Each record argument of ``args`` (``CMD``'s ``arg``) sent on ``port`` as one
    :data:`~mcf.abi.node.CMD` beat, then the cycles until ``done`` is high; returns each
    record's cycles — ``limit`` for a record not done within ``limit`` cycles, which ends the
    run."""
    cycles: list[int] = []
    for a in args:
        await send(ctx, port, [CMD.const({"arg": a}).as_bits()])
        c = 0
        while not ctx.get(done) and c < limit:
            await ctx.tick()
            c += 1
        cycles.append(c)
        if c >= limit:
            break
    return cycles


def pack_fields(layout, fields: dict) -> int:
    """The bits of a ``layout`` value from its fields (each cut to its width)."""
    return sum((int(fields[name]) & ((1 << f.width) - 1)) << f.offset for name, f in layout)


def unpack_fields(layout, raw: int) -> dict[str, int]:
    """The fields of a ``layout`` value from its bits."""
    return {name: (raw >> f.offset) & ((1 << f.width) - 1) for name, f in layout}


def parsed_beats(meta: Meta, payload: bytes, data_width: int = 64) -> list[int]:
    """A packet on a parser's output stream: one :func:`~mcf.abi.framing.parsed_layout` beat
    per ``data_width`` bits of payload, ``meta`` on every beat, ``keep`` per byte, ``last`` on
    the final one; a header-only packet is one empty beat."""
    lay, nb = parsed_layout(data_width), data_width // 8

    def beat(**fields: int) -> int:
        return sum(v << lay[n].offset for n, v in fields.items())

    raw = meta.pack()
    if not payload:
        return [beat(meta=raw, data=0, keep=0, last=1)]
    return [beat(meta=raw, data=int.from_bytes(payload[k:k + nb], "little"),
                 keep=(1 << len(payload[k:k + nb])) - 1, last=int(k + nb >= len(payload)))
            for k in range(0, len(payload), nb)]


# --- NIC streams ----------------------------------------------------------------------------

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


def split_packets(beats: list[dict]) -> list[list[dict]]:
    pkts, cur = [], []
    for b in beats:
        cur.append(b)
        if b["last"]:
            pkts.append(cur)
            cur = []
    assert not cur, "stream ended inside a packet"
    return pkts


# --- packet path ----------------------------------------------------------------------------

class Sink:
    """Records every transfer on ``port`` (as raw ints, with the cycle number)."""

    def __init__(self, port, *, backpressure: float = 0.0, seed: int = 0):
        self.port = port
        self.backpressure = backpressure
        self.rng = random.Random(seed)
        self.items: list[int] = []
        self.cycles: list[int] = []

    async def run(self, ctx):
        """Run forever: add with ``sim.add_testbench(sink.run, background=True)``."""
        value = _value(self.port)
        cycle = 0
        while True:
            ready = not (self.backpressure and self.rng.random() < self.backpressure)
            ctx.set(self.port.ready, ready)
            *_, valid, raw = await ctx.tick().sample(self.port.valid, value)
            if valid and ready:
                self.items.append(int(raw))
                self.cycles.append(cycle)
            cycle += 1


def _status(ctx, port, layout) -> dict[str, int]:
    raw = ctx.get(port.as_value())
    return unpack_fields(layout, int(raw))


def run_packetizer(dut, metas: list[int], frames, *, idle: float = 0.0,
                   backpressure: float = 0.0, seed: int = 0, extra_cycles: int = 8):
    """Push raw metadata words and payload frames (lists of WireBeat) into a
    :class:`~mcf.hdl.packet.packetizer.Packetizer`; return (output beats as raw ints, status)."""
    from amaranth.sim import Simulator

    from mcf.abi.csrmap import PACKETIZER_STATUS

    beat = dut.o_packet.payload.shape()
    words = [pack_fields(beat, b._asdict()) for f in frames for b in f]
    expected_packets = len(metas)
    sink = Sink(dut.o_packet, backpressure=backpressure, seed=seed + 1)
    result = {}

    async def metas_tb(ctx):
        await send(ctx, dut.i_meta, metas, idle=idle, rng=random.Random(seed + 2))

    async def payload_tb(ctx):
        await send(ctx, dut.i_payload, words, idle=idle, rng=random.Random(seed + 3))

    async def main(ctx):
        last_bit = beat["last"].offset
        for _ in range(200 * (len(words) + len(metas)) + 1000):
            if sum(x >> last_bit & 1 for x in sink.items) >= expected_packets:
                break
            await ctx.tick()
        await ctx.tick().repeat(extra_cycles)
        result["status"] = _status(ctx, dut.status, PACKETIZER_STATUS)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(metas_tb)
    sim.add_testbench(payload_tb)
    sim.add_testbench(sink.run, background=True)
    sim.add_testbench(main)
    sim.run()
    return sink.items, result["status"]


def run_parser(dut, beats, *, local_id: int, num_nodes: int, expected_beats: int,
               idle: float = 0.0, backpressure: float = 0.0, seed: int = 0,
               extra_cycles: int = 16):
    """Feed WireBeats into a :class:`~mcf.hdl.packet.parser.Parser`; return
    ({Port: [raw parsed beats]}, status dict, stalls) where ``stalls`` counts cycles in which
    ``i_packet`` offered a beat and was refused. Stops once ``expected_beats`` beats have left
    (plus ``extra_cycles`` to catch anything unexpected). One testbench drives every output
    (random backpressure per port) so the simulation stays fast."""
    from amaranth.sim import Simulator

    from mcf.abi.csrmap import PARSER_STATUS
    from mcf.abi.meta import Port

    layout = dut.i_packet.payload.shape()
    words = [pack_fields(layout, b._asdict()) for b in beats]
    ports = list(Port)
    outs = [dut.output(p) for p in ports]
    got = {p: [] for p in ports}
    rng = random.Random(seed + 10)
    result = {}

    async def src(ctx):
        ctx.set(dut.local_id, local_id)
        ctx.set(dut.num_nodes, num_nodes)
        await send(ctx, dut.i_packet, words, idle=idle, rng=random.Random(seed + 2))
        result["sent"] = True

    async def sinks(ctx):
        ctx.set(dut.local_id, local_id)
        ctx.set(dut.num_nodes, num_nodes)
        cycles = stalls = received = 0
        limit = 200 * len(words) + 1000
        watched = [dut.i_packet.valid, dut.i_packet.ready]
        for o in outs:
            watched += [o.valid, o.payload.as_value()]
        tail = extra_cycles
        while cycles < limit and tail:
            readies = [not (backpressure and rng.random() < backpressure) for _ in outs]
            for o, r in zip(outs, readies):
                ctx.set(o.ready, r)
            sample = await ctx.tick().sample(*watched)
            in_valid, in_ready, *per_port = sample[-len(watched):]
            for i, port in enumerate(ports):
                if per_port[2 * i] and readies[i]:
                    got[port].append(int(per_port[2 * i + 1]))
                    received += 1
            stalls += bool(in_valid and not in_ready)
            cycles += 1
            if result.get("sent") and received >= expected_beats:
                tail -= 1
        result["status"] = _status(ctx, dut.status, PARSER_STATUS)
        result["stalls"] = stalls

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(src)
    sim.add_testbench(sinks)
    sim.run()
    return got, result["status"], result["stalls"]


def expected_parsed(model, layout) -> dict:
    """The golden ParserModel's outputs as raw parsed-beat ints, per port."""
    return {p: [pack_fields(layout, b._asdict()) for pkt in pkts for b in pkt]
            for p, pkts in model.outputs.items()}
