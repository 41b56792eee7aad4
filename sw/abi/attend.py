"""ATTEND executor: the ATTEND record, its block list in DDR, the query and output formats, the
status counters and registers (docs/node.md §3 "ATTEND's block list lives in DDR, one list per
step", §5, §7; issue #11 §1.2–1.4). Its bit-exact golden model is
:func:`mcf.golden.attend_unit.attend_model`.

**The record** (:class:`~mcf.abi.node.RecordClass` ``ATTEND``, COMPUTE queue):

* ``meta``: a :data:`mcf.abi.meta.META` whose ``kv_id`` is the first block's ``kv_id`` — the
  sequencer issues the record once ``landed(meta.kv_id) ≥ wait``. The unit ignores ``meta``.
* ``wait``: that landed count (0: no wait). Per-block landed waits are **not** supported: the
  driver orders the ATTEND behind the landings of every block it names (docs/node.md §7).
* ``arg`` = :data:`ATTEND_ARG`: ``list`` — the list's 16-byte entry index in the list table
  (list address ``ATT_LIST_BASE + list · 16``), ``blocks`` — block entries (1..``max_list``),
  ``mode`` (:class:`AttendMode`), ``heads`` — query heads sharing the KV head (1..``max_heads``),
  ``softmax`` (:class:`AttendSoftmax`): one online-softmax pass, or a phase of the two-phase
  softmax whose sums do not depend on how the keys are split into blocks or nodes.

**The list** (16-byte entries, little-endian): entry 0 is the header :data:`ATTEND_HEADER`
(``q_addr``: the query record; ``out_addr``: PREFILL's ``o/l`` row; in DECODE FIXED the
``heads`` 32-bit maxima :data:`mcf.abi.softmax.STATE_M` the phase computes against — an MBUF
slot, :func:`mcf.abi.decode_land.mbuf_address`, 16-byte aligned —; ignored otherwise), then
``blocks`` entries :data:`ATTEND_BLOCK` (``addr`` of the block's first token record — the
landing rule, :func:`mcf.abi.kv_reader.block_address` —, ``tokens`` 1..``max_block``,
``pos0``). Reserved bits must be 0 (not checked).

**The query** at ``q_addr`` (any alignment) is one :func:`mcf.abi.query.pack_query` record of
exactly ``heads`` heads: its header ``pos`` is the query position (causal mask in PREFILL).
DECODE: the QBUF slot the decode lander wrote (:func:`mcf.abi.decode_land.qbuf_address`).
PREFILL: the token's row in the driver's query region of ACT, :func:`prefill_query_address`,
written in the same format (the vector unit's requantised Q head rows).

**Outputs.** DECODE SINGLE (not normalised): per query head one payload, the state
``(m, l, o)`` (:func:`mcf.abi.softmax.pack_state`, ``state_bytes(d)``), staged whole in the send
unit's ``staged_attn`` FIFO for the SEND records (``src = ATTN``) that follow; the record is
done when all ``heads`` payloads are in the FIFO. DECODE MAX (the engine's ``AttnMode.MAX``, K
rows only): one payload of ``heads`` 32-bit maxima (:func:`max_payload_bytes`; ``M_EMPTY`` for
a head with no key), for a ``ReduceOp.MAX`` reduction. DECODE FIXED (``AttnMode.FIXED``
against the maxima at ``out_addr``): per head the state ``(M, l, o)`` with exact wrapped sums,
staged like SINGLE's; states of one query merged with ``SOFTMAX_MERGE`` (equal ``m``: an
integer sum) give the same bits for any split of its keys. PREFILL SINGLE (normalised,
causal): ``heads · d`` ATTN_OUT words ``o/l`` written at ``out_addr`` (any alignment); done
after the write's B responses. PREFILL EXACT: the unit runs a causal MAX job over the list,
keeps the maxima, then a causal FIXED job over the same list, normalised, written like SINGLE's
— ``o/l`` that does not depend on the blocks' partition.

**Bad records** (counted, retired with ``done``, nothing emitted): undefined ``mode``, a
``softmax`` the mode does not run (:data:`SOFTMAX_OF_MODE`),
``heads`` outside 1..``max_heads``, ``blocks`` 0 or above ``max_list`` (``bad_record``); a read
error on the list or the query, a block entry with ``tokens`` outside 1..``max_block``, a query
whose header ``heads`` differs from ``arg.heads``, a read error on FIXED's maxima
(``bad_list``). A write error on ``o/l`` is
counted (``write_errors``) and the record retires.
"""

