"""KV landing: the direct-mapped KV region, the ``LAND_OFF`` table and the landing engine's
registers (docs/node.md §5 "DDR layout and the kv_id -> address rule", "Landing engine";
paper §5: KV blocks arriving from the network land in DDR with no PS on the path).

Every arriving ``Op.KV_REPLICA`` fragment lands at

    addr(kv_id, seq) = KV_BASE + kv_id · KV_SLOT + LAND_OFF[seq].offset      (kv_id < KV_COUNT)

``LAND_OFF`` has one entry per ``Meta.seq`` value (:data:`LAND_OFF_ENTRIES`): a 24-bit byte
offset and a valid bit (:data:`LAND_OFF_ENTRY`). ``KV_BASE``, ``KV_SLOT`` and every offset are
multiples of :data:`KV_ALIGN` (4 bytes: a KV record is whole 32-bit words), so every landing
address is: the hardware takes their low 2 bits as 0 and the landing writer realigns by words;
:class:`LandingConfig`, :func:`land_off_entry` and :class:`KvLayout` refuse others. The table,
not arithmetic on ``seq``, places fragments, so neither ``H_kv`` nor the record format is wired
into the engine;
:func:`per_token_land_off` builds it the way MARS numbers fragments
(``MetaEncoder.fragment_tokens``). :func:`kv_address` and :func:`land_decision` define what
the engine (``mcf.hdl.node.landing.LandingEngine``) does with a packet; the golden model
:class:`mcf.golden.landing.LandingModel` applies them to a packet stream and also gives the land
events the engine sends to the directory (:mod:`mcf.abi.directory`).

A packet is dropped whole, and counted, when its ``op`` is not ``KV_REPLICA`` (``drop_op``:
the node's :mod:`mcf.abi.local_sink` routes the other ops elsewhere, so none arrive there),
when ``kv_id >= KV_COUNT`` (``drop_unmapped``), or when its ``LAND_OFF`` entry is invalid, its
length is 0 or above :data:`~mcf.abi.framing.MAX_PAYLOAD`, or ``offset + length > KV_SLOT``
(``drop_bad_seq``).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from amaranth.hdl import unsigned
from amaranth.lib import data

from .compute import DMA_ADDR_BITS
from .framing import MAX_PAYLOAD
from .meta import META, Meta, Op
from .regs import Access, Field, Register, counters, status_registers

__all__ = [
    "LAND_OFF_BITS", "LAND_OFF_ENTRY", "LAND_OFF_ENTRIES", "KV_BASE_BITS", "KV_SLOT_BITS",
    "KV_COUNT_BITS", "LANDED_BITS", "LANDING_CONFIG", "LANDING_STATUS", "LandingConfig",
    "LandResult", "land_off_entry", "kv_address", "land_decision", "KvLayout",
    "per_token_land_off", "landing_registers", "KV_ALIGN",
]

LAND_OFF_BITS = 24
"""Byte offset of a fragment inside its ``kv_id``'s slot (a slot is at most 16 MiB)."""

KV_ALIGN = 4
"""``KV_BASE``, ``KV_SLOT`` and ``LAND_OFF`` offsets are multiples of this (one 32-bit word): the
landing engine and the send unit take their low 2 bits as 0, the landing writer shifts by words
only."""

LAND_OFF_ENTRY = data.StructLayout({"offset": unsigned(LAND_OFF_BITS), "valid": unsigned(1)})
LAND_OFF_ENTRIES = 1 << META["seq"].width
"""One ``LAND_OFF`` entry per ``Meta.seq`` value."""

KV_BASE_BITS = DMA_ADDR_BITS
KV_SLOT_BITS = LAND_OFF_BITS
KV_COUNT_BITS = META["kv_id"].width + 1
"""``KV_COUNT`` can name every ``kv_id`` (65,536 needs 17 bits)."""

LANDED_BITS = 10
"""Per-``kv_id`` landed-packet count in the directory (a ``kv_id`` has <= 256 packets; the count
saturates, :mod:`mcf.abi.directory`)."""

