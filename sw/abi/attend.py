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
(``q_addr``: the query record — PREFILL_TILE: the chunk's first query slot; ``out_addr``:
PREFILL's ``o/l`` row — PREFILL_TILE: the chunk's first token's row; in DECODE FIXED the
``heads`` 32-bit maxima :data:`mcf.abi.softmax.STATE_M` the phase computes against — an MBUF
slot, :func:`mcf.abi.decode_land.mbuf_address`, 16-byte aligned —; ignored otherwise;
``tokens`` and ``out_stride``: PREFILL_TILE's chunk, reserved otherwise), then ``blocks``
entries :data:`ATTEND_BLOCK` (``addr`` of the block's first token record — the landing rule,
:func:`mcf.abi.kv_reader.block_address`; a per-channel-K block's first group header —,
``tokens`` 1..``max_block``, ``pos0``). Reserved bits must be 0 (not checked). Every address
a record names — ``q_addr``, a block's ``addr``, ``out_addr`` where the record uses it, and
PREFILL_TILE's ``out_stride`` — is a multiple of :data:`ATT_ALIGN` (4 bytes: the unit's DMA
engines shift by 32-bit words only; a KV record, a query record and an output row are whole
words); ``ATT_LIST_BASE`` is taken with its low 2 bits as 0.

**The query** at ``q_addr`` is one :func:`mcf.abi.query.pack_query` record of
exactly ``heads`` heads: its header ``pos`` is the query position (causal mask in PREFILL).
DECODE: the QBUF slot the decode lander wrote (:func:`mcf.abi.decode_land.qbuf_address`).
PREFILL: the token's row in the driver's query region of ACT, :func:`prefill_query_address`,
written in the same format (the vector unit's requantised Q head rows).

**PREFILL_TILE: a chunk of query tokens on the tiled datapath** (issue #33,
``mcf.hdl.compute.tile_*``): the header's ``tokens`` (1..``max_chunk``, the executor's chunk
limit; :data:`ATTEND_CHUNK_BITS` bits) consecutive query tokens — token ``i``'s query slot
at ``prefill_query_address(q_addr, i, heads, head_dim)``, the layout of PREFILL's rows, each
a :func:`~mcf.abi.query.pack_query` record of ``heads`` heads at position ``pos₀ + i`` (``pos₀``:
slot 0's header, modulo ``2^KV_POS_BITS``) — against the block list, causal. Its
``tokens · heads`` rows (token × query head, row ``i · heads + h``) run in query tiles of
:data:`ATTEND_TILE_ROWS` rows against the blocks in list order, a tile's blocks requested
again per tile and a block a tile lies wholly before skipped
(:func:`mcf.golden.attention_tiled.tile_schedule`); P·V in the 8-bit row-scaled
:data:`mcf.abi.attn_tile.P8` format. Token ``i``'s ``heads · d`` ATTN_OUT words ``o/l``
(:func:`prefill_out_bytes`) go to :func:`prefill_tile_out_address` ``= out_addr + i ·
out_stride`` — PREFILL's output row, so a loop of PREFILL records with ``out_addr`` stepping
by ``out_stride`` writes the same places (``out_stride``: bytes, :data:`ATTEND_STRIDE_BITS`
bits, ``≥ prefill_out_bytes(heads, d)``; the node's attention rows interleave the KV heads, so
its stride is the whole row of all query heads). SINGLE only (:data:`SOFTMAX_OF_MODE`): P8's
row shift depends on the block's keys, so its sums are not split-invariant, and FIXED's unpacked
20-bit ``w`` (:data:`mcf.abi.attn_tile.PV_W`) does not fit the packed P·V arrays — a
``two_phase`` run keeps PREFILL EXACT records. The query tile size changes the order and the
number of block requests, never the bits (rows are independent). In the RTL a node with the
tiled path (``NodeConfig.tiled``, ``CAPS.tile_chunk_log2`` ≠ 0) runs PREFILL_TILE records on
its ``TileUnit`` (``max_chunk`` = ``tile_max_chunk``); a node without it (kr260) counts them as
``bad_record`` (the golden model with ``max_chunk`` = 0). The layer program
(:mod:`mcf.node.layer`) issues one PREFILL_TILE record per (chunk, KV head) on a tiled node in
a ``single`` run (:func:`mcf.node.layer.prefill_tile_chunk`).

**Outputs.** DECODE SINGLE (not normalised): per query head one payload, the state
``(m, l, o)`` (:func:`mcf.abi.softmax.pack_state`, ``state_bytes(d)``), staged whole in the send
unit's ``staged_attn`` FIFO for the SEND records (``src = ATTN``) that follow; the record is
done when all ``heads`` payloads are in the FIFO. DECODE MAX (the engine's ``AttnMode.MAX``, K
rows only): one payload of ``heads`` 32-bit maxima (:func:`max_payload_bytes`; ``M_EMPTY`` for
a head with no key), for a ``ReduceOp.MAX`` reduction. DECODE FIXED (``AttnMode.FIXED``
against the maxima at ``out_addr``): per head the state ``(M, l, o)`` with exact wrapped sums,
staged like SINGLE's; states of one query merged with ``SOFTMAX_MERGE`` (equal ``m``: an
integer sum) give the same bits for any split of its keys. PREFILL SINGLE (normalised,
causal): ``heads · d`` ATTN_OUT words ``o/l`` written at ``out_addr``; done
after the write's B responses. PREFILL EXACT: the unit runs a causal MAX job over the list,
keeps the maxima, then a causal FIXED job over the same list, normalised, written like SINGLE's
— ``o/l`` that does not depend on the blocks' partition.

