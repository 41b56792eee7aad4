"""INT4 KV cache format, its scales, the query format and the score arithmetic (paper §3.1, §5).

Everything the attention engine, the KV memory, the packetizer and the golden models agree on
about a KV block is defined here once. This module's format is ``KVFormat.PER_TOKEN`` (the
default); the second format, ``KVFormat.PER_CHANNEL_K`` (K per channel over groups of
``KV_GROUP`` tokens, V per token), is defined in :mod:`mcf.abi.kv_channel`
(which imports this module, never the other way round).

Quantisation granularity — **per token and KV head**, one scale for K and one for V:

* a token's K row (``head_dim`` values of one KV head) is stored as INT4 (:data:`KV_ELEM`, the
  :func:`mcf.abi.fixed.pack_int4` nibble order) with one :data:`KV_SCALE` code ``sk``; V likewise
  with ``sv``. Real value = ``int4 · scale``.
* Why per token and not per group of tokens: a block is produced chunk by chunk and emitted as soon
  as its token is computed, so a per-token scale never has to be revised when later tokens arrive;
  the scales cost 4 bytes per token and head (3 % of a 128-wide INT4 row pair) and they enter the
  datapath once per (query, key) pair, not per element: ``sk`` multiplies the finished dot
  product, ``sv`` multiplies the probability before it meets the V row.
* :data:`KV_SCALE` is UQ4.12: 16 bits, 12 fraction bits, range 2^-12 .. 16 (|x| up to 112 with
  INT4 codes -8..7).

Query: INT8 codes per (token, query head) with the activation scale of the GEMM/vector unit,
:class:`mcf.abi.quant.Scale` ``(m, e)`` (value ``m·2^e``), i.e. exactly what
:func:`mcf.abi.quant.requantize` produces from the ACT codes of one head's Q row. New K/V rows
arrive as :data:`mcf.abi.quant.ACT` codes and are requantised to INT4 by
:func:`quantize_kv_rows`.

Score (log2 domain, :data:`mcf.abi.softmax.SCORE`): with ``acc = Σ q·k`` (exact integer),

    qm = round_half_up(m · C_d, QM_SHIFT)                 # once per query head
    sh = clamp(SCORE_SHIFT_BASE − e, 1, SCORE_SHIFT_MAX)  # once per query head
    t  = sat32(round_half_up(acc · sk · qm, sh))          # once per (query, key) pair

where ``C_d = round(log2(e)/sqrt(head_dim) · 2^SCORE_CONST_FRAC)`` (:func:`score_const`). So ``t``
is ``q·k/sqrt(d)·log2(e)`` in units of 2^-SCORE_FRAC.

Probability and V weighting (per key and query head, identical in every mode):

    p = exp2_neg(m − t)                       # UQ1.16, mcf.abi.softmax LUT + shift
    w = round_half_up(p · sv, KV_SCALE.frac)  # probability times V scale, 2^-16 units
    o += w · v                                # exact integer products and sums

Rounding happens per key, before any sum, so a sum over any set of keys does not depend on how the
keys were grouped: that is what makes the two-phase mode split-invariant.

KV block payload (``Op.KV_REPLICA``): token-major records, one per token, so a block can be
fragmented at any token boundary: ``sk`` (u16 LE), ``sv`` (u16 LE), the K row (``head_dim/2``
packed bytes), the V row (``head_dim/2`` bytes). :func:`kv_token_bytes` gives the record size.
"""

from __future__ import annotations

import math

import numpy as np
from amaranth.hdl import unsigned
from amaranth.lib import data, enum

from .fixed import INT4, FixedFormat, pack_int4, round_shift, saturate, unpack_int4
from .quant import ACT, SCALE_EXP_BITS, SCALE_MANT_BITS, XQ, bitlen, requantize
from .regs import COUNTER_BITS
from .softmax import NORM_OUT, SCORE, SCORE_FRAC, recip_mant, state_words

__all__ = [
    "KV_ELEM", "KV_SCALE", "Q_ELEM", "SCORE_CONST_FRAC", "QM_SHIFT", "SCORE_SHIFT_BASE",
    "SCORE_SHIFT_MAX", "ATTN_OUT", "KVQ_SCALE_SHIFT",
    "score_const", "q_multiplier", "score_shift", "score", "v_weight",
    "to_act", "quantize_q", "dequantize_q", "quantize_kv_float", "dequantize", "quantize_kv_rows",
    "kvq_scale_mult", "kv_token_bytes", "pack_kv_block", "unpack_kv_block",
    "KV_POS_BITS", "AttnMode", "attn_job_layout", "q_beat_layout", "kv_beat_layout",
    "kv_header_layout",
    "job_out_words", "job_payloads", "attn_status_layout",
]

