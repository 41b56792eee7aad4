"""docs/nic.md "Link frame format" against the ABI: the bit diagram between its markers is
generated here from ``mcf.abi.nic.LINK_HEADER``, ``LINK_MAGIC``, ``CRC_BYTES``,
``mcf.abi.meta.META`` and ``mcf.abi.framing`` (a width or field change fails this test, which
prints the new diagram), and the documented receive rules — including the partial-``keep``
header beat — are checked on the golden ``link_frame`` / ``LinkRxModel`` (which
tests/test_nic_link.py holds bit-exact to ``LinkTx`` / ``LinkRx``)."""

from __future__ import annotations

import re
from pathlib import Path

from mcf.abi.framing import FRAME_OVERHEAD_BEATS, MAX_PAYLOAD, keep_mask, max_frame_beats
from mcf.abi.meta import META, Meta, Op
from mcf.abi.nic import CRC_BYTES, LINK_HEADER, LINK_MAGIC, crc32, link_crc
from mcf.golden.nic import LinkRxModel, Packet, link_frame

DOC = Path(__file__).resolve().parents[1] / "docs" / "nic.md"
WIDTH = 64


def _fields(layout, width: int, names: dict[str, str] | None = None) -> str:
    """``[hi:lo] name`` from the MSB down; bits above the layout are ``0``."""
    names = names or {}
    parts = []
    if layout.size < width:
        parts.append(f"[{width - 1}:{layout.size}] 0")
    for name, fld in sorted(layout, key=lambda nf: -nf[1].offset):
        hi, lo = fld.offset + fld.width - 1, fld.offset
        bits = f"[{hi}:{lo}]" if hi != lo else f"[{lo}]"
        parts.append(f"{bits} {names.get(name, name)}")
    return " | ".join(parts)


def frame_diagram(width: int = WIDTH) -> str:
    """The diagram docs/nic.md shows, from the ABI."""
    full = (1 << (width // 8)) - 1
    crc_keep = (1 << CRC_BYTES) - 1
    magic = {"magic": f"magic = {LINK_MAGIC:#06x}"}
    rows = [
        f"one link frame = {FRAME_OVERHEAD_BEATS} + ceil(length / {width // 8}) beats of "
        f"{width} bits, bytes little-endian (byte k = bits [8k+7:8k])",
        "",
        f"beat 0      LINK_HEADER  {_fields(LINK_HEADER, width, magic)}",
        f"            keep {full:#04x}, last 0",
        f"beat 1      META         {_fields(META, width)}",
        f"            keep {full:#04x}, last 0",
        f"beats 2..   payload      payload byte {width // 8}·b + k in bits [8k+7:8k] of payload "
        f"beat b; keep {full:#04x}, the last one keep_mask(length) "
        f"(length 5: {keep_mask(5, width):#04x}); none when length = 0",
        f"last beat   CRC-32       [{width - 1}:{8 * CRC_BYTES}] 0 | [{8 * CRC_BYTES - 1}:0] "
        f"CRC-32 over every byte under keep of the beats before it",
        f"            keep {crc_keep:#04x}, last 1",
        "",
        f"longest frame: {max_frame_beats(width)} beats (MAX_PAYLOAD = {MAX_PAYLOAD} B)",
    ]
    return "\n".join(rows)


def _doc_block() -> str:
    text = DOC.read_text()
    m = re.search(r"<!-- link-frame:begin -->\n```\n(.*?)\n```\n<!-- link-frame:end -->", text,
                  re.S)
    assert m, "docs/nic.md lost its link-frame markers"
    return m.group(1)


def test_doc_diagram_is_the_abi_layout():
    want = frame_diagram()
    assert _doc_block() == want, "docs/nic.md link frame diagram is stale; now:\n" + want


def _packet(length: int) -> Packet:
    meta = Meta(op=Op.KV_REPLICA, src=1, dst=0, route_id=3, kv_id=0x1234, length=length, seq=5)
    return Packet(meta, bytes((7 * i + 1) & 0xFF for i in range(length)))


def test_documented_frame_bytes():
    """Magic at bytes 0–1, seq at 2–3, the Meta beat, payload, the CRC beat — as drawn."""
    bpb = WIDTH // 8
    beats = link_frame(_packet(13), seq=0x0102, data_width=WIDTH)
    assert len(beats) == FRAME_OVERHEAD_BEATS + 2
    hdr, keep0 = beats[0]
    assert hdr[:4] == LINK_MAGIC.to_bytes(2, "little") + (0x0102).to_bytes(2, "little")
    assert hdr[4:] == bytes(bpb - 4) and keep0 == 0xFF
    assert int.from_bytes(beats[1][0], "little") == _packet(13).meta.pack()
    assert beats[-2][1] == keep_mask(13, WIDTH) == 0x1F
    covered = b"".join(d for d, _ in beats[:-1])   # whole beats (zero past keep, as sent)
    assert beats[-1] == (crc32(covered).to_bytes(CRC_BYTES, "little") + bytes(bpb - CRC_BYTES),
                         (1 << CRC_BYTES) - 1)
    assert len(link_frame(_packet(0), 0, WIDTH)) == FRAME_OVERHEAD_BEATS


def _recrc(beats):
    crc = link_crc(beats[:-1]).to_bytes(CRC_BYTES, "little")
    return beats[:-1] + [(crc.ljust(WIDTH // 8, b"\0"),
                          (1 << CRC_BYTES) - 1)]


def test_documented_receive_rules():
    rx = LinkRxModel(WIDTH, MAX_PAYLOAD)
    assert isinstance(rx.receive(link_frame(_packet(8), 0, WIDTH)), Packet)
    # a header beat with partial keep: accepted when the CRC covers the kept bytes
    frame = link_frame(_packet(8), 1, WIDTH)
    frame[0] = (frame[0][0], 0x0F)
    assert isinstance(rx.receive(_recrc(frame)), Packet)
    # sequence: ahead → accepted, gap counted; behind → stale
    assert isinstance(rx.receive(link_frame(_packet(0), 4, WIDTH)), Packet)
    assert rx.counters["seq_gaps"] == 1 and rx.counters["lost_frames"] == 2
    assert rx.receive(link_frame(_packet(0), 3, WIDTH)) == "drop_stale"
    bad = link_frame(_packet(0), 5, WIDTH)
    bad[0] = ((LINK_MAGIC ^ 1).to_bytes(2, "little") + bad[0][0][2:], bad[0][1])
    assert rx.receive(_recrc(bad)) == "drop_bad_header"
    wrong_keep = link_frame(_packet(0), 5, WIDTH)
    wrong_keep[-1] = (wrong_keep[-1][0], 0xFF)
    assert rx.receive(wrong_keep) == "crc_errors"
