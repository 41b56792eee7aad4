"""KV reader: landed KV blocks in DDR → the attention engine's ``k`` and ``v`` streams
(docs/node.md §4 "HP1: KV reader", §5 "a KV head's token records are contiguous in DDR, which is
what the KV reader streams for one attention block"; issue #11 §1.3 "Reader").

A **block request** (:data:`KV_BLOCK_REQ`) names ``tokens`` consecutive token records of one KV
head at ``addr`` — the ATTEND executor computes it with the landing rule
(:func:`block_address`: ``KV_BASE + kv_id · KV_SLOT + head · HEAD_STRIDE``, plus
``t0 · kv_token_bytes(d)`` for a block that starts at token ``t0`` of the head). The records are
the ``KVFormat.PER_TOKEN`` records of :func:`mcf.abi.kv.pack_kv_block` (``sk``, ``sv``, K row,
V row). The reader emits, per request, the block's K rows on ``k`` and its V rows on ``v``
(:func:`mcf.abi.kv.kv_beat_layout`): :func:`block_beats` is the bit-exact golden model.

A request with ``tokens = 0``, ``tokens > max_block`` or an ``addr`` off
:data:`mcf.abi.attend.ATT_ALIGN` (4 bytes; the reader's DMA realigns by words) is dropped and
counted (``rejects``); nothing is read and no beat is emitted for it.
"""

from __future__ import annotations

from dataclasses import dataclass

from amaranth.hdl import unsigned
from amaranth.lib import data

from .compute import DMA_ADDR_BITS
from .kv import KV_ELEM, KV_POS_BITS, kv_beat_layout, kv_token_bytes, unpack_kv_block
from .landing import KvLayout, LandingConfig
from .regs import Register, counters, status_registers

__all__ = [
    "KV_BLOCK_TOKENS_BITS", "KV_BLOCK_REQ", "KvBlockReq", "KV_READER_STATUS",
    "block_address", "block_beats", "kv_reader_registers",
]

KV_BLOCK_TOKENS_BITS = 16
"""Token count field of a block request (the engine's ``max_block`` bounds it)."""

KV_BLOCK_REQ = data.StructLayout({
    "addr": unsigned(DMA_ADDR_BITS),
    "tokens": unsigned(KV_BLOCK_TOKENS_BITS),
    "pos0": unsigned(KV_POS_BITS),
    "last": unsigned(1),
    "k_only": unsigned(1),
})
"""One attention block: the byte address of its first token record, the token count, the
position of its first token (token ``i`` has position ``pos0 + i``, modulo 2^KV_POS_BITS, for the
causal mask), ``last`` (the job's final block; counted in ``jobs``) and ``k_only`` (a MAX-mode
job of the two-phase split: the K rows only, no V block)."""

KV_READER_STATUS = counters("blocks", "tokens", "jobs", "rejects", "bus_errors")
"""Blocks whose last K beat was emitted, their tokens, blocks with ``last``, requests dropped
(``tokens`` 0 or above ``max_block``), non-OKAY AXI read beats (their data are passed on as
read; the count tells software the numbers are suspect). Registers ``kvr_<field>``."""


@dataclass(frozen=True)
class KvBlockReq:
    """Host view of :data:`KV_BLOCK_REQ`."""
    addr: int
    tokens: int
    pos0: int = 0
    last: bool = False
    k_only: bool = False

    def pack(self) -> int:
        return KV_BLOCK_REQ.const({
            "addr": self.addr, "tokens": self.tokens,
            "pos0": self.pos0 & ((1 << KV_POS_BITS) - 1),
            "last": int(self.last), "k_only": int(self.k_only)}).as_bits()


def block_address(cfg: LandingConfig, kv_id: int, head: int, layout: KvLayout,
                  t0: int = 0, head_dim: int | None = None) -> int:
    """DDR address of KV head ``head``'s records of ``kv_id``, from its token ``t0``
    (``head_dim`` needed only when ``t0 > 0``): the landing rule of
    :func:`mcf.abi.landing.kv_address` with ``LAND_OFF`` replaced by the head's start."""
    if not 0 <= kv_id < cfg.kv_count:
        raise ValueError(f"kv_id {kv_id} is unmapped (KV_COUNT = {cfg.kv_count})")
    if not 0 <= head < layout.kv_slot // layout.head_stride:
        raise ValueError(f"head {head} outside the slot")
    off = head * layout.head_stride
    if t0:
        if head_dim is None:
            raise ValueError("t0 > 0 needs head_dim")
        off += t0 * kv_token_bytes(head_dim)
    return (cfg.kv_base + kv_id * cfg.kv_slot + off) % (1 << DMA_ADDR_BITS)


def _word(values, width: int) -> int:
    out = 0
    for i, v in enumerate(values):
        out |= (int(v) & ((1 << width) - 1)) << (width * i)
    return out


def block_beats(records: bytes, head_dim: int, lanes: int, pos0: int = 0,
                k_only: bool = False) -> tuple[list[int], list[int]]:
    """Golden model of the reader for one block: the packed ``k`` and ``v`` beats
    (:func:`mcf.abi.kv.kv_beat_layout`) of ``records`` (whole token records).

    K beats: ``head_dim/lanes`` per token, INT4 codes ``lanes`` per beat, ``scale_k``,
    ``scale_v`` and ``pos`` of the token on every beat of its row, ``v = 0``, ``last`` on the
    block's final beat. V beats: the same rows of V codes, ``v = 1``, ``last`` on the final beat,
    ``scale_k``/``scale_v``/``pos`` zero (the engine takes the V scale with the K row). No V
    beats when ``k_only``."""
    lay = kv_beat_layout(lanes)
    k4, sk, v4, sv = unpack_kv_block(records, head_dim)
    n = len(sk)
    kb, vb = [], []
    for t in range(n):
        for c in range(0, head_dim, lanes):
            last = int(t == n - 1 and c + lanes >= head_dim)
            kb.append(lay.const({
                "data": _word(k4[t, c:c + lanes], KV_ELEM.width),
                "scale_k": int(sk[t]), "scale_v": int(sv[t]),
                "pos": (pos0 + t) & ((1 << KV_POS_BITS) - 1), "v": 0,
                "last": last}).as_bits())
            if not k_only:
                vb.append(lay.const({
                    "data": _word(v4[t, c:c + lanes], KV_ELEM.width), "v": 1,
                    "last": last}).as_bits())
    return kb, vb


def kv_reader_registers() -> list[Register]:
    """The KV reader's status counters ``kvr_*`` (:data:`KV_READER_STATUS`); it has no
    configuration (its addresses come with each request)."""
    return status_registers("kvr", KV_READER_STATUS, "KV reader")

