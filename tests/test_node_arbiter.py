"""PacketArbiter (hdl/node/arbiter.py, docs/node.md §6): amaranth.sim with random packets, idle
cycles and backpressure; a scoreboard per input (order kept, packets never interleaved), the
output stream rule, round-robin fairness and no bubble between packets."""

from __future__ import annotations

import random

import pytest
from amaranth.sim import Simulator

from mcf.abi.framing import beat_layout, parsed_layout
from mcf.hdl.node.arbiter import PacketArbiter

DW = 64


def make_packets(rng, n_in, n_pkts, max_beats):
    """Per input, packets as lists of beat dicts; data names (input, packet, beat)."""
    out = []
    for k in range(n_in):
        pkts = []
        for p in range(n_pkts):
            nb = rng.randint(1, max_beats)
            pkts.append([{"data": (k << 48) | (p << 16) | b, "keep": rng.randrange(256),
                          "last": int(b == nb - 1), "meta": rng.getrandbits(64)}
                         for b in range(nb)])
        out.append(pkts)
    return out


def run(n_in, packets, *, idle, ready, seed, layout=None, cycles_after=50):
    """Drive ``packets`` (per input) into a PacketArbiter; returns the output beats with the
    cycle of each transfer, plus a count of stream-rule violations on the output."""
    layout = layout or parsed_layout(DW)
    dut = PacketArbiter(n_in, layout)
    got, log = [], {"violations": 0, "cycles": 0, "valid_cycles": 0}
    sim = Simulator(dut)
    sim.add_clock(1e-8)

    def producer(k):
        async def proc(ctx):
            rng = random.Random(seed * 31 + k)
            port = dut.inputs()[k]
            for pkt in packets[k]:
                for beat in pkt:
                    while idle and rng.random() < idle:
                        ctx.set(port.valid, 0)
                        await ctx.tick()
                    ctx.set(port.payload.as_value(),
                            sum(beat[f] << fld.offset for f, fld in layout))
                    ctx.set(port.valid, 1)
                    await ctx.tick().until(port.ready)
            ctx.set(port.valid, 0)
        return proc

    async def consumer(ctx):
        rng = random.Random(seed * 7 + 100)
        total = sum(len(pkt) for pkts in packets for pkt in pkts)
        cycle, quiet, prev = 0, 0, None
        while len(got) < total or quiet < cycles_after:
            r = int(ready >= 1.0 or rng.random() < ready)
            ctx.set(dut.o.ready, r)
            _, _, valid, raw = await ctx.tick().sample(dut.o.valid, dut.o.payload.as_value())
            cycle += 1
            quiet = quiet + 1 if len(got) >= total else 0
            if prev is not None and (not valid or raw != prev):
                log["violations"] += 1              # valid dropped / payload changed, stalled
            prev = raw if valid and not r else None
            log["valid_cycles"] += valid
            if valid and r:
                got.append(({f: (raw >> fld.offset) & ((1 << fld.width) - 1)
                             for f, fld in layout}, cycle))
            assert cycle < 200_000
        log["cycles"] = cycle

    for k in range(n_in):
        sim.add_testbench(producer(k), background=True)
    sim.add_testbench(consumer)
    sim.run()
    return got, log


def split(got):
    pkts, cur = [], []
    for beat, cyc in got:
        cur.append((beat, cyc))
        if beat["last"]:
            pkts.append(cur)
            cur = []
    assert cur == [], "a packet was cut"
    return pkts


def scoreboard(packets, got):
    """Every packet arrives whole, contiguous and unchanged; per input in order."""
    seen = {k: [] for k in range(len(packets))}
    for pkt in split(got):
        beats = [b for b, _ in pkt]
        k = beats[0]["data"] >> 48
        assert all(b["data"] >> 48 == k for b in beats), "packets interleaved"
        seen[k].append(beats)
    for k in range(len(packets)):
        assert seen[k] == packets[k], f"input {k}: packets lost, changed or reordered"
    return [pkt[0][0]["data"] >> 48 for pkt in split(got)]


@pytest.mark.parametrize("idle, ready", [(0.0, 1.0), (0.3, 1.0), (0.0, 0.5), (0.4, 0.6)])
def test_arbiter_random_scoreboard(idle, ready):
    rng = random.Random(5)
    n_in = 4
    packets = make_packets(rng, n_in, 40, 6)
    got, log = run(n_in, packets, idle=idle, ready=ready, seed=int(idle * 10 + ready * 100))
    scoreboard(packets, got)
    assert log["violations"] == 0


def test_arbiter_other_layout_and_single_input():
    """Any layout with ``last`` (the wire beat), and n = 1."""
    rng = random.Random(9)
    layout = beat_layout(DW)
    packets = [[[{k: v for k, v in b.items() if k != "meta"} for b in pkt] for pkt in pkts]
               for pkts in make_packets(rng, 3, 20, 4)]
    got, log = run(3, packets, idle=0.2, ready=0.7, seed=3, layout=layout)
    scoreboard(packets, got)
    assert log["violations"] == 0
    got, log = run(1, packets[:1], idle=0.2, ready=0.7, seed=4, layout=layout)
    scoreboard(packets[:1], got)


def test_arbiter_round_robin_no_bubble():
    """Every input always has a packet waiting and the output never stalls: grants rotate
    0, 1, 2, 3, 0, … and ``o`` carries a beat on every cycle — no bubble between packets."""
    rng = random.Random(2)
    n_in = 4
    packets = make_packets(rng, n_in, 25, 5)
    got, log = run(n_in, packets, idle=0.0, ready=1.0, seed=1)
    order = scoreboard(packets, got)
    assert order == [i % n_in for i in range(len(order))]
    cycles = [c for _, c in got]
    assert cycles == list(range(cycles[0], cycles[0] + len(cycles))), "bubble on the output"


def test_arbiter_no_starvation():
    """Input 0 streams long packets back to back and backpressure is heavy; the others send
    now and then. Between two packets of any waiting input at most n - 1 other packets are
    granted, so every sparse input gets through while input 0 never pauses."""
    rng = random.Random(8)
    n_in = 4
    packets = make_packets(rng, n_in, 30, 8)
    packets[0] = [[dict(b, last=int(j == 7)) for j, b in
                   enumerate([{"data": (0 << 48) | (p << 16) | j, "keep": 255, "meta": 0,
                               "last": 0} for j in range(8)])] for p in range(120)]
    got, log = run(n_in, packets, idle=0.0, ready=0.4, seed=6)
    order = scoreboard(packets, got)
    # while input 0 is pending, the others are granted in between: count input-0 packets
    # between consecutive packets of each other input's busy period
    last_pos = {k: None for k in range(1, n_in)}
    for pos, k in enumerate(order):
        if k != 0:
            if last_pos[k] is not None:
                between = order[last_pos[k] + 1:pos]
                assert between.count(0) <= 1, "input 0 took more than its turn"
            last_pos[k] = pos
    assert all(order.count(k) == 30 for k in range(1, n_in))
