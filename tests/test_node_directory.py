"""kv_id directory (mcf.hdl.node.directory, docs/node.md §5): amaranth.sim against the golden
model (mcf.golden.directory.DirectoryModel), every fresh read on a read port, plus the ABI
semantics.

Rate (reported, not asserted beyond the docstring's figure):
``pytest tests/test_node_directory.py -k rate -s``.
"""

from __future__ import annotations

import random

import pytest
from amaranth.sim import Simulator
from hypothesis import given, settings
from hypothesis import strategies as st
from landing_sim import dir_entry, read_directory

from mcf.abi.directory import (
    DIR_ENTRY,
    DIR_OP,
    DIRECTORY_STATUS,
    LAND_EVENT,
    LANDED_MAX,
    DirEntry,
    DirOp,
    DirState,
    directory_registers,
)
from mcf.abi.landing import LANDED_BITS
from mcf.abi.regs import Access
from mcf.golden.directory import DirectoryModel
from mcf.hdl.node.directory import Directory, DirOpArbiter


def _status(ctx, dut) -> dict[str, int]:
    raw = ctx.get(dut.status.as_value())
    return {n: (raw >> f.offset) & ((1 << f.width) - 1) for n, f in DIRECTORY_STATUS}


# --- golden model semantics ---------------------------------------------------------------

def test_model_semantics():
    d = DirectoryModel(16)
    d.land(1, owner=False)
    assert d.entry(1) == DirEntry(DirState.VALID, 1)
    d.drain(1)
    d.land(1, owner=False)                      # DRAINING is sticky
    assert d.entry(1) == DirEntry(DirState.DRAINING, 2)
    d.free(1, 3)                                # more than landed: refused
    assert d.status["free_refused_count"] == 1 and d.entry(1).landed == 2
    d.free(1, 1)
    assert d.entry(1) == DirEntry(DirState.DRAINING, 1)
    d.free(1, 1)                                # semaphore reaches zero: ABSENT
    assert d.entry(1) == DirEntry(DirState.ABSENT, 0)
    d.land(2, owner=True)
    d.land(2, owner=False)                      # a replica never demotes the owner
    d.free(2, 1)
    d.drain(2)
    assert d.entry(2) == DirEntry(DirState.OWNER, 2)
    assert d.status["free_refused_owner"] == 1 and d.status["drain_refused_owner"] == 1
    d.land(3, owner=False)
    d.land(3, owner=True)                       # a local landing takes ownership
    assert d.entry(3).state is DirState.OWNER
    d.drain(4)                                  # a notice before any packet
    d.free(4, 0)
    assert d.entry(4) == DirEntry()
    d.land(16, owner=False)
    d.op(DirOp.FREE, 99, 1)
    assert d.status["out_of_range"] == 2
    for _ in range(LANDED_MAX + 3):
        d.land(5, owner=False)
    assert d.entry(5).landed == LANDED_MAX and d.status["saturated"] == 3


_EVENTS = st.lists(st.tuples(st.sampled_from(["land", "own", "free", "drain"]),
                             st.integers(0, 3), st.integers(0, 4)), max_size=200)


@given(_EVENTS)
@settings(max_examples=200, deadline=None)
def test_model_invariants(events):
    """docs/node.md §5 as properties: an OWNER entry stays OWNER; an entry is ABSENT exactly
    when nothing has landed since it was last freed to zero (and no DRAIN came); the count is
    the lands minus the FREEs applied, never negative; every event is counted once."""
    d = DirectoryModel(4)
    lands = dict.fromkeys(range(4), 0)
    for kind, kv, count in events:
        before = d.entry(kv)
        if kind in ("land", "own"):
            d.land(kv, kind == "own")
            lands[kv] += 1
        elif kind == "free":
            d.free(kv, count)
            if d.entry(kv) != before:
                lands[kv] -= count
        else:
            d.drain(kv)
        after = d.entry(kv)
        if before.state is DirState.OWNER:
            assert after.state is DirState.OWNER
        assert after.landed == lands[kv] >= 0
        if after.state is DirState.ABSENT:
            assert after.landed == 0
    s = d.status
    assert s["landed"] == sum(k in ("land", "own") for k, _, _ in events)
    assert s["frees"] + s["free_refused_owner"] + s["free_refused_count"] == \
        sum(k == "free" for k, _, _ in events)
    assert s["drains"] + s["drain_refused_owner"] == sum(k == "drain" for k, _, _ in events)


def test_layouts_and_registers():
    assert DIR_ENTRY.size == 2 + LANDED_BITS
    assert LAND_EVENT["kv_id"].width == 16 and DIR_OP["count"].width == LANDED_BITS
    assert DirEntry.unpack(DirEntry(DirState.DRAINING, 513).pack()) == \
        DirEntry(DirState.DRAINING, 513)
    assert DirEntry().pack() == 0
    regs = {r.name: r for r in directory_registers()}
    assert regs["DIR_CTRL"].fields[0].access is Access.W
    assert regs["DIR_READY"].fields[0].access is Access.R
    assert {f"dir_{n}" for n, _ in DIRECTORY_STATUS} <= set(regs)