LANDING_CONFIG = data.StructLayout({
    "kv_base": unsigned(KV_BASE_BITS),
    "kv_slot": unsigned(KV_SLOT_BITS),
    "kv_count": unsigned(KV_COUNT_BITS),
})
"""The landing engine's configuration inputs (driven by the registers of
:func:`landing_registers`)."""

LANDING_STATUS = counters("packets", "bytes", "drop_unmapped", "drop_bad_seq", "drop_op",
                          "write_errors", "framing_errors")
"""Packets landed (written, B response OKAY, counted in the directory), their payload bytes,
packets dropped by cause, packets whose write answered SLVERR/DECERR (not counted as landed),
landing packets whose beat count disagreed with ``length`` (written as ``length`` bytes: cut,
or padded with zeros; impossible behind a parser). Registers ``land_<field>``."""


@dataclass(frozen=True)
class LandingConfig:
    """Host view of :data:`LANDING_CONFIG`."""
    kv_base: int
    kv_slot: int
    kv_count: int

    def __post_init__(self):
        for name, fld in LANDING_CONFIG:
            value = getattr(self, name)
            if not 0 <= value < (1 << fld.shape.width):
                raise ValueError(f"LandingConfig.{name}={value} does not fit in {fld.shape}")
        for name in ("kv_base", "kv_slot"):
            if getattr(self, name) % KV_ALIGN:
                raise ValueError(f"LandingConfig.{name}={getattr(self, name)}: a multiple of "
                                 f"{KV_ALIGN} bytes")

    def pack(self) -> int:
        return LANDING_CONFIG.const({"kv_base": self.kv_base, "kv_slot": self.kv_slot,
                                     "kv_count": self.kv_count}).as_bits()


def land_off_entry(offset: int | None) -> int:
    """A ``LAND_OFF`` entry as an integer: ``None`` is an invalid entry."""
    if offset is None:
        return 0
    if not 0 <= offset < (1 << LAND_OFF_BITS):
        raise ValueError(f"LAND_OFF offset {offset} does not fit in {LAND_OFF_BITS} bits")
    if offset % KV_ALIGN:
        raise ValueError(f"LAND_OFF offset {offset}: a multiple of {KV_ALIGN} bytes")
    return LAND_OFF_ENTRY.const({"offset": offset, "valid": 1}).as_bits()


class LandResult(enum.Enum):
    LANDED = "packets"
    DROP_UNMAPPED = "drop_unmapped"
    DROP_BAD_SEQ = "drop_bad_seq"
    DROP_OP = "drop_op"


def kv_address(cfg: LandingConfig, kv_id: int, seq: int,
               land_off: Sequence[int | None]) -> int:
    """``KV_BASE + kv_id · KV_SLOT + LAND_OFF[seq].offset`` (``land_off[seq]`` is an offset or
    ``None``). Raises ``ValueError`` for an unmapped ``kv_id`` or an invalid entry."""
    if not 0 <= kv_id < cfg.kv_count:
        raise ValueError(f"kv_id {kv_id} is unmapped (KV_COUNT = {cfg.kv_count})")
    off = land_off[seq]
    if off is None:
        raise ValueError(f"LAND_OFF[{seq}] is invalid")
    return (cfg.kv_base + kv_id * cfg.kv_slot + off) % (1 << KV_BASE_BITS)


def land_decision(cfg: LandingConfig, meta: Meta, land_off: Sequence[int | None],
                  kv_capacity: int | None = None) -> tuple[LandResult, int | None]:
    """What the engine does with a packet: ``(result, address)`` (address only when landed).
    ``kv_capacity`` is the engine's directory depth (a ``kv_id`` at or above it is unmapped
    whatever ``KV_COUNT`` says)."""
    if meta.op != Op.KV_REPLICA:
        return LandResult.DROP_OP, None
    limit = cfg.kv_count if kv_capacity is None else min(cfg.kv_count, kv_capacity)
    if meta.kv_id >= limit:
        return LandResult.DROP_UNMAPPED, None
    off = land_off[meta.seq]
    if off is None or meta.length == 0 or meta.length > MAX_PAYLOAD or \
            off + meta.length > cfg.kv_slot:
        return LandResult.DROP_BAD_SEQ, None
    return LandResult.LANDED, kv_address(cfg, meta.kv_id, meta.seq, land_off)


