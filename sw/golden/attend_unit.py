"""Golden model of the ATTEND executor (``mcf.hdl.node.attend.AttendUnit``; docs/node.md §3, §7):
one ATTEND record — its block list, query and KV token records read from memory — to the
payloads, ``o/l`` writes or bad-record counter the unit produces, bit for bit.

The record, list, query and output formats are the ABI's (:mod:`mcf.abi.attend`); the
attention arithmetic is :mod:`mcf.golden.attention`'s (DECODE, PREFILL) and
:mod:`mcf.golden.attention_tiled`'s (PREFILL_TILE: the tiled arrays' P8 arithmetic through the
packed-array model, ``array=True``, in :func:`~mcf.golden.attention_tiled.tile_schedule`'s
order). The RTL ``AttendUnit`` runs DECODE and PREFILL; a node with the tiled path
(``NodeConfig.tiled``) sends PREFILL_TILE records to its ``TileUnit`` instead, and the two
together are the model with ``max_chunk`` = ``tile_max_chunk``; a node without it is the model
with ``max_chunk = 0`` (PREFILL_TILE records are bad records).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..abi.attend import (
    ATT_ALIGN,
    ATT_ENTRY_BYTES,
    ATTEND_ARG,
    ATTEND_TILE_ROWS,
    SOFTMAX_OF_MODE,
    AttendBlock,
    AttendHeader,
    AttendMode,
    AttendSoftmax,
    max_payload_bytes,
    prefill_out_bytes,
    prefill_query_address,
    prefill_tile_out_address,
)
from ..abi.attn_tile import P8
from ..abi.kv import KV_POS_BITS, kv_token_bytes, unpack_kv_block
from ..abi.kv_channel import KVFormat, kv_channel_block_bytes, unpack_kv_channel_block
from ..abi.query import QUERY_HEADER, QUERY_HEADER_BYTES, QueryRecord, query_bytes, unpack_query
from ..abi.softmax import pack_state
from .attention import (
    KVBlock,
    KVChannelBlock,
    attend_fixed,
    attend_max,
    attend_single,
    normalize_state,
)
from .attention_tiled import attend_prefill_tiled, tile_schedule

__all__ = ["AttendResult", "attend_model", "tile_block_requests"]

_POS_MASK = (1 << KV_POS_BITS) - 1


@dataclass
class AttendResult:
    """What one record produces: ``payloads`` (DECODE: one state per head; MAX: one payload
    of maxima), ``writes`` (PREFILL: one ``(out_addr, bytes)``; PREFILL_TILE: one per chunk
    token, in token order), or ``bad`` (the counter it increments); ``blocks``: the block
    requests it makes (``att_blocks``)."""
    payloads: list[bytes]
    writes: list[tuple[int, bytes]] = field(default_factory=list)
    bad: str | None = None
    blocks: int = 0

    @property
    def write(self) -> tuple[int, bytes] | None:
        """The one ``o/l`` write of a PREFILL record (``None`` if it writes none)."""
        return self.writes[0] if len(self.writes) == 1 else None


def _query(read, addr: int, heads: int, head_dim: int) -> QueryRecord | None:
    """The query record at ``addr``; ``None`` if its header does not carry ``heads`` heads."""
    raw = read(addr, query_bytes(heads, head_dim))
    hfld = QUERY_HEADER["heads"]
    if int.from_bytes(raw[:QUERY_HEADER_BYTES], "little") >> hfld.offset \
            & ((1 << hfld.width) - 1) != heads:
        return None
    return unpack_query(raw, head_dim)


def _block(read, ent: AttendBlock, head_dim: int, kv_format: KVFormat):
    """A list entry's block, read in the unit's KV format."""
    n = ent.tokens
    pos = (ent.pos0 + np.arange(n, dtype=np.int64)) % (1 << KV_POS_BITS)
    if kv_format == KVFormat.PER_CHANNEL_K:
        k4, ks, v4, sv, sk = unpack_kv_channel_block(
            read(ent.addr, kv_channel_block_bytes(n, head_dim)), head_dim, with_sk=True)
        return KVChannelBlock.from_groups(k4, ks, v4, sv, pos, sk=sk)
    k4, sk, v4, sv = unpack_kv_block(read(ent.addr, n * kv_token_bytes(head_dim)), head_dim)
    return KVBlock(k4, sk, v4, sv, pos)


def tile_block_requests(q_pos, blocks: list, tile_rows: int = ATTEND_TILE_ROWS) -> int:
    """Block requests of a PREFILL_TILE chunk whose rows sit at ``q_pos[R]``: one per (query
    tile, block) pair of :func:`~mcf.golden.attention_tiled.tile_schedule`."""
    return sum(1 for _ in tile_schedule(q_pos, blocks, tile_rows))


def attend_model(arg: int, list_base: int, read: Callable[[int, int], bytes], head_dim: int,
                 max_heads: int, max_block: int, max_list: int, *, max_chunk: int = 0,
                 kv_format: KVFormat = KVFormat.PER_TOKEN, tile_rows: int = ATTEND_TILE_ROWS,
                 p_format=P8) -> AttendResult:
    """Golden model of one ATTEND record: ``arg`` (:data:`~mcf.abi.attend.ATTEND_ARG` bits)
    and the bytes ``read(addr, n)`` returns for the list, the queries and the KV blocks.

    The unit's generics: ``head_dim``, ``max_heads``, ``max_block``, ``max_list``;
    ``max_chunk`` — PREFILL_TILE's tokens per chunk (0: no tiled path, PREFILL_TILE is a bad
    record — ``AttendUnit`` alone, a node without the tiled path); ``kv_format`` — the
    blocks' records (:class:`mcf.abi.kv.KVFormat`, as the engine's ``kv_format``; the RTL
    ``KvReader`` reads PER_TOKEN ones); ``tile_rows`` — PREFILL_TILE's query tile
    (:data:`~mcf.abi.attend.ATTEND_TILE_ROWS`; it changes ``blocks``, not the bits).
    ``p_format``: PREFILL_TILE's P·V format, the record's :data:`mcf.abi.attn_tile.P8`;
    ``None`` (today's unpacked ``w``) gives the bits of a loop of PREFILL records, for tests
    and measurements only."""
    a = ATTEND_ARG.from_bits(arg)
    mode, heads, nb = int(a.mode), int(a.heads), int(a.blocks)
    softmax = AttendSoftmax(a.softmax)      # the view gives the member (every code is defined)
    if mode not in (m.value for m in AttendMode) \
            or (mode == AttendMode.PREFILL_TILE.value and max_chunk < 1) \
            or not 1 <= heads <= max_heads or not 1 <= nb <= max_list \
            or softmax not in SOFTMAX_OF_MODE[AttendMode(mode)]:
        return AttendResult([], bad="bad_record")
    lst = read(list_base // ATT_ALIGN * ATT_ALIGN + int(a.list) * ATT_ENTRY_BYTES,
               (1 + nb) * ATT_ENTRY_BYTES)
    hdr = AttendHeader.unpack(lst)
    ents = [AttendBlock.unpack(lst[i * ATT_ENTRY_BYTES:]) for i in range(1, nb + 1)]
    if any(not 1 <= e.tokens <= max_block or e.addr % ATT_ALIGN for e in ents):
        return AttendResult([], bad="bad_list")
    uses_out = mode != AttendMode.DECODE.value or softmax == AttendSoftmax.FIXED
    if hdr.q_addr % ATT_ALIGN or (uses_out and hdr.out_addr % ATT_ALIGN) \
            or (mode == AttendMode.PREFILL_TILE.value and hdr.out_stride % ATT_ALIGN):
        return AttendResult([], bad="bad_list")
    if mode == AttendMode.PREFILL_TILE.value:
        return _prefill_tile(hdr, ents, read, heads, head_dim, max_chunk, kv_format,
                             tile_rows, p_format)
    qr = _query(read, hdr.q_addr, heads, head_dim)
    if qr is None:
        return AttendResult([], bad="bad_list")
    blocks = [_block(read, e, head_dim, kv_format) for e in ents]
    causal = mode == AttendMode.PREFILL.value
    if softmax == AttendSoftmax.MAX:
        m = attend_max(qr.codes, qr.scales, blocks, qr.pos) & 0xFFFF_FFFF
        return AttendResult([m.astype("<u4").tobytes()], blocks=nb)
    if softmax == AttendSoftmax.SINGLE:
        st = attend_single(qr.codes, qr.scales, blocks, qr.pos, causal)
    else:
        if softmax == AttendSoftmax.FIXED:
            m_fix = np.frombuffer(read(hdr.out_addr, max_payload_bytes(heads)), dtype="<i4")
        else:
            m_fix = attend_max(qr.codes, qr.scales, blocks, qr.pos, causal)
        st = attend_fixed(qr.codes, qr.scales, blocks, m_fix, qr.pos, causal)[0]
    if causal:
        words = normalize_state(st).ravel().astype(np.int64) & 0xFFFF_FFFF
        passes = 2 if softmax == AttendSoftmax.EXACT else 1
        return AttendResult([], writes=[(hdr.out_addr, words.astype("<u4").tobytes())],
                            blocks=passes * nb)
    return AttendResult([pack_state(st.m[h], st.l[h], st.o[h]) for h in range(heads)],
                        blocks=nb)


def _prefill_tile(hdr: AttendHeader, ents: list[AttendBlock], read, heads: int, head_dim: int,
                  max_chunk: int, kv_format: KVFormat, tile_rows: int,
                  p_format) -> AttendResult:
    """PREFILL_TILE SINGLE (the arg is checked): the chunk's slots and blocks → its rows."""
    n = hdr.tokens
    if not 1 <= n <= max_chunk or hdr.out_stride < prefill_out_bytes(heads, head_dim):
        return AttendResult([], bad="bad_list")
    qs = []
    for i in range(n):
        qr = _query(read, prefill_query_address(hdr.q_addr, i, heads, head_dim), heads,
                    head_dim)
        if qr is None or (i and qr.pos != (qs[0].pos + i) & _POS_MASK):
            return AttendResult([], bad="bad_list")
        qs.append(qr)
    if qs[0].pos < ents[0].pos0:    # the first token would see no key: never a causal prefill
        return AttendResult([], bad="bad_list")
    blocks = [_block(read, e, head_dim, kv_format) for e in ents]
    pos = np.array([q.pos for q in qs], dtype=np.int64)
    out = attend_prefill_tiled(np.stack([q.codes for q in qs]),
                               np.stack([q.scales for q in qs]), blocks, pos,
                               p_format=p_format, q_tile=tile_rows, array=True)
    words = out.astype(np.int64) & 0xFFFF_FFFF
    writes = [(prefill_tile_out_address(hdr.out_addr, i, hdr.out_stride),
               words[i].astype("<u4").tobytes()) for i in range(n)]
    return AttendResult([], writes=writes,
                        blocks=tile_block_requests(np.repeat(pos, heads), blocks, tile_rows))
