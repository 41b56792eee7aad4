"""Second KV cache format: **K quantised per channel over a group of tokens**, V per token
(KIVI-style; issue #10 §5). Re-exported by :mod:`mcf.abi.kv`; the per-token format there stays
the default and is unchanged.

Why: real keys (Qwen2 through its K bias) have a few outlier channels. With one K scale per token
the outlier channel sets the row's scale and the other channels round to zero. With one scale per
channel over a group of tokens, each channel gets its own range.

Group (:data:`KV_GROUP` = 32 tokens)
    A group is ``KV_GROUP`` consecutive tokens of one KV head. 32 divides the engine's maximum
    block (256) and every prefill chunk that is a multiple of 32; it is the low end of KIVI's
    32..128, chosen because (a) the measured error grows with the group (more tokens share each
    channel's range), (b) the decode residual buffer (tokens waiting for their group to fill) is at
    most 31 tokens, (c) the quantiser buffers one group of ACT K rows on chip
    (32 · 128 · 32 bit = 16 KiB per KV head), (d) the header costs 2·head_dim bytes per group, i.e.
    8 bytes per token at head_dim 128 (6 % over the per-token record). The last group of a block
    may be shorter (1..32 tokens): its scales are taken over the tokens it has.

Quantiser (:func:`quantize_k_channels`, bit-exact, the on-chip arithmetic of
:func:`mcf.abi.kv.quantize_kv_rows` applied to the **columns** of the group's ACT K rows)::

    a_c  = max_t |x[t, c]|                         # channel absmax over the group's tokens
    k4[t, c] = sat4(round_half_up(x[t, c] · 7 · r_c, RECIP_FRAC − RECIP_IN_BITS + n_c))
    s_c  = clamp(round_half_up(a_c · kvq_scale_mult(), KVQ_SCALE_SHIFT), 1, KV_SCALE.max_int)

with ``n_c = bitlen(a_c)`` and ``r_c = recip_mant(a_c`` normalised to RECIP_IN_BITS bits,
truncating``)``. V is quantised per token exactly as in the per-token format (``sv``).

Payload (``Op.KV_REPLICA``, :func:`pack_kv_channel_block`): per group a **header** of
``head_dim`` u16 LE K-channel scale codes (channel 0 first, ``2·head_dim`` bytes), then the
group's **token records in the per-token layout** ``sk | sv | K row | V row``
(:func:`mcf.abi.kv.kv_token_bytes` bytes), ``sk = KV_ONE`` (= 1.0, 4096) in a closed group
(an open group's records carry their own, see below): the record parser
and the engine's KV beat (``scale_k``/``scale_v``) are the per-token ones, 2 bytes per token buy
4-byte alignment and a score path with no case distinction. Groups follow each other; all groups
but the last have ``KV_GROUP`` records, so the token count follows from the payload length
(:func:`kv_channel_block_tokens`). Packets (``MAX_PAYLOAD``) cut a block at header/record
boundaries without spanning groups (:func:`kv_channel_fragments`).

Open group (decode residual, :func:`quantize_k_open`): tokens of a KV head's last, not yet full
group wait (as ACT rows) in a residual buffer until the group fills and is quantised per channel
as above (KIVI). Until then they are stored as an **open group**: a header carrying the channel
scales ``s`` of the KV head's previous closed group (all ``KV_ONE`` if there is none), and per
token its K row **prescaled** by those scales and quantised per token, with its own ``sk``::

    n_c = bitlen(s_c);  r_c = recip_mant(s_c << (RECIP_IN_BITS − n_c))   # ≈ 2^31 / (s_c·2^(16−n_c))
    y_c = sat32(round_half_up(x_c · r_c, n_c + PRESCALE_SHIFT_BASE))      # ≈ x_c · 2^12 / s_c
    (k4, sk) = quantize_kv_rows(y)                                        # per token, as PER_TOKEN

so ``x_c ≈ k4_c · sk · s_c`` (both in KV_SCALE units): the outlier channels are brought to the
range of the others before the per-token scale is taken. The record's ``sk`` is that per-token
scale (not ``KV_ONE``); everything else is a group like any other.

Score (:func:`fold_query`): the group header's channel scales are folded into the query
**once per group** and the per-token score path is used unchanged with the record's ``sk``. For
one query head (INT8 ``q[d]``, scale ``(m, e)``) and a group header ``s[d]``::

    p_c  = q_c · s_c                                 # exact, |p_c| < 2^23
    a    = max_c |p_c|;  n = bitlen(a)
    x16  = a normalised to RECIP_IN_BITS (16) bits, truncating (a >> (n−16) or a << (16−n))
    r    = recip_mant(x16)                           # ≈ 2^31 / x16, the engine's Recip
    q'_c = sat8(round_half_up(p_c · r, FOLD_Q_SHIFT_BASE + n))     # FOLD_Q_SHIFT_BASE = 8
    m'   = round_half_up(m · x16, FOLD_M_SHIFT)      # FOLD_M_SHIFT = 16, m' in [2^14, 2^16)
    e'   = sat8(e + n − FOLD_E_BASE)                 # FOLD_E_BASE = 19

(``q' ≈ p · 128 / a``: the absmax element saturates to 127, the convention of
:data:`mcf.abi.quant.QMAX_SHIFT`.) An all-zero ``p`` gives ``q' = 0``, ``(m', e') = (0, 0)``.
Then for every record of the group, with ``acc' = Σ q'_c · k4_c`` and the record's ``sk``
(``KV_ONE`` in a closed group)::

    t = score(acc', sk, q_multiplier(m', d), score_shift(e'))

— exactly :func:`mcf.abi.kv.score` of the per-token format with ``(m', e')`` in place of the
query scale: **the engine scores every group's records as per-token records, after loading the
query folded with the group's header**. Real value check:
``Σ q_c m 2^e · k4_c s_c 2^-12 = Σ p_c k4_c · m 2^(e−12) ≈ acc' · x16 2^(n−16−7) · m 2^(e−12)
= acc' · m' 2^(e')``.
"""

