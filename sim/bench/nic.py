#!/usr/bin/env python3
"""NIC benchmarks: sustained beats/cycle of the router (multicast), per-hop latency, reduction
elements/cycle/lane, link framing efficiency (cycles from amaranth.sim), and a yosys
``synth_xilinx -family xcup`` resource estimate per engine and for the whole NIC block
(``mcf_nic``: 3 links, engines, AXI-Lite registers), with its K26 LUT share (no fmax: no open
UltraScale+ timing).

    python scripts/bench_nic.py            # table
    python scripts/bench_nic.py --json     # one JSON object
    python scripts/bench_nic.py --no-synth # skip the yosys runs
"""

from __future__ import annotations

import argparse
import json
import sys

from amaranth.sim import Simulator
from tqdm import tqdm

from mcf.abi.meta import Meta, ReduceOp
from mcf.abi.nic import Topology, reduce_config
from mcf.abi.route import route_entry
from mcf.golden.nic import parsed_beats
from mcf.hdl.nic.all_to_all import AllToAll
from mcf.hdl.nic.link import LinkRx, LinkTx
from mcf.hdl.nic.reduce import ReduceEngine
from mcf.hdl.nic.router import Router
from mcf.hdl.tops import TOPS
from mcf.sim import synth
from mcf.sim.benches.nic_amsim import pack_fields

DW = 64


def _feed(ctx, stream, beats):
    layout = stream.payload.shape()

    async def run():
        for b in beats:
            ctx.set(stream.payload.as_value(), pack_fields(layout, b))
            ctx.set(stream.valid, 1)
            await ctx.tick().until(stream.ready)
        ctx.set(stream.valid, 0)
    return run()


async def _full_rate(ctx, stream, beats) -> int:
    """Offer ``beats`` back to back (valid held high); the cycles until all were accepted."""
    layout = stream.payload.shape()
    k = cycles = 0
    while k < len(beats):
        ctx.set(stream.payload.as_value(), pack_fields(layout, beats[k]))
        ctx.set(stream.valid, 1)
        _, _, rdy = await ctx.tick().sample(stream.ready)
        k += rdy
        cycles += 1
    ctx.set(stream.valid, 0)
    return cycles


def router_rate(n_beats=2, n_packets=120):
    """Local input → multicast to all 4 ports + local, all outputs always ready."""
    dut = Router(data_width=DW, n_ports=4, topology=Topology.MESH, max_payload=256)
    res = {}
    sim = Simulator(dut)
    sim.add_clock(1e-8)

    async def tb(ctx):
        ctx.set(dut.route_wr.addr, 1)
        ctx.set(dut.route_wr.data.as_value(), route_entry({0, 1, 2, 3}, local=True))
        ctx.set(dut.route_wr.en, 1)
        await ctx.tick()
        ctx.set(dut.route_wr.en, 0)
        for s in dut.outputs():
            ctx.set(s.ready, 1)
        # latency: one packet into an idle router
        meta = Meta(route_id=1, length=8)
        inp = dut.inputs()[4]
        ctx.set(inp.payload.as_value(), pack_fields(inp.payload.shape(),
                                                     parsed_beats(meta, bytes(8), DW)[0]))
        ctx.set(inp.valid, 1)
        await ctx.tick().until(inp.ready)
        ctx.set(inp.valid, 0)
        lat = 0
        while not ctx.get(dut.o0.valid):
            await ctx.tick()
            lat += 1
        res["hop_latency_cycles"] = lat + 1   # input beat in cycle c, copy valid in c + 2
        for _ in range(5):
            await ctx.tick()
        meta = Meta(route_id=1, length=n_beats * 8)
        beats = [b for _ in range(n_packets) for b in parsed_beats(meta, bytes(n_beats * 8), DW)]
        layout = inp.payload.shape()
        out_beats = 0
        cycles = 0
        k = 0
        started = False
        while k < len(beats):
            ctx.set(inp.payload.as_value(), pack_fields(layout, beats[k]))
            ctx.set(inp.valid, 1)
            _, _, rdy, ov = await ctx.tick().sample(inp.ready, dut.o0.valid)
            if rdy:
                k += 1
            if ov:
                started = True
            if started:
                cycles += 1
                out_beats += ov
        ctx.set(inp.valid, 0)
        res["beats_per_cycle"] = round(out_beats / cycles, 3)

    sim.add_testbench(tb)
    sim.run()
    return res


def reduce_rate(n_beats=2, n_packets=120):
    """Back-to-back SUM contributions (k = 2, four tags interleaved), output always ready."""
    dut = ReduceEngine(data_width=DW, n_slots=4, max_payload=256)
    res = {}
    sim = Simulator(dut)
    sim.add_clock(1e-8)

    async def tb(ctx):
        ctx.set(dut.cfg_wr.addr, 0)
        ctx.set(dut.cfg_wr.data.as_value(), reduce_config(2))
        ctx.set(dut.cfg_wr.en, 1)
        await ctx.tick()
        ctx.set(dut.cfg_wr.en, 0)
        ctx.set(dut.o.ready, 1)
        beats = []
        for n in range(n_packets):
            meta = Meta(reduce_op=ReduceOp.SOFTMAX_MERGE, kv_id=n // 2 % 4 + 4 * (n // 8),
                        length=n_beats * 8)
            beats += parsed_beats(meta, bytes(n_beats * 8), DW)
        cycles = await _full_rate(ctx, dut.i, beats)
        res["elements_per_cycle_per_lane"] = round(len(beats) / cycles, 3)
        res["lanes"] = DW // 32

    sim.add_testbench(tb)
    sim.run()
    return res


