"""Host/hardware contract of the node's metadata ingress (docs/node.md §2, issue #11; paper §4:
MARS's per-node records reach the datapath without the PS on the per-record path).

The PS driver writes 16-byte :data:`CMD` entries into one DDR ring per queue and rings the
doorbell by writing ``CMDq_PROD``; the PL's ring reader (:mod:`mcf.hdl.node.ingress`) fetches
them, drops malformed ones (counted in :data:`INGRESS_STATUS`) and advances ``CMDq_CONS``.
Host code packs entries with the very layout the hardware decodes (:class:`Cmd`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from amaranth.hdl import unsigned
from amaranth.lib import data, enum

from .framing import MAX_PAYLOAD
from .meta import META, Op
from .regs import COUNTER_BITS, Access, Field, Register, counters, status_registers

__all__ = [
    "RecordClass", "Queue", "PayloadSource", "CMD_FLAGS", "CMD", "CMD_BYTES", "CMD_RING_MAX_LOG2",
    "CMD_INDEX_BITS", "CMD_ADDR_BITS", "CMD_WAIT_BITS", "CLASS_QUEUES", "Cmd", "cmd_raw",
    "cmd_malformed", "INGRESS_STATUS", "ingress_registers", "N_QUEUES", "IRQ_CAUSES",
    "irq_registers", "dir_land_register",
]


class RecordClass(enum.Enum, shape=4):
    """What the sequencer does with a record (docs/node.md §3). Codes 8–15 are unassigned."""
    NOP = 0
    SEND = 1
    DIR = 2
    JOB = 3
    EMIT = 4
    ATTEND = 5
    WAIT = 6
    MARK = 7


class Queue(enum.Enum, shape=1):
    """The two in-order queues; ring ``CMDq`` feeds queue ``q``."""
    NET = 0
    COMPUTE = 1


N_QUEUES = len(Queue)


class PayloadSource(enum.Enum, shape=3):
    """Where a SEND's payload comes from. Codes 5–7 are unassigned."""
    HDR = 0     # header-only packet, ``meta.length`` must be 0
    KV = 1      # the ``meta.kv_id`` slot in DDR
    QBUF = 2    # the decode query buffer
    ATTN = 3    # the attention engine's staged state
    EMIT = 4    # the KV emitter's staged fragment


CLASS_QUEUES: dict[RecordClass, frozenset[Queue]] = {
    RecordClass.NOP: frozenset(Queue),
    RecordClass.SEND: frozenset(Queue),
    RecordClass.DIR: frozenset({Queue.COMPUTE}),
    RecordClass.JOB: frozenset({Queue.COMPUTE}),
    RecordClass.EMIT: frozenset({Queue.COMPUTE}),
    RecordClass.ATTEND: frozenset({Queue.COMPUTE}),
    RecordClass.WAIT: frozenset(Queue),
    RecordClass.MARK: frozenset(Queue),
}
"""Which queues run each class (docs/node.md §3); a class on another queue is malformed."""

CMD_FLAGS = data.StructLayout({
    "irq": unsigned(1),        # raise the interrupt when the record retires
    "replicate": unsigned(1),  # EMIT: also send the fragment (the tee)
    "reserved": unsigned(2),   # must be 0
})

CMD_WAIT_BITS = 20
CMD = data.StructLayout({
    "meta": unsigned(64),            # SEND: the packet's Meta (mcf.abi.META); else an argument
    "cls": RecordClass,
    "queue": Queue,
    "src": PayloadSource,
    "flags": CMD_FLAGS,
    "wait": unsigned(CMD_WAIT_BITS),
    "arg": unsigned(32),
})
"""One command-ring entry: 16 bytes = one 128-bit HP beat, little-endian (docs/node.md §2).

``meta`` of a SEND is the packet's ``Meta`` as it leaves. For an ``Op.INVALIDATE`` packet (a
header-only HDR SEND) ``Meta.seq`` is not a fragment index but the
:class:`mcf.abi.meta.InvalidateKind`: ``seq = 0`` (DRAIN) is applied by the receiver's local
sink as a directory DRAIN of ``meta.kv_id`` (``lsink_drains``), any other ``seq`` is consumed
and counted (``lsink_drop_invalidate``) — a FREE is never a packet but the DIR record
(``arg = DirOp.FREE``, ``wait`` = the packets it releases)."""

CMD_BYTES = CMD.size // 8
CMD_RING_MAX_LOG2 = 16          # CMDq_SIZE ≤ 16: at most 2^16 entries (1 MiB); the ring
                                # reader takes a larger SIZE as 16, the driver refuses it
CMD_INDEX_BITS = 16             # free-running PROD / CONS indices
CMD_ADDR_BITS = 40              # CMDq_BASE: a physical address

