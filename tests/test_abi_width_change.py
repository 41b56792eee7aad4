# amaranth: UnusedElaboratable=no
"""One source of truth: change a Meta width in the ABI and everything follows, with no other edit.

A layout with a 48-bit ``kv_id`` (Meta = 96 bits, more than one 64-bit beat) on a 128-bit
stream: the packetizer and parser elaborate and pass traffic bit-exactly against the golden
model, the host packs/unpacks with the same layout, and the generated docs change. A layout with
a 10-bit ``route_id`` (and 6-bit node ids): the NIC router and reduction engine size their
tables, tags and node ids from it — route ids that differ only above bit 7 reach different
table entries, against the golden models.
"""

import random

import numpy as np
import pytest
from amaranth.sim import Simulator

from mcf.abi import META, Meta, MetaWidths, Port, beat_layout, meta_layout, parsed_layout
from mcf.abi.csrmap import DropCause
from mcf.abi.doc import bit_diagram, layout_markdown
from mcf.abi.framing import keep_mask, payload_beats
from mcf.abi.meta import Collective, Op, ReduceOp
from mcf.abi.nic import reduce_config, reduce_status_layout
from mcf.abi.route import route_entry
from mcf.golden.nic import Packet, ReduceModel, RouterModel
from mcf.golden.packet import (
    ParserModel,
    malformed_packet,
    packet_beats,
    packetize,
    payload_frame,
    random_good_packet,
)
from mcf.hdl.nic.reduce import ReduceEngine
from mcf.hdl.nic.router import Router
from mcf.hdl.packet.packetizer import Packetizer
from mcf.hdl.packet.parser import Parser
from mcf.sim.amsim import (
    drive,
    expected_parsed,
    pack_fields,
    run_packetizer,
    run_parser,
    sinks_process,
    split_packets,
    unpack_fields,
    write_table,
)

WIDE = meta_layout(MetaWidths(kv_id=48))
WIDTH = 128
LOCAL_ID, NUM_NODES, MAX_PAYLOAD = 1, 4, 64


def test_wide_layout_is_wider():
    assert WIDE.size == META.size + 32 > 64
    assert WIDE["kv_id"].width == 48
    with pytest.raises(ValueError):
        beat_layout(64, WIDE)   # no longer fits one 64-bit header beat


def test_pack_unpack_round_trip():
    rng = random.Random(1)
    for _ in range(50):
        meta, _ = random_good_packet(rng, WIDTH, max_len=40, num_nodes=NUM_NODES,
                                     meta_layout=WIDE)
        meta = meta.replace(kv_id=rng.getrandbits(48))
        raw = meta.pack(WIDE)
        assert Meta.unpack(raw, WIDE) == meta
        assert len(meta.to_bytes(WIDE)) == 12
    with pytest.raises(ValueError):
        Meta(kv_id=1 << 48).pack(WIDE)
    with pytest.raises(ValueError):
        Meta(kv_id=1 << 16).pack(META)


def test_docs_follow_the_layout():
    assert bit_diagram(WIDE, "Meta") != bit_diagram(META, "Meta")
    assert "(96 bits)" in bit_diagram(WIDE, "Meta")
    md = layout_markdown(WIDE, "Meta")
    assert "| `kv_id` |" in md and "(96 bits)" in md
    assert md != layout_markdown(META, "Meta")


def test_packetizer_with_wide_meta():
    rng = random.Random(2)
    packets = [random_good_packet(rng, WIDTH, max_len=50, num_nodes=NUM_NODES, meta_layout=WIDE)
               for _ in range(20)]
    packets = [(m.replace(kv_id=rng.getrandbits(48)), p) for m, p in packets]
    metas = [m.pack(WIDE) for m, _ in packets]
    frames = [payload_frame(p, WIDTH) for m, p in packets if m.length]
    expected = packetize(metas, frames, WIDTH, WIDE)
    assert expected == [b for m, p in packets for b in packet_beats(m, p, WIDTH, WIDE)]
    dut = Packetizer(WIDTH, WIDE, meta_depth=4, payload_depth=8)
    got, status = run_packetizer(dut, metas, frames, idle=0.2, backpressure=0.3, seed=2)
    layout = beat_layout(WIDTH, WIDE)
    assert got == [pack_fields(layout, b._asdict()) for b in expected]
    assert status["packets"] == len(packets)


