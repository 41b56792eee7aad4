"""All-to-all engine (amaranth.sim) against mcf.golden.nic.A2AModel: scatter framing, and
gathers for N in {2, 4, 8} in random arrival order with interleaved tags, duplicates and foreign
parts mixed in; results bit-exact, counters exact."""

from __future__ import annotations

import random

import pytest
from amaranth.sim import Simulator

from mcf.abi.meta import META, Collective, Meta, Op
from mcf.abi.nic import A2A_STATUS
from mcf.golden.nic import A2AModel, Packet, beats_to_packet, parsed_beats
from mcf.hdl.nic.a2a_scatter import A2AScatter
from mcf.hdl.nic.all_to_all import AllToAll
from mcf.sim.amsim import drive, pack_fields, sink_process, split_packets, unpack_fields

DW = 64


def run(n, scatters, parts, seed, local=1, ready=0.7, timeout=0, tail=20):
    dut = AllToAll(data_width=DW, max_nodes=8, part_max=64, n_slots=2)
    model = A2AModel(DW, 8, 64, 2, n, local_id=local)
    exp_net = []
    for meta, p in scatters:
        r = model.scatter(meta, p)
        if isinstance(r, list):
            exp_net += r
    exp_out = [r for r in (model.part(m, p) for m, p in parts) if isinstance(r, Packet)]
    net, out, status = [], [], {}
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_process(sink_process(dut.net, net, random.Random(seed), ready))
    sim.add_process(sink_process(dut.o, out, random.Random(seed + 1), ready))
    n_net = sum(len(parsed_beats(p.meta, p.payload, DW)) for p in exp_net)
    n_out = sum(len(parsed_beats(p.meta, p.payload, DW)) for p in exp_out)

    async def tb_scatter(ctx):
        ctx.set(dut.local_id, local)
        ctx.set(dut.num_nodes, n)
        ctx.set(dut.timeout, timeout)
        beats = [b for m, p in scatters for b in parsed_beats(m, p, DW)]
        await drive(ctx, dut.scatter, beats, random.Random(seed + 2), 0.2)

    async def tb_gather(ctx):
        await ctx.tick()
        beats = [b for m, p in parts for b in parsed_beats(m, p, DW)]
        await drive(ctx, dut.i, beats, random.Random(seed + 3), 0.2)
        for _ in range(5000):
            if len(net) >= n_net and len(out) >= n_out:
                break
            await ctx.tick()
        for _ in range(tail):
            await ctx.tick()
        status.update(unpack_fields(A2A_STATUS, ctx.get(dut.status.as_value())))

    sim.add_testbench(tb_scatter)
    sim.add_testbench(tb_gather)
    sim.run()
    got_net = [beats_to_packet(b, DW) for b in split_packets(net)]
    got_out = [beats_to_packet(b, DW) for b in split_packets(out)]
    return got_net, exp_net, got_out, exp_out, status, model.counters


@pytest.mark.parametrize("n", [2, 4, 8])
def test_all_to_all(n):
    rng = random.Random(n)
    local = 1
    scatters, parts = [], []
    for tag in range(12):
        plen = 8 * rng.randrange(1, 9)
        # the tensor this node scatters (plus one malformed length now and then)
        meta = Meta(op=Op.KV_REPLICA, collective=Collective.ALL_TO_ALL, kv_id=tag,
                    route_id=16 * tag, src=local, length=n * plen)
        scatters.append((meta, rng.randbytes(n * plen)))
        if tag % 5 == 0:
            scatters.append((meta.replace(length=n * plen + 4), rng.randbytes(n * plen + 4)))
        # the parts every node sends to us for this tag
        for s in range(n):
            pm = Meta(op=Op.KV_REPLICA, collective=Collective.ALL_TO_ALL, kv_id=100 + tag,
                      src=s, dst=local, route_id=16 * tag + local, length=plen, seq=local)
            parts.append((pm, rng.randbytes(plen)))
    # arrival order: random within a window of two tags (interleaved), then malformed ones
    order = []
    for base in range(0, len(parts), 2 * n):
        chunk = parts[base:base + 2 * n]
        rng.shuffle(chunk)
        order += chunk
    bad, seen = [], {}
    for k, (m, p) in enumerate(order):
        bad.append((m, p))
        seen[m.kv_id] = seen.get(m.kv_id, 0) + 1
        if k % 3 == 0 and seen[m.kv_id] < n:
            bad.append((m, p))                                         # duplicate (tag open)
        if k % 13 == 5:
            bad.append((m.replace(src=n if n < 8 else 9), p))          # foreign source
        if k % 17 == 7:
            bad.append((m.replace(length=m.length + 4), p + bytes(4)))  # bad length
    got_net, exp_net, got_out, exp_out, status, counters = run(n, scatters, bad, seed=n)
    assert got_net == exp_net
    assert sorted(got_out, key=lambda p: p.meta.kv_id) == \
        sorted(exp_out, key=lambda p: p.meta.kv_id)
    assert len(exp_out) >= 10
    assert status == counters
    assert status["drop_duplicate"] > 0 and status["drop_bad_src"] > 0


