"""The send unit's contract: which SEND records become packets, with which payload (docs/node.md
§2-3 record classes, §5 the ``kv_id`` → address rule, §6 rule 3 the injection rule; paper §5:
packets leave the node without the PS on the per-record path).

A SEND record (:data:`mcf.abi.node.CMD`, ``cls = SEND``) names the packet's ``Meta`` and where
its ``meta.length`` payload bytes come from (``src``, :class:`~mcf.abi.node.PayloadSource`):

* ``HDR``: none (``length`` must be 0);
* ``KV``: DDR at :func:`mcf.abi.landing.kv_address` ``(kv_id, seq)`` — the very slot the
  landing engine writes, through the same ``LAND_OFF`` table and configuration;
* ``QBUF``: DDR at ``qbuf_base + arg`` (40-bit wrap; ``qbuf_base`` taken with its low 2 bits as
  0 and ``arg`` a multiple of :data:`~mcf.abi.decode_land.DEC_ALIGN`, 4 bytes: the unit's DMA
  reader realigns by words, as every ``KV`` address is on
  :data:`~mcf.abi.landing.KV_ALIGN`);
* ``ATTN``, ``EMIT``: the next packet of that producer's staging FIFO. Exactly ``length`` bytes
  are sent: a staged packet with fewer beats than ``payload_beats(length)`` is zero-padded, one
  with more is cut (both counted in ``framing_errors``).

A record is **not sent** (counted, consumed, never a stall) when it is not a SEND, its ``src``
or ``meta.op`` is unassigned, ``length > MAX_PAYLOAD``, ``HDR`` has ``length != 0`` or another
source ``length == 0``, a ``QBUF`` ``arg`` off a word (``drop_bad_record``; a staged source's
packet is then discarded so the FIFO stays aligned with its records); a ``KV`` record whose
``kv_id >= KV_COUNT`` (``drop_unmapped``) or whose ``LAND_OFF[seq]`` is invalid or ``offset
+ length > KV_SLOT`` (``drop_bad_seq``) — the landing engine's drop rules
(:func:`mcf.abi.landing.land_decision`).

:func:`send_decision` is the rule; :class:`mcf.golden.send.SendModel` /
:func:`mcf.golden.send.send_packets` are the golden model of ``mcf.hdl.node.send.SendUnit``.
"""

from __future__ import annotations

from collections.abc import Sequence

from .decode_land import DEC_ALIGN
from .framing import MAX_PAYLOAD
from .landing import KV_BASE_BITS, LandingConfig
from .meta import META, Op
from .node import CMD, PayloadSource, RecordClass
from .regs import Register, counters, status_registers

__all__ = ["SEND_STATUS", "STAGED_SOURCES", "send_registers", "send_decision"]

SEND_STATUS = counters("packets", "bytes", "drop_unmapped", "drop_bad_seq", "drop_bad_record",
                       "read_errors", "framing_errors")
"""Packets sent (``Meta`` handed to the packetizer) and their payload bytes; records not sent
by cause (:mod:`module docs <mcf.abi.send>`); sent packets with a DDR beat answered
SLVERR/DECERR (the beat's bytes as the bus returned them); staged packets whose beat count
disagreed with ``length`` (cut or zero-padded). Registers ``send_<field>``."""

STAGED_SOURCES = (PayloadSource.ATTN, PayloadSource.EMIT)
"""Sources whose payload waits complete in a staging FIFO (one ``staged_*`` port each)."""

PACKET_WIDTH = 64


def send_registers() -> list[Register]:
    """The send unit's status counters ``send_*`` (:data:`SEND_STATUS`). Its configuration is
    shared: ``KV_BASE``/``KV_SLOT``/``KV_COUNT`` and the ``LAND_OFF`` write port of
    :func:`mcf.abi.landing.landing_registers` (the unit keeps its own copy of the table,
    written by the same strobe), ``QBUF_BASE`` of :func:`mcf.abi.decode_land.decode_land_registers`.
    Not yet part of :func:`mcf.abi.csrmap.node_regmap`."""
    return status_registers("send", SEND_STATUS, "send unit")


def _field(raw: int, name: str, layout=CMD) -> int:
    fld = layout[name]
    return (raw >> fld.offset) & ((1 << fld.width) - 1)


def send_decision(raw: int, cfg: LandingConfig, land_off: Sequence[int | None],
                  qbuf_base: int = 0) -> tuple[str, int | None]:
    """``(result, address)`` for one 128-bit record: result ``"send"`` or a drop counter's
    name; the DDR address for ``KV``/``QBUF`` sends (else ``None``)."""
    meta = _field(raw, "meta")
    src, cls = _field(raw, "src"), _field(raw, "cls")
    op, length = _field(meta, "op", META), _field(meta, "length", META)
    if cls != RecordClass.SEND.value or src not in {s.value for s in PayloadSource} or \
            op not in {o.value for o in Op} or length > MAX_PAYLOAD or \
            (src == PayloadSource.HDR.value) != (length == 0) or \
            (src == PayloadSource.QBUF.value and _field(raw, "arg") % DEC_ALIGN):
        return "drop_bad_record", None
    if src == PayloadSource.KV.value:
        kv_id, seq = _field(meta, "kv_id", META), _field(meta, "seq", META)
        if kv_id >= cfg.kv_count:
            return "drop_unmapped", None
        off = land_off[seq]
        if off is None or off + length > cfg.kv_slot:
            return "drop_bad_seq", None
        return "send", (cfg.kv_base + kv_id * cfg.kv_slot + off) % (1 << KV_BASE_BITS)
    if src == PayloadSource.QBUF.value:
        return "send", (qbuf_base // DEC_ALIGN * DEC_ALIGN + _field(raw, "arg")) \
            % (1 << KV_BASE_BITS)
    return "send", None
