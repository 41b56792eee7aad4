"""Router unit tests (amaranth.sim): unicast/multicast fan-out, drops, counters, per-output
backpressure, order per input, against mcf.golden.nic.RouterModel."""

from __future__ import annotations

import random

import pytest
from amaranth import Module, Signal
from amaranth.sim import Simulator

from mcf.abi.meta import Collective, Meta, Op
from mcf.abi.nic import ROUTER_STATUS, Topology
from mcf.abi.route import NET_PORTS, route_entry
from mcf.golden.nic import RouterModel, beats_to_packet, parsed_beats
from mcf.hdl.nic.router import Router, _gt_const
from mcf.sim.amsim import drive, sink_process, split_packets, unpack_fields, write_table

DW = 64


def make_traffic(rng, n_inputs, n_packets, max_payload, route_ids, oversize=0.0):
    per_input = {i: [] for i in range(n_inputs)}
    for uid in range(n_packets):
        i = rng.randrange(n_inputs)
        length = rng.choice([0, 1, 7, 8, 9, 16, 24, rng.randrange(0, max_payload + 1)])
        if rng.random() < oversize:
            length = max_payload + rng.randrange(1, 16)
        meta = Meta(op=Op.KV_REPLICA, collective=Collective.MULTICAST, src=i,
                    route_id=rng.choice(route_ids), kv_id=uid, length=length)
        per_input[i].append((meta, rng.randbytes(length)))
    return per_input


def run_router(dut, table, per_input, ready, idle, seed, max_cycles=200_000):
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    outs = dut.outputs()
    got = [[] for _ in outs]
    for o, s in enumerate(outs):
        sim.add_process(sink_process(s, got[o], random.Random(seed * 31 + o), ready[o]))
    model = RouterModel(dut.n_ports, dut.max_payload)
    for rid, e in table.items():
        model.write_route(rid, e)
    expected = [{i: [] for i in per_input} for _ in outs]
    for i, pkts in per_input.items():
        for meta, payload in pkts:
            dest = model.route(meta)
            if isinstance(dest, list):
                for d in dest:
                    o = dut.n_ports if d == "local" else d
                    expected[o][i].append((meta, payload))
    total_beats = sum(len(parsed_beats(m, p, DW)) for o in expected for lst in o.values()
                      for m, p in lst)
    status = {}
    done = {}

    async def setup_and_feed(ctx):
        await write_table(ctx, dut.route_wr, table)
        done["setup"] = True

    def feeder(i):
        async def tb(ctx):
            while "setup" not in done:
                await ctx.tick()
            beats = [b for meta, p in per_input[i] for b in parsed_beats(meta, p, DW)]
            await drive(ctx, dut.inputs()[i], beats, random.Random(seed * 7 + i), idle)
        return tb

    async def waiter(ctx):
        for _ in range(max_cycles):
            await ctx.tick()
            if sum(len(g) for g in got) >= total_beats and "setup" in done:
                break
        for _ in range(20):
            await ctx.tick()
        status.update(unpack_fields(ROUTER_STATUS, ctx.get(dut.status.as_value())))

    sim.add_testbench(setup_and_feed)
    for i in per_input:
        sim.add_testbench(feeder(i))
    sim.add_testbench(waiter)
    sim.run()
    return got, expected, status, model


def check(dut, got, expected, status, model):
    for o in range(len(got)):
        pkts = [beats_to_packet(b, DW) for b in split_packets(got[o])]
        by_input = {i: [] for i in expected[o]}
        for p in pkts:
            by_input[p.meta.src].append((p.meta, p.payload))
        for i in expected[o]:
            assert by_input[i] == expected[o][i], f"output {o} input {i} differs"
    assert status == model.counters


@pytest.mark.parametrize("n_ports,topology", [(4, Topology.MESH), (3, Topology.MESH),
                                              (2, Topology.RING)])
def test_router_random_multicast(n_ports, topology):
    rng = random.Random(n_ports)
    dut = Router(data_width=DW, n_ports=n_ports, topology=topology, max_payload=64,
                 packet_slots=3)
    table = {}
    for rid in range(12):
        ports = {p for p in range(NET_PORTS) if rng.random() < 0.4}
        if n_ports == NET_PORTS or rid % 4:
            ports = {p for p in ports if p < n_ports}
        table[rid] = route_entry(ports, local=rng.random() < 0.5)
    table[12] = route_entry({p for p in range(n_ports)}, local=True)   # broadcast + local
    table[13] = route_entry(set(), local=False)                        # no route
    per_input = make_traffic(rng, dut.n_inputs, 160, 64, list(range(15)), oversize=0.03)
    ready = [0.3 + 0.7 * rng.random() for _ in range(n_ports + 1)]
    got, expected, status, model = run_router(dut, table, per_input, ready, idle=0.3,
                                              seed=n_ports)
    check(dut, got, expected, status, model)
    assert status["drop_no_route"] > 0 and status["drop_oversize"] > 0
    if n_ports < NET_PORTS:
        assert status["drop_bad_port"] > 0


