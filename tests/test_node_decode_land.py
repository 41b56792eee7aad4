"""Decode lander (mcf.hdl.node.decode_land, docs/node.md §5, §7): the ABI rules
(mcf.abi.decode_land) against MARS's decode records, amaranth.sim unit tests against the golden
model (DecodeLandModel) with an in-test AXI slave, and the runner of the cocotb + Verilator
bench (sim/benches/node_decode_land.py) against cocotbext-axi AxiRam.

Rate measurement (reported, not asserted): ``pytest tests/test_node_decode_land.py -k rate -s``.
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from amaranth.sim import Simulator
from hypothesis import given, settings
from hypothesis import strategies as hs

from mcf.abi.decode_land import (
    DECODE_LAND_CONFIG,
    DECODE_LAND_STATUS,
    DecodeLandConfig,
    DecodeLandModel,
    DecodeLandResult,
    decode_land_decision,
    decode_land_registers,
    normalized_row,
    obuf_address,
    obuf_row_bytes,
    qbuf_address,
    query_header,
    query_slot_bytes,
    state_bytes,
)
from mcf.abi.framing import parsed_layout
from mcf.abi.meta import Collective, Meta, Op, ReduceOp
from mcf.abi.query import QUERY_HEADER, QUERY_HEADER_BYTES, query_bytes, query_head_bytes
from mcf.abi.softmax import normalize, pack_state
from mcf.hdl.node.decode_land import DecodeLander, PacketUpsizer
from mcf.sim.axi_slave import write_slave
from mcf.sim.benches.node_decode_land import (
    HEAD_DIM,
    edge_states,
    make_traffic,
    query_packet,
    random_state,
    state_packet,
)

PARSED = parsed_layout(64)


def _beat(**fields: int) -> int:
    return sum(v << PARSED[n].offset for n, v in fields.items())


def _beats(meta: Meta, payload: bytes) -> list[int]:
    raw = meta.pack()
    if not payload:
        return [_beat(meta=raw, data=0, keep=0, last=1)]
    return [_beat(meta=raw, data=int.from_bytes(payload[k:k + 8], "little"),
                  keep=(1 << len(payload[k:k + 8])) - 1, last=int(k + 8 >= len(payload)))
            for k in range(0, len(payload), 8)]


def simulate(packets, cfg: DecodeLandConfig, *, head_dim=HEAD_DIM, bad_beats=(), idle=0.0,
             wpause=0.0, b_latency=(1, 6), seed=1):
    """Run the lander on ``packets``; returns DDR bytes written, the status counters, the AW
    bursts (address, beats), the cycle count and the number of cycles ``i`` was not ready
    while valid."""
    dut = DecodeLander(head_dim)
    bus = dut.bus
    rng = random.Random(seed)
    mem: dict[int, int] = {}
    aws: list[tuple[int, int]] = []
    out: dict = {"stalls": 0}
    finished = [False]

    async def producer(ctx):
        ctx.set(dut.cfg.as_value(), cfg.pack())
        await ctx.tick()
        for meta, payload in packets:
            for beat in _beats(meta, payload):
                while rng.random() < idle:
                    await ctx.tick()
                ctx.set(dut.i.valid, 1)
                ctx.set(dut.i.payload.as_value(), beat)
                while True:
                    _, _, ready = await ctx.tick().sample(dut.i.ready)
                    if ready:
                        break
                    out["stalls"] += 1
                ctx.set(dut.i.valid, 0)
        finished[0] = True

    slave = write_slave(bus, rng, mem, aws, bad_beats, wpause, b_latency)

    async def checker(ctx):
        cycles = 0
        idle_for = 0
        while idle_for < 100:
            await ctx.tick()
            cycles += 1
            busy = ctx.get(dut.i.valid) or ctx.get(bus.awvalid) or ctx.get(bus.wvalid) or \
                ctx.get(bus.bvalid)
            idle_for = idle_for + 1 if finished[0] and not busy else 0
            assert cycles < 300_000, "hang"
        raw = ctx.get(dut.status.as_value())
        out["status"] = {n: (raw >> f.offset) & ((1 << f.width) - 1)
                         for n, f in DECODE_LAND_STATUS}
        out["cycles"] = cycles - idle_for

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(producer, background=True)
    sim.add_testbench(slave, background=True)
    sim.add_testbench(checker)
    sim.run()
    return mem, out["status"], aws, out["cycles"], out["stalls"]


def _model(cfg, packets, head_dim=HEAD_DIM, errors=()):
    model = DecodeLandModel(cfg, head_dim)
    for k, (meta, payload) in enumerate(packets):
        model.land(meta, payload, k in errors)
    return model


# --- the ABI rules ---------------------------------------------------------------------------

def test_abi_rules():
    """Slot and row addresses, drop causes in order, the normalised row, the registers."""
    cfg = DecodeLandConfig(qbuf_base=0x8_0000_0010, obuf_base=0xFF_FFFF_FF00, q_slot=600,
                           q_heads=12, tag_base=0xFFFA)
    hdr = {"pos": 9, "layer": 3, "head0": 4, "heads": 4}
    meta = Meta(op=Op.QUERY, length=query_bytes(4, 128))
    assert qbuf_address(cfg, meta, hdr) == 0x8_0000_0010 + (12 + 4) * 600
    st = Meta(op=Op.PARTIAL_STATE, kv_id=3, seq=5, length=state_bytes(128))
    # head = (3 − 0xFFFA) mod 2^16 = 9; row 12 + 9; the 40-bit address wraps
    assert obuf_address(cfg, st, 128) == (0xFF_FFFF_FF00 + 21 * 512) % (1 << 40)
    assert obuf_row_bytes(128) == 512 and state_bytes(128) == 520
    assert query_slot_bytes(4, 128) == 544
    with pytest.raises(ValueError):
        obuf_address(cfg, st.replace(kv_id=0xFFFA + 12 - (1 << 16)), 128)
    with pytest.raises(ValueError):
        qbuf_address(cfg, meta, {**hdr, "head0": 9})
    R = DecodeLandResult
    payload = bytes(pack_query_header(hdr))
    assert decode_land_decision(cfg, meta, payload, 128)[0] is R.QUERY
    assert decode_land_decision(cfg, meta.replace(length=meta.length + 4), payload, 128)[0] \
        is R.DROP_LENGTH
    assert decode_land_decision(cfg, meta, {**hdr, "heads": 0}, 128)[0] is R.DROP_LENGTH
    assert decode_land_decision(cfg, meta, {**hdr, "head0": 9}, 128)[0] is R.DROP_SLOT
    small = DecodeLandConfig(0, 0, q_slot=500, q_heads=12)
    assert decode_land_decision(small, meta, hdr, 128)[0] is R.DROP_SLOT
    assert decode_land_decision(cfg, st, b"", 128)[0] is R.RESULT
    assert decode_land_decision(cfg, st.replace(reduce_op=ReduceOp.SOFTMAX_MERGE, length=4),
                                b"", 128)[0] is R.DROP_REDUCE_OP
    assert decode_land_decision(cfg, st.replace(length=516), b"", 128)[0] is R.DROP_LENGTH
    assert decode_land_decision(cfg, st.replace(kv_id=6), b"", 128)[0] is R.DROP_SLOT
    for op in (Op.KV_REPLICA, Op.INVALIDATE, Op.REDUCTION, Op.FETCH_REQUEST, Op.CONTROL):
        assert decode_land_decision(cfg, st.replace(op=op), b"", 128)[0] is R.DROP_OP
    g = np.random.default_rng(1)
    m, l_sum, o = random_state(g, 128)
    row = normalized_row(pack_state(m, l_sum, o), 128)
    assert np.array_equal(np.frombuffer(row, "<i4"), normalize(l_sum, o))
    names = [r.name for r in decode_land_registers()]
    assert {"QBUF_BASE_LO", "QBUF_BASE_HI", "OBUF_BASE_LO", "OBUF_BASE_HI", "QBUF_SLOT",
            "DEC_Q_HEADS", "DEC_TAG_BASE", "dec_queries_landed", "dec_results_landed",
            "dec_drop_slot", "dec_write_errors"} <= set(names)
    assert len(names) == len(set(names))
    assert DecodeLandConfig(**{n: 1 for n, _ in DECODE_LAND_CONFIG}).pack() != 0


def pack_query_header(hdr) -> bytes:
    return QUERY_HEADER.const(hdr).as_bits().to_bytes(QUERY_HEADER_BYTES, "little")


def test_mars_decode_records_land():
    """MARS's decode records (tiny model, 2 waves): every query fragment lands in its own
    slot of its layer's parity, and the root's final state of every (layer, head) — the last
    contribution's Meta made final by the reduction engine — in its own OBUF row."""
    from mcf.mars.metadata import MetaEncoder
    from mcf.mars.model import get_model

    model = get_model("tiny")
    hd, hq = model.head_dim, model.q_heads
    enc = MetaEncoder(model, nodes=3, num_chunks=2, max_payload=state_bytes(hd),
                      reduce_slots=max(1, hq // 2))
    k, root = 77, 1
    widest = max(c for wave in enc.payloads.waves for _, c in wave)
    cfg = DecodeLandConfig(0x10_0000, 0x20_0000, query_slot_bytes(widest, hd), hq,
                           enc.decode_tag(k, 0))
    records = enc.decode_records(k, root, bcast_id=3, reduce_id=4)
    slots, rows = set(), set()
    for r in records:
        meta = r.meta
        if meta.op == Op.QUERY:
            head0 = (meta.kv_id - cfg.tag_base) % (1 << 16)
            count = (meta.length - QUERY_HEADER_BYTES) // query_head_bytes(hd)
            hdr = {"pos": 0, "layer": meta.seq, "head0": head0, "heads": count}
            result, addr = decode_land_decision(cfg, meta, hdr, hd)
            assert result is DecodeLandResult.QUERY
            slots.add(addr)
        elif r.node == root:      # the root's own contribution: the final result's Meta
            final = meta.replace(reduce_op=ReduceOp.NONE, collective=Collective.MULTICAST,
                                 route_id=9, src=root)
            result, addr = decode_land_decision(cfg, final, b"", hd)
            assert result is DecodeLandResult.RESULT
            rows.add((meta.seq, addr))
    n_frag = sum(len(w) for w in enc.payloads.waves)
    assert len(slots) == min(2, model.layers) * n_frag
    assert len(rows) == model.layers * hq
    assert len({a for _, a in rows}) == min(2, model.layers) * hq


# --- the lander, amaranth.sim ----------------------------------------------------------------

@settings(max_examples=15)
@given(hs.lists(hs.integers(1, 9), min_size=1, max_size=8), hs.integers(0, 1 << 30),
       hs.sampled_from([128, 256]))
def test_packet_upsizer(lengths, seed, width):
    """Packets of 1..9 beats under random idle and backpressure: each packet's beats packed
    from lane 0 into width-bit words, the last word flushed at the packet's end."""
    dut = PacketUpsizer(width)
    rng = random.Random(seed)
    ratio = width // 64
    packets = [[rng.getrandbits(64) for _ in range(n)] for n in lengths]
    want = [sum(b << (64 * (k % ratio)) for k, b in enumerate(p[w:w + ratio], w))
            for p in packets for w in range(0, len(p), ratio)]
    got = []

    async def producer(ctx):
        for p in packets:
            for k, b in enumerate(p):
                while rng.random() < 0.3:
                    await ctx.tick()
                ctx.set(dut.i.valid, 1)
                ctx.set(dut.i.payload.data, b)
                ctx.set(dut.i.payload.last, int(k == len(p) - 1))
                await ctx.tick().until(dut.i.ready)
                ctx.set(dut.i.valid, 0)

    async def consumer(ctx):
        for _ in range(20 * sum(lengths) + 100):
            if len(got) == len(want):
                break
            ready = int(rng.random() >= 0.4)
            ctx.set(dut.o.ready, ready)
            _, _, v, d = await ctx.tick().sample(dut.o.valid, dut.o.payload)
            if v and ready:
                got.append(d)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(producer, background=True)
    sim.add_testbench(consumer)
    sim.run()
    assert got == want


def test_random_mix():
    """Random queries, final states and malformed packets, idle input, W pauses, an injected
    SLVERR: DDR bytes and every counter equal the model's."""
    t = make_traffic(seed=3, n=120)
    bad = {t.bad_addr}
    model = t.model()
    st = model.status
    assert st["write_errors"] >= 1 and st["queries_landed"] and st["results_landed"]
    assert all(st[k] for k in ("drop_op", "drop_reduce_op", "drop_length", "drop_slot"))
    mem, status, _, _, _ = simulate(t.packets, t.cfg, bad_beats=bad, idle=0.3, wpause=0.3,
                                    seed=3)
    assert status == st
    skip = {a for meta, pl in t.packets if t.write_error(meta, pl) for a in t.span(meta, pl)}
    assert {a: b for a, b in mem.items() if a not in skip} == \
        {a: b for a, b in model.mem.items() if a not in skip}


def test_normaliser_kr260_head_dim():
    """head_dim 128 (the kr260 attention engine's): edge states (l = 0, one LSB, top bit set,
    saturating o) and merged random states, bit-exact against mcf.abi.softmax.normalize; a
    whole 12-head query and two rows crossing a 4 KiB page (two bursts each)."""
    hd = 128
    rng = random.Random(4)
    g = np.random.default_rng(4)
    cfg = DecodeLandConfig(0x7F00 - 12 * 2048, 0x1000 - 3 * 512 + 8, 2048, 12, 12 * 40)
    states = edge_states(g, hd) + [random_state(g, hd, n) for n in (1, 2, 3, 4, 5, 6)]
    packets = [state_packet(rng, cfg, s, h % 12, h // 12) for h, s in enumerate(states)]
    packets.insert(3, query_packet(rng, cfg, hd, 40, 1, 0, 12))
    model = _model(cfg, packets, hd)
    assert model.status["results_landed"] == len(states)
    mem, status, aws, _, _ = simulate(packets, cfg, head_dim=hd, wpause=0.2)
    assert status == model.status and mem == model.mem
    for h, s in enumerate(states):
        assert np.array_equal(model.row(h // 12, h % 12), normalize(s[1], s[2]))
    assert len(aws) == len(packets) + 3     # the query, rows 2 and 10 crossed a 4 KiB page
    assert (0x7F00, 16) in aws and (0xE00, 32) in aws and (0x1E00, 32) in aws


def test_back_to_back_full_rate():
    """States and queries back to back, no pauses: one input beat per cycle, the input never
    stalls."""
    t = make_traffic(seed=6, n=80, bad_fraction=0.0, bad_write=False)
    beats = sum(len(_beats(m, p)) for m, p in t.packets)
    mem, status, _, cycles, stalls = simulate(t.packets, t.cfg, b_latency=(1, 3))
    model = t.model()
    assert status == model.status and mem == model.mem
    assert stalls == 0
    assert cycles <= beats + 40


def _with_header(payload: bytes, **changes: int) -> bytes:
    hdr = {**query_header(payload), **changes}
    return QUERY_HEADER.const(hdr).as_bits().to_bytes(QUERY_HEADER_BYTES, "little") + \
        payload[QUERY_HEADER_BYTES:]


def test_drops_at_full_rate():
    """A run of dropped packets (every cause) takes one cycle per beat and writes nothing."""
    rng = random.Random(7)
    g = np.random.default_rng(7)
    cfg = DecodeLandConfig(0, 0x1000, 64, 4, 0)
    sm, sp = state_packet(rng, cfg, random_state(g, HEAD_DIM), 1, 0)
    qm, qp = query_packet(rng, cfg, HEAD_DIM, 0, 0, 0, 2)
    variants = [
        (sm.replace(op=Op.KV_REPLICA), sp), (sm.replace(reduce_op=ReduceOp.SUM), sp),
        (sm.replace(length=sm.length - 4), sp), (sm.replace(kv_id=4), sp),
        (qm.replace(op=Op.CONTROL), qp), (qm.replace(length=qm.length - 4), qp),
        (qm, _with_header(qp, head0=7)), (qm, _with_header(qp, heads=0)),
    ]
    packets = variants * 5
    model = _model(cfg, packets)
    assert model.status == {**dict.fromkeys(model.status, 0), "drop_op": 10,
                            "drop_reduce_op": 5, "drop_length": 15, "drop_slot": 10}
    beats = sum(len(_beats(m, p)) for m, p in packets)
    mem, status, aws, cycles, stalls = simulate(packets, cfg)
    assert aws == [] and mem == {} and status == model.status
    assert stalls == 0 and cycles <= beats + 10


def test_write_error_not_counted():
    """A SLVERR burst: counted in write_errors, not landed; the packets after it land."""
    rng = random.Random(8)
    g = np.random.default_rng(8)
    cfg = DecodeLandConfig(0x100, 0x2000, 48, 6, 600)
    packets = [state_packet(rng, cfg, random_state(g, HEAD_DIM), h, 2) for h in range(6)]
    packets += [query_packet(rng, cfg, HEAD_DIM, 100, 3, h, 2) for h in (0, 2, 4)]
    bad = 0x2000 + 2 * 64 + 32                          # row of head 2
    mem, status, _, _, _ = simulate(packets, cfg, bad_beats={bad})
    model = _model(cfg, packets, errors={2})
    assert status == model.status
    assert status["write_errors"] == 1 and status["results_landed"] == 5
    assert status["queries_landed"] == 3
    assert {a: b for a, b in mem.items() if not 0x2080 <= a < 0x20C0} == model.mem


def test_framing_guard():
    """Packets whose beats disagree with Meta.length (impossible behind a parser) are taken as
    length bytes, cut or zero-padded, and counted; the packets after them land intact."""
    rng = random.Random(9)
    g = np.random.default_rng(9)
    cfg = DecodeLandConfig(0x40, 0x3000, 48, 6, 6)
    s = [state_packet(rng, cfg, random_state(g, HEAD_DIM), h, 1) for h in range(4)]
    q = [query_packet(rng, cfg, HEAD_DIM, 1, 0, h, 2) for h in (0, 2)]
    packets = [(s[0][0], s[0][1][:20]),                 # short state: 3 beats for 9
               (s[1][0], s[1][1] + bytes(range(40))),    # long state
               q[0],
               (q[1][0], q[1][1][:8]),                   # short query: header only
               s[2], (s[3][0], b"")]                     # one keep=0 beat for a state
    model = _model(cfg, packets)
    assert model.status["framing_errors"] == 4
    assert query_header(q[1][1][:8])["heads"] == 2
    mem, status, _, _, _ = simulate(packets, cfg, idle=0.2, wpause=0.3)
    assert status == model.status
    assert mem == model.mem


# --- cocotb + Verilator bench ---------------------------------------------------------------

BENCH = "mcf.sim.benches.node_decode_land"


def lander_built(head_dim: int = HEAD_DIM):
    from mcf.hdl.flat import FlatTop
    from mcf.sim import build
    name = "node_decode_land" if head_dim == HEAD_DIM else f"node_decode_land_{head_dim}"
    return build(FlatTop(DecodeLander(head_dim), {"i": "s_axis"}), name)


@pytest.mark.parametrize("idle,pause", [(0.0, 0.0), (0.3, 0.3), (0.0, 0.6)])
def test_decode_land_bench(idle, pause):
    from mcf.sim import run
    run(lander_built(), BENCH, params={"seed": 11 + int(10 * pause), "n": 300, "idle": idle,
                                       "pause": pause, "tests": ["random_mix"]})


@pytest.mark.parametrize("head_dim", [HEAD_DIM, 128])
def test_decode_land_rate(tmp_path, head_dim):
    """Full input rate, no pauses, at the sim and the kr260 head_dim: the figure is reported
    (printed with ``-s``), not asserted; the bench's scoreboard checks every landed byte and
    counter."""
    from mcf.sim import run
    out = tmp_path / "rate.json"
    run(lander_built(head_dim), BENCH, params={"seed": 2, "rate_n": 80, "tests": ["rate"],
                                               "head_dim": head_dim, "out": str(out)})
    result = json.loads(out.read_text())
    for r in result:
        print(f"decode landing rate (head_dim {head_dim}):", r)
    assert [r["mix"] for r in result] == ["states", "queries", "mixed"]


@pytest.mark.slow
def test_decode_land_bench_long():
    from mcf.sim import run
    run(lander_built(), BENCH, params={"seed": 23, "n": 1500, "idle": 0.5, "pause": 0.5,
                                       "tests": ["random_mix"]})