def test_all_to_all_watchdog_frees_incomplete_gather():
    """Three of four parts arrive: the watchdog frees the slot and counts the trip; with the
    watchdog off the slot stays open until the missing part arrives."""
    n = 4
    parts = [(Meta(collective=Collective.ALL_TO_ALL, kv_id=5, src=s, dst=1, length=16),
              bytes([s]) * 16) for s in range(n)]
    _, _, got_out, exp_out, status, _ = run(n, [], parts[:3], seed=1, timeout=40, tail=200)
    assert got_out == exp_out == [] and status["watchdog_trips"] == 1
    _, _, got_out, exp_out, status, counters = run(n, [], parts[:3] + parts, seed=2,
                                                   timeout=0)
    # without the watchdog the slot stays open: the repeats of parts 0-2 are duplicates and
    # part 3 completes the gather
    assert got_out == exp_out and len(got_out) == 1
    assert status == counters and status["drop_duplicate"] == 3


def test_scatter_latency_and_part_framing():
    """A2AScatter alone: a 2-part tensor's first part beat is on ``net`` ``latency`` cycles
    after its head was accepted (``net`` always ready), the 4 beats leave back to back framed
    as 2 parts (AllToAll's ``scatter_latency`` is this ``latency``)."""
    dut = A2AScatter(data_width=DW, max_nodes=8, part_max=64, meta_layout=META)
    meta = Meta(op=Op.KV_REPLICA, collective=Collective.ALL_TO_ALL, kv_id=3, route_id=8,
                src=1, length=32)
    beats = parsed_beats(meta, bytes(range(32)), DW)
    got = []

    async def tb(ctx):
        ctx.set(dut.local_id, 1)
        ctx.set(dut.num_nodes, 2)
        ctx.set(dut.net.ready, 1)
        layout = dut.scatter.payload.shape()
        for cyc in range(20):
            ctx.set(dut.scatter.valid, cyc < len(beats))
            if cyc < len(beats):
                ctx.set(dut.scatter.payload.as_value(), pack_fields(layout, beats[cyc]))
                assert ctx.get(dut.scatter.ready)
            if ctx.get(dut.net.valid):
                got.append((cyc, unpack_fields(layout, ctx.get(dut.net.payload.as_value()))))
            await ctx.tick()
        assert unpack_fields(dut.status.shape(), ctx.get(dut.status.as_value())) == {
            "scatter_ops": 1, "scatter_drops": 0, "parts_sent": 2}

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    assert [c for c, _ in got] == [dut.latency + k for k in range(4)]
    metas = [Meta.unpack(b["meta"]) for _, b in got]
    assert [(mt.dst, mt.seq, mt.route_id, mt.length, mt.src) for mt in metas] == \
        [(0, 0, 8, 16, 1)] * 2 + [(1, 1, 9, 16, 1)] * 2
    assert [b["last"] for _, b in got] == [0, 1, 0, 1]
    assert [b["data"] for _, b in got] == [b["data"] for b in beats]
