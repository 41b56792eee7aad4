"""mcf.abi.landing: LAND_OFF layout, the address rule, the drop rules, the MARS-built table and
the registers (docs/node.md §5)."""

from __future__ import annotations

import pytest

from mcf.abi.framing import MAX_PAYLOAD
from mcf.abi.kv import kv_token_bytes
from mcf.abi.landing import (
    KV_BASE_BITS,
    LAND_OFF_ENTRIES,
    LAND_OFF_ENTRY,
    LANDING_CONFIG,
    LANDING_STATUS,
    KvLayout,
    LandingConfig,
    LandResult,
    kv_address,
    land_decision,
    land_off_entry,
    landing_registers,
    per_token_land_off,
)
from mcf.abi.meta import META, Meta, Op
from mcf.abi.regs import Access, RegisterMap
from mcf.golden.landing import LandingModel
from mcf.mars.metadata import MetaEncoder
from mcf.mars.model import get_model


def test_layouts_follow_meta():
    assert LAND_OFF_ENTRIES == 1 << META["seq"].width == 256
    assert LAND_OFF_ENTRY.size == 25
    assert LANDING_CONFIG["kv_base"].shape.width == KV_BASE_BITS == 40
    assert 1 << META["kv_id"].width < 1 << LANDING_CONFIG["kv_count"].shape.width
    raw = land_off_entry(0x123454)
    view = LAND_OFF_ENTRY.from_bits(raw)
    assert (int(view.offset), int(view.valid)) == (0x123454, 1)
    assert land_off_entry(None) == 0
    with pytest.raises(ValueError):
        land_off_entry(1 << 24)
    with pytest.raises(ValueError):
        LandingConfig(1 << 40, 4, 1)
    # KV_ALIGN: bases, slots, offsets and layouts off a 32-bit word are refused
    for bad in (lambda: land_off_entry(0x123456), lambda: LandingConfig(0x1002, 4, 1),
                lambda: LandingConfig(0x1000, 6, 1), lambda: KvLayout(6, 12, (0,)),
                lambda: KvLayout(8, 16, (0, 3))):
        with pytest.raises(ValueError, match="multiples? of 4"):
            bad()
    cfg = LandingConfig(0xAB_1234_5678, 0x10000, 65536)
    view = LANDING_CONFIG.from_bits(cfg.pack())
    assert (int(view.kv_base), int(view.kv_slot), int(view.kv_count)) == \
        (0xAB_1234_5678, 0x10000, 65536)


def test_kv_address():
    cfg = LandingConfig(kv_base=0x8_0000_0000, kv_slot=67_584, kv_count=1792)
    table = [None] * 256
    table[3] = 33_792 + 15 * 132
    assert kv_address(cfg, 1791, 3, table) == 0x8_0000_0000 + 1791 * 67_584 + 33_792 + 1980
    with pytest.raises(ValueError):
        kv_address(cfg, 1792, 3, table)
    with pytest.raises(ValueError):
        kv_address(cfg, 0, 4, table)


def test_land_decision_rules():
    cfg = LandingConfig(kv_base=0x1000, kv_slot=1000, kv_count=10)
    table = [None] * 256
    table[0], table[1] = 0, 900
    ok = Meta(kv_id=9, seq=0, length=100)
    assert land_decision(cfg, ok, table) == (LandResult.LANDED, 0x1000 + 9000)
    assert land_decision(cfg, ok, table, kv_capacity=9)[0] is LandResult.DROP_UNMAPPED
    assert land_decision(cfg, ok.replace(kv_id=10), table)[0] is LandResult.DROP_UNMAPPED
    assert land_decision(cfg, ok.replace(seq=2), table)[0] is LandResult.DROP_BAD_SEQ
    assert land_decision(cfg, ok.replace(seq=1, length=100), table)[0] is LandResult.LANDED
    assert land_decision(cfg, ok.replace(seq=1, length=101), table)[0] is \
        LandResult.DROP_BAD_SEQ
    assert land_decision(cfg, ok.replace(length=0), table)[0] is LandResult.DROP_BAD_SEQ
    big = LandingConfig(0, 1 << 20, 10)
    assert land_decision(big, ok.replace(length=MAX_PAYLOAD + 1), table)[0] is \
        LandResult.DROP_BAD_SEQ
    for op in Op:
        if op != Op.KV_REPLICA:   # op is checked first, whatever else is wrong
            assert land_decision(cfg, ok.replace(op=op, kv_id=99), table)[0] is \
                LandResult.DROP_OP


