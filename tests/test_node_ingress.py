"""The node's command-ring reader (mcf.hdl.node.ingress, docs/node.md §2).

amaranth.sim unit tests against a small AXI4 read slave in the testbench: the record checks
(against the golden :func:`mcf.abi.node.cmd_malformed`), ring wrap-around, 16-bit index
arithmetic of the overrun check, read errors, FIFO never overrun under backpressure. The
cocotb + Verilator bench (sim/benches/node_ingress.py, cocotbext-axi AxiRam as DDR) runs at the
end of this file.
"""

from __future__ import annotations

import collections
import json
import random

import pytest
from amaranth.sim import Simulator

from mcf.abi.node import (
    CMD_BYTES,
    INGRESS_STATUS,
    Queue,
    cmd_malformed,
)
from mcf.hdl.node.ingress import CmdRingReader
from mcf.sim.benches.node_records import random_record

BASE = 0x1000_0F00   # 16-byte aligned, not 256-byte aligned: bursts meet the 4 KiB boundary


def run_ring(records, *, queue=Queue.NET, size=3, seed=0, batch=(1, 12), latency=3,
             ar_pause=0.0, r_pause=0.0, bp=0.0, err_slots=(), overrun_at=None, fifo_depth=32,
             timeout=200_000):
    """Push ``records`` through a ring of ``2^size`` entries; returns (received records, status,
    overrun doorbells sent, max FIFO level seen, cycles)."""
    dut = CmdRingReader(queue, fifo_depth=fifo_depth)
    rng = random.Random(seed)
    mem: dict[int, int] = {}
    n_slots = 1 << size
    got: list[int] = []
    expected_good = sum(not cmd_malformed(r, queue) for i, r in enumerate(records)
                        if i not in err_slots)
    info = {"overruns_sent": 0, "max_level": 0, "cycles": 0, "done": False}
    err_addrs: set[int] = set()

    async def doorbell(ctx, value):
        ctx.set(dut.doorbell.valid, 1)
        ctx.set(dut.doorbell.payload, value)
        await ctx.tick()
        ctx.set(dut.doorbell.valid, 0)

    async def host(ctx):
        ctx.set(dut.base, BASE)
        ctx.set(dut.size, size)
        prod = 0
        i = 0
        while i < len(records):
            n = min(rng.randint(*batch), len(records) - i)
            for _ in range(n):
                while (prod + 1 - ctx.get(dut.cons)) % 65536 > n_slots:
                    if ctx.get(dut.prod) != prod:      # ring full: ring the doorbell early
                        await doorbell(ctx, prod)
                    await ctx.tick()
                addr = BASE + (prod % n_slots) * CMD_BYTES
                mem[addr] = records[i]
                (err_addrs.add if i in err_slots else err_addrs.discard)(addr)
                prod = (prod + 1) % 65536
                i += 1
            for _ in range(rng.randint(0, 6)):
                await ctx.tick()
            await doorbell(ctx, prod)
            assert ctx.get(dut.prod) == prod
            if overrun_at is not None and i >= overrun_at and not info["overruns_sent"]:
                # one past a full ring, counted from the PL's consumer index
                await doorbell(ctx, (ctx.get(dut.cons) + n_slots + 1) % 65536)
                assert ctx.get(dut.prod) == prod
                # an index behind CONS (16-bit wrap: PROD − CONS mod 2^16 is huge)
                await doorbell(ctx, (ctx.get(dut.cons) - 1) % 65536)
                assert ctx.get(dut.prod) == prod
                info["overruns_sent"] = 2

    async def slave(ctx):
        bus = dut.bus
        ars = collections.deque()
        cur = None      # [addr, beats left]
        cycle = 0
        beat = None
        while True:
            ar_ready = rng.random() >= ar_pause
            ctx.set(bus.arready, ar_ready)
            if beat is None:
                if cur is None and ars and ars[0][0] <= cycle:
                    _, a, n = ars.popleft()
                    cur = [a, n]
                if cur is not None and rng.random() >= r_pause:
                    a = cur[0]
                    assert a in mem, f"read of unwritten slot {a:#x}"
                    beat = (mem[a], 2 if a in err_addrs else 0, cur[1] == 1)
                    cur = None if cur[1] == 1 else [a + CMD_BYTES, cur[1] - 1]
            if beat is not None:
                ctx.set(bus.rvalid, 1)
                ctx.set(bus.rdata, 0 if beat[1] else beat[0])
                ctx.set(bus.rresp, beat[1])
                ctx.set(bus.rlast, beat[2])
            else:
                ctx.set(bus.rvalid, 0)
            _, _, arvalid, araddr, arlen, arsize, rready = await ctx.tick().sample(
                bus.arvalid, bus.araddr, bus.arlen, bus.arsize, bus.rready)
            if arvalid and ar_ready:
                beats = arlen + 1
                assert arsize == 4 and araddr % 16 == 0 and beats <= 16
                assert araddr // 4096 == (araddr + 16 * beats - 1) // 4096
                assert araddr >= BASE and araddr + 16 * beats <= BASE + 16 * n_slots
                ars.append((cycle + latency, araddr, beats))
            if beat is not None:
                assert rready
                beat = None
            cycle += 1

    async def sink(ctx):
        while len(got) < expected_good or ctx.get(dut.cons) != len(records) % 65536:
            ready = rng.random() >= bp
            ctx.set(dut.o.ready, ready)
            _, _, valid, payload = await ctx.tick().sample(dut.o.valid, dut.o.payload)
            info["cycles"] += 1
            assert info["cycles"] < timeout, "ingress hung"
            if valid and ready:
                got.append(payload.as_bits())
        ctx.set(dut.o.ready, 1)
        for _ in range(20):       # nothing more may arrive
            await ctx.tick()
            assert not ctx.get(dut.o.valid)
        info["status"] = {name: int(ctx.get(dut.status[name])) for name, _ in INGRESS_STATUS}
        info["prod"], info["cons"] = ctx.get(dut.prod), ctx.get(dut.cons)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(host, background=True)
    sim.add_testbench(slave, background=True)
    sim.add_testbench(sink)
    sim.run()
    return got, info


