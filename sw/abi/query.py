"""Decode query payload (``Op.QUERY``, paper §4 end: the new token's query is multicast to the
KV shards). Little-endian, 32-bit aligned:

    header   QUERY_HEADER in the low bits of QUERY_HEADER_BYTES bytes (rest zero):
             pos (KV_POS_BITS: the token's position), layer, head0 (first query head carried),
             heads (query heads in this payload)
    per head (``heads`` times, head0, head0 + 1, ...):
             scale  QUERY_SCALE in one 32-bit word: the head's activation scale
                    :class:`mcf.abi.quant.Scale` — ``m`` (SCALE_MANT_BITS, unsigned) then ``e``
                    (SCALE_EXP_BITS, two's complement), rest zero — exactly the ``scale_m`` /
                    ``scale_e`` of :func:`mcf.abi.kv.q_beat_layout`
             codes  ``head_dim`` :data:`mcf.abi.kv.Q_ELEM` (INT8) codes, element 0 first, zero
                    padded to a whole 32-bit word

A query is the INT8 codes and scale of every query head (what :func:`mcf.abi.kv.quantize_q` /
:func:`mcf.abi.quant.requantize` produce). It may be cut into several payloads of whole heads
(:func:`query_fragments`), each with its own header, so no payload exceeds
:data:`mcf.abi.framing.MAX_PAYLOAD`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from amaranth.hdl import signed, unsigned
from amaranth.lib import data

from .framing import MAX_PAYLOAD
from .kv import KV_POS_BITS, Q_ELEM
from .meta import META
from .quant import SCALE_EXP_BITS, SCALE_MANT_BITS

__all__ = [
    "QUERY_HEAD_BITS", "QUERY_HEADER", "QUERY_SCALE", "QUERY_WORD_BYTES", "QUERY_HEADER_BYTES",
    "QUERY_SCALE_BYTES", "QueryRecord", "query_head_bytes", "query_bytes", "query_fragments",
    "pack_query", "unpack_query",
]

QUERY_WORD_BYTES = 4
"""Alignment of the header, of every head's scale word and of its code row."""

QUERY_HEAD_BITS = 8
"""Width of the header's query-head index and count."""

QUERY_HEADER = data.StructLayout({
    "pos": unsigned(KV_POS_BITS),
    "layer": unsigned(META["seq"].width),
    "head0": unsigned(QUERY_HEAD_BITS),
    "heads": unsigned(QUERY_HEAD_BITS),
})

QUERY_SCALE = data.StructLayout({
    "m": unsigned(SCALE_MANT_BITS),
    "e": signed(SCALE_EXP_BITS),
})