PREFILL_TILE writes ``tokens`` rows, the record is done after the last write's B responses.

**Bad records** (counted, retired with ``done``, nothing emitted): undefined ``mode`` (3, or
PREFILL_TILE on an executor without the tiled path, ``max_chunk`` = 0), a ``softmax`` the mode
does not run (:data:`SOFTMAX_OF_MODE`),
``heads`` outside 1..``max_heads``, ``blocks`` 0 or above ``max_list`` (``bad_record``); a read
error on the list or the query, a block entry with ``tokens`` outside 1..``max_block``, an
address off :data:`ATT_ALIGN` (``q_addr``, a block's ``addr``, a used ``out_addr``, PREFILL_TILE's
``out_stride``), a query
whose header ``heads`` differs from ``arg.heads``, a read error on FIXED's maxima; PREFILL_TILE:
a header ``tokens`` outside 1..``max_chunk``, an ``out_stride`` below one output row, a query
slot whose ``pos`` is not ``pos₀ + i`` (``bad_list``). A write error on ``o/l`` is
counted (``write_errors``) and the record retires.
"""

from __future__ import annotations

from dataclasses import dataclass

from amaranth.hdl import unsigned
from amaranth.lib import data, enum

from .compute import DMA_ADDR_BITS
from .decode_land import DEC_ALIGN, query_slot_bytes
from .kv import ATTN_OUT, KV_POS_BITS, AttnMode
from .kv_reader import KV_BLOCK_TOKENS_BITS
from .landing import KV_ALIGN
from .regs import Access, Register, counters, status_registers

__all__ = [
    "AttendMode", "ATTEND_ARG", "ATTEND_HEADER", "ATTEND_BLOCK", "ATT_ENTRY_BYTES",
    "ATTEND_STATUS", "AttendArg", "AttendBlock", "AttendHeader",
    "attend_list_bytes", "prefill_query_address", "attend_registers",
    "ENGINE_MODE", "AttendSoftmax", "SOFTMAX_OF_MODE", "max_payload_bytes",
    "RUN_SOFTMAX", "PREFILL_SOFTMAX", "ATTEND_CHUNK_BITS", "ATTEND_STRIDE_BITS",
    "ATTEND_TILE_ROWS", "prefill_out_bytes", "prefill_tile_out_address", "ATT_ALIGN",
]

ATT_ENTRY_BYTES = 16
"""A list entry: one 128-bit beat."""

ATT_ALIGN = min(KV_ALIGN, DEC_ALIGN)
"""``q_addr``, block ``addr``, a used ``out_addr`` and ``out_stride`` are multiples of this (one
32-bit word: a block address is a landing address, :data:`~mcf.abi.landing.KV_ALIGN`; a query or
maxima address a decode slot, :data:`~mcf.abi.decode_land.DEC_ALIGN`, or an ACT row; others are
a bad list), ``ATT_LIST_BASE``'s low bits are taken as 0: the unit's DMA engines and the KV
reader's shift by words only."""


class AttendMode(enum.Enum, shape=2):
    """What an ATTEND computes (code 3 is undefined: a bad record)."""
    DECODE = 0        # per-head states (m, l, o) → staged for SEND src=ATTN
    PREFILL = 1       # one query token, causal, o/l → DDR at out_addr
    PREFILL_TILE = 2  # a chunk of query tokens on the tiled arrays (P8), causal, o/l rows → DDR


class AttendSoftmax(enum.Enum, shape=2):
    """How an ATTEND computes its softmax (``ATTEND_ARG.softmax``)."""
    SINGLE = 0    # one online-softmax pass (block states merged in list order)
    MAX = 1       # DECODE, two-phase phase 1: per-head maxima only (one payload)
    FIXED = 2     # DECODE, two-phase phase 2: states against the maxima at ``out_addr``
    EXACT = 3     # PREFILL: MAX then FIXED on this unit, normalised


SOFTMAX_OF_MODE = {
    AttendMode.DECODE: (AttendSoftmax.SINGLE, AttendSoftmax.MAX, AttendSoftmax.FIXED),
    AttendMode.PREFILL: (AttendSoftmax.SINGLE, AttendSoftmax.EXACT),
    AttendMode.PREFILL_TILE: (AttendSoftmax.SINGLE,),
}
"""The softmax settings each mode runs; any other pair is a bad record. PREFILL_TILE runs SINGLE
only: its P·V format :data:`mcf.abi.attn_tile.P8` is defined for one online pass (the row shift
depends on the block's keys) and FIXED's unpacked ``w`` does not fit the packed arrays."""

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


ATTEND_CHUNK_BITS = 16
"""Width of the header's ``tokens`` (PREFILL_TILE: query tokens in the chunk; the executor's
``max_chunk`` bounds it)."""

