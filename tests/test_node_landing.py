"""KV landing engine (mcf.hdl.node.landing, docs/node.md §5): amaranth.sim unit tests against
the golden model (mcf.golden.landing.LandingModel: DDR bytes, status, the land-event stream to the
directory) with an in-test AXI slave, and the runner of the cocotb + Verilator bench
(sim/benches/node_landing.py) against cocotbext-axi AxiRam.

Rate measurement (reported, not asserted):
``pytest tests/test_node_landing.py -k rate -s``.
"""

from __future__ import annotations

import json
import random

import pytest
from amaranth import Elaboratable, Module
from amaranth.lib import stream, wiring
from amaranth.sim import Simulator
from landing_sim import feed_packets, read_directory, run_drained, write_land_off

from mcf.abi.directory import DIR_OP, DirOp, DirState
from mcf.abi.framing import parsed_layout
from mcf.abi.landing import (
    LAND_OFF_ENTRIES,
    LANDING_STATUS,
    LandingConfig,
    LandResult,
    land_decision,
)
from mcf.abi.meta import InvalidateKind, Meta, Op
from mcf.golden.directory import DirectoryModel
from mcf.golden.landing import LandingModel
from mcf.golden.local_sink import LocalSinkModel, SinkBeat
from mcf.hdl.node.directory import Directory, DirOpArbiter
from mcf.hdl.node.landing import LandingEngine
from mcf.hdl.node.local_sink import LocalSink
from mcf.sim.amsim import parsed_beats
from mcf.sim.axi_slave import write_slave
from mcf.sim.benches.node_landing import KV_CAPACITY, make_traffic

PARSED = parsed_layout(64)


def simulate(packets, cfg: LandingConfig, land_off, *, kv_count=KV_CAPACITY, bad_beats=(),
             idle=0.0, wpause=0.0, b_latency=(1, 6), seed=1, local_id=0, ev_stall=0.0):
    """Run the engine on ``packets``; returns DDR bytes written, the status counters, the
    AW addresses, the land events (``(kv_id, owner)`` in order; ``ev_stall``: probability
    that ``landed.ready`` is low in a cycle) and the cycle count."""
    dut = LandingEngine(kv_count=kv_count)
    bus = dut.m_axi
    rng = random.Random(seed)
    mem: dict[int, int] = {}
    aws: list[tuple[int, int]] = []
    out: dict = {}
    finished = [False]

    events: list[tuple[int, bool]] = []

    async def event_sink(ctx):
        erng = random.Random(seed + 1000)
        while True:
            ctx.set(dut.landed.ready, int(erng.random() >= ev_stall))
            _, _, valid, ready, kv_id, owner = await ctx.tick().sample(
                dut.landed.valid, dut.landed.ready, dut.landed.payload.kv_id,
                dut.landed.payload.owner)
            if valid and ready:
                events.append((kv_id, bool(owner)))

    async def producer(ctx):
        ctx.set(dut.cfg.as_value(), cfg.pack())
        ctx.set(dut.local_id, local_id)
        await write_land_off(ctx, dut, land_off)
        await feed_packets(ctx, dut.i, packets, rng, idle)
        finished[0] = True

    run_drained(dut, bus, producer, finished, out, LANDING_STATUS, rng=rng, mem=mem, aws=aws,
                bad_beats=bad_beats, wpause=wpause, b_latency=b_latency, quiet=200,
                limit=200_000, also=(dut.landed.valid,), background=(event_sink,))
    return mem, out["status"], aws, events, out["cycles"]


def _table(entries: dict[int, int]) -> list[int | None]:
    t: list[int | None] = [None] * LAND_OFF_ENTRIES
    for seq, off in entries.items():
        t[seq] = off
    return t


