# amaranth: UnusedElaboratable=no
"""One source of truth: change a Meta width in the ABI and everything follows, with no other edit.

A layout with a 48-bit ``kv_id`` (Meta = 96 bits, more than one 64-bit beat) on a 128-bit
stream: the packetizer and parser elaborate and pass traffic bit-exactly against the golden
model, the host packs/unpacks with the same layout, and the generated docs change.
"""

import random

import pytest

from mcf.abi import META, Meta, MetaWidths, Port, beat_layout, meta_layout, parsed_layout
from mcf.abi.csrmap import DropCause
from mcf.abi.doc import bit_diagram, layout_markdown
from mcf.golden.packet import (
    ParserModel,
    malformed_packet,
    packet_beats,
    packetize,
    payload_frame,
    random_good_packet,
)
from mcf.hdl.packet.packetizer import Packetizer
from mcf.hdl.packet.parser import Parser
from mcf.sim.benches.packet_streams import expected_parsed, pack, run_packetizer, run_parser

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
    assert got == [pack(layout, b._asdict()) for b in expected]
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