KV_ELEM = INT4
KV_SCALE = FixedFormat("kv_scale", 16, 12, signed=False)
Q_ELEM = XQ

SCORE_CONST_FRAC = 16
QM_SHIFT = 8
SCORE_SHIFT_BASE = KV_SCALE.frac + SCORE_CONST_FRAC - QM_SHIFT - SCORE_FRAC
SCORE_SHIFT_MAX = 62

ATTN_OUT = NORM_OUT
"""Normalised attention output ``o / l`` (prefill output for the next GEMM): signed 32-bit with
EXP_FRAC = 16 fraction bits — the same shape as :data:`mcf.abi.quant.ACT` (checked by a test)."""


def score_const(head_dim: int) -> int:
    """``C_d = round(log2(e) / sqrt(head_dim) · 2^SCORE_CONST_FRAC)``."""
    return int(math.floor(math.log2(math.e) / math.sqrt(head_dim) * (1 << SCORE_CONST_FRAC)
                          + 0.5))


def q_multiplier(m, head_dim: int):
    """Per query head: ``qm = round_half_up(m · C_d, QM_SHIFT)`` from the scale mantissa."""
    return round_shift(np.asarray(m, dtype=np.int64) * score_const(head_dim), QM_SHIFT)


def score_shift(e):
    """Per query head: ``clamp(SCORE_SHIFT_BASE − e, 1, SCORE_SHIFT_MAX)``."""
    return np.clip(SCORE_SHIFT_BASE - np.asarray(e, dtype=np.int64), 1, SCORE_SHIFT_MAX)


def score(acc, sk, qm, sh):
    """Log2-domain score from the integer dot product ``acc``, key scale ``sk``, multiplier
    ``qm`` and shift ``sh``: ``sat32(round_half_up(acc · sk · qm, sh))`` (broadcasting)."""
    prod = (np.asarray(acc, dtype=np.int64) * np.asarray(sk, dtype=np.int64)
            * np.asarray(qm, dtype=np.int64))
    sh = np.asarray(sh, dtype=np.int64)
    return saturate((prod + (np.int64(1) << (sh - 1))) >> sh, SCORE.width, SCORE.signed)


def v_weight(p, sv):
    """``w = round_half_up(p · sv, KV_SCALE.frac)``: probability times V scale (2^-16 units)."""
    return round_shift(np.asarray(p, dtype=np.int64) * np.asarray(sv, dtype=np.int64),
                       KV_SCALE.frac)


# --- host-side quantisers (float → codes), used by tests, MARS tooling and the runtime ---------

def _scale_codes(absmax, qmax: int, fmt: FixedFormat):
    code = np.floor(np.asarray(absmax, dtype=np.float64) / qmax * (1 << fmt.frac) + 0.5)
    return np.clip(code, 1, fmt.max_int).astype(np.int64)


def to_act(x):
    """Float → saturated ACT codes (what the QKV projection hands to attention)."""
    return ACT.quantize(x, "half_even")


def quantize_q(x):
    """Float Q rows ``[..., d]`` → (INT8 codes, scales ``[..., 2]`` = (m, e)), through ACT and
    :func:`mcf.abi.quant.requantize` per row, as the vector unit does on chip."""
    q, m, e = requantize(to_act(x))
    return q, np.stack([m, e], axis=-1)


def dequantize_q(q, sq):
    sq = np.asarray(sq, dtype=np.int64)
    scale = sq[..., 0].astype(np.float64) * np.exp2(sq[..., 1].astype(np.float64))
    return np.asarray(q, dtype=np.float64) * scale[..., None]


def quantize_kv_float(x):
    """Float rows ``[..., d]`` → (INT4 codes, KV_SCALE codes per row), symmetric absmax/7
    (host reference quantiser; the engine's path is :func:`quantize_kv_rows`)."""
    x = np.asarray(x, dtype=np.float64)
    s = _scale_codes(np.abs(x).max(axis=-1), KV_ELEM.max_int, KV_SCALE)
    q = np.rint(x / KV_SCALE.to_float(s)[..., None])
    return saturate(q.astype(np.int64), KV_ELEM.width), s


def dequantize(codes, scales, fmt: FixedFormat):
    return np.asarray(codes, dtype=np.float64) * fmt.to_float(scales)[..., None]


# --- on-chip requantisation of a new K/V row (ACT codes → INT4 + KV_SCALE) ---------------------

KVQ_SCALE_SHIFT = 24
"""``sk = clamp(round_half_up(a · kvq_scale_mult(), KVQ_SCALE_SHIFT), 1, KV_SCALE.max_int)``."""


