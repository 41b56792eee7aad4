"""The EMIT executor's contract: the record's fields, the ACT K/V row layout it reads, its
registers and status counters (docs/node.md §3 EMIT row, §6 rule 3; issue #11 §1.3 "K/V
emitter output goes to local DDR always and to the packetizer when the record says replicate (a
tee, no second computation)"). The bit-exact golden model is :mod:`mcf.golden.emit`.

**Record** (:data:`mcf.abi.node.CMD`, ``cls = EMIT``, COMPUTE queue):

* ``meta`` — the fragment's :class:`~mcf.abi.meta.Meta` as MARS sends it (``op = KV_REPLICA``,
  ``kv_id``, ``seq = f·H_kv + h``, ``length = tokens · kv_token_bytes(head_dim)``, route). The
  local copy carries it with ``src`` replaced by the node's ``local_id`` (the landing engine
  then marks the directory entry OWNER); ``wait`` is the sequencer's landed wait as usual.
* ``arg`` — :data:`EMIT_ARG`: ``row`` (the fragment's first token row in the ACT K/V buffer),
  ``head`` (KV head ``h``), ``tokens`` (1..:func:`max_fragment_tokens`).
* ``flags.replicate`` — also stage the payload for the ``SEND src=EMIT`` the driver puts right
  after the EMIT (the network ``Meta`` is that SEND's).

**ACT K/V row layout** (what the QKV projection + RoPE write, what the emitter reads). Per token
``t`` one row at ``EMIT_KV_BASE + t · EMIT_ROW_STRIDE``; inside it, per KV head ``h`` a *pair* of
:func:`kv_pair_bytes` at ``h · kv_pair_bytes``: the head's K row (``head_dim``
:data:`mcf.abi.quant.ACT` words, 32-bit little-endian, RoPE applied), then its V row. (The
projection's output columns are permuted to this order by the weight layout, at no cost.) A
fragment is then one 2-D read — ``tokens`` rows of ``kv_pair_bytes`` with stride
``EMIT_ROW_STRIDE`` — whose 128-bit beats are exactly the quantizer's input beats
(:func:`mcf.abi.kv.kvq_in_layout`: 4 ACT codes per beat, K row then V row per token). The base
and the stride are multiples of :data:`EMIT_ALIGN` (16 B; the emitter ignores their low bits).

**Bad records** (counted in :data:`EMIT_STATUS`, retired with ``done``, nothing sent):
``meta.op ≠ KV_REPLICA``, ``tokens`` 0 or above :func:`max_fragment_tokens`, or
``meta.length ≠ tokens · kv_token_bytes`` (``bad_record``); a fragment whose read returned
SLVERR/DECERR on any beat is quantised but dropped whole (``read_errors``).
"""

from __future__ import annotations

from dataclasses import dataclass

from amaranth.hdl import unsigned
from amaranth.lib import data

from .compute import DMA_ADDR_BITS, DMA_STRIDE_BITS
from .framing import MAX_PAYLOAD
from .kv import (
    kv_token_bytes,
)
from .meta import Meta, Op
from .quant import ACT
from .regs import Access, Register, counters, status_registers

__all__ = [
    "EMIT_ARG", "EMIT_CONFIG", "EMIT_STATUS", "EmitArg", "EmitConfig", "kv_pair_bytes",
    "max_fragment_tokens", "emit_registers", "emit_check", "EMIT_ALIGN",
]

EMIT_ALIGN = 16
"""``EMIT_KV_BASE`` and ``EMIT_ROW_STRIDE`` are multiples of this (one 128-bit beat; a pair is
too, :func:`kv_pair_bytes`): the emitter takes their low 4 bits as 0, and its DMA reader has no
byte realigner. :class:`EmitConfig` refuses others."""

EMIT_ARG = data.StructLayout({
    "row": unsigned(16),      # first token row of the fragment in the ACT K/V buffer
    "head": unsigned(8),      # KV head h
    "tokens": unsigned(8),    # tokens in the fragment
})
"""``CMD.arg`` of an EMIT record (32 bits)."""