from __future__ import annotations

import numpy as np
from amaranth.hdl import unsigned
from amaranth.lib import data, enum

from .fixed import round_shift, saturate
from .framing import MAX_PAYLOAD
from .kv import KV_SCALE, Q_ELEM, kv_token_bytes, pack_kv_block, quantize_kv_rows
from .quant import SCALE_EXP_BITS, bitlen
from .regs import COUNTER_BITS
from .softmax import RECIP_FRAC, RECIP_IN_BITS, recip_mant

__all__ = [
    "KVFormat", "KV_GROUP", "KV_ONE", "FOLD_QMAX_SHIFT", "FOLD_Q_SHIFT_BASE", "FOLD_M_SHIFT",
    "FOLD_E_BASE", "PRESCALE_SHIFT_BASE", "quantize_k_channels", "quantize_kv_channel",
    "prescale_k", "quantize_k_open", "fold_query",
    "kv_group_header_bytes", "kv_channel_block_bytes", "kv_channel_block_tokens",
    "group_sizes", "kv_channel_fragments", "pack_kv_channel_block", "unpack_kv_channel_block",
    "kvq_status_layout",
]


class KVFormat(enum.Enum, shape=1):
    """KV cache format of a block (a per-job / per-block choice; PER_TOKEN is the default)."""
    PER_TOKEN = 0       # mcf.abi.kv: one K scale and one V scale per token
    PER_CHANNEL_K = 1   # this module: K scales per channel per KV_GROUP tokens, V per token


KV_GROUP = 32
"""Tokens per K-scale group (divides the engine's max block of 256 and 32-multiple chunks)."""

KV_ONE = 1 << KV_SCALE.frac
"""``sk`` of every token record of a per-channel group: 1.0 in KV_SCALE."""