ATTEND_STRIDE_BITS = 24
"""Width of the header's ``out_stride`` (PREFILL_TILE: bytes between consecutive tokens'
``o/l`` rows)."""

ATTEND_TILE_ROWS = 64
"""Query rows (token × query head) per query tile of a PREFILL_TILE record: the rows that run
against a KV block between two requests of it (``q_tile`` of
:func:`mcf.golden.attention_tiled.tile_schedule`; ``TileMerge`` holds a tile's running states,
its ``rows``). It sets the order and the block requests, not the bits."""


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
    "tokens": unsigned(ATTEND_CHUNK_BITS),
    "out_stride": unsigned(ATTEND_STRIDE_BITS),
    "reserved": unsigned(128 - 2 * DMA_ADDR_BITS - ATTEND_CHUNK_BITS - ATTEND_STRIDE_BITS),
})
"""List entry 0 (``tokens``, ``out_stride``: PREFILL_TILE only, reserved in the other modes)."""

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
per pass; PREFILL_TILE once per query tile and block the tile does not lie wholly before),
records rejected on their ``arg``, records rejected on their list/query/maxima (read
error, bad entry, heads mismatch), ``o/l`` writes answered with an error. Registers
``att_<field>``."""


def _fields(layout: data.StructLayout, bits: int, names) -> dict:
    view = layout.from_bits(bits)
    return {n: int(view[n]) for n in names}


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

    @classmethod
    def unpack(cls, bits: int) -> AttendArg:
        f = _fields(ATTEND_ARG, bits, ("list", "blocks", "mode", "heads"))
        return cls(**f, softmax=AttendSoftmax(ATTEND_ARG.from_bits(bits).softmax))


@dataclass(frozen=True)
class AttendHeader:
    q_addr: int
    out_addr: int = 0
    tokens: int = 0          # PREFILL_TILE: query tokens in the chunk
    out_stride: int = 0      # PREFILL_TILE: bytes between consecutive tokens' o/l rows

    def pack(self) -> bytes:
        raw = ATTEND_HEADER.const({"q_addr": self.q_addr, "out_addr": self.out_addr,
                                   "tokens": self.tokens, "out_stride": self.out_stride})
        return raw.as_bits().to_bytes(ATT_ENTRY_BYTES, "little")

    @classmethod
    def unpack(cls, raw: bytes) -> AttendHeader:
        return cls(**_fields(ATTEND_HEADER, int.from_bytes(raw[:ATT_ENTRY_BYTES], "little"),
                             ("q_addr", "out_addr", "tokens", "out_stride")))


@dataclass(frozen=True)
class AttendBlock:
    addr: int
    tokens: int
    pos0: int = 0

    def pack(self) -> bytes:
        raw = ATTEND_BLOCK.const({"addr": self.addr, "tokens": self.tokens,
                                  "pos0": self.pos0 & ((1 << KV_POS_BITS) - 1)})
        return raw.as_bits().to_bytes(ATT_ENTRY_BYTES, "little")

    @classmethod
    def unpack(cls, raw: bytes) -> AttendBlock:
        return cls(**_fields(ATTEND_BLOCK, int.from_bytes(raw[:ATT_ENTRY_BYTES], "little"),
                             ("addr", "tokens", "pos0")))


def attend_list_bytes(header: AttendHeader, blocks: list[AttendBlock]) -> bytes:
    """The list as the driver writes it at ``ATT_LIST_BASE + list · 16``."""
    return header.pack() + b"".join(b.pack() for b in blocks)


def prefill_query_address(q_base: int, token: int, heads: int, head_dim: int) -> int:
    """PREFILL query row of chunk token ``token`` (0-based) in the driver's ACT query region:
    ``q_base + token · query_slot_bytes(heads, head_dim)`` (slots 16-byte aligned)."""
    return q_base + token * query_slot_bytes(heads, head_dim)


def prefill_out_bytes(heads: int, head_dim: int) -> int:
    """One token's ``o/l`` row of a PREFILL or PREFILL_TILE record: ``heads · head_dim``
    ATTN_OUT words."""
    return heads * head_dim * (ATTN_OUT.width // 8)


def prefill_tile_out_address(out_addr: int, token: int, out_stride: int) -> int:
    """PREFILL_TILE: the ``o/l`` row of chunk token ``token`` (0-based):
    ``out_addr + token · out_stride``."""
    return (out_addr + token * out_stride) % (1 << DMA_ADDR_BITS)


def attend_registers() -> list[Register]:
    """Configuration (the list table's 40-bit base over two words) and status ``att_*``."""
    hi = DMA_ADDR_BITS - 32
    return [
        Register.single("ATT_LIST_BASE_LO", 32, Access.RW,
                        desc="ATTEND list table base, bits 31..0 (bits 1..0 taken as 0)"),
        Register.single("ATT_LIST_BASE_HI", hi, Access.RW,
                        desc=f"ATTEND list table base, bits {DMA_ADDR_BITS - 1}..32"),
    ] + status_registers("att", ATTEND_STATUS, "ATTEND executor")
