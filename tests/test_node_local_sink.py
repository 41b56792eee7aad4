"""Local-packet sink (mcf.hdl.node.local_sink, docs/node.md §5, §6 rule 1): amaranth.sim with
random packets of every op, idle input and backpressure on every output, scoreboarded beat for
beat against mcf.golden.local_sink.LocalSinkModel; bad framing never stalls the sink."""

from __future__ import annotations

import random

import pytest
from amaranth.sim import Simulator

from mcf.abi.directory import DIR_OP, DirOp
from mcf.abi.framing import parsed_layout
from mcf.abi.local_sink import LOCAL_SINK_STATUS, SinkRoute, local_sink_registers, sink_route
from mcf.abi.meta import META, InvalidateKind, Meta, Op
from mcf.golden.local_sink import LocalSinkModel, SinkBeat
from mcf.hdl.node.local_sink import LocalSink

PARSED = parsed_layout(64)


def _pack(b: SinkBeat) -> int:
    return (b.meta << PARSED["meta"].offset | b.data << PARSED["data"].offset |
            b.keep << PARSED["keep"].offset | int(b.last) << PARSED["last"].offset)


def _unpack(raw: int) -> SinkBeat:
    def f(name):
        return raw >> PARSED[name].offset & ((1 << PARSED[name].width) - 1)
    return SinkBeat(f("meta"), f("data"), f("keep"), bool(f("last")))


def random_beats(rng: random.Random, n_packets: int, bad_framing: float = 0.0):
    """Packets of every op (and the unassigned code 7) as beats; ``bad_framing``: that share
    of the beats get a random ``last`` instead of the one the length implies."""
    beats = []
    for _ in range(n_packets):
        op = rng.randrange(8)
        length = rng.choice([0, 0, rng.randrange(1, 9), rng.randrange(9, 200)])
        seq = rng.randrange(4) if op == Op.INVALIDATE.value else rng.randrange(256)
        raw = Meta(kv_id=rng.randrange(1 << 16), length=length, seq=seq,
                   src=rng.randrange(32)).pack()
        raw = raw & ~(((1 << META["op"].width) - 1) << META["op"].offset) | \
            op << META["op"].offset
        n = max(1, -(-length // 8))
        for k in range(n):
            last = k == n - 1
            if rng.random() < bad_framing:
                last = rng.random() < 0.5
            beats.append(SinkBeat(raw, rng.getrandbits(64), rng.getrandbits(8), last))
    return beats


def run_sink(beats, *, seed=1, idle=0.3, stall=0.4):
    dut = LocalSink()
    rng = random.Random(seed)
    got = {"kv": [], "decode": [], "dir_op": []}
    done = [False]
    res = {}

    async def producer(ctx):
        for b in beats:
            while rng.random() < idle:
                await ctx.tick()
            ctx.set(dut.i.valid, 1)
            ctx.set(dut.i.payload.as_value(), _pack(b))
            await ctx.tick().until(dut.i.ready)
            ctx.set(dut.i.valid, 0)
        done[0] = True

    def consumer(name, port, decode):
        async def run(ctx):
            crng = random.Random(hash((seed, name)) & 0xFFFF)
            while True:
                ctx.set(port.ready, int(crng.random() >= stall))
                _, _, valid, ready, payload = await ctx.tick().sample(
                    port.valid, port.ready, port.payload)
                if valid and ready:
                    got[name].append(decode(payload))
        return run

    async def checker(ctx):
        cycles = 0
        while not done[0]:
            await ctx.tick()
            cycles += 1
            assert cycles < 40 * len(beats) + 1000, "sink stalled"
        await ctx.tick()
        raw = ctx.get(dut.status.as_value())
        res["status"] = {n: (raw >> f.offset) & ((1 << f.width) - 1)
                         for n, f in LOCAL_SINK_STATUS}
        res["control"] = ctx.get(dut.control)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(producer, background=True)
    sim.add_testbench(consumer("kv", dut.kv, lambda p: _unpack(p.as_bits())), background=True)
    sim.add_testbench(consumer("decode", dut.decode, lambda p: _unpack(p.as_bits())),
                      background=True)
    sim.add_testbench(consumer("dir_op", dut.dir_op, lambda p: (
        DIR_OP.from_bits(p.as_bits()).op, int(DIR_OP.from_bits(p.as_bits()).kv_id),
        int(DIR_OP.from_bits(p.as_bits()).count))), background=True)
    sim.add_testbench(checker)
    sim.run()
    return got, res


def _model(beats) -> LocalSinkModel:
    model = LocalSinkModel()
    for b in beats:
        model.beat(b)
    return model


@pytest.mark.parametrize("seed,idle,stall,bad", [(1, 0.3, 0.4, 0.0), (2, 0.0, 0.0, 0.0),
                                                 (3, 0.0, 0.7, 0.0), (4, 0.2, 0.5, 0.2)])
def test_random_against_model(seed, idle, stall, bad):
    """Every op, idle input, backpressure on kv/decode/dir_op; bad framing in the last case
    (the sink follows ``last`` and never stalls)."""
    beats = random_beats(random.Random(seed), 400, bad)
    model = _model(beats)
    got, res = run_sink(beats, seed=seed, idle=idle, stall=stall)
    assert got["kv"] == model.kv
    assert got["decode"] == model.decode
    assert got["dir_op"] == [(op, kv, 0) for op, kv in model.dir_ops]
    assert res["status"] == model.status
    assert res["control"] == model.status["control"]
    assert all(model.status[r.value] > 0 for r in SinkRoute)


def test_full_rate_without_backpressure():
    """No idle, no stall: one beat per cycle on every route."""
    beats = random_beats(random.Random(6), 100)
    dut = LocalSink()
    cycles = [0]

    async def bench(ctx):
        for p in (dut.kv, dut.decode, dut.dir_op):
            ctx.set(p.ready, 1)
        for b in beats:
            ctx.set(dut.i.valid, 1)
            ctx.set(dut.i.payload.as_value(), _pack(b))
            assert ctx.get(dut.i.ready)
            await ctx.tick()
            cycles[0] += 1

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert cycles[0] == len(beats)


def test_routes_and_registers():
    assert sink_route(Op.INVALIDATE.value, InvalidateKind.DRAIN) is SinkRoute.DRAIN
    assert sink_route(Op.INVALIDATE.value, InvalidateKind.FREE) is SinkRoute.DROP_INVALIDATE
    assert sink_route(7, 0) is SinkRoute.DROP_OP
    for op in (Op.QUERY, Op.PARTIAL_STATE, Op.REDUCTION):   # REDUCTION: two-phase maxima
        assert sink_route(op.value, 0) is SinkRoute.DECODE
    assert sink_route(Op.KV_REPLICA.value, 0) is SinkRoute.KV
    assert sink_route(Op.CONTROL.value, 0) is SinkRoute.CONTROL
    assert sink_route(Op.FETCH_REQUEST.value, 0) is SinkRoute.FETCH_REQUEST
    names = {r.name for r in local_sink_registers()}
    assert names == {f"lsink_{n}" for n, _ in LOCAL_SINK_STATUS}
    assert DirOp.DRAIN in DirOp