FOLD_QMAX_SHIFT = 7
"""Folded query: the absmax element maps to 2^7 (saturating to 127), as quant.QMAX_SHIFT."""
FOLD_Q_SHIFT_BASE = RECIP_FRAC - RECIP_IN_BITS - FOLD_QMAX_SHIFT
"""``q' = sat8(round_half_up(p · r, FOLD_Q_SHIFT_BASE + n))`` (= 8)."""
FOLD_M_SHIFT = 16
"""``m' = round_half_up(m · x16, FOLD_M_SHIFT)``: the product of two 16-bit mantissas → 16 bits."""
FOLD_E_BASE = RECIP_IN_BITS + FOLD_QMAX_SHIFT + KV_SCALE.frac - FOLD_M_SHIFT
"""``e' = e + n − FOLD_E_BASE`` (= 19)."""
PRESCALE_SHIFT_BASE = RECIP_FRAC - RECIP_IN_BITS - KV_SCALE.frac
"""Open group: ``y = sat32(round_half_up(x · r_s, bitlen(s) + PRESCALE_SHIFT_BASE))`` (= 3)."""

_EXP_LO, _EXP_HI = -(1 << (SCALE_EXP_BITS - 1)), (1 << (SCALE_EXP_BITS - 1)) - 1


def quantize_k_channels(x):
    """ACT K rows of one group ``x[T, d]`` (1 ≤ T ≤ the group size) → (INT4 codes ``[T, d]``,
    channel scale codes ``[d]``): :func:`mcf.abi.kv.quantize_kv_rows` on the columns (channel
    absmax over the group's tokens, reciprocal, no divider). An all-zero channel gives codes 0
    and scale 1."""
    x = np.asarray(x, dtype=np.int64)
    if x.ndim != 2 or x.shape[0] < 1:
        raise ValueError(f"a K group is a non-empty [T, d] array, got shape {x.shape}")
    k4t, s = quantize_kv_rows(x.T)
    return k4t.T.copy(), s


def prescale_k(x, s):
    """Open group: ACT K rows ``x[..., d]`` divided by the channel scales ``s[d]`` (KV_SCALE
    codes ≥ 1) through the reciprocal, ``y ≈ x · 2^KV_SCALE.frac / s`` (module docstring)."""
    x = np.asarray(x, dtype=np.int64)
    s = np.asarray(s, dtype=np.int64)
    if s.size and (s.min() < 1 or s.max() > KV_SCALE.max_int):
        raise ValueError("channel scale codes must lie in 1..KV_SCALE.max_int")
    n = bitlen(s)
    r = recip_mant(s << (RECIP_IN_BITS - n))
    sh = n + PRESCALE_SHIFT_BASE
    return saturate((x * r + (np.int64(1) << (sh - 1))) >> sh, 32)


def quantize_k_open(x, s_prev):
    """Open group (decode residual): ACT K rows ``x[T, d]`` → (INT4 ``[T, d]``, per-token
    ``sk[T]``) against the previous closed group's channel scales ``s_prev[d]`` (``KV_ONE``
    everywhere if there is none): :func:`quantize_kv_rows` of :func:`prescale_k`."""
    return quantize_kv_rows(prescale_k(x, s_prev))


def group_sizes(tokens: int, group: int = KV_GROUP) -> list[int]:
    """Token counts of the groups of a block of ``tokens`` tokens (all full but the last)."""
    full, rem = divmod(int(tokens), group)
    return [group] * full + ([rem] if rem else [])


def quantize_kv_channel(k_act, v_act, group: int = KV_GROUP):
    """ACT K/V rows of a block ``[T, d]`` → ``(k4 [T, d], kscale [n_groups, d], v4 [T, d],
    sv [T])``: K per channel per group (:func:`quantize_k_channels`), V per token
    (:func:`mcf.abi.kv.quantize_kv_rows`). Groups are consecutive tokens from the block start."""
    k_act = np.asarray(k_act, dtype=np.int64)
    v4, sv = quantize_kv_rows(np.asarray(v_act, dtype=np.int64))
    k4 = np.zeros_like(k_act)
    scales, lo = [], 0
    for n in group_sizes(k_act.shape[0], group):
        k4[lo:lo + n], s = quantize_k_channels(k_act[lo:lo + n])
        scales.append(s)
        lo += n
    kscale = np.stack(scales) if scales else np.zeros((0, k_act.shape[1]), dtype=np.int64)
    return k4, kscale, v4, sv


