"""Golden model of the ATTEND executor (``mcf.hdl.node.attend.AttendUnit``; docs/node.md §3, §7):
one ATTEND record — its block list, query and KV token records read from memory — to the
payloads, ``o/l`` write or bad-record counter the unit produces, bit for bit.

The record, list, query and output formats are the ABI's (:mod:`mcf.abi.attend`); the
attention arithmetic is :mod:`mcf.golden.attention`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..abi.attend import (
    ATT_ENTRY_BYTES,
    ATTEND_ARG,
    ATTEND_BLOCK,
    ATTEND_HEADER,
    SOFTMAX_OF_MODE,
    AttendMode,
    AttendSoftmax,
    max_payload_bytes,
)
from ..abi.kv import KV_POS_BITS, kv_token_bytes, unpack_kv_block
from ..abi.query import QUERY_HEADER, QUERY_HEADER_BYTES, query_bytes, unpack_query
from ..abi.softmax import pack_state
from .attention import KVBlock, attend_fixed, attend_max, attend_single, normalize_state

__all__ = ["AttendResult", "attend_model"]


@dataclass
class AttendResult:
    """What one record produces: ``payloads`` (DECODE: one state per head; MAX: one payload
    of maxima), ``write`` (PREFILL: ``(out_addr, bytes)``), or ``bad`` (the counter it
    increments); ``blocks``: the block requests it makes (``att_blocks``)."""
    payloads: list[bytes]
    write: tuple[int, bytes] | None = None
    bad: str | None = None
    blocks: int = 0


def attend_model(arg: int, list_base: int, read: Callable[[int, int], bytes], head_dim: int,
                 max_heads: int, max_block: int, max_list: int) -> AttendResult:
    """Golden model of one ATTEND record: ``arg`` (:data:`~mcf.abi.attend.ATTEND_ARG` bits)
    and the bytes ``read(addr, n)`` returns for the list, the query and the KV token records.
    Uses :mod:`mcf.golden.attention` (``attend_single``, ``attend_max``, ``attend_fixed``,
    ``normalize_state``)."""
    a = ATTEND_ARG.from_bits(arg)
    mode, heads, nb = int(a.mode), int(a.heads), int(a.blocks)
    softmax = AttendSoftmax(a.softmax)      # the view gives the member (every code is defined)
    if mode not in (m.value for m in AttendMode) or not 1 <= heads <= max_heads \
            or not 1 <= nb <= max_list or softmax not in SOFTMAX_OF_MODE[AttendMode(mode)]:
        return AttendResult([], bad="bad_record")
    lst = read(list_base + int(a.list) * ATT_ENTRY_BYTES, (1 + nb) * ATT_ENTRY_BYTES)
    hdr = ATTEND_HEADER.from_bits(int.from_bytes(lst[:ATT_ENTRY_BYTES], "little"))
    ents = [ATTEND_BLOCK.from_bits(int.from_bytes(lst[i * 16:(i + 1) * 16], "little"))
            for i in range(1, nb + 1)]
    q_addr, out_addr = int(hdr.q_addr), int(hdr.out_addr)
    if any(not 1 <= int(e.tokens) <= max_block for e in ents):
        return AttendResult([], bad="bad_list")
    raw_q = read(q_addr, query_bytes(heads, head_dim))
    hfld = QUERY_HEADER["heads"]
    if int.from_bytes(raw_q[:QUERY_HEADER_BYTES], "little") >> hfld.offset \
            & ((1 << hfld.width) - 1) != heads:
        return AttendResult([], bad="bad_list")
    qr = unpack_query(raw_q, head_dim)
    blocks = []
    rec = kv_token_bytes(head_dim)
    for e in ents:
        n, p0 = int(e.tokens), int(e.pos0)
        k4, sk, v4, sv = unpack_kv_block(read(int(e.addr), n * rec), head_dim)
        pos = (p0 + np.arange(n, dtype=np.int64)) % (1 << KV_POS_BITS)
        blocks.append(KVBlock(k4, sk, v4, sv, pos))
    causal = mode == AttendMode.PREFILL.value
    if softmax == AttendSoftmax.MAX:
        m = attend_max(qr.codes, qr.scales, blocks, qr.pos) & 0xFFFF_FFFF
        return AttendResult([m.astype("<u4").tobytes()], blocks=nb)
    if softmax == AttendSoftmax.SINGLE:
        st = attend_single(qr.codes, qr.scales, blocks, qr.pos, causal)
    else:
        if softmax == AttendSoftmax.FIXED:
            m_fix = np.frombuffer(read(out_addr, max_payload_bytes(heads)), dtype="<i4")
        else:
            m_fix = attend_max(qr.codes, qr.scales, blocks, qr.pos, causal)
        st = attend_fixed(qr.codes, qr.scales, blocks, m_fix, qr.pos, causal)[0]
    if causal:
        words = normalize_state(st).ravel().astype(np.int64) & 0xFFFF_FFFF
        passes = 2 if softmax == AttendSoftmax.EXACT else 1
        return AttendResult([], write=(out_addr, words.astype("<u4").tobytes()),
                            blocks=passes * nb)
    return AttendResult([pack_state(st.m[h], st.l[h], st.o[h]) for h in range(heads)],
                        blocks=nb)