def check(records, got, info, queue=Queue.NET, err_slots=()):
    """Scoreboard: every good record in order, bit-exact; bad and errored ones counted."""
    good = [r for i, r in enumerate(records) if i not in err_slots and not cmd_malformed(r, queue)]
    assert got == good
    st = info["status"]
    bad_idx = [i for i, r in enumerate(records) if i not in err_slots and cmd_malformed(r, queue)]
    assert st["records"] == len(good)
    assert st["bad_records"] == len(bad_idx)
    assert st["read_errors"] == len(err_slots)
    if bad_idx:
        assert st["last_bad"] == bad_idx[-1] % 65536
    assert info["cons"] == info["prod"] == len(records) % 65536
    assert st["overruns"] == info["overruns_sent"]


def records_for(n, queue, seed, p_bad=0.25):
    rng = random.Random(seed)
    return [random_record(rng, queue, p_bad) for _ in range(n)]


@pytest.mark.parametrize("queue", list(Queue))
def test_record_checks_match_golden(queue):
    """Every kind of malformed record is skipped and counted; good ones pass bit-exact."""
    recs = records_for(300, queue, seed=10 + queue.value, p_bad=0.4)
    got, info = run_ring(recs, queue=queue, size=5, seed=1)
    check(recs, got, info, queue)


def test_wraparound_backpressure_overrun():
    """A ring of 8 entries wrapped ~40 times, slow consumer and bus pauses, and two overrunning
    doorbells (one past full, one behind CONS) that are ignored and counted."""
    recs = records_for(320, Queue.NET, seed=4)
    got, info = run_ring(recs, size=3, seed=2, latency=5, ar_pause=0.3, r_pause=0.3, bp=0.5,
                         overrun_at=100)
    check(recs, got, info)
    assert info["overruns_sent"] == 2


def test_small_fifo_never_overruns():
    """FIFO of 16 (one burst), consumer mostly stalled: nothing is lost or duplicated."""
    recs = records_for(150, Queue.COMPUTE, seed=6, p_bad=0.1)
    got, info = run_ring(recs, queue=Queue.COMPUTE, size=6, seed=3, batch=(20, 60), bp=0.85,
                         fifo_depth=16)
    check(recs, got, info, Queue.COMPUTE)