if CMD.size != 128 or META.size > CMD["meta"].width:
    raise AssertionError("CMD must be one 128-bit beat holding a Meta")  # pragma: no cover


def cmd_raw(**fields: int) -> int:
    """An entry from raw field integers (any value that fits, valid or not); ``flags`` is the
    4-bit field as an integer. Unnamed fields are 0."""
    raw = 0
    for name, value in fields.items():
        fld = CMD[name]
        width = fld.width
        if not 0 <= value < (1 << width):
            raise ValueError(f"CMD.{name}={value} does not fit in {width} bits")
        raw |= value << fld.offset
    return raw


def _field(raw: int, name: str) -> int:
    fld = CMD[name]
    return (raw >> fld.offset) & ((1 << fld.width) - 1)


def cmd_malformed(raw: int, queue: Queue, exclude: tuple[RecordClass, ...] = ()) -> bool:
    """Golden model of the ring reader's record checks (the ones that need no sequencer state):
    unassigned ``cls``; ``queue`` ≠ the ring's; a class the queue does not run; reserved flag
    bits set; SEND with an unassigned ``src`` or ``meta.op``, ``length > MAX_PAYLOAD``, or HDR
    with ``length ≠ 0``; a class in ``exclude`` (one the node build does not execute)."""
    cls, q = _field(raw, "cls"), _field(raw, "queue")
    if cls not in {c.value for c in RecordClass} or q != queue.value:
        return True
    if queue not in CLASS_QUEUES[RecordClass(cls)] or RecordClass(cls) in exclude:
        return True
    if (_field(raw, "flags") >> CMD_FLAGS["reserved"].offset) != 0:
        return True
    if cls == RecordClass.SEND.value:
        meta = _field(raw, "meta")
        op = (meta >> META["op"].offset) & ((1 << META["op"].width) - 1)
        length = (meta >> META["length"].offset) & ((1 << META["length"].width) - 1)
        src = _field(raw, "src")
        if src not in {s.value for s in PayloadSource} or op not in {o.value for o in Op}:
            return True
        if length > MAX_PAYLOAD or (src == PayloadSource.HDR.value and length != 0):
            return True
    return False


@dataclass(frozen=True)
class Cmd:
    """Host view of one :data:`CMD` entry. ``meta`` is the raw 64-bit word (a
    :meth:`mcf.abi.meta.Meta.pack` for SEND)."""
    cls: RecordClass
    queue: Queue
    meta: int = 0
    src: PayloadSource = PayloadSource.HDR
    irq: bool = False
    replicate: bool = False
    wait: int = 0
    arg: int = 0

    def pack(self) -> bytes:
        """The entry's 16 bytes. Raises on out-of-range fields."""
        return cmd_raw(meta=self.meta, cls=self.cls.value, queue=self.queue.value,
                       src=self.src.value, flags=int(self.irq) | int(self.replicate) << 1,
                       wait=self.wait, arg=self.arg).to_bytes(CMD_BYTES, "little")

    @classmethod
    def unpack(cls, raw: bytes) -> Cmd:
        """Decode 16 bytes; raises ``ValueError`` for unassigned codes or reserved flags."""
        if len(raw) != CMD_BYTES:
            raise ValueError(f"a CMD entry is {CMD_BYTES} bytes, got {len(raw)}")
        word = int.from_bytes(raw, "little")
        flags = CMD_FLAGS.from_bits(_field(word, "flags"))
        if int(flags.reserved):
            raise ValueError("CMD.flags has reserved bits set")
        return cls(cls=RecordClass(_field(word, "cls")), queue=Queue(_field(word, "queue")),
                   meta=_field(word, "meta"), src=PayloadSource(_field(word, "src")),
                   irq=bool(flags.irq), replicate=bool(flags.replicate),
                   wait=_field(word, "wait"), arg=_field(word, "arg"))

    def replace(self, **changes) -> Cmd:
        return dataclasses.replace(self, **changes)


INGRESS_STATUS = counters("records", "bad_records", "overruns", "read_errors", "bursts",
                          "last_bad")
"""One ring reader: well-formed records pushed to its queue, malformed records skipped, PROD
writes ignored as ring overruns, entries skipped on non-OKAY read beats, read bursts issued,
the ring index (free-running, 16 bits) of the last malformed record (docs/node.md §2). The
reader checks the record alone (:func:`cmd_malformed`), never the node's configuration: a KV
SEND of an unmapped ``kv_id`` or a JOB beyond the table is well-formed here and counted where
it fails (``send_drop_unmapped``, ``jobs_bad_index``)."""

if (1 << CMD_INDEX_BITS) > (1 << COUNTER_BITS):
    raise AssertionError("last_bad must hold a ring index")  # pragma: no cover