def test_address_rule_40_bits():
    """The AW addresses and bytes follow kv_address, with a base above 4 GiB and offsets off
    the bus beat (on KV_ALIGN), a slot at the top of the KV_COUNT range and packets crossing
    4 KiB pages."""
    cfg = LandingConfig(kv_base=0x8_0000_0000 + 0x1234, kv_slot=0x3_0A08, kv_count=256)
    land_off = _table({0: 0, 1: 0x1_0004, 7: 0x3_0900 - 4, 255: 0x10C})
    rng = random.Random(3)
    cross = next(k for k in range(2, 200) if (cfg.kv_base + k * cfg.kv_slot) % 4096 > 3000)
    packets = []
    for kv_id, seq, length in [(0, 0, 8), (1, 1, 100), (255, 7, 0xFF), (17, 255, 2048),
                               (200, 0, 1), (254, 1, 333), (cross, 0, 2048)]:
        payload = bytes(rng.randrange(256) for _ in range(length))
        packets.append((Meta(kv_id=kv_id, seq=seq, length=length), payload))
    model = LandingModel(cfg, land_off, KV_CAPACITY)
    for meta, payload in packets:
        assert model.land(meta, payload) is LandResult.LANDED
    mem, status, aws, events, _ = simulate(packets, cfg, land_off)
    assert mem == model.mem
    assert status == model.status
    first_aw = {a for a, _ in aws}
    for meta, _ in packets:
        addr = land_decision(cfg, meta, land_off)[1]
        assert addr - addr % 16 in first_aw
    assert len(aws) > len(packets)      # some packets crossed a 4 KiB page: two bursts
    assert events == model.events == [(m.kv_id, True) for m, _ in packets]


def test_drops_and_counts():
    """Every drop cause, counted once per packet; the landed packets' bytes exact; one land
    event per landed packet, owner by ``src``, under event backpressure; input never stalls
    for drops."""
    t = make_traffic(seed=5, n=60, kv_count=40, bad_fraction=0.5)
    model = LandingModel(t.cfg, t.land_off, KV_CAPACITY, local_id=1)
    for meta, payload in t.packets:
        model.land(meta, payload)
    assert all(model.status[k] for k in ("drop_unmapped", "drop_bad_seq", "drop_op"))
    mem, status, _, events, _ = simulate(t.packets, t.cfg, t.land_off, idle=0.3,
                                         wpause=0.3, seed=5, local_id=1, ev_stall=0.6)
    assert status == model.status
    assert mem == model.mem
    assert events == model.events
    assert {o for _, o in events} == {True, False}


def test_drops_run_at_full_rate():
    """A run of dropped packets (every cause) takes one cycle per beat."""
    cfg = LandingConfig(kv_base=0, kv_slot=1024, kv_count=10)
    land_off = _table({0: 0, 1: 1000})
    packets = []
    for k in range(30):
        meta = [Meta(kv_id=10 + k, length=64), Meta(kv_id=1, seq=2, length=64),
                Meta(kv_id=1, seq=1, length=64), Meta(op=Op.QUERY, length=64)][k % 4]
        packets.append((meta, bytes(range(64))))
    _, status, aws, events, cycles = simulate(packets, cfg, land_off)
    assert aws == [] and events == []
    assert status["drop_unmapped"] + status["drop_bad_seq"] + status["drop_op"] == 30
    beats = 30 * 8
    assert cycles - 200 <= beats + len(land_off) + 10


def test_write_error_not_counted():
    """A SLVERR burst: counted in write_errors, not landed; the engine keeps running."""
    cfg = LandingConfig(kv_base=0x100, kv_slot=4096, kv_count=8)
    land_off = _table({0: 0, 1: 2048})
    packets = [(Meta(kv_id=k, seq=s, length=2048), bytes([k * 2 + s]) * 2048)
               for k in range(4) for s in range(2)]
    bad = 0x100 + 2 * 4096 + 2048 + 16 * 40       # inside kv_id 2, seq 1
    mem, status, _, events, _ = simulate(packets, cfg, land_off, bad_beats={bad})
    assert status["write_errors"] == 1 and status["packets"] == 7
    assert [k for k, _ in events] == [0, 0, 1, 1, 2, 3, 3]
    model = LandingModel(cfg, land_off, KV_CAPACITY)
    for meta, payload in packets:
        model.land(meta, payload, write_error=(meta.kv_id, meta.seq) == (2, 1))
    assert {a: b for a, b in mem.items() if not 0x2100 + 2048 <= a < 0x3100} == model.mem