def test_model_counts_and_bytes():
    cfg = LandingConfig(kv_base=0x10, kv_slot=64, kv_count=4)
    table = [None] * 256
    table[0] = 8
    m = LandingModel(cfg, table)
    assert m.land(Meta(kv_id=1, length=3), b"abc") is LandResult.LANDED
    assert m.land(Meta(kv_id=1, length=3), b"xyz", write_error=True) is LandResult.LANDED
    m.land(Meta(kv_id=5, length=3), b"abc")
    m.land(Meta(op=Op.CONTROL), b"")
    assert m.mem == {0x10 + 64 + 8 + i: b for i, b in enumerate(b"abc")}
    assert m.status == {"packets": 1, "bytes": 3, "drop_unmapped": 1, "drop_bad_seq": 0,
                        "drop_op": 1, "write_errors": 1, "framing_errors": 0}
    assert m.landed[1] == 1
    assert m.events == [(1, True)]          # src 0 == local_id 0: a local copy
    m.land(Meta(kv_id=2, length=10), b"0123456789abcdefXYZ")    # 3 beats for 2: cut
    m.land(Meta(kv_id=3, length=12), b"0123")                   # 1 beat for 2: padded
    assert m.status["framing_errors"] == 2 and m.status["packets"] == 3
    assert bytes(m.mem[0x10 + 2 * 64 + 8 + i] for i in range(10)) == b"0123456789"
    assert bytes(m.mem[0x10 + 3 * 64 + 8 + i] for i in range(12)) == b"0123" + bytes(8)
    assert [n for n, _ in LANDING_STATUS] == list(m.status)


def test_model_events_owner_bit():
    """One event per landed packet, in order; owner is ``meta.src == local_id``; none for a
    drop or a write error."""
    cfg = LandingConfig(kv_base=0, kv_slot=64, kv_count=8)
    m = LandingModel(cfg, [0] + [None] * 255, local_id=3)
    m.land(Meta(kv_id=1, length=8, src=3), bytes(8))
    m.land(Meta(kv_id=2, length=8, src=1), bytes(8))
    m.land(Meta(kv_id=9, length=8, src=3), bytes(8))          # unmapped
    m.land(Meta(kv_id=4, length=8, src=3), bytes(8), write_error=True)
    m.land(Meta(kv_id=1, length=8, src=0), bytes(8))
    assert m.events == [(1, True), (2, False), (1, False)]
    assert m.landed == {1: 2, 2: 1}


@pytest.mark.parametrize("model,nodes,chunks,slice_tokens,max_payload", [
    ("tiny", 2, 4, 16, MAX_PAYLOAD),          # docs/node.md: 2 packets per kv_id
    ("tiny", 2, 4, 80, 640),
    ("qwen2.5-1.5b", 4, 16, 256, MAX_PAYLOAD),  # 36 packets: 2 heads x 18 fragments
])
def test_per_token_land_off_matches_mars(model, nodes, chunks, slice_tokens, max_payload):
    """The table places every fragment MARS sends where its tokens belong: fragments tile
    each head's records contiguously and never overlap."""
    spec = get_model(model)
    enc = MetaEncoder(spec, nodes, chunks, max_payload=max_payload)
    lay = per_token_land_off(enc, slice_tokens)
    rec = kv_token_bytes(spec.head_dim)
    assert lay.head_stride % 64 == 0 and lay.head_stride >= slice_tokens * rec
    assert lay.kv_slot == spec.kv_heads * lay.head_stride
    frags = enc.fragments(slice_tokens)
    covered = {h: [] for h in range(spec.kv_heads)}
    for seq, length in enumerate(frags):
        head, t0 = enc.fragment_tokens(seq)
        off = lay.land_off[seq]
        assert off == head * lay.head_stride + t0 * rec
        covered[head].append((off, off + length))
    for head, spans in covered.items():
        spans.sort()
        assert spans[0][0] == head * lay.head_stride
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
        assert spans[-1][1] == head * lay.head_stride + slice_tokens * rec
    assert all(off is None for off in lay.land_off[len(frags):])
    if model == "qwen2.5-1.5b":
        assert (lay.head_stride, len(frags)) == (33_792, 36)
    cfg = LandingConfig(0, lay.kv_slot, 16)
    for seq, length in enumerate(frags):
        assert land_decision(cfg, Meta(kv_id=3, seq=seq, length=length),
                             lay.land_off)[0] is LandResult.LANDED


def test_registers():
    regs = landing_registers()
    names = [r.name for r in regs]
    assert names[:6] == ["KV_BASE_LO", "KV_BASE_HI", "KV_SLOT", "KV_COUNT", "LAND_OFF_DATA",
                         "LAND_OFF_WR"]
    assert [f"land_{n}" for n, _ in LANDING_STATUS] == names[6:]
    wr = regs[names.index("LAND_OFF_WR")]
    assert [(f.name, f.width, f.access) for f in wr.fields] == \
        [("seq", META["seq"].width, Access.W)]
    data = regs[names.index("LAND_OFF_DATA")]
    assert sum(f.width for f in data.fields) == LAND_OFF_ENTRY.size
    assert regs[names.index("KV_BASE_HI")].fields[0].width == KV_BASE_BITS - 32
    rmap = RegisterMap("landing", 0x100)
    rmap.extend(regs)        # fits one map, names unique
    assert len(rmap) == 2 + len(regs)