def test_read_errors_skip_and_count():
    recs = records_for(120, Queue.NET, seed=8)
    errs = {3, 4, 5, 40, 119}
    got, info = run_ring(recs, size=4, seed=5, err_slots=errs)
    check(recs, got, info, err_slots=errs)


def test_size_one_entry_ring():
    """SIZE = 0: a ring of one entry, the smallest legal ring."""
    recs = records_for(40, Queue.NET, seed=9)
    got, info = run_ring(recs, size=0, seed=7, batch=(1, 1))
    check(recs, got, info)


@pytest.mark.slow
def test_index_wraps_at_16_bits():
    """More than 2^16 records: the free-running PROD/CONS wrap through 0 with no stall, loss or
    duplicate (ring of 16 entries, batches of up to 16)."""
    recs = records_for(65_536 + 700, Queue.NET, seed=12, p_bad=0.05)
    got, info = run_ring(recs, size=4, seed=11, batch=(4, 16), latency=2, overrun_at=65_600,
                         timeout=400_000)
    check(recs, got, info)


# --- cocotb + Verilator bench (sim/benches/node_ingress.py), AxiRam as DDR ---------------------

BENCH = "mcf.sim.benches.node_ingress"


def ingress_built(queue=Queue.NET):
    from mcf.hdl.flat import FlatTop
    from mcf.sim import build
    return build(FlatTop(CmdRingReader(queue)), f"node_ingress_{queue.name.lower()}",
                 width_warnings=True)


@pytest.mark.parametrize("pauses,latency", [(0.0, 0), (0.4, 0), (0.4, 25)])
def test_ingress_bench(pauses, latency):
    """A few hundred random good and malformed records in batches through a 32-entry ring,
    random AR/R pauses and stream backpressure, one overrunning doorbell; the last case with a
    DDR-like pipelined read latency."""
    from mcf.sim import run
    run(ingress_built(), BENCH, params={"mode": "stress", "seed": 3 + int(10 * pauses) + latency,
                                        "n": 400, "size": 5, "p_bad": 0.25, "latency": latency,
                                        "ar_pause": pauses, "r_pause": pauses, "bp": pauses})


@pytest.mark.parametrize("latency", [0, 40])
def test_ingress_rate(tmp_path, latency):
    """Sustained records/cycle with no backpressure, AxiRam's own read latency and a DDR-like
    40-cycle AR→R latency (reported, not asserted):
    ``pytest tests/test_node_ingress.py -k rate -s``."""
    from mcf.sim import run
    out = tmp_path / "rate.json"
    run(ingress_built(), BENCH, params={"mode": "rate", "seed": 2, "size": 10,
                                        "latency": latency, "out": str(out)})
    result = json.loads(out.read_text())
    print(f"\ncommand-ring ingress: {result}")
    assert result["records"] == 1024 and result["records_per_cycle"] > 0


@pytest.mark.parametrize("queue", list(Queue))
def test_cmd_check_with_excluded_classes_matches_golden(queue):
    """A node build that does not execute some classes treats them as malformed (the node top
    excludes the compute classes until its engines join)."""
    from amaranth import Module, Signal
    from amaranth.lib import data

    from mcf.abi.node import CMD, RecordClass
    from mcf.hdl.node.ingress import cmd_check

    exclude = (RecordClass.JOB, RecordClass.EMIT, RecordClass.ATTEND)
    m = Module()
    rec = Signal(CMD)
    bad = cmd_check(m, data.View(CMD, rec.as_value()), queue, exclude)
    flag = Signal()
    m.d.comb += flag.eq(bad)
    rng = random.Random(7)
    records = [random_record(rng, queue, 0.3) for _ in range(400)]
    records += [r for r in records if (r >> CMD["cls"].offset) & 0xF in
                {c.value for c in exclude}][:50]
    seen = collections.Counter()

    async def bench(ctx):
        for raw in records:
            ctx.set(rec.as_value(), raw)
            got = bool(ctx.get(flag))
            assert got == cmd_malformed(raw, queue, exclude), hex(raw)
            cls = (raw >> CMD["cls"].offset) & 0xF
            seen[cls in {c.value for c in exclude}, got] += 1

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()
    if queue is Queue.COMPUTE:
        assert seen[True, True] > 0 and seen[True, False] == 0