def ingress_registers(n_queues: int = N_QUEUES) -> list[Register]:
    """Per ring ``q``: ``CMDq_BASE_LO``/``_HI`` (the 40-bit base split over two 32-bit words,
    since a register holds ≤ 32 bits), ``CMDq_SIZE``, ``CMDq_PROD`` (RW: the doorbell),
    ``CMDq_CONS`` (R) and the status counters ``cmdq_<counter>``. Not yet in the node map."""
    regs = []
    for q in range(n_queues):
        regs += [
            Register.single(f"CMD{q}_BASE_LO", 32, Access.RW,
                            desc=f"ring {q} physical base, bits 31..0 (16-byte aligned)"),
            Register.single(f"CMD{q}_BASE_HI", CMD_ADDR_BITS - 32, Access.RW,
                            desc=f"ring {q} physical base, bits {CMD_ADDR_BITS - 1}..32"),
            Register.single(f"CMD{q}_SIZE", CMD_RING_MAX_LOG2.bit_length(), Access.RW,
                            desc=f"ring {q}: log2 of the entry count, ≤ {CMD_RING_MAX_LOG2} "
                                 f"(CAPS.ring_max_log2; a larger value acts as "
                                 f"{CMD_RING_MAX_LOG2}); at {CMD_RING_MAX_LOG2} at most "
                                 f"2^{CMD_INDEX_BITS} − 1 records in flight"),
            Register.single(f"CMD{q}_PROD", CMD_INDEX_BITS, Access.W,
                            desc=f"ring {q} doorbell: the new producer index (free-running); "
                                 "ignored and counted if it overruns the ring"),
            Register.single(f"CMD{q}_HEAD", CMD_INDEX_BITS, Access.R,
                            desc=f"ring {q}: the last producer index the PL accepted"),
            Register.single(f"CMD{q}_CONS", CMD_INDEX_BITS, Access.R,
                            desc=f"ring {q} consumer index (free-running), driven by the PL"),
        ]
        regs += status_registers(f"cmd{q}", INGRESS_STATUS, f"command ring {q}")
    return regs


IRQ_CAUSES: tuple[tuple[str, str], ...] = (
    ("mark0", "a NET record with flags.irq retired"),
    ("mark1", "a COMPUTE record with flags.irq retired"),
    ("halt0", "the NET queue halted (watchdog): see its SEQ status"),
    ("halt1", "the COMPUTE queue halted (watchdog): see its SEQ status"),
    ("bad_record", "a ring reader skipped a malformed record, or a compute unit rejected one"
                   " (JOB index/entry, EMIT, ATTEND arg/list, KV block request)"),
    ("overrun", "a doorbell overran its ring and was ignored"),
    ("bus_error", "a DMA read or write answered SLVERR/DECERR"),
    ("drop", "a local packet was dropped (landing: unmapped kv_id, bad seq, bad op; local "
             "sink: bad op, INVALIDATE not DRAIN; decode lander) or a SEND record was not sent "
             "(send_drop_unmapped, send_drop_bad_seq, send_drop_bad_record)"),
    ("link_error", "a link receiver dropped a frame (CRC, header, oversize, stale) or saw a "
                   "sequence gap: see its linkN_rx_* counters"),
)
"""Interrupt causes, one bit each in ``IRQ_STATUS`` (RW1C) and ``IRQ_ENABLE`` (RW), in this
order. ``irq`` = OR of ``IRQ_STATUS & IRQ_ENABLE`` (docs/node.md §10 (d))."""


def irq_registers() -> list[Register]:
    """``IRQ_STATUS`` (sticky causes, write 1 to clear) and ``IRQ_ENABLE`` (mask)."""
    return [
        Register("IRQ_STATUS", tuple(Field(n, 1, Access.RW1C, desc=d) for n, d in IRQ_CAUSES),
                 "interrupt causes (sticky; write 1 to clear)"),
        Register("IRQ_ENABLE", tuple(Field(n, 1, Access.RW, desc=f"enable: {d}")
                                     for n, d in IRQ_CAUSES), "interrupt enables"),
    ]


def dir_land_register() -> Register:
    """``DIR_LAND``: declare one packet of ``kv_id`` landed, as if the landing engine had
    written it (a directory land event, :data:`mcf.abi.directory.LAND_EVENT`). For KV the PS
    placed in DDR itself — a restored checkpoint or a cached prompt prefix — so the sequencer's
    landed waits see it; one write per packet."""
    kv_bits = META["kv_id"].width
    return Register("DIR_LAND", (
        Field("kv_id", kv_bits, Access.W, desc="kv_id of the packet declared landed"),
        Field("owner", 1, Access.W, desc="1: this node's own copy (state OWNER), 0: VALID"),
    ), "directory land event from the PS (one per write)")