def link_rate(n_beats=8, n_packets=30):
    dut = LinkTx(data_width=DW)
    res = {}
    sim = Simulator(dut)
    sim.add_clock(1e-8)

    async def tb(ctx):
        ctx.set(dut.o.ready, 1)
        meta = Meta(length=n_beats * 8)
        beats = [b for _ in range(n_packets) for b in parsed_beats(meta, bytes(n_beats * 8), DW)]
        layout = dut.i.payload.shape()
        k = cycles = wire = 0
        while k < len(beats):
            ctx.set(dut.i.payload.as_value(), pack_fields(layout, beats[k]))
            ctx.set(dut.i.valid, 1)
            _, _, rdy, ov = await ctx.tick().sample(dut.i.ready, dut.o.valid)
            k += rdy
            wire += ov
            cycles += 1
        res["wire_beats_per_cycle"] = round(wire / cycles, 3)
        res["payload_beats_per_cycle"] = round(len(beats) / cycles, 3)

    sim.add_testbench(tb)
    sim.run()
    return res


def a2a_rate(n=4, part_beats=4, n_ops=20):
    """Scatter N-part tensors and gather N parts per tag (N = 4, 4-beat parts), outputs ready;
    beats/cycle = beats moved / cycles on each side."""
    dut = AllToAll(data_width=DW, max_nodes=8, part_max=256, n_slots=2)
    res = {}
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    plen = part_beats * 8

    async def tb(ctx):
        ctx.set(dut.num_nodes, n)
        ctx.set(dut.net.ready, 1)
        ctx.set(dut.o.ready, 1)
        beats = [b for t in range(n_ops)
                 for b in parsed_beats(Meta(kv_id=t, length=n * plen), bytes(n * plen), DW)]
        cycles = await _full_rate(ctx, dut.scatter, beats)
        res["scatter_beats_per_cycle"] = round(len(beats) / cycles, 3)
        beats = [b for t in range(n_ops) for s in range(n)
                 for b in parsed_beats(Meta(kv_id=t, src=s, length=plen), bytes(plen), DW)]
        k = cycles = out = 0
        while k < len(beats) or out < len(beats):
            if k < len(beats):
                ctx.set(dut.i.payload.as_value(), pack_fields(dut.i.payload.shape(), beats[k]))
            ctx.set(dut.i.valid, k < len(beats))
            _, _, rdy, ov = await ctx.tick().sample(dut.i.ready, dut.o.valid)
            k += rdy and k < len(beats)
            out += ov
            cycles += 1
        res["gather_beats_per_cycle"] = round(len(beats) / cycles, 3)

    sim.add_testbench(tb)
    sim.run()
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-synth", action="store_true")
    args = ap.parse_args(argv)
    mc = router_rate()
    red = reduce_rate()
    link = link_rate()
    a2a = a2a_rate()
    resources = {}
    if not args.no_synth:
        blocks = {
            "router_4port": Router(data_width=DW, n_ports=4, max_payload=1024),
            "reduction_4slot": ReduceEngine(data_width=DW, n_slots=4, max_payload=1024),
            "all_to_all": AllToAll(data_width=DW, max_nodes=8, part_max=256, n_slots=2),
            "link_tx": LinkTx(data_width=DW),
            "link_rx": LinkRx(data_width=DW, max_payload=1024),
            "nic_block": TOPS["mcf_nic"](),     # 3 links + engines + AXI-Lite registers
        }
        for name, top in tqdm(blocks.items(), desc="yosys", disable=args.json):
            resources[name] = synth.resources(top, f"bench_{name}")
    result = {
        "multicast": {"beats_per_cycle": mc["beats_per_cycle"],
                      "hop_latency_cycles": mc["hop_latency_cycles"]},
        "all_to_all": {"beats_per_cycle": min(a2a.values()), **a2a},
        "reduction": {"elements_per_cycle_per_lane": red["elements_per_cycle_per_lane"],
                      "lanes": red["lanes"]},
        "link": link,
        "resources": resources,
    }
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{'engine':<28}{'figure':<34}{'value':>10}")
    print(f"{'router (multicast 4+local)':<28}{'output beats/cycle, 2-beat pkts':<34}"
          f"{mc['beats_per_cycle']:>10}")
    print(f"{'router':<28}{'hop latency (cycles)':<34}{mc['hop_latency_cycles']:>10}")
    print(f"{'reduction (softmax merge)':<28}{'elements/cycle/lane':<34}"
          f"{red['elements_per_cycle_per_lane']:>10}")
    print(f"{'link tx':<28}{'payload beats/cycle, 8-beat pkts':<34}"
          f"{link['payload_beats_per_cycle']:>10}")
    print(f"{'all-to-all (N=4, 4-beat)':<28}{'scatter beats/cycle':<34}"
          f"{a2a['scatter_beats_per_cycle']:>10}")
    print(f"{'all-to-all':<28}{'gather beats/cycle (in = out)':<34}"
          f"{a2a['gather_beats_per_cycle']:>10}")
    if resources:
        print()
        keys = list(synth.RESOURCE_KEYS)
        print(f"{'engine':<18}" + "".join(f"{k:>10}" for k in keys) + f"{'K26 LUT %':>11}")
        for name, r in resources.items():
            lut = 100 * synth.utilization(r)["LUT"]
            print(f"{name:<18}" + "".join(f"{r[k]:>10}" for k in keys) + f"{lut:>11.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
