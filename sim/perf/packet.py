"""Packet path benchmark: packetizer → parser at full load (paper §5), 64- and 128-bit.

For each data width and payload size (in beats) a train of packets is pushed through
:class:`mcf.hdl.packet.top.PacketPath` in amaranth.sim with both inputs always valid and every
parser output always ready. Every beat leaving any parser port is compared with the golden
models chained (:func:`mcf.golden.packet.packetize` → :class:`mcf.golden.packet.ParserModel`)
and every parser counter with the model's; a mismatch, a stall or any drop counter above zero
raises :class:`~mcf.sim.perf.BenchRefused` (the bench plans no drop). Measured (simulation
cycles, no timing claims):

* ``cycles_per_packet`` — steady-state interval between packets at the parser output;
* ``beats_per_cycle`` — wire beats per packet (payload + 1 header) / cycles per packet;
* ``latency`` — cycles from the metadata entering the packetizer to the first parser output
  beat, for the first packet of a train on an idle path.

Sizes: 0, 1, 2, 4, 8, 16, 64 payload beats and the largest packet, ``MAX_PAYLOAD`` bytes
(:data:`mcf.abi.framing.MAX_PAYLOAD`; 256 beats at 64 bits, 128 at 128 bits). Resources:
:func:`mcf.sim.synth.resources` of ``PacketPath`` with its defaults, per width.

    mcf bench packet [--small] [--no-synth] [--json]
"""

from __future__ import annotations

import random

from amaranth.sim import Simulator

from mcf.abi import META, Meta, beat_layout, parsed_layout
from mcf.abi.csrmap import PARSER_STATUS
from mcf.abi.framing import MAX_PAYLOAD
from mcf.abi.meta import Port
from mcf.golden.packet import ParserModel, packetize, payload_frame
from mcf.hdl.packet.parser import port_member_name
from mcf.hdl.packet.top import PacketPath
from mcf.sim.amsim import Sink, pack_fields, send, unpack_fields
from mcf.sim.perf import BenchRefused, refuse_unplanned, resource_table

__all__ = ["collect", "render", "measure", "WIDTHS", "sizes"]

WIDTHS = (64, 128)
LOCAL_ID, NUM_NODES = 0, 4