def _words(bits: int) -> int:
    return -(-bits // (8 * QUERY_WORD_BYTES)) * QUERY_WORD_BYTES


QUERY_HEADER_BYTES = _words(QUERY_HEADER.size)
QUERY_SCALE_BYTES = _words(QUERY_SCALE.size)
"""Bytes of a query head's scale word (the head's codes follow it)."""

if Q_ELEM.width != 8:   # pragma: no cover - the byte-per-code layout below assumes INT8
    raise AssertionError("the query record stores one Q_ELEM code per byte")


def _code_bytes(head_dim: int) -> int:
    return _words(head_dim * Q_ELEM.width)


def query_head_bytes(head_dim: int) -> int:
    """Bytes of one query head in a payload: its scale word and its padded code row."""
    if head_dim < 1:
        raise ValueError(f"head_dim must be >= 1 (got {head_dim})")
    return QUERY_SCALE_BYTES + _code_bytes(head_dim)


def query_bytes(heads: int, head_dim: int) -> int:
    """Bytes of a query payload carrying ``heads`` query heads (header included)."""
    if heads < 1:
        raise ValueError(f"a query payload carries at least one head (got {heads})")
    return QUERY_HEADER_BYTES + heads * query_head_bytes(head_dim)


def query_fragments(heads: int, head_dim: int, max_payload: int = MAX_PAYLOAD,
                    max_heads: int | None = None) -> list[tuple[int, int]]:
    """Cut a query of ``heads`` heads into payloads of whole heads, each at most
    ``max_payload`` bytes and ``max_heads`` heads: ``[(head0, count), ...]`` in head order,
    as equal as possible (counts differ by at most one). Raises ``ValueError`` when one head
    does not fit."""
    if heads < 1 or heads > 1 << QUERY_HEAD_BITS:
        raise ValueError(f"a query has 1..{1 << QUERY_HEAD_BITS} heads (got {heads})")
    fit = (max_payload - QUERY_HEADER_BYTES) // query_head_bytes(head_dim)
    if fit < 1:
        raise ValueError(f"one query head ({query_bytes(1, head_dim)} B with its header) "
                         f"exceeds the largest payload ({max_payload} B)")
    if max_heads is not None:
        fit = min(fit, max_heads)
    count = -(-heads // fit)
    base, extra = divmod(heads, count)
    out, head0 = [], 0
    for i in range(count):
        n = base + (i < extra)
        out.append((head0, n))
        head0 += n
    return out


@dataclass(frozen=True)
class QueryRecord:
    """One decoded query payload: ``codes[heads, head_dim]`` and ``scales[heads, 2]`` = (m, e),
    the layout of :func:`mcf.abi.kv.quantize_q`."""
    pos: int
    layer: int
    head0: int
    codes: np.ndarray
    scales: np.ndarray

    @property
    def heads(self) -> int:
        return int(self.codes.shape[0])


def pack_query(codes, scales, pos: int, layer: int, head0: int = 0) -> bytes:
    """Payload of query heads ``head0 ..`` from INT8 ``codes[heads, head_dim]`` and
    ``scales[heads, 2]`` (m, e). Raises ``ValueError`` on out-of-range fields or codes."""
    codes = np.asarray(codes, dtype=np.int64)
    scales = np.asarray(scales, dtype=np.int64)
    if codes.ndim != 2 or codes.shape[0] < 1 or codes.shape[1] < 1:
        raise ValueError(f"codes must be [heads, head_dim] with both >= 1 (got {codes.shape})")
    heads, head_dim = codes.shape
    if scales.shape != (heads, 2):
        raise ValueError(f"scales must be [{heads}, 2] (m, e), got {scales.shape}")
    if codes.min() < Q_ELEM.min_int or codes.max() > Q_ELEM.max_int:
        raise ValueError(f"query codes must lie in {Q_ELEM.min_int}..{Q_ELEM.max_int}")
    m, e = scales[:, 0], scales[:, 1]
    if m.min() < 0 or m.max() >= 1 << SCALE_MANT_BITS:
        raise ValueError(f"scale mantissas must fit {SCALE_MANT_BITS} unsigned bits")
    e_lo, e_hi = -(1 << (SCALE_EXP_BITS - 1)), (1 << (SCALE_EXP_BITS - 1)) - 1
    if e.min() < e_lo or e.max() > e_hi:
        raise ValueError(f"scale exponents must lie in {e_lo}..{e_hi}")
    for name, value in (("pos", pos), ("layer", layer), ("head0", head0), ("heads", heads)):
        width = QUERY_HEADER[name].shape.width
        if not 0 <= value < 1 << width:
            raise ValueError(f"query {name}={value} does not fit in {width} bits")
    header = QUERY_HEADER.const({"pos": pos, "layer": layer, "head0": head0,
                                 "heads": heads}).as_bits()
    out = bytearray(header.to_bytes(QUERY_HEADER_BYTES, "little"))
    scale_words = m | ((e & ((1 << SCALE_EXP_BITS) - 1)) << QUERY_SCALE["e"].offset)
    row = np.zeros(_code_bytes(head_dim), dtype=np.uint8)
    for h in range(heads):
        out += int(scale_words[h]).to_bytes(QUERY_SCALE_BYTES, "little")
        row[:head_dim] = codes[h] & 0xFF
        out += row.tobytes()
    return bytes(out)


def unpack_query(payload: bytes, head_dim: int) -> QueryRecord:
    """Inverse of :func:`pack_query`. Raises ``ValueError`` when the length does not match the
    header's head count."""
    if len(payload) < QUERY_HEADER_BYTES:
        raise ValueError(f"a query payload has at least {QUERY_HEADER_BYTES} bytes "
                         f"(got {len(payload)})")
    raw = int.from_bytes(payload[:QUERY_HEADER_BYTES], "little")
    hdr = QUERY_HEADER.from_bits(raw & ((1 << QUERY_HEADER.size) - 1))
    heads = int(hdr.heads)
    want = query_bytes(heads, head_dim) if heads else QUERY_HEADER_BYTES
    if heads < 1 or len(payload) != want:
        raise ValueError(f"query payload of {len(payload)} bytes does not hold the {heads} "
                         f"heads of head_dim {head_dim} its header names ({want} B)")
    per = query_head_bytes(head_dim)
    body = np.frombuffer(payload, dtype=np.uint8)[QUERY_HEADER_BYTES:].reshape(heads, per)
    words = body[:, :QUERY_SCALE_BYTES].astype(np.int64)
    word = sum(words[:, i] << (8 * i) for i in range(QUERY_SCALE_BYTES))
    m = word & ((1 << SCALE_MANT_BITS) - 1)
    e = (word >> QUERY_SCALE["e"].offset) & ((1 << SCALE_EXP_BITS) - 1)
    e = np.where(e >= 1 << (SCALE_EXP_BITS - 1), e - (1 << SCALE_EXP_BITS), e)
    codes = body[:, QUERY_SCALE_BYTES:QUERY_SCALE_BYTES + head_dim].astype(np.int64)
    codes = np.where(codes >= 128, codes - 256, codes)
    return QueryRecord(int(hdr.pos), int(hdr.layer), int(hdr.head0), codes,
                       np.stack([m, e], axis=-1))