def test_router_blocked_port_does_not_disturb_others():
    """Output 0 never ready: copies to the other outputs of packets that avoid port 0 all
    arrive in order; multicast packets including port 0 stop the input only when port 0's
    FIFO is full, and nothing is lost or corrupted on the others."""
    dut = Router(data_width=DW, n_ports=4, topology=Topology.MESH, max_payload=32,
                 packet_slots=3)
    table = {0: route_entry({1, 2}, local=True), 1: route_entry({0, 3}), 2: route_entry({3})}
    rng = random.Random(5)
    per_input = {i: [] for i in range(dut.n_inputs)}
    uid = 0
    for i in range(dut.n_inputs):
        for n in range(12):
            rid = 1 if (i == 4 and n == 10) else rng.choice([0, 2])
            length = rng.randrange(0, 33)
            per_input[i].append((Meta(src=i, route_id=rid, kv_id=uid, length=length),
                                 rng.randbytes(length)))
            uid += 1
    ready = [0.0, 1.0, 0.5, 0.7, 0.9]
    got, expected, status, model = run_router(dut, table, per_input, ready, idle=0.0, seed=9,
                                              max_cycles=1200)
    # output 0 never drained: it holds the one packet routed to it
    assert got[0] == []
    expected[0] = {i: [] for i in expected[0]}
    for o in range(1, 5):
        pkts = [beats_to_packet(b, DW) for b in split_packets(got[o])]
        by_input = {i: [] for i in expected[o]}
        for p in pkts:
            by_input[p.meta.src].append((p.meta, p.payload))
        assert by_input == expected[o]
    model.counters["tx_port0"] -= 1
    assert status == model.counters


@pytest.mark.parametrize("width,consts", [(6, [0, 1, 5, 32, 33, 47, 62, 63]),
                                          (4, [-1, 0, 7, 8, 14, 15, 20])])
def test_length_check_is_the_compare(width, consts):
    """The router's carry-free ``x > c`` equals the comparison for every x and each c."""
    x = Signal(width)
    outs = [Signal(name=f"gt{k}") for k in range(len(consts))]
    m = Module()
    for o, c in zip(outs, consts):
        m.d.comb += o.eq(_gt_const(x, c))
    sim = Simulator(m)
    bad = []

    async def tb(ctx):
        for v in range(1 << width):
            ctx.set(x, v)
            for o, c in zip(outs, consts):
                if ctx.get(o) != int(v > c):
                    bad.append((v, c))

    sim.add_testbench(tb)
    sim.run()
    assert bad == []


def test_disjoint_heads_are_granted_together_and_conflicts_in_turn():
    """Parallel allocation: heads on disjoint outputs are accepted in the same cycle; of two
    heads wanting the same output, exactly one is accepted per cycle, in round-robin order,
    and both packets arrive whole."""
    dut = Router(data_width=DW, n_ports=4, topology=Topology.MESH, max_payload=64,
                 n_local_in=2)
    table = {0: route_entry({0}), 1: route_entry({1}), 2: route_entry({2, 3}, local=True)}
    one = {i: parsed_beats(Meta(src=i, route_id=rid, kv_id=i, length=8), bytes(range(8)), DW)
           for i, rid in ((0, 0), (1, 1), (4, 2), (5, 2))}
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    accepted = []

    async def tb(ctx):
        await write_table(ctx, dut.route_wr, table)
        for o in dut.outputs():
            ctx.set(o.ready, 1)
        ins = dut.inputs()
        for i, beats in one.items():
            b = beats[0]
            ctx.set(ins[i].payload.meta.as_value(), b["meta"])
            ctx.set(ins[i].payload.data, b["data"])
            ctx.set(ins[i].payload.keep, b["keep"])
            ctx.set(ins[i].payload.last, b["last"])
            ctx.set(ins[i].valid, 1)
        pending = set(one)
        for _ in range(6):
            got = {i for i in pending if ctx.get(ins[i].ready)}
            accepted.append(got)
            await ctx.tick()
            for i in got:
                ctx.set(ins[i].valid, 0)
            pending -= got

    sim.add_testbench(tb)
    sim.run()
    # 0 (port 0), 1 (port 1) and the first of 4/5 (ports 2, 3, local) in cycle 0; the other
    # of 4/5 when the first has left its outputs
    assert accepted[0] == {0, 1, 4} and 5 not in accepted[0]
    assert sum(5 in a for a in accepted) == 1