def sizes(data_width: int) -> tuple[int, ...]:
    """Payload sizes in beats: small ones, then the largest packet (``MAX_PAYLOAD`` bytes)."""
    return (0, 1, 2, 4, 8, 16, 64, MAX_PAYLOAD // (data_width // 8))


def _packets(payload_beats: int, small: bool) -> int:
    if small:
        return max(8, min(16, 256 // max(payload_beats, 1)))
    return max(8, min(64, 1024 // max(payload_beats, 1)))


def measure(data_width: int, payload_beats: int, packets: int, *,
            max_payload: int = MAX_PAYLOAD, seed: int = 1) -> dict:
    """Run ``packets`` packets of ``payload_beats`` beats through
    the path at full load; check every output beat and counter; return the figures.

    ``max_payload`` is the parser's limit: a packet longer than it is dropped (``OVERSIZE``),
    which the bench did not plan, so it refuses."""
    length = payload_beats * (data_width // 8)
    dut = PacketPath(data_width, max_payload=max_payload)
    rng = random.Random(seed * 1000 + payload_beats)
    metas, frames = [], []
    for i in range(packets):
        meta = Meta(dst=1, src=0, length=length, seq=i & 0xFF)  # P2P to another node: FORWARD
        payload = rng.randbytes(length)
        metas.append(meta.pack(META))
        frames.append(payload_frame(payload, data_width))
    model = ParserModel(data_width, max_payload=max_payload, local_id=LOCAL_ID,
                        num_nodes=NUM_NODES)
    model.feed(packetize(metas, frames, data_width))
    playout = parsed_layout(data_width)
    blayout = beat_layout(data_width)
    payload_words = [pack_fields(blayout, b._asdict()) for f in frames for b in f]
    sinks = {p: Sink(getattr(dut, port_member_name(p))) for p in Port}
    first_cycle: dict[str, int] = {}
    done = {}
    limit = 20 * packets * (payload_beats + 1) + 2000

    async def meta_src(ctx):
        ctx.set(dut.local_id, LOCAL_ID)
        ctx.set(dut.num_nodes, NUM_NODES)
        await send(ctx, dut.i_meta, metas)

    async def payload_src(ctx):
        await send(ctx, dut.i_payload, payload_words)

    async def watch(ctx):
        cycle = quiet = 0
        valids = [s.port.valid for s in sinks.values()]
        while True:
            mv, mr, rx, *ov = (await ctx.tick().sample(
                dut.i_meta.valid, dut.i_meta.ready, dut.ps_status.rx_packets, *valids))[2:]
            if mv and mr and "in" not in first_cycle:
                first_cycle["in"] = cycle
            cycle += 1
            # every packet reached the parser: stop once the outputs have been quiet a while
            quiet = quiet + 1 if rx == packets and not any(ov) else 0
            if quiet >= 16:
                break
            if cycle > limit:
                done["stalled"] = cycle
                break
        done["status"] = unpack_fields(PARSER_STATUS, int(ctx.get(dut.ps_status.as_value())))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(meta_src, background=True)
    sim.add_testbench(payload_src, background=True)
    for s in sinks.values():
        sim.add_testbench(s.run, background=True)
    sim.add_testbench(watch)
    sim.run()

    what = f"packet path {data_width}-bit, {payload_beats}-beat packets"
    if "stalled" in done:
        raise BenchRefused(f"{what}: stalled ({done['stalled']} cycles)")
    status = done["status"]
    refuse_unplanned(what, {k: v for k, v in status.items() if k.startswith("drop_")})
    for p, sink in sinks.items():
        want = [pack_fields(playout, b._asdict()) for pkt in model.outputs[p] for b in pkt]
        if sink.items != want:
            raise BenchRefused(f"{what}: port {p.name} output differs from the golden model "
                               f"({len(sink.items)} beats, expected {len(want)})")
    if status != model.counters:
        raise BenchRefused(f"{what}: parser counters {status} != golden {model.counters}")
    if model.counters["rx_packets"] != packets or len(model.outputs[Port.FORWARD]) != packets:
        raise BenchRefused(f"{what}: not every packet reached the FORWARD port")

    sink = sinks[Port.FORWARD]
    per_packet = max(payload_beats, 1)
    ends = sink.cycles[per_packet - 1::per_packet]
    starts = sink.cycles[0::per_packet]
    k0 = packets // 4              # steady state: skip the first quarter (pipeline fill)
    interval = (ends[-1] - ends[k0]) / (packets - 1 - k0)
    return {
        "cycles_per_packet": interval,
        "beats_per_cycle": (payload_beats + 1) / interval,
        "latency": starts[0] - first_cycle["in"],
    }


def collect(small: bool = False, synth: bool = True) -> dict:
    """Both widths, every size (see the module docstring); ``resources`` by top name."""
    out: dict = {"max_payload": MAX_PAYLOAD, "widths": {}}
    for w in WIDTHS:
        rows = {n: measure(w, n, _packets(n, small)) for n in sizes(w)}
        out["widths"][str(w)] = {
            "data_width": w,
            "beats_per_cycle": {str(n): round(r["beats_per_cycle"], 4) for n, r in rows.items()},
            "cycles_per_packet": {str(n): round(r["cycles_per_packet"], 4)
                                  for n, r in rows.items()},
            "latency": {str(n): r["latency"] for n, r in rows.items()},
        }
    if synth:
        from mcf.sim.synth import resources
        out["resources"] = {f"packet_path_{w}": resources(PacketPath(w), f"mcf_packet_path_{w}")
                            for w in WIDTHS}
    return out


def render(result: dict) -> str:
    lines = []
    for w, r in result["widths"].items():
        lines.append(f"packetizer -> parser, {w}-bit, full load (amaranth.sim cycles, every "
                     "beat checked against the golden models)")
        lines.append(f"{'payload beats':>13} {'wire beats':>10} {'cycles/packet':>13} "
                     f"{'beats/cycle':>11} {'latency':>7}")
        for n in r["beats_per_cycle"]:
            lines.append(f"{n:>13} {int(n) + 1:>10} {r['cycles_per_packet'][n]:>13.3f} "
                         f"{r['beats_per_cycle'][n]:>11.3f} {r['latency'][n]:>7}")
        lines.append("")
    if result.get("resources"):
        lines += resource_table(result["resources"],
                                f"resources at max_payload {result['max_payload']} B")
    return "\n".join(lines).rstrip()