# --- the component ------------------------------------------------------------------------

def _event(rng, kv_ids, owner_rate=0.15):
    kv = rng.choice(kv_ids)
    if rng.random() < 0.6:
        return ("land", LAND_EVENT.const({"kv_id": kv, "owner": int(rng.random() < owner_rate)})
                .as_bits(), kv)
    op = DirOp.FREE if rng.random() < 0.7 else DirOp.DRAIN
    return ("op", DIR_OP.const({"op": op, "kv_id": kv, "count": rng.choice([0, 1, 1, 2, 3])})
            .as_bits(), kv)


def run_directory(*, kv_count=16, n=3000, seed=1, land_rate=0.7, op_rate=0.4, kv_ids=None,
                  clear_at=(), reads=True, owner_rate=0.15, read_change=0.5):
    """One testbench drives both streams (random valid gaps, payload held until taken) and
    read port 0 (a new random ``kv_id`` in a cycle with probability ``read_change``), applies
    each accepted event to the model in acceptance order and checks every fresh read against
    the model state one cycle back; returns (model, status, accepted land events, cycles,
    checks, stale reads)."""
    dut = Directory(kv_count=kv_count, n_read=2)
    rng = random.Random(seed)
    kv_ids = kv_ids or list(range(kv_count + 2))        # two out-of-range ids
    model = DirectoryModel(kv_count)
    res = {}

    async def bench(ctx):
        ctx.set(dut.read1.kv_id, 0)
        while not ctx.get(dut.ready):
            await ctx.tick()
        model.clear()
        land = op = None
        history = [dict(model.entries)]        # entries after each cycle's accepted event
        lands = 0
        cycle = 0
        checks = stale = 0
        rkv = kv_ids[0]
        clears = list(clear_at)
        while cycle < n or land or op:
            if clears and cycle == clears[0]:
                clears.pop(0)
                ctx.set(dut.clear, 1)
                await ctx.tick()
                ctx.set(dut.clear, 0)
                walk = 0
                while not ctx.get(dut.ready):
                    await ctx.tick()
                    walk += 1
                assert walk == kv_count
                model.clear()
                history = [dict(model.entries)]
            if land is None and cycle < n and rng.random() < land_rate:
                land = _event(rng, kv_ids, owner_rate)
                while land[0] != "land":
                    land = _event(rng, kv_ids, owner_rate)
            if op is None and cycle < n and rng.random() < op_rate:
                op = _event(rng, kv_ids)
                while op[0] != "op":
                    op = _event(rng, kv_ids)
            ctx.set(dut.land.valid, land is not None)
            ctx.set(dut.op.valid, op is not None)
            if land:
                ctx.set(dut.land.payload.as_value(), land[1])
            if op:
                ctx.set(dut.op.payload.as_value(), op[1])
            if rng.random() < read_change:
                rkv = rng.choice(kv_ids)
            ctx.set(dut.read0.kv_id, rkv)
            took_land = land is not None and ctx.get(dut.land.ready)
            took_op = op is not None and ctx.get(dut.op.ready)
            assert not (took_land and took_op)
            await ctx.tick()
            cycle += 1
            if took_land:
                ev = LAND_EVENT.from_bits(land[1])
                model.land(int(ev.kv_id), bool(ev.owner))
                land = None
                lands += 1
            if took_op:
                ev = DIR_OP.from_bits(op[1])
                model.op(ev.op, int(ev.kv_id), int(ev.count))
                op = None
            history.append(dict(model.entries))
            # the read presented before this tick sees events accepted up to the cycle before
            if reads and len(history) >= 2 and not ctx.get(dut.read0.fresh):
                stale += 1
            elif reads and len(history) >= 2:
                want = history[-2].get(rkv, DirEntry()) if rkv < kv_count else DirEntry()
                got = dir_entry(ctx, dut.read0)
                assert got == want, f"cycle {cycle}: read {rkv}: {got} != {want}"
                checks += 1
        ctx.set(dut.land.valid, 0)
        ctx.set(dut.op.valid, 0)
        for _ in range(3):
            await ctx.tick()
        res["status"] = _status(ctx, dut)
        res["entries"] = await read_directory(ctx, dut.read1, kv_count)
        res["lands"], res["cycles"], res["checks"], res["stale"] = lands, cycle, checks, stale

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return model, res


@pytest.mark.parametrize("seed,land_rate,op_rate", [(1, 0.7, 0.4), (2, 1.0, 1.0),
                                                    (3, 0.3, 0.2)])
def test_random_against_model(seed, land_rate, op_rate):
    """Random lands, FREEs and DRAINs over 16 ids (+2 out of range), back-to-back on the same
    id often; every fresh read and the final entries and counters equal the model."""
    model, res = run_directory(seed=seed, land_rate=land_rate, op_rate=op_rate)
    assert res["entries"] == {k: model.entry(k) for k in range(16)}
    assert res["status"] == model.status
    for key in ("landed", "frees", "free_refused_owner", "free_refused_count", "drains",
                "drain_refused_owner", "out_of_range"):
        assert model.status[key] > 0, key
    print("directory: fresh reads", res["checks"], "stale", res["stale"])
    # ops always valid beside land events: a changed port is read only in the gaps of both
    assert res["checks"] > (100 if op_rate == 1.0 else 800)