def test_parser_with_wide_meta():
    rng = random.Random(3)
    beats = []
    for i in range(40):
        if i % 4 == 3:
            beats += malformed_packet(rng, list(DropCause)[i % len(DropCause)], WIDTH,
                                      max_payload=MAX_PAYLOAD, num_nodes=NUM_NODES, max_len=48,
                                      meta_layout=WIDE)
        else:
            meta, payload = random_good_packet(
                rng, WIDTH, max_len=48, num_nodes=NUM_NODES, meta_layout=WIDE,
                port=list(Port)[i % len(Port)], local_id=LOCAL_ID)
            meta = meta.replace(kv_id=rng.getrandbits(48))
            beats += packet_beats(meta, payload, WIDTH, WIDE)
    model = ParserModel(WIDTH, max_payload=MAX_PAYLOAD, local_id=LOCAL_ID, num_nodes=NUM_NODES,
                        meta_layout=WIDE)
    model.feed(beats)
    layout = parsed_layout(WIDTH, WIDE)
    assert layout["meta"].width == 96
    expected = expected_parsed(model, layout)
    dut = Parser(WIDTH, WIDE, max_payload=MAX_PAYLOAD)
    got, status, _ = run_parser(dut, beats, local_id=LOCAL_ID, num_nodes=NUM_NODES,
                                expected_beats=sum(map(len, expected.values())),
                                backpressure=0.3, seed=3)
    assert got == expected
    assert status == model.counters
    # the wide kv_id really travelled: some delivered packet has kv_id bits above bit 15
    kv = WIDE["kv_id"]
    metas = [b.meta for pkts in model.outputs.values() for pkt in pkts for b in pkt]
    assert any((m >> kv.offset) & ((1 << kv.width) - 1) >= 1 << 16 for m in metas)


# --- NIC engines with a 10-bit route_id -----------------------------------------------------

ROUTE10 = meta_layout(MetaWidths(route_id=10, node=6))
NIC_DW = 128


def _beats(meta: Meta, payload: bytes, layout=ROUTE10) -> list[dict]:
    """Parsed-layout beats with the metadata packed in ``layout``."""
    raw, bpb = meta.pack(layout), NIC_DW // 8
    n = payload_beats(len(payload), NIC_DW)
    if n == 0:
        return [{"meta": raw, "data": 0, "keep": 0, "last": 1}]
    return [{"meta": raw, "data": int.from_bytes(payload[b * bpb:(b + 1) * bpb], "little"),
             "keep": keep_mask(len(payload), NIC_DW) if b == n - 1 else (1 << bpb) - 1,
             "last": int(b == n - 1)} for b in range(n)]


def _packet(beats: list[dict], layout=ROUTE10) -> Packet:
    bpb = NIC_DW // 8
    payload = b"".join(b["data"].to_bytes(bpb, "little")[:bin(b["keep"]).count("1")]
                       for b in beats)
    return Packet(Meta.unpack(beats[0]["meta"], layout), payload)


def test_route10_layout_is_wider():
    assert ROUTE10["route_id"].width == 10 and ROUTE10.size == META.size + 2 + 2
    with pytest.raises(ValueError):
        Meta(route_id=0x3FF).pack(META)