def kvq_scale_mult() -> int:
    """``round(2^(KVQ_SCALE_SHIFT + KV_SCALE.frac − ACT.frac) / KV_ELEM.max_int)``."""
    num = 1 << (KVQ_SCALE_SHIFT + KV_SCALE.frac - ACT.frac)
    return (num + KV_ELEM.max_int // 2) // KV_ELEM.max_int


def quantize_kv_rows(x):
    """Requantise ACT rows ``x[T, d]`` to (INT4 codes, KV_SCALE codes), bit-exactly as the
    hardware: ``a = max|x|`` with ``n`` = its bit length; ``a`` normalised (truncating) to a
    RECIP_IN_BITS mantissa ``x16`` whose reciprocal is ``r = recip_mant(x16)``;
    ``k4 = sat4(round_half_up(x · 7 · r, RECIP_FRAC − RECIP_IN_BITS + n))`` and the scale as
    :data:`KVQ_SCALE_SHIFT` says. An all-zero row gives zeros and scale 1. Rows whose absmax
    exceeds the scale range (|x| > 7·16) saturate the scale (counted by the hardware)."""
    from .softmax import RECIP_FRAC, RECIP_IN_BITS

    x = np.asarray(x, dtype=np.int64)
    a = np.abs(x).max(axis=-1)
    n = bitlen(a)
    top = RECIP_IN_BITS
    x16 = np.where(n >= top, a >> np.maximum(n - top, 0), a << np.maximum(top - n, 0))
    r = recip_mant(np.where(a > 0, x16, 1 << (top - 1)))
    sh = (RECIP_FRAC - top + n)[..., None]
    prod = x * (KV_ELEM.max_int * r)[..., None]
    k4 = saturate((prod + (np.int64(1) << (sh - 1))) >> sh, KV_ELEM.width)
    k4 = np.where((a > 0)[..., None], k4, 0)
    s = round_shift(a * kvq_scale_mult(), KVQ_SCALE_SHIFT)
    return k4, np.clip(s, 1, KV_SCALE.max_int)


# --- KV block payload ---------------------------------------------------------------------------

def kv_token_bytes(head_dim: int) -> int:
    """Bytes of one token record in a KV block payload: sk, sv (u16 each), K row, V row."""
    if head_dim % 2:
        raise ValueError("head_dim must be even for INT4 packing")
    return 2 * (KV_SCALE.width // 8) + head_dim


def pack_kv_block(k4, sk, v4, sv) -> bytes:
    """Token-major KV block payload from INT4 codes ``[T, d]`` and scale codes ``[T]``."""
    k4, v4 = np.asarray(k4), np.asarray(v4)
    out = bytearray()
    for t in range(k4.shape[0]):
        out += int(sk[t]).to_bytes(2, "little") + int(sv[t]).to_bytes(2, "little")
        out += pack_int4(k4[t]).tobytes() + pack_int4(v4[t]).tobytes()
    return bytes(out)


def unpack_kv_block(payload: bytes, head_dim: int):
    """Inverse of :func:`pack_kv_block`: ``(k4, sk, v4, sv)``."""
    rec = kv_token_bytes(head_dim)
    if len(payload) % rec:
        raise ValueError(f"KV payload of {len(payload)} bytes is not whole {rec}-byte tokens")
    n = len(payload) // rec
    b = np.frombuffer(payload, dtype=np.uint8).reshape(n, rec)
    sk = b[:, 0].astype(np.int64) | (b[:, 1].astype(np.int64) << 8)
    sv = b[:, 2].astype(np.int64) | (b[:, 3].astype(np.int64) << 8)
    half = head_dim // 2
    k4 = np.stack([unpack_int4(r[4:4 + half]) for r in b]) if n else np.zeros((0, head_dim))
    v4 = np.stack([unpack_int4(r[4 + half:]) for r in b]) if n else np.zeros((0, head_dim))
    return k4.astype(np.int64), sk, v4.astype(np.int64), sv


# --- attention engine streams (mcf.hdl.compute.attention) ---------------------------------------

KV_POS_BITS = 20
"""Token positions carried with K rows (causal mask) and in the job descriptor."""


class AttnMode(enum.Enum, shape=2):
    """What an attention job computes (see :mod:`mcf.golden.attention`)."""
    SINGLE = 0   # online softmax, block states merged in order → (m, l, o) or o / l
    MAX = 1      # two-phase, phase 1: per-head maximum score only (K rows; V rows ignored)
    FIXED = 2    # two-phase, phase 2: exponentials against the given maximum, wrapped sums


def attn_job_layout(max_heads: int) -> data.StructLayout:
    """Job descriptor: one query token × ``heads`` query heads sharing one KV head.
    ``normalize`` emits ``o / l`` (prefill) instead of the state (decode); ``causal`` masks keys
    with ``pos > q_pos``; ``n_blocks`` KV blocks follow on the KV stream (0: empty shard)."""
    return data.StructLayout({
        "mode": AttnMode,
        "normalize": unsigned(1),
        "causal": unsigned(1),
        "heads": unsigned(max(1, max_heads.bit_length())),
        "n_blocks": unsigned(16),
        "q_pos": unsigned(KV_POS_BITS),
    })


def q_beat_layout(lanes: int) -> data.StructLayout:
    """Query beats, head-major, ``head_dim/lanes`` beats per head, element ``i`` of a beat in
    bits ``[8i, 8i+8)``. ``scale_m``/``scale_e`` (the head's :class:`mcf.abi.quant.Scale`,
    ``e`` two's complement) and ``m_fix`` (SCORE, FIXED mode's maximum) are sampled on each
    head's first beat."""
    return data.StructLayout({
        "data": unsigned(lanes * Q_ELEM.width),
        "scale_m": unsigned(SCALE_MANT_BITS),
        "scale_e": unsigned(SCALE_EXP_BITS),
        "m_fix": unsigned(SCORE.width),
    })


def kv_beat_layout(lanes: int) -> data.StructLayout:
    """Beats of the attention engine's two KV streams, ``k`` and ``v``: a block's K rows on
    ``k`` and its V rows on ``v`` (MAX-mode jobs send no V block), each row ``head_dim/lanes``
    beats of INT4 (element ``i`` in bits ``[4i, 4i+4)``); ``last`` marks each part's final
    beat. ``scale_k`` and ``pos`` are sampled on the first beat of a K row, ``scale_v`` on the
    first beat of a V row (the token record carries both scales, see :func:`pack_kv_block`);
    the ``v`` bit says which part a beat belongs to (checked by the engine)."""
    return data.StructLayout({
        "data": unsigned(lanes * KV_ELEM.width),
        "scale_k": unsigned(KV_SCALE.width),
        "scale_v": unsigned(KV_SCALE.width),
        "pos": unsigned(KV_POS_BITS),
        "v": unsigned(1),
        "last": unsigned(1),
    })


def kv_header_layout(lanes: int) -> data.StructLayout:
    """A beat of a per-channel-K group header on the engine's ``kh`` stream
    (``KVFormat.PER_CHANNEL_K`` only): ``lanes`` K channel scale codes (:data:`KV_SCALE`,
    channel ``i`` of the beat in bits ``[16i, 16i+16)``), ``head_dim/lanes`` beats per header in
    channel order — the payload header of :func:`pack_kv_channel_block`, one group at a time."""
    return data.StructLayout({"data": unsigned(lanes * KV_SCALE.width)})


def job_out_words(mode: AttnMode, normalize: bool, heads: int, head_dim: int) -> int:
    """32-bit words an attention job emits: per head ``m, l, o[head_dim]`` (state, see
    :func:`mcf.abi.softmax.pack_state`), ``head_dim`` words of ``o / l`` when normalised, or one
    word ``m`` in MAX mode. Heads in order; see :func:`job_payloads` for the ``last`` marks."""
    if mode == AttnMode.MAX:
        return heads
    if normalize:
        return heads * head_dim
    return heads * state_words(head_dim)


def job_payloads(mode: AttnMode, normalize: bool, heads: int) -> int:
    """Payloads (``last``-terminated) a job emits: one per head for states (SINGLE / FIXED
    without ``normalize``: each head's ``(m, l, o)`` is one reduction payload, the unit the NIC's
    SOFTMAX_MERGE works on), one for the whole job otherwise (MAX: ``heads`` lanes for a MAX
    all-reduce; normalised output: ``heads · head_dim`` ATTN_OUT words for the next GEMM)."""
    return 1 if mode == AttnMode.MAX or normalize else heads


def attn_status_layout() -> data.StructLayout:
    """Status counters of the attention engine (read through the CSR block; 32-bit counters
    that wrap, :data:`mcf.abi.regs.COUNTER_BITS`)."""
    return data.StructLayout({
        "jobs": unsigned(COUNTER_BITS),      # jobs completed (payload handed to the output FIFO)
        "blocks": unsigned(COUNTER_BITS),    # KV blocks processed
        "err_rows": unsigned(COUNTER_BITS),  # malformed blocks: V/K row counts differ, partial
                                             # rows, rows beyond max_block, missing ``last``
        "err_max": unsigned(COUNTER_BITS),   # FIXED mode: (key, head) scores above the maximum
        "err_job": unsigned(COUNTER_BITS),   # jobs with heads outside 1..max_heads (dropped with
                                             # their query and KV beats, no output)
        "busy": unsigned(1),
    })