def fold_query(q_codes, q_scale, k_channel_scales):
    """Fold a group's K channel scales into the query (module docstring, bit-exact).

    ``q_codes[..., d]`` INT8, ``q_scale[..., 2]`` = ``(m, e)``, ``k_channel_scales[d]`` (or
    broadcastable ``[..., d]``) KV_SCALE codes → ``(q' [..., d] INT8, (m', e') [..., 2])``. The
    score of a key of that group is then ``score(q'·k4, KV_ONE, q_multiplier(m'),
    score_shift(e'))``."""
    q = np.asarray(q_codes, dtype=np.int64)
    sq = np.asarray(q_scale, dtype=np.int64)
    s = np.asarray(k_channel_scales, dtype=np.int64)
    p = q * s
    a = np.abs(p).max(axis=-1)
    n = bitlen(a)
    top = RECIP_IN_BITS
    x16 = np.where(n >= top, a >> np.maximum(n - top, 0), a << np.maximum(top - n, 0))
    r = recip_mant(np.where(a > 0, x16, 1 << (top - 1)))
    sh = (FOLD_Q_SHIFT_BASE + n)[..., None]
    qf = saturate((p * r[..., None] + (np.int64(1) << (sh - 1))) >> sh, Q_ELEM.width)
    nz = a > 0
    qf = np.where(nz[..., None], qf, 0)
    mf = np.where(nz, round_shift(sq[..., 0] * x16, FOLD_M_SHIFT), 0)
    ef = np.where(nz, np.clip(sq[..., 1] + n - FOLD_E_BASE, _EXP_LO, _EXP_HI), 0)
    return qf, np.stack([mf, ef], axis=-1)


# --- payload ------------------------------------------------------------------------------------