def test_back_to_back_same_kv_id():
    """The read-modify-write hazard: every event on one kv_id, at one per cycle."""
    model, res = run_directory(kv_ids=[5], land_rate=1.0, op_rate=0.5, seed=7, n=1500,
                               owner_rate=0.0)
    assert res["entries"][5] == model.entry(5)
    assert res["status"] == model.status
    assert model.status["landed"] > 500 and model.status["frees"] > 100


def test_saturation():
    """Counts stop at 2^LANDED_BITS - 1 and each extra landing is counted."""
    model, res = run_directory(kv_count=4, kv_ids=[2], land_rate=1.0, op_rate=0.0,
                               n=LANDED_MAX + 40, seed=3)
    assert res["entries"][2] == DirEntry(DirState.VALID, LANDED_MAX) or \
        res["entries"][2] == DirEntry(DirState.OWNER, LANDED_MAX)
    assert res["status"]["saturated"] == res["lands"] - LANDED_MAX >= 39
    assert res["status"] == model.status


def test_clear_walk():
    """Reset walk, then a DIR_CTRL.clear mid-run: ready low for kv_count cycles, every
    entry zero afterwards, the walks counted."""
    model, res = run_directory(kv_count=32, n=800, clear_at=(400,), seed=4)
    assert res["status"]["clear_walks"] == 2
    assert res["entries"] == {k: model.entry(k) for k in range(32)}
    assert res["status"] == model.status


def test_rate():
    """Land events back to back: one accepted per cycle while the read port's ``kv_id``
    stays; with op always valid too, the two share the slot
    round-robin; with the port's ``kv_id`` changing every cycle, events and its reads
    alternate."""
    model, res = run_directory(land_rate=1.0, op_rate=0.0, n=1000, seed=8, reads=False,
                               read_change=0.0)
    print("directory: land events per cycle", res["lands"] / res["cycles"])
    assert res["lands"] == res["cycles"] == 1000
    model, res = run_directory(land_rate=1.0, op_rate=1.0, n=1000, seed=9, reads=False,
                               read_change=0.0)
    print("directory: land events per cycle with ops always valid", res["lands"] / 1000)
    assert res["lands"] in (500, 501)
    model, res = run_directory(land_rate=1.0, op_rate=0.0, n=1000, seed=10, read_change=1.0)
    print("directory: land events per cycle, a read kv_id each cycle", res["lands"] / 1000,
          "fresh reads", res["checks"])
    assert 500 <= res["lands"] < 560 and res["status"] == model.status  # same id: 1 in 18


def test_parameters():
    with pytest.raises(ValueError):
        Directory(kv_count=0)
    with pytest.raises(ValueError):
        Directory(kv_count=1 << 17)
    d = Directory(kv_count=1 << 16, n_read=3)
    assert d.kv_count == 65536 and hasattr(d, "read2") and not hasattr(d, "read3")


# --- DirOpArbiter -------------------------------------------------------------------------

@pytest.mark.parametrize("n,rate,stall", [(2, 1.0, 0.0), (2, 0.4, 0.3), (3, 0.7, 0.5)])
def test_op_arbiter(n, rate, stall):
    """Every op of every input delivered once, in its input's order; with all inputs always
    valid the grant rotates (no input waits more than n - 1 transfers)."""
    dut = DirOpArbiter(n)
    rng = random.Random(n * 10 + int(rate * 10))
    sent = {k: [DIR_OP.const({"op": DirOp.FREE, "kv_id": 1000 * k + j, "count": j % 4})
                .as_bits() for j in range(150)] for k in range(n)}
    got: list[int] = []
    done = [0]

    def producer(k):
        async def run(ctx):
            port = getattr(dut, f"i{k}")
            for raw in sent[k]:
                while rng.random() >= rate:
                    await ctx.tick()
                ctx.set(port.valid, 1)
                ctx.set(port.payload.as_value(), raw)
                await ctx.tick().until(port.ready)
                ctx.set(port.valid, 0)
            done[0] += 1
        return run

    async def consumer(ctx):
        crng = random.Random(5)
        while done[0] < n or ctx.get(dut.o.valid):
            ctx.set(dut.o.ready, int(crng.random() >= stall))
            _, _, v, r, p = await ctx.tick().sample(dut.o.valid, dut.o.ready, dut.o.payload)
            if v and r:
                got.append(p.as_bits())

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    for k in range(n):
        sim.add_testbench(producer(k), background=True)
    sim.add_testbench(consumer)
    sim.run()
    by_input = {k: [g for g in got if DIR_OP.from_bits(g).kv_id // 1000 == k] for k in range(n)}
    assert by_input == sent
    if rate == 1.0 and stall == 0.0:
        src = [int(DIR_OP.from_bits(g).kv_id) // 1000 for g in got[:2 * n * 10]]
        assert src[n:] == src[:-n] and len(set(src[:n])) == n
