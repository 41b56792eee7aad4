"""Decode landing: queries into ``QBUF``, the root's final state normalised into ``OBUF``
(docs/node.md §5 "Landing engine", §7; paper §4 end: the query goes to the KV shards, their
partial states merge along the tree and the root finishes ``o / l``).

Three packet kinds reach the decode lander (``mcf.hdl.node.decode_land.DecodeLander``):

* ``Op.QUERY`` — payload :func:`mcf.abi.query.pack_query` (a :data:`QUERY_HEADER` in its first
  :data:`QUERY_HEADER_BYTES` bytes, then whole query heads). Landed whole, header included, in
  one **QBUF slot**: ::

      slot(header) = (header.layer mod 2) · Q_HEADS + header.head0
      qbuf_address = QBUF_BASE + slot · Q_SLOT

  ``Q_HEADS`` is the model's query-head count ``H_q`` (slots per layer parity), ``Q_SLOT`` the
  slot stride in bytes (≥ the largest query payload MARS cuts, :func:`query_slot_bytes`). Two
  layer parities, so layer ``l+1``'s query never overwrites the one layer ``l`` still reads. A
  payload carrying heads ``head0 .. head0 + heads − 1`` lives in slot ``head0``; a query sent
  whole (one payload, ``head0 = 0``) is slot 0 of its parity.

* ``Op.PARTIAL_STATE`` with ``reduce_op = NONE`` — a reduction root's **final** state
  (``mcf.abi.nic.reduce_config_layout``: the root's engine marks its result final), one query
  head's ``(m, l, o[head_dim])`` (:func:`mcf.abi.softmax.pack_state`). Normalised
  (:func:`mcf.abi.softmax.normalize`, bit for bit) into ``head_dim``
  :data:`mcf.abi.kv.ATTN_OUT` words (little-endian 32-bit, the attention output's ACT format)
  and written as one **OBUF row**: ::

      head = (Meta.kv_id − TAG_BASE) mod 2^16          (MARS: kv_id = decode_tag(k, head))
      row  = (Meta.seq mod 2) · Q_HEADS + head          (MARS: seq = layer)
      obuf_address = OBUF_BASE + row · 4 · head_dim

  ``TAG_BASE`` is the token's ``decode_tag(k, 0) = k · H_q mod 2^16`` (loaded per token, the
  MARK of docs/node.md §3 (c)); :func:`decode_tag` and its inverse :func:`tag_head` are the
  one definition of this tag (``TAG_BITS`` = ``Meta.kv_id``'s 16 bits). The rows of one parity
  are the O-projection's input vector ``[H_q · head_dim]`` in head order.

* ``Op.REDUCTION`` with ``reduce_op = NONE`` — the two-phase decode's all-reduced maxima of one
  KV head's query heads (the root's ``ReduceOp.MAX`` result, and the root's multicast of it to
  the other nodes): ``heads`` 32-bit words, landed as they are in one **MBUF slot** of
  :data:`M_SLOT_BYTES`, where the FIXED ATTEND of that KV head reads them
  (:mod:`mcf.abi.attend`): ::

      head0 = (Meta.kv_id − TAG_BASE) mod 2^16          (MARS: kv_id = decode_tag(k, head0))
      mbuf_address = MBUF_BASE + ((Meta.seq mod 2) · Q_HEADS + head0) · M_SLOT_BYTES

* ``Op.REDUCTION`` with ``reduce_op = NONE`` whose tag lies in the **SUM window** — one
  payload of a tensor-parallel row's SUM all-reduce result (:func:`mcf.node.tp.sum_payloads`:
  the ``acc_out`` lanes of the row-parallel step, whole lane pairs): landed as it is in one
  **SUM slot** of :data:`SUM_SLOT_BYTES` (= :data:`mcf.abi.framing.MAX_PAYLOAD`), so the
  payloads of one row, cut at ``MAX_PAYLOAD``, land as one contiguous lane vector from
  ``SUM_BASE``: ::

      off  = (Meta.kv_id − TAG_BASE) mod 2^16
      SUM window:  Q_HEADS ≤ off < Q_HEADS + SUM_SLOTS,   slot = off − Q_HEADS
      sum_address = SUM_BASE + slot · SUM_SLOT_BYTES

  The window is the tags right above the token's maxima (``decode_tag(k, H_q + slot)``,
  :func:`sum_tag`). They are the next token's maxima tags, but no packet of token ``k + 1``
  exists before token ``k``'s output row (autoregressive decode), and ``TAG_BASE`` moves at
  the next token's MARK. ``SUM_SLOTS = 0`` (the reset value) closes the window: the lander is
  then exactly the maxima-only one (a tag above ``Q_HEADS`` is a maxima ``drop_slot``).

Dropped whole and counted (:data:`DECODE_LAND_STATUS`), first matching rule: any other ``op``
(``drop_op``); a PARTIAL_STATE whose ``reduce_op`` is not NONE — it should have gone to the
reduction engine (``drop_reduce_op``); a query whose header names no head, whose length is not
:func:`mcf.abi.query.query_bytes` of its header's head count or exceeds
:data:`mcf.abi.framing.MAX_PAYLOAD`, a state whose length is not
``4 · state_words(head_dim)``, maxima whose length is 0, not a multiple of 4 or above
:data:`M_SLOT_BYTES`, SUM lanes whose length is 0, not a multiple of :data:`SUM_LEN_ALIGN`
(whole lane pairs) or above :data:`SUM_SLOT_BYTES` (``drop_length``); a query with
``head0 + heads > Q_HEADS`` or longer than ``Q_SLOT``, a state or maxima with
``head ≥ Q_HEADS`` outside the SUM window (``drop_slot``). A REDUCTION whose ``reduce_op`` is
not NONE counts as ``drop_reduce_op`` like a state.

:func:`decode_land_decision` is the lander's decision, :func:`normalized_row` its datapath; the
golden model of the hardware, :class:`mcf.golden.decode_land.DecodeLandModel`, applies them.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from amaranth.hdl import unsigned
from amaranth.lib import data

from .compute import DMA_ADDR_BITS
from .framing import MAX_PAYLOAD
from .kv import ATTN_OUT
from .meta import META, Meta, Op, ReduceOp
from .query import QUERY_HEAD_BITS, QUERY_HEADER, QUERY_HEADER_BYTES, query_bytes
from .regs import Access, Register, counters, status_registers
from .softmax import LANE_BITS, normalize, state_words, unpack_state
from .tp import ACC_LANES

__all__ = [
    "DEC_ADDR_BITS", "Q_SLOT_BITS", "M_SLOT_BYTES", "mbuf_address", "mbuf_bytes", "mbuf_slot",
    "Q_HEADS_BITS", "TAG_BITS", "DECODE_LAND_CONFIG",
    "DECODE_LAND_STATUS", "DecodeLandConfig", "DecodeLandResult", "state_bytes",
    "obuf_row_bytes", "query_slot_bytes", "query_header", "decode_tag", "tag_head",
    "decode_head", "qbuf_address", "obuf_address", "decode_land_decision", "normalized_row",
    "decode_land_registers", "SUM_SLOT_BYTES", "SUM_SLOTS_BITS", "SUM_LEN_ALIGN", "sum_tag",
    "sum_address",
    "DEC_ALIGN",
]

DEC_ADDR_BITS = DMA_ADDR_BITS
Q_SLOT_BITS = 16
"""Width of the QBUF slot stride in bytes."""
Q_HEADS_BITS = QUERY_HEAD_BITS + 1
"""``Q_HEADS`` can be 2^QUERY_HEAD_BITS (every head a header can name)."""
TAG_BITS = META["kv_id"].width
DEC_ALIGN = 4
"""``QBUF_BASE``, ``OBUF_BASE``, ``MBUF_BASE``, ``SUM_BASE`` and the QBUF slot stride
``q_slot`` are multiples of this (one ACT word): the lander takes their low 2 bits as 0 and
its DMA writer shifts by words only; :class:`DecodeLandConfig` refuses others."""

M_SLOT_BYTES = 32
"""An MBUF slot: up to 8 maxima (a KV head's query heads), two 128-bit beats."""
SUM_SLOT_BYTES = MAX_PAYLOAD
"""A SUM slot: one SUM all-reduce payload of at most ``MAX_PAYLOAD`` bytes."""
SUM_SLOTS_BITS = 8
"""Width of ``SUM_SLOTS`` (up to 255 slots: 510 KiB of lanes, a row of N = 65280)."""
SUM_LEN_ALIGN = ACC_LANES * LANE_BITS // 8
"""A SUM payload is whole lane pairs (an output element's two accumulator lanes)."""

DECODE_LAND_CONFIG = data.StructLayout({
    "qbuf_base": unsigned(DEC_ADDR_BITS),
    "obuf_base": unsigned(DEC_ADDR_BITS),
    "mbuf_base": unsigned(DEC_ADDR_BITS),
    "q_slot": unsigned(Q_SLOT_BITS),
    "q_heads": unsigned(Q_HEADS_BITS),
    "tag_base": unsigned(TAG_BITS),
    "sum_base": unsigned(DEC_ADDR_BITS),
    "sum_slots": unsigned(SUM_SLOTS_BITS),
})
"""The decode lander's configuration inputs (driven by :func:`decode_land_registers`;
``tag_base`` may instead come from the sequencer's per-token MARK)."""

DECODE_LAND_STATUS = counters(
    "queries_landed", "results_landed", "maxes_landed", "sums_landed", "drop_op", "drop_reduce_op",
    "drop_length", "drop_slot", "write_errors", "framing_errors")
"""Queries written to QBUF, final states written to OBUF, maxima written to MBUF and SUM
lanes written to their SUM slot (each counted after the write's B response, OKAY: the
sequencer's WAITs read these four), packets
dropped by cause, packets whose write answered SLVERR/DECERR (not counted as landed), landing
packets whose beat count
disagreed with ``length`` (treated as ``length`` bytes: cut, or padded with zeros; impossible
behind a parser). Registers ``dec_<field>``."""

_WORD = LANE_BITS // 8
if ATTN_OUT.width != LANE_BITS:  # pragma: no cover - the row is one ATTN_OUT word per lane
    raise AssertionError("ATTN_OUT words are 32-bit lanes")


def state_bytes(head_dim: int) -> int:
    """Payload bytes of one head's ``(m, l, o)`` state."""
    return _WORD * state_words(head_dim)


def obuf_row_bytes(head_dim: int) -> int:
    """Bytes of one OBUF row: ``head_dim`` :data:`mcf.abi.kv.ATTN_OUT` words."""
    return ATTN_OUT.width // 8 * head_dim


def query_slot_bytes(max_heads: int, head_dim: int, align: int = 16) -> int:
    """A QBUF slot stride holding a payload of up to ``max_heads`` heads, rounded up to
    ``align`` bytes (one HP beat)."""
    return -(-query_bytes(max_heads, head_dim) // align) * align


@dataclass(frozen=True)
class DecodeLandConfig:
    """Host view of :data:`DECODE_LAND_CONFIG`."""
    qbuf_base: int
    obuf_base: int
    q_slot: int
    q_heads: int
    tag_base: int = 0
    mbuf_base: int = 0
    sum_base: int = 0
    sum_slots: int = 0

    def __post_init__(self):
        for name, fld in DECODE_LAND_CONFIG:
            value = getattr(self, name)
            if not 0 <= value < (1 << fld.shape.width):
                raise ValueError(f"DecodeLandConfig.{name}={value} does not fit in {fld.shape}")
        for name in ("qbuf_base", "obuf_base", "mbuf_base", "sum_base", "q_slot"):
            if getattr(self, name) % DEC_ALIGN:
                raise ValueError(f"DecodeLandConfig.{name}={getattr(self, name)}: a multiple "
                                 f"of {DEC_ALIGN} bytes")

    def pack(self) -> int:
        return DECODE_LAND_CONFIG.const({name: getattr(self, name)
                                         for name, _ in DECODE_LAND_CONFIG}).as_bits()


class DecodeLandResult(enum.Enum):
    QUERY = "queries_landed"
    RESULT = "results_landed"
    MAXES = "maxes_landed"
    SUMS = "sums_landed"
    DROP_OP = "drop_op"
    DROP_REDUCE_OP = "drop_reduce_op"
    DROP_LENGTH = "drop_length"
    DROP_SLOT = "drop_slot"


def query_header(payload: bytes) -> dict[str, int]:
    """The :data:`QUERY_HEADER` fields of a payload's first bytes (zero-filled when short),
    whatever they hold."""
    raw = int.from_bytes(bytes(payload[:QUERY_HEADER_BYTES]).ljust(QUERY_HEADER_BYTES, b"\0"),
                         "little")
    view = QUERY_HEADER.from_bits(raw & ((1 << QUERY_HEADER.size) - 1))
    return {name: int(view[name]) for name, _ in QUERY_HEADER}


def decode_tag(k: int, head: int, q_heads: int) -> int:
    """The ``Meta.kv_id`` of decode token ``k``'s packets for query head ``head`` (MARS's query
    fragments, partial states and maxima), with ``q_heads`` = ``H_q``:
    ``(k · H_q + head) mod 2^TAG_BITS``. ``decode_tag(k, 0)`` is the token's ``TAG_BASE``;
    :func:`tag_head` is the inverse."""
    return (k * q_heads + head) % (1 << TAG_BITS)


def tag_head(kv_id: int, tag_base: int) -> int:
    """Inverse of :func:`decode_tag`: the query head of a packet tagged ``kv_id`` of the token
    whose ``TAG_BASE`` is ``tag_base``: ``(kv_id − tag_base) mod 2^TAG_BITS`` (the lander's
    subtraction, ``TAG_BITS`` wide)."""
    return (kv_id - tag_base) % (1 << TAG_BITS)


def decode_head(cfg: DecodeLandConfig, meta: Meta) -> int:
    """The query head a final state or maxima packet belongs to: :func:`tag_head` of its
    ``kv_id`` against ``cfg.tag_base``."""
    return tag_head(meta.kv_id, cfg.tag_base)


def qbuf_address(cfg: DecodeLandConfig, meta: Meta, header: Mapping[str, int]) -> int:
    """``QBUF_BASE + ((layer mod 2) · Q_HEADS + head0) · Q_SLOT`` for a query payload with
    header ``header`` (a mapping with ``layer``, ``head0``, ``heads``; see
    :func:`query_header`). ``meta`` is the packet's (its ``length`` must fit the slot). Raises
    ``ValueError`` when the payload does not fit its slot range."""
    if header["head0"] + header["heads"] > cfg.q_heads or meta.length > cfg.q_slot:
        raise ValueError(f"query heads {header['head0']}+{header['heads']} / {meta.length} B "
                         f"outside QBUF ({cfg.q_heads} heads, {cfg.q_slot}-B slots)")
    slot = (header["layer"] & 1) * cfg.q_heads + header["head0"]
    return (cfg.qbuf_base + slot * cfg.q_slot) % (1 << DEC_ADDR_BITS)


def obuf_address(cfg: DecodeLandConfig, meta: Meta, head_dim: int) -> int:
    """``OBUF_BASE + ((seq mod 2) · Q_HEADS + head) · 4 · head_dim`` for a final state.
    Raises ``ValueError`` when ``head ≥ Q_HEADS``."""
    head = decode_head(cfg, meta)
    if head >= cfg.q_heads:
        raise ValueError(f"state head {head} outside OBUF ({cfg.q_heads} heads)")
    row = (meta.seq & 1) * cfg.q_heads + head
    return (cfg.obuf_base + row * obuf_row_bytes(head_dim)) % (1 << DEC_ADDR_BITS)


def mbuf_bytes(q_heads: int) -> int:
    """The MBUF region: one slot per (layer parity, query head)."""
    return 2 * q_heads * M_SLOT_BYTES


def mbuf_address(cfg: DecodeLandConfig, meta: Meta) -> int:
    """``MBUF_BASE + ((seq mod 2) · Q_HEADS + head0) · M_SLOT_BYTES`` for a maxima payload.
    Raises ``ValueError`` when ``head0 ≥ Q_HEADS``."""
    head = decode_head(cfg, meta)
    if head >= cfg.q_heads:
        raise ValueError(f"maxima head {head} outside MBUF ({cfg.q_heads} heads)")
    return mbuf_slot(cfg.mbuf_base, cfg.q_heads, meta.seq, head)


def mbuf_slot(mbuf_base: int, q_heads: int, layer: int, head0: int) -> int:
    """The MBUF slot of ``layer``'s maxima from query head ``head0`` on."""
    slot = (layer & 1) * q_heads + head0
    return (mbuf_base + slot * M_SLOT_BYTES) % (1 << DEC_ADDR_BITS)


def sum_tag(tag_base: int, q_heads: int, slot: int) -> int:
    """The ``Meta.kv_id`` of SUM slot ``slot``'s payload for the token whose ``TAG_BASE`` is
    ``tag_base``: ``(tag_base + q_heads + slot) mod 2^TAG_BITS`` (the SUM window)."""
    return (tag_base + q_heads + slot) % (1 << TAG_BITS)


def _sum_slot(cfg: DecodeLandConfig, meta: Meta) -> int | None:
    """The SUM slot of a REDUCTION result, or None when its tag is outside the SUM window."""
    off = decode_head(cfg, meta)
    slot = off - cfg.q_heads
    return slot if 0 <= slot < cfg.sum_slots else None


def sum_address(cfg: DecodeLandConfig, slot: int) -> int:
    """``SUM_BASE + slot · SUM_SLOT_BYTES``. Raises ``ValueError`` outside ``SUM_SLOTS``."""
    if not 0 <= slot < cfg.sum_slots:
        raise ValueError(f"SUM slot {slot} outside the {cfg.sum_slots} slots")
    return (cfg.sum_base + slot * SUM_SLOT_BYTES) % (1 << DEC_ADDR_BITS)


def decode_land_decision(cfg: DecodeLandConfig, meta: Meta, header: bytes | Mapping[str, int],
                         head_dim: int) -> tuple[DecodeLandResult, int | None]:
    """What the lander does with a packet: ``(result, address)`` (address only when it lands).
    ``header``: the payload (its first bytes are read as the query header) or the header's
    fields."""
    if not isinstance(header, Mapping):
        header = query_header(header)
    if meta.op == Op.QUERY:
        heads = header["heads"]
        if heads == 0 or meta.length > MAX_PAYLOAD or \
                meta.length != query_bytes(heads, head_dim):
            return DecodeLandResult.DROP_LENGTH, None
        if header["head0"] + heads > cfg.q_heads or meta.length > cfg.q_slot:
            return DecodeLandResult.DROP_SLOT, None
        return DecodeLandResult.QUERY, qbuf_address(cfg, meta, header)
    if meta.op == Op.PARTIAL_STATE:
        if meta.reduce_op != ReduceOp.NONE:
            return DecodeLandResult.DROP_REDUCE_OP, None
        if meta.length != state_bytes(head_dim):
            return DecodeLandResult.DROP_LENGTH, None
        if decode_head(cfg, meta) >= cfg.q_heads:
            return DecodeLandResult.DROP_SLOT, None
        return DecodeLandResult.RESULT, obuf_address(cfg, meta, head_dim)
    if meta.op == Op.REDUCTION:
        if meta.reduce_op != ReduceOp.NONE:
            return DecodeLandResult.DROP_REDUCE_OP, None
        slot = _sum_slot(cfg, meta)
        if slot is not None:
            if meta.length == 0 or meta.length % SUM_LEN_ALIGN or meta.length > SUM_SLOT_BYTES:
                return DecodeLandResult.DROP_LENGTH, None
            return DecodeLandResult.SUMS, sum_address(cfg, slot)
        if meta.length == 0 or meta.length % 4 or meta.length > M_SLOT_BYTES:
            return DecodeLandResult.DROP_LENGTH, None
        if decode_head(cfg, meta) >= cfg.q_heads:
            return DecodeLandResult.DROP_SLOT, None
        return DecodeLandResult.MAXES, mbuf_address(cfg, meta)
    return DecodeLandResult.DROP_OP, None


def normalized_row(state: bytes, head_dim: int) -> bytes:
    """The OBUF row of one head's state payload: ``normalize(l, o)`` as little-endian 32-bit
    :data:`mcf.abi.kv.ATTN_OUT` words."""
    _m, l_sum, o = unpack_state(state, head_dim)
    return (normalize(l_sum, o) & 0xFFFFFFFF).astype("<u4").tobytes()


def decode_land_registers() -> list[Register]:
    """The decode lander's registers: the four 40-bit bases (split over two words), the QBUF
    slot stride, ``Q_HEADS``, the token's ``TAG_BASE``, ``SUM_SLOTS`` and the status counters
    ``dec_*``
    (:data:`DECODE_LAND_STATUS`). Not yet part of :func:`mcf.abi.csrmap.node_regmap`."""
    hi = DEC_ADDR_BITS - 32
    regs = []
    for name, what in (("QBUF", "decode query buffer"), ("OBUF", "decode o/l rows"),
                       ("MBUF", "two-phase decode maxima"),
                       ("SUM", "SUM all-reduce lanes")):
        regs += [
            Register.single(f"{name}_BASE_LO", 32, Access.RW, desc=f"{what} base, bits 31..0"),
            Register.single(f"{name}_BASE_HI", hi, Access.RW,
                            desc=f"{what} base, bits {DEC_ADDR_BITS - 1}..32"),
        ]
    regs += [
        Register.single("QBUF_SLOT", Q_SLOT_BITS, Access.RW,
                        desc="bytes per QBUF slot (>= the largest query payload)"),
        Register.single("DEC_Q_HEADS", Q_HEADS_BITS, Access.RW,
                        desc="query heads H_q: QBUF slots and OBUF rows per layer parity"),
        Register.single("DEC_TAG_BASE", TAG_BITS, Access.RW,
                        desc="kv_id of head 0's final state for the current token (k * H_q)"),
        Register.single("DEC_SUM_SLOTS", SUM_SLOTS_BITS, Access.RW,
                        desc="SUM slots (MAX_PAYLOAD bytes each) above the token's maxima tags; "
                             "0 closes the SUM window"),
    ]
    return regs + status_registers("dec", DECODE_LAND_STATUS, "decode landing")