def test_framing_guard():
    """Packets whose beats disagree with Meta.length (impossible behind a parser) are written
    as length bytes, cut or zero-padded, and counted; the packets after them land intact."""
    cfg = LandingConfig(kv_base=0x40, kv_slot=4096, kv_count=8)
    land_off = _table({0: 0, 1: 2000})
    rng = random.Random(9)
    pl = [bytes(rng.randrange(256) for _ in range(n)) for n in (300, 37, 500, 200, 64)]
    packets = [(Meta(kv_id=0, length=100), pl[0]),          # long: 38 beats for 13
               (Meta(kv_id=1, length=200), pl[1]),          # short: 5 beats for 25
               (Meta(kv_id=2, seq=1, length=500), pl[2]),   # good
               (Meta(kv_id=3, length=17), b""),             # one keep=0 beat for 3
               (Meta(kv_id=4, seq=1, length=64), pl[4])]    # good
    model = LandingModel(cfg, land_off, KV_CAPACITY)
    for meta, payload in packets:
        model.land(meta, payload)
    assert model.status["framing_errors"] == 3
    mem, status, _, events, _ = simulate(packets, cfg, land_off, idle=0.2, wpause=0.3)
    assert status == model.status
    assert mem == model.mem
    assert events == model.events == [(k, True) for k in range(5)]


def test_events_back_to_back():
    """Many one-beat packets to two kv_ids, B answered at once: one event each, in order,
    none lost, with and without event backpressure (B responses wait on a full event
    FIFO)."""
    cfg = LandingConfig(kv_base=0, kv_slot=1 << 20, kv_count=4)
    land_off = _table({s: 16 * s for s in range(200)})
    packets = [(Meta(kv_id=k % 2, seq=s, length=8), bytes([s]) * 8)
               for s in range(120) for k in range(2) if (s + k) % 3]
    for stall in (0.0, 0.8):
        _, status, _, events, _ = simulate(packets, cfg, land_off, b_latency=(0, 0),
                                           ev_stall=stall, local_id=5)
        assert events == [(m.kv_id, False) for m, _ in packets]
        assert status["packets"] == len(packets)


# --- the landing path: LocalSink -> LandingEngine -> Directory ------------------------------

class _LandingPath(Elaboratable):
    """The node's local landing path as the top will wire it: ``LocalSink.kv`` →
    ``LandingEngine.i``, ``LandingEngine.landed`` → ``Directory.land``; ``Directory.op`` is a
    ``DirOpArbiter`` of the sink's DRAINs and the sequencer's FREEs (``free``, driven by the
    test)."""

    def __init__(self, kv_count):
        self.sink = LocalSink()
        self.lander = LandingEngine(kv_count=kv_count)
        self.dir = Directory(kv_count=kv_count, n_read=1)
        self.free = stream.Signature(DIR_OP).create()

    def elaborate(self, platform):
        m = Module()
        m.submodules.sink, m.submodules.lander = self.sink, self.lander
        m.submodules.dir = self.dir
        wiring.connect(m, self.sink.kv, self.lander.i)
        wiring.connect(m, self.lander.landed, self.dir.land)
        m.submodules.arb = arb = DirOpArbiter(2)
        wiring.connect(m, self.sink.dir_op, arb.i0)
        wiring.connect(m, self.free, arb.i1)
        wiring.connect(m, arb.o, self.dir.op)
        return m