def kv_group_header_bytes(head_dim: int) -> int:
    """Bytes of a group header: ``head_dim`` u16 K-channel scale codes."""
    return head_dim * (KV_SCALE.width // 8)


def kv_channel_block_bytes(tokens: int, head_dim: int, group: int = KV_GROUP) -> int:
    """Payload length (``meta.length``) of a per-channel block of ``tokens`` tokens."""
    return (len(group_sizes(tokens, group)) * kv_group_header_bytes(head_dim)
            + tokens * kv_token_bytes(head_dim))


def kv_channel_block_tokens(length: int, head_dim: int, group: int = KV_GROUP) -> int:
    """Inverse of :func:`kv_channel_block_bytes` (``ValueError`` for an impossible length)."""
    hdr, rec = kv_group_header_bytes(head_dim), kv_token_bytes(head_dim)
    full_bytes = hdr + group * rec
    full, rem = divmod(int(length), full_bytes)
    tail = 0
    if rem:
        if rem <= hdr or (rem - hdr) % rec:
            raise ValueError(f"{length} bytes is not a per-channel KV block (head_dim {head_dim})")
        tail = (rem - hdr) // rec
    return full * group + tail


def kv_channel_fragments(tokens: int, head_dim: int, max_payload: int = MAX_PAYLOAD,
                         group: int = KV_GROUP) -> list[tuple[int, int, int, int]]:
    """Packet cuts of a per-channel block payload: ``(byte offset, bytes, first token,
    tokens)`` per fragment. A fragment never splits a header or a token record and never
    spans two groups: the first fragment of a group carries its header and as many records as
    fit in ``max_payload``, the following ones records only (their group is ``first token //
    group``, its header came in the group's first fragment). At head_dim 128 and 2048-byte
    payloads a 32-token group is 3 packets: header + 13, 15, 4 records."""
    hdr, rec = kv_group_header_bytes(head_dim), kv_token_bytes(head_dim)
    if hdr + rec > max_payload:
        raise ValueError(f"a group header + one record ({hdr + rec} B) exceeds the payload "
                         f"limit ({max_payload} B)")
    out, off, tok = [], 0, 0
    for n in group_sizes(tokens, group):
        first, left = True, n
        while left:
            room = max_payload - (hdr if first else 0)
            take = min(left, room // rec)
            size = (hdr if first else 0) + take * rec
            out.append((off, size, tok, take))
            off, tok, left, first = off + size, tok + take, left - take, False
    return out


def pack_kv_channel_block(k4, kscale, v4, sv, group: int = KV_GROUP, sk=None) -> bytes:
    """Per-channel block payload: per group its header (``kscale[g]``, u16 LE) then its token
    records ``sk | sv | K | V`` (:func:`mcf.abi.kv.pack_kv_block`); ``sk`` defaults to
    ``KV_ONE`` for every token (closed groups), an open group passes its per-token ``sk``."""
    k4, v4 = np.asarray(k4), np.asarray(v4)
    kscale, sv = np.asarray(kscale, dtype=np.int64), np.asarray(sv, dtype=np.int64)
    sk = np.full(k4.shape[0], KV_ONE) if sk is None else np.asarray(sk, dtype=np.int64)
    sizes = group_sizes(k4.shape[0], group)
    if kscale.shape != (len(sizes), k4.shape[1]):
        raise ValueError(f"kscale shape {kscale.shape}, expected {(len(sizes), k4.shape[1])}")
    if kscale.size and (kscale.min() < 0 or kscale.max() > KV_SCALE.max_int):
        raise ValueError("K channel scale codes must be u16")
    out, lo = bytearray(), 0
    for g, n in enumerate(sizes):
        out += kscale[g].astype("<u2").tobytes()
        out += pack_kv_block(k4[lo:lo + n], sk[lo:lo + n], v4[lo:lo + n], sv[lo:lo + n])
        lo += n
    return bytes(out)


def unpack_kv_channel_block(payload: bytes, head_dim: int, group: int = KV_GROUP,
                            with_sk: bool = False):
    """Inverse of :func:`pack_kv_channel_block`: ``(k4, kscale, v4, sv)``, or
    ``(k4, kscale, v4, sv, sk)`` with ``with_sk``. Without ``with_sk``, records whose ``sk`` is
    not ``KV_ONE`` (an open group) are rejected (``ValueError``)."""
    from .kv import unpack_kv_block

    tokens = kv_channel_block_tokens(len(payload), head_dim, group)
    hdr, rec = kv_group_header_bytes(head_dim), kv_token_bytes(head_dim)
    ks, k4s, v4s, svs, sks, off = [], [], [], [], [], 0
    for n in group_sizes(tokens, group):
        ks.append(np.frombuffer(payload[off:off + hdr], dtype="<u2").astype(np.int64))
        off += hdr
        k4, sk, v4, sv = unpack_kv_block(payload[off:off + n * rec], head_dim)
        if not with_sk and np.any(sk != KV_ONE):
            raise ValueError("per-channel token record with sk != KV_ONE (open group)")
        sks.append(sk)
        k4s.append(k4)
        v4s.append(v4)
        svs.append(sv)
        off += n * rec
    if not ks:
        z = np.zeros((0, head_dim), dtype=np.int64)
        out = (z, z.copy(), z.copy(), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
    else:
        out = (np.concatenate(k4s), np.stack(ks), np.concatenate(v4s), np.concatenate(svs),
               np.concatenate(sks))
    return out if with_sk else out[:4]


# --- KV emitter status ------------------------------------------------------------------------

def kvq_status_layout() -> data.StructLayout:
    """Status counters of the K/V emitter (``mcf.hdl.compute.attention_kvq.KVQuantizer``)."""
    return data.StructLayout({
        "tokens": unsigned(COUNTER_BITS),     # token records emitted
        "blocks": unsigned(COUNTER_BITS),     # block payloads emitted (``last``)
        "groups": unsigned(COUNTER_BITS),     # per-channel K groups emitted (headers)
        "scale_sat": unsigned(COUNTER_BITS),  # rows (PER_TOKEN) or channels (K, PER_CHANNEL_K)
                                              # whose absmax exceeded the scale range
        "len_err": unsigned(COUNTER_BITS),    # blocks whose payload length != meta.length
    })