EMIT_CONFIG = data.StructLayout({
    "kv_base": unsigned(DMA_ADDR_BITS),      # ACT K/V buffer: token row 0
    "row_stride": unsigned(DMA_STRIDE_BITS),  # bytes between consecutive token rows
})
"""The emitter's configuration inputs (driven by the registers of :func:`emit_registers`)."""

EMIT_STATUS = counters("records", "tokens", "local", "staged", "bad_record", "read_errors",
                       "scale_sat")
"""Records executed (good or bad), tokens quantised, local packets handed on, staged copies
completed, bad records, fragments dropped for a read error, rows whose KV scale saturated.
Registers ``emit_<field>``."""

if EMIT_ARG.size != 32:
    raise AssertionError("EMIT_ARG must fill CMD.arg")  # pragma: no cover


def kv_pair_bytes(head_dim: int) -> int:
    """Bytes of one KV head's (K row, V row) pair in a token row of the ACT K/V buffer."""
    return 2 * head_dim * ACT.width // 8


def max_fragment_tokens(head_dim: int) -> int:
    """Most tokens one fragment may carry: one ``MAX_PAYLOAD`` packet (the staging capacity)."""
    return min(MAX_PAYLOAD // kv_token_bytes(head_dim), (1 << EMIT_ARG["tokens"].width) - 1)


@dataclass(frozen=True)
class EmitArg:
    row: int
    head: int
    tokens: int

    def pack(self) -> int:
        return EMIT_ARG.const({"row": self.row, "head": self.head,
                               "tokens": self.tokens}).as_bits()

    @classmethod
    def unpack(cls, raw: int) -> EmitArg:
        v = EMIT_ARG.from_bits(raw)
        return cls(int(v.row), int(v.head), int(v.tokens))


@dataclass(frozen=True)
class EmitConfig:
    kv_base: int
    row_stride: int

    def __post_init__(self):
        if self.kv_base % EMIT_ALIGN or self.row_stride % EMIT_ALIGN:
            raise ValueError(f"EMIT_KV_BASE {self.kv_base:#x} and EMIT_ROW_STRIDE "
                             f"{self.row_stride}: multiples of {EMIT_ALIGN} bytes")

    def pack(self) -> int:
        return EMIT_CONFIG.const({"kv_base": self.kv_base,
                                  "row_stride": self.row_stride}).as_bits()

    def pair_address(self, head_dim: int, row: int, head: int) -> int:
        """Address of token row ``row``'s K/V pair of KV head ``head``."""
        return (self.kv_base + row * self.row_stride
                + head * kv_pair_bytes(head_dim)) % (1 << DMA_ADDR_BITS)


def emit_registers() -> list[Register]:
    """The emitter's registers: the ACT K/V buffer (RW) and the ``emit_*`` counters."""
    hi = DMA_ADDR_BITS - 32
    return [
        Register.single("EMIT_KV_BASE_LO", 32, Access.RW,
                        desc="ACT K/V buffer (token row 0) address, bits 31..0 (bits 3..0 "
                             "taken as 0)"),
        Register.single("EMIT_KV_BASE_HI", hi, Access.RW,
                        desc=f"ACT K/V buffer address, bits {DMA_ADDR_BITS - 1}..32"),
        Register.single("EMIT_ROW_STRIDE", DMA_STRIDE_BITS, Access.RW,
                        desc="bytes between consecutive token rows of the ACT K/V buffer "
                             "(bits 3..0 taken as 0)"),
    ] + status_registers("emit", EMIT_STATUS, "KV emitter")


def emit_check(meta: Meta, arg: EmitArg, head_dim: int) -> bool:
    """Is the record good (see the module docstring's bad records)?"""
    return (meta.op == Op.KV_REPLICA and 1 <= arg.tokens <= max_fragment_tokens(head_dim)
            and meta.length == arg.tokens * kv_token_bytes(head_dim))