def _path_traffic(seed):
    """make_traffic's KV fragments and malformed packets (every op among them) plus DRAIN
    notices (some with a payload), FREE-kind INVALIDATEs, CONTROL, FETCH_REQUEST, QUERY."""
    t = make_traffic(seed=seed, n=160, kv_count=24, bad_fraction=0.3)
    rng = random.Random(seed)
    extra = []
    for _ in range(50):
        kind = rng.randrange(5)
        kv_id = 3 * rng.randrange(9) if kind < 2 else rng.randrange(26)   # some stay VALID
        length = rng.choice([0, 0, rng.randrange(1, 40)])
        meta = Meta(op=[Op.INVALIDATE, Op.INVALIDATE, Op.CONTROL, Op.FETCH_REQUEST,
                        Op.QUERY][kind], kv_id=kv_id, length=length,
                    seq=int(InvalidateKind.FREE) if kind == 1 else 0, src=rng.randrange(2))
        extra.append((meta, bytes(rng.randrange(256) for _ in range(length))))
    packets = t.packets + extra
    rng.shuffle(packets)
    return t, packets


@pytest.mark.parametrize("seed,stall", [(31, 0.0), (32, 0.5)])
def test_landing_path(seed, stall):
    """Random local traffic through LocalSink → LandingEngine (in-test AXI slave) →
    Directory, with FREEs interleaved and the directory's reset walk under way at the start:
    DDR bytes = LandingModel, land events = its events, DRAINs = LocalSinkModel's, the
    directory's entries and counters = DirectoryModel fed the accepted events in order."""
    t, packets = _path_traffic(seed)
    local_id = 1
    top = _LandingPath(KV_CAPACITY)
    sink, lander, dirc = top.sink, top.lander, top.dir
    rng = random.Random(seed)
    mem: dict[int, int] = {}
    aws: list = []
    bad = {t.bad_addr}
    slave = write_slave(lander.m_axi, rng, mem, aws, bad, wpause=stall)
    accepted: list = []
    decoded: list = []
    finished = [False, False]
    out: dict = {}

    async def producer(ctx):
        ctx.set(lander.cfg.as_value(), t.cfg.pack())
        ctx.set(lander.local_id, local_id)
        await write_land_off(ctx, lander, t.land_off)
        await feed_packets(ctx, sink.i, packets, rng, 0.2)
        finished[0] = True

    async def freer(ctx):
        frng = random.Random(seed + 7)
        for _ in range(60):
            for _ in range(frng.randrange(5, 80)):
                await ctx.tick()
            ctx.set(top.free.valid, 1)
            ctx.set(top.free.payload.as_value(), DIR_OP.const({
                "op": DirOp.FREE, "kv_id": frng.randrange(26),
                "count": frng.choice([0, 1, 1, 2, 3])}).as_bits())
            await ctx.tick().until(top.free.ready)
            ctx.set(top.free.valid, 0)
        finished[1] = True

    async def decode_sink(ctx):
        drng = random.Random(seed + 9)
        while True:
            ctx.set(sink.decode.ready, int(drng.random() >= stall))
            _, _, v, r, p = await ctx.tick().sample(sink.decode.valid, sink.decode.ready,
                                                    sink.decode.payload)
            if v and r:
                decoded.append(p.as_bits())

    async def monitor(ctx):
        while True:
            _, _, lv, lr, lp, ov, orr, op = await ctx.tick().sample(
                dirc.land.valid, dirc.land.ready, dirc.land.payload, dirc.op.valid,
                dirc.op.ready, dirc.op.payload)
            if lv and lr:
                accepted.append(("land", int(lp.kv_id), bool(lp.owner)))
            if ov and orr:
                accepted.append(("op", op.op, int(op.kv_id), int(op.count)))

    async def checker(ctx):
        bus = lander.m_axi
        cycles = idle_for = 0
        while idle_for < 200:
            await ctx.tick()
            cycles += 1
            busy = any(ctx.get(x) for x in (sink.i.valid, bus.awvalid, bus.wvalid, bus.bvalid,
                                             lander.landed.valid, dirc.op.valid))
            idle_for = idle_for + 1 if all(finished) and not busy else 0
            assert cycles < 300_000, "hang"
        for name, dut in (("land", lander), ("sink", sink), ("dir", dirc)):
            raw = ctx.get(dut.status.as_value())
            out[name] = {n: (raw >> f.offset) & ((1 << f.width) - 1)
                         for n, f in dut.status.shape()}
        out["entries"] = await read_directory(ctx, dirc.read0, KV_CAPACITY)

    sim = Simulator(top)
    sim.add_clock(1e-8)
    for bench in (producer, freer, decode_sink, monitor, slave):
        sim.add_testbench(bench, background=True)
    sim.add_testbench(checker)
    sim.run()

    sink_model = LocalSinkModel()
    land_model = LandingModel(t.cfg, t.land_off, KV_CAPACITY, local_id)
    for meta, payload in packets:
        for raw in parsed_beats(meta, payload):
            v = PARSED.from_bits(raw)
            sink_model.beat(SinkBeat(v.meta.as_bits(), int(v.data), int(v.keep), bool(v.last)))
        if meta.op == Op.KV_REPLICA:
            land_model.land(meta, payload, t.write_error(meta))
    assert out["sink"] == sink_model.status
    assert out["land"] == land_model.status
    skip = {a for m, _ in packets if m.op == Op.KV_REPLICA and t.write_error(m)
            for a in t.span(m)}                 # the SLVERR packet's bytes are not modelled
    assert land_model.status["write_errors"] >= 1
    assert {a: b for a, b in mem.items() if a not in skip} == \
        {a: b for a, b in land_model.mem.items() if a not in skip}
    assert decoded == [_pack_sink(b) for b in sink_model.decode]
    lands = [(e[1], e[2]) for e in accepted if e[0] == "land"]
    assert lands == land_model.events
    drains = [(e[1], e[2]) for e in accepted if e[0] == "op" and e[1] is DirOp.DRAIN]
    assert drains == sink_model.dir_ops
    dir_model = DirectoryModel(KV_CAPACITY)
    dir_model.clear()
    for e in accepted:
        if e[0] == "land":
            dir_model.land(e[1], e[2])
        else:
            dir_model.op(e[1], e[2], e[3])
    assert out["dir"] == dir_model.status
    assert out["entries"] == {k: dir_model.entry(k) for k in range(KV_CAPACITY)}
    for key in ("frees", "free_refused_owner", "free_refused_count", "drains"):
        assert dir_model.status[key] > 0, key
    assert {e.state for e in out["entries"].values()} == set(DirState)