def test_router_table_follows_route_id_width():
    # three ids equal in their low 8 bits, each with its own entry, + one with no route
    table = {0x3A5: route_entry({0}), 0x0A5: route_entry({1}),
             0x2A5: route_entry(set(), local=True), 0x1A5: 0}
    dut = Router(data_width=NIC_DW, n_ports=2, max_payload=64, meta_layout=ROUTE10)
    assert dut.route_wr.addr.shape().width == 10
    model = RouterModel(2, 64)
    for rid, entry in table.items():
        model.write_route(rid, entry)
    rng = random.Random(5)
    feed, expected = [], {0: [], 1: [], "local": []}
    for n in range(60):
        meta = Meta(op=Op.KV_REPLICA, collective=Collective.MULTICAST, src=33 + n % 20,
                    route_id=rng.choice(sorted(table)), kv_id=n, length=rng.randrange(0, 65))
        pkt = Packet(meta, rng.randbytes(meta.length))
        feed += _beats(meta, pkt.payload)
        dest = model.route(meta)
        for d in ([] if isinstance(dest, str) else dest):
            expected[d].append(pkt)
    outs = {0: [], 1: [], "local": []}
    status = {}
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    srng = random.Random(6)
    sim.add_process(sinks_process([(dut.o0, outs[0], srng, 0.7), (dut.o1, outs[1], srng, 0.7),
                                   (dut.local, outs["local"], srng, 0.7)]))

    async def tb(ctx):
        await write_table(ctx, dut.route_wr, table)
        await drive(ctx, dut.i2, feed, random.Random(7), idle=0.2)
        for _ in range(200):
            await ctx.tick()
        status.update(unpack_fields(dut.status.shape(), ctx.get(dut.status.as_value())))

    sim.add_testbench(tb)
    sim.run()
    for o in outs:
        assert [_packet(p) for p in split_packets(outs[o])] == expected[o]
        assert expected[o]
    assert status == model.counters
    assert status["drop_no_route"] > 0


def test_reduction_engine_follows_route_id_width():
    cfg_final = reduce_config(2, final=True, result_route=0x3C1, meta_layout=ROUTE10)
    configs = {0x2AB: cfg_final, 0x1AB: reduce_config(3, meta_layout=ROUTE10)}  # 0x0AB: none
    dut = ReduceEngine(data_width=NIC_DW, n_slots=2, max_payload=64, meta_layout=ROUTE10)
    assert dut.cfg_wr.addr.shape().width == 10
    assert dut.local_id.shape().width == 6
    model = ReduceModel(2, 64, local_id=45, meta_layout=ROUTE10)
    for rid, entry in configs.items():
        model.write_config(rid, entry)
    rng = np.random.default_rng(8)
    stream = []
    for tag in range(12):
        rid = (0x2AB, 0x1AB, 0x0AB)[tag % 3]
        for s in range({0x2AB: 2, 0x1AB: 3, 0x0AB: 1}[rid]):
            words = rng.integers(-(1 << 31), 1 << 31, 8).astype("<i4").tobytes()
            stream.append((Meta(op=Op.REDUCTION, collective=Collective.ALL_REDUCE,
                                reduce_op=ReduceOp.SUM, src=40 + s, route_id=rid, kv_id=tag,
                                seq=tag, length=32), words))
    expected = [r for meta, p in stream if isinstance(r := model.contribute(meta, p), Packet)]
    got, status = [], {}
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_process(sinks_process([(dut.o, got, random.Random(9), 0.8)]))

    async def tb(ctx):
        ctx.set(dut.local_id, 45)
        await write_table(ctx, dut.cfg_wr, configs)
        await drive(ctx, dut.i, [b for m, p in stream for b in _beats(m, p)], random.Random(10),
                    idle=0.1)
        for _ in range(100):
            await ctx.tick()
        status.update(unpack_fields(reduce_status_layout(ROUTE10),
                                    ctx.get(dut.status.as_value())))

    sim.add_testbench(tb)
    sim.run()
    results = [_packet(p) for p in split_packets(got)]
    assert results == expected and len(results) == 8
    assert {r.meta.route_id for r in results} == {0x3C1, 0x1AB}
    assert all(r.meta.src == 45 for r in results)
    assert status == model.counters
    assert status["drop_no_config"] == 4
