"""amaranth.sim stream drivers for the packet-path unit tests and the packet benchmark.

Plain async testbench helpers (``sim.add_testbench``): a source that sends payload values with
optional random idle cycles, and a sink that records transfers with optional random
backpressure. Payloads are written and read as raw integers so that the tests compare bit for
bit against the golden model (:mod:`mcf.golden.packet`).
"""

from __future__ import annotations

import random

from amaranth.lib import data

__all__ = ["send", "Sink", "fields", "pack", "run_packetizer", "run_parser", "expected_parsed"]


def fields(layout: data.StructLayout, raw: int) -> dict[str, int]:
    return {name: (raw >> f.offset) & ((1 << f.width) - 1) for name, f in layout}


def pack(layout: data.StructLayout, values: dict[str, int]) -> int:
    raw = 0
    for name, f in layout:
        raw |= (values[name] & ((1 << f.width) - 1)) << f.offset
    return raw


async def send(ctx, port, payloads, *, idle: float = 0.0, rng: random.Random | None = None):
    """Send raw payload integers on stream ``port``, one per transfer."""
    rng = rng or random.Random(0)
    width = len(port.payload.as_value()) if isinstance(port.payload, data.View) \
        else len(port.payload)
    for p in payloads:
        while idle and rng.random() < idle:
            ctx.set(port.valid, 0)
            await ctx.tick()
        ctx.set(port.valid, 1)
        ctx.set(port.payload.as_value() if isinstance(port.payload, data.View)
                else port.payload, p & ((1 << width) - 1))
        await ctx.tick().until(port.ready)
    ctx.set(port.valid, 0)


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
        value = self.port.payload.as_value() if isinstance(self.port.payload, data.View) \
            else self.port.payload
        cycle = 0
        while True:
            ready = not (self.backpressure and self.rng.random() < self.backpressure)
            ctx.set(self.port.ready, ready)
            *_, valid, raw = await ctx.tick().sample(self.port.valid, value)
            if valid and ready:
                self.items.append(int(raw))
                self.cycles.append(cycle)
            cycle += 1


# --- whole-block harnesses ------------------------------------------------------------------

def _status(ctx, port, layout) -> dict[str, int]:
    raw = ctx.get(port.as_value())
    return fields(layout, int(raw))


def run_packetizer(dut, metas: list[int], frames, *, idle: float = 0.0,
                   backpressure: float = 0.0, seed: int = 0, extra_cycles: int = 8):
    """Push raw metadata words and payload frames (lists of WireBeat) into a
    :class:`~mcf.hdl.packet.packetizer.Packetizer`; return (output beats as raw ints, status)."""
    from amaranth.sim import Simulator

    from mcf.abi.csrmap import PACKETIZER_STATUS

    beat = dut.o_packet.payload.shape()
    words = [pack(beat, b._asdict()) for f in frames for b in f]
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
    words = [pack(layout, b._asdict()) for b in beats]
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
    return {p: [pack(layout, b._asdict()) for pkt in pkts for b in pkt]
            for p, pkts in model.outputs.items()}