@dataclass(frozen=True)
class KvLayout:
    """One ``kv_id``'s slot: ``H_kv`` heads of ``head_stride`` bytes, token records contiguous
    per head; ``land_off[seq]`` places fragment ``seq`` (``None``: no such fragment)."""
    head_stride: int
    kv_slot: int
    land_off: tuple[int | None, ...]

    def __post_init__(self):
        offs = [self.head_stride, self.kv_slot, *(o for o in self.land_off if o is not None)]
        if any(v % KV_ALIGN for v in offs):
            raise ValueError(f"KvLayout: head stride, slot and offsets are multiples of "
                             f"{KV_ALIGN} bytes")


def per_token_land_off(encoder, slice_tokens: int, align: int = 64) -> KvLayout:
    """The slot layout and ``LAND_OFF`` table of a MARS plan in the ``PER_TOKEN`` format
    (docs/node.md §5): ``HEAD_STRIDE = slice_tokens · record`` rounded up to ``align`` bytes,
    ``KV_SLOT = H_kv · HEAD_STRIDE``, ``LAND_OFF[seq] = h · HEAD_STRIDE + t0 · record`` for
    ``(h, t0) = encoder.fragment_tokens(seq)``, valid for the ``len(encoder.fragments(
    slice_tokens))`` fragments MARS sends for one layer of a slice. ``encoder`` is a
    :class:`mcf.mars.metadata.MetaEncoder` (duck-typed: ``fragments``, ``fragment_tokens``,
    ``token_record_bytes``, ``model.kv_heads``)."""
    record = encoder.token_record_bytes
    head_stride = -(-slice_tokens * record // align) * align
    kv_slot = encoder.model.kv_heads * head_stride
    if kv_slot >= 1 << KV_SLOT_BITS:
        raise ValueError(f"KV slot of {kv_slot} B does not fit in {KV_SLOT_BITS} bits")
    table: list[int | None] = [None] * LAND_OFF_ENTRIES
    for seq, length in enumerate(encoder.fragments(slice_tokens)):
        head, t0 = encoder.fragment_tokens(seq)
        off = head * head_stride + t0 * record
        if off + length > (head + 1) * head_stride:
            raise AssertionError("fragment outside its head")  # pragma: no cover
        table[seq] = off
    return KvLayout(head_stride, kv_slot, tuple(table))


def landing_registers() -> list[Register]:
    """The landing engine's registers: configuration (RW), the ``LAND_OFF`` write port (stage
    the entry in ``LAND_OFF_DATA``, then write ``seq`` to ``LAND_OFF_WR``: one table write per
    strobe, like ``ROUTE_WR``) and the status counters ``land_*`` (:data:`LANDING_STATUS`).
    Not yet part of :func:`mcf.abi.csrmap.node_regmap`."""
    hi = KV_BASE_BITS - 32
    regs = [
        Register.single("KV_BASE_LO", 32, Access.RW, desc="KV region base address, bits 31..0"),
        Register.single("KV_BASE_HI", hi, Access.RW,
                        desc=f"KV region base address, bits {KV_BASE_BITS - 1}..32"),
        Register.single("KV_SLOT", KV_SLOT_BITS, Access.RW, desc="bytes per kv_id slot"),
        Register.single("KV_COUNT", KV_COUNT_BITS, Access.RW,
                        desc="kv_ids mapped; kv_id >= KV_COUNT is dropped (land_drop_unmapped)"),
        Register("LAND_OFF_DATA", tuple(
            Field(name, fld.shape.width, Access.RW,
                  desc="byte offset in the slot" if name == "offset" else "entry valid")
            for name, fld in LAND_OFF_ENTRY), "LAND_OFF entry staged for LAND_OFF_WR"),
        Register("LAND_OFF_WR", (
            Field("seq", META["seq"].width, Access.W,
                  desc="LAND_OFF entry to write with LAND_OFF_DATA"),
        ), "LAND_OFF table write port (one write per strobe)"),
    ]
    return regs + status_registers("land", LANDING_STATUS, "KV landing")