def _pack_sink(b) -> int:
    return (b.meta << PARSED["meta"].offset | b.data << PARSED["data"].offset |
            b.keep << PARSED["keep"].offset | int(b.last) << PARSED["last"].offset)


# --- cocotb + Verilator bench ---------------------------------------------------------------

BENCH = "mcf.sim.benches.node_landing"


def landing_built():
    from mcf.hdl.flat import FlatTop
    from mcf.sim import build
    # not width_warnings=True: DmaWriter's realigner ({i, prev} >> shift into 128 bits) trips
    # WIDTHTRUNC; the landing engine's own logic is clean
    return build(FlatTop(LandingEngine(kv_count=KV_CAPACITY), {"i": "s_axis"}), "node_landing")


@pytest.mark.parametrize("idle,pause", [(0.0, 0.0), (0.3, 0.3), (0.0, 0.6)])
def test_landing_bench(idle, pause):
    from mcf.sim import run
    run(landing_built(), BENCH, params={"seed": 11 + int(10 * pause), "n": 300, "idle": idle,
                                        "pause": pause, "tests": ["random_mix"]})


def test_landing_rate(tmp_path):
    """Full input rate, no pauses: the figure is reported (printed with ``-s``), not asserted;
    the bench's scoreboard checks every landed byte and count."""
    from mcf.sim import run
    out = tmp_path / "rate.json"
    run(landing_built(), BENCH, params={"seed": 2, "rate_n": 60, "tests": ["rate"],
                                        "rate_payloads": [2048, 640, 200], "out": str(out)})
    result = json.loads(out.read_text())
    for r in result:
        print("landing rate:", r)
    assert [r["max_payload"] for r in result] == [2048, 640, 200]


@pytest.mark.slow
def test_landing_bench_long():
    from mcf.sim import run
    run(landing_built(), BENCH, params={"seed": 23, "n": 1500, "idle": 0.5, "pause": 0.5,
                                        "tests": ["random_mix"]})