from __future__ import annotations

from dataclasses import dataclass

from amaranth.hdl import unsigned
from amaranth.lib import data, enum

from .compute import DMA_ADDR_BITS
from .csrmap import counters
from .decode_land import query_slot_bytes
from .kv import KV_POS_BITS, AttnMode
from .kv_reader import KV_BLOCK_TOKENS_BITS
from .regs import Access, Register, status_registers

__all__ = [
    "AttendMode", "ATTEND_ARG", "ATTEND_HEADER", "ATTEND_BLOCK", "ATT_ENTRY_BYTES",
    "ATTEND_STATUS", "AttendArg", "AttendBlock", "AttendHeader",
    "attend_list_bytes", "prefill_query_address", "attend_registers",
    "ENGINE_MODE", "AttendSoftmax", "SOFTMAX_OF_MODE", "max_payload_bytes",
    "RUN_SOFTMAX", "PREFILL_SOFTMAX",
]

ATT_ENTRY_BYTES = 16
"""A list entry: one 128-bit beat."""


class AttendMode(enum.Enum, shape=2):
    """What an ATTEND computes (codes 2, 3 are undefined: a bad record)."""
    DECODE = 0    # per-head states (m, l, o) → staged for SEND src=ATTN
    PREFILL = 1   # causal, o/l → DDR at out_addr


class AttendSoftmax(enum.Enum, shape=2):
    """How an ATTEND computes its softmax (``ATTEND_ARG.softmax``)."""
    SINGLE = 0    # one online-softmax pass (block states merged in list order)
    MAX = 1       # DECODE, two-phase phase 1: per-head maxima only (one payload)
    FIXED = 2     # DECODE, two-phase phase 2: states against the maxima at ``out_addr``
    EXACT = 3     # PREFILL: MAX then FIXED on this unit, normalised


SOFTMAX_OF_MODE = {
    AttendMode.DECODE: (AttendSoftmax.SINGLE, AttendSoftmax.MAX, AttendSoftmax.FIXED),
    AttendMode.PREFILL: (AttendSoftmax.SINGLE, AttendSoftmax.EXACT),
}
"""The softmax settings each mode runs; any other pair is a bad record."""

ENGINE_MODE = {AttendSoftmax.SINGLE: AttnMode.SINGLE, AttendSoftmax.MAX: AttnMode.MAX,
               AttendSoftmax.FIXED: AttnMode.FIXED}
"""The engine mode of an ATTEND's job (EXACT: a MAX job, then a FIXED job)."""


RUN_SOFTMAX = ("single", "two_phase")
"""How a run's attention computes its softmax: ``single`` — PREFILL SINGLE and DECODE SINGLE
(one online pass per ATTEND, per-node states merged along the reduction tree); ``two_phase`` —
PREFILL EXACT and the two-phase decode (DECODE MAX, a ``ReduceOp.MAX`` all-reduce of the
maxima, DECODE FIXED against them, states summed): the attention does not depend on how the
keys are split into blocks or over nodes, so a run's bits do not depend on N."""

PREFILL_SOFTMAX = {"single": AttendSoftmax.SINGLE, "two_phase": AttendSoftmax.EXACT}
"""The PREFILL ATTEND setting of each :data:`RUN_SOFTMAX`."""


def max_payload_bytes(heads: int) -> int:
    """DECODE MAX's payload: ``heads`` 32-bit maxima."""
    return 4 * heads


