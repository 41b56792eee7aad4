"""The metadata layout, host packing and dispatch rules (mcf.abi.meta, mcf.abi.framing)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcf.abi import (
    DISPATCH_RULES,
    META,
    Collective,
    Meta,
    MetaWidths,
    Op,
    Port,
    ReduceOp,
    Stage,
    dispatch_port,
    encode_packet,
    keep_mask,
    meta_layout,
    payload_beats,
    raw_fields,
)
from mcf.abi.framing import beat_layout, parsed_layout


def metas(layout=META):
    return st.builds(
        Meta, stage=st.sampled_from(Stage), op=st.sampled_from(Op),
        collective=st.sampled_from(Collective), reduce_op=st.sampled_from(ReduceOp),
        **{name: st.integers(0, (1 << layout[name].width) - 1)
           for name in ("src", "dst", "route_id", "kv_id", "length", "seq")})


def test_default_layout_is_one_64_bit_word():
    assert META.size == 64
    offsets = sorted((f.offset, f.width) for _, f in META)
    # fields tile the word with no gaps or overlaps, LSB first in declaration order
    pos = 0
    for off, width in offsets:
        assert off == pos
        pos += width
    assert pos == 64
    assert [n for n, _ in META][:4] == ["stage", "op", "collective", "reduce_op"]


def test_pack_by_hand():
    m = Meta(stage=Stage.DECODE, op=Op.PARTIAL_STATE, collective=Collective.ALL_REDUCE,
             reduce_op=ReduceOp.SOFTMAX_MERGE, src=3, dst=17, route_id=0xA5, kv_id=0x1234,
             length=520, seq=9)
    # stage:1 | op:3 | collective:2 | reduce_op:2 | src:5 | dst:5 | route:8 | kv:16 | len:14 | seq:8
    expect = (1 | 3 << 1 | 3 << 4 | 3 << 6 | 3 << 8 | 17 << 13 | 0xA5 << 18 | 0x1234 << 26
              | 520 << 42 | 9 << 56)
    assert m.pack() == expect
    assert Meta.unpack(expect) == m
    assert m.to_bytes() == expect.to_bytes(8, "little")


@given(metas())
def test_round_trip(meta):
    raw = meta.pack()
    assert 0 <= raw < 1 << 64
    assert Meta.unpack(raw) == meta
    fields = raw_fields(raw)
    assert fields["op"] == meta.op.value and fields["kv_id"] == meta.kv_id


def test_out_of_range_field_rejected():
    with pytest.raises(ValueError, match="dst=32 does not fit in 5 bits"):
        Meta(dst=32).pack()


def test_unassigned_opcode_rejected_on_unpack():
    raw = Meta().pack() | (7 << META["op"].offset)
    with pytest.raises(ValueError):
        Meta.unpack(raw)
    assert raw_fields(raw)["op"] == 7


def test_widths_are_parameters():
    wide = meta_layout(MetaWidths(kv_id=24, node=6))
    assert wide.size == 64 + 8 + 2
    m = Meta(kv_id=(1 << 24) - 1, dst=63)
    assert Meta.unpack(m.pack(wide), wide) == m
    with pytest.raises(ValueError):
        m.pack()  # does not fit the default layout


@pytest.mark.parametrize("meta,local,port", [
    (Meta(op=Op.CONTROL, collective=Collective.ALL_REDUCE), 0, Port.CONTROL),
    (Meta(op=Op.PARTIAL_STATE, collective=Collective.ALL_REDUCE), 0, Port.REDUCTION),
    (Meta(op=Op.PARTIAL_STATE, reduce_op=ReduceOp.SOFTMAX_MERGE, dst=1), 1, Port.REDUCTION),
    (Meta(op=Op.KV_REPLICA, collective=Collective.ALL_TO_ALL, dst=2), 2, Port.ALL_TO_ALL),
    (Meta(op=Op.KV_REPLICA, collective=Collective.P2P, dst=2), 2, Port.LOCAL),
    (Meta(op=Op.KV_REPLICA, collective=Collective.P2P, dst=3), 2, Port.FORWARD),
    (Meta(op=Op.QUERY, collective=Collective.MULTICAST, dst=2), 2, Port.FORWARD),
])
def test_dispatch(meta, local, port):
    assert dispatch_port(meta, local) is port


def test_dispatch_table_ends_with_catch_all():
    last = DISPATCH_RULES[-1]
    assert (last.op, last.collective, last.reduce_op_not_none, last.dst_is_local) == \
        (None, None, None, None)


@pytest.mark.parametrize("width", [64, 128])
def test_framing(width):
    bpb = width // 8
    assert payload_beats(0, width) == 0
    assert payload_beats(1, width) == 1
    assert payload_beats(bpb, width) == 1
    assert payload_beats(bpb + 1, width) == 2
    assert keep_mask(bpb, width) == (1 << bpb) - 1
    assert keep_mask(3, width) == 0b111
    meta = Meta(length=5)
    pkt = encode_packet(meta, b"abcde", width)
    assert len(pkt) == bpb + 5
    assert int.from_bytes(pkt[:bpb], "little") == meta.pack()
    assert beat_layout(width).size == width + bpb + 1
    assert parsed_layout(width).size == 64 + width + bpb + 1
    with pytest.raises(ValueError, match="meta.length=4"):
        encode_packet(Meta(length=4), b"abcde", width)


def test_meta_must_fit_header_beat():
    with pytest.raises(ValueError, match="must fit in one 64-bit header beat"):
        beat_layout(64, meta_layout(MetaWidths(kv_id=20)))


def test_meta_length_names_max_payload():
    """The one maximum payload (mcf.abi.framing.MAX_PAYLOAD) is a length the Meta can carry."""
    from mcf.abi.framing import MAX_PAYLOAD
    assert 0 < MAX_PAYLOAD <= (1 << META["length"].width) - 1
    raw = Meta(length=MAX_PAYLOAD).pack()
    assert Meta.unpack(raw).length == MAX_PAYLOAD