ATTEND_ARG = data.StructLayout({
    "list": unsigned(16),
    "blocks": unsigned(8),
    "mode": unsigned(2),
    "heads": unsigned(4),
    "softmax": AttendSoftmax,
})
"""``CMD.arg`` of an ATTEND record."""

ATTEND_HEADER = data.StructLayout({
    "q_addr": unsigned(DMA_ADDR_BITS),
    "out_addr": unsigned(DMA_ADDR_BITS),
    "reserved": unsigned(128 - 2 * DMA_ADDR_BITS),
})
"""List entry 0."""

ATTEND_BLOCK = data.StructLayout({
    "addr": unsigned(DMA_ADDR_BITS),
    "tokens": unsigned(KV_BLOCK_TOKENS_BITS),
    "pos0": unsigned(KV_POS_BITS),
    "reserved": unsigned(128 - DMA_ADDR_BITS - KV_BLOCK_TOKENS_BITS - KV_POS_BITS),
})
"""List entries 1..blocks: one KV block (token records of one KV head)."""

if ATTEND_HEADER.size != 8 * ATT_ENTRY_BYTES or ATTEND_BLOCK.size != 8 * ATT_ENTRY_BYTES:
    raise AssertionError("list entries are one 128-bit beat")  # pragma: no cover

ATTEND_STATUS = counters("records", "blocks", "bad_record", "bad_list", "write_errors")
"""Records done (good ones), blocks requested (PREFILL EXACT requests its list twice, once
per pass), records rejected on their ``arg``, records rejected on their list/query/maxima (read
error, bad entry, heads mismatch), ``o/l`` writes answered with an error. Registers
``att_<field>``."""


@dataclass(frozen=True)
class AttendArg:
    list: int
    blocks: int
    mode: int
    heads: int
    softmax: AttendSoftmax = AttendSoftmax.SINGLE

    def pack(self) -> int:
        return ATTEND_ARG.const({"list": self.list, "blocks": self.blocks, "mode": self.mode,
                                 "heads": self.heads, "softmax": self.softmax}).as_bits()


@dataclass(frozen=True)
class AttendHeader:
    q_addr: int
    out_addr: int = 0

    def pack(self) -> bytes:
        raw = ATTEND_HEADER.const({"q_addr": self.q_addr, "out_addr": self.out_addr})
        return raw.as_bits().to_bytes(ATT_ENTRY_BYTES, "little")


@dataclass(frozen=True)
class AttendBlock:
    addr: int
    tokens: int
    pos0: int = 0

    def pack(self) -> bytes:
        raw = ATTEND_BLOCK.const({"addr": self.addr, "tokens": self.tokens,
                                  "pos0": self.pos0 & ((1 << KV_POS_BITS) - 1)})
        return raw.as_bits().to_bytes(ATT_ENTRY_BYTES, "little")


def attend_list_bytes(header: AttendHeader, blocks: list[AttendBlock]) -> bytes:
    """The list as the driver writes it at ``ATT_LIST_BASE + list · 16``."""
    return header.pack() + b"".join(b.pack() for b in blocks)


def prefill_query_address(q_base: int, token: int, heads: int, head_dim: int) -> int:
    """PREFILL query row of chunk token ``token`` (0-based) in the driver's ACT query region:
    ``q_base + token · query_slot_bytes(heads, head_dim)`` (slots 16-byte aligned)."""
    return q_base + token * query_slot_bytes(heads, head_dim)


def attend_registers() -> list[Register]:
    """Configuration (the list table's 40-bit base over two words) and status ``att_*``."""
    hi = DMA_ADDR_BITS - 32
    return [
        Register.single("ATT_LIST_BASE_LO", 32, Access.RW,
                        desc="ATTEND list table base, bits 31..0"),
        Register.single("ATT_LIST_BASE_HI", hi, Access.RW,
                        desc=f"ATTEND list table base, bits {DMA_ADDR_BITS - 1}..32"),
    ] + status_registers("att", ATTEND_STATUS, "ATTEND executor")
