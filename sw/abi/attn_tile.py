"""Prefill attention on the GEMM arrays: the tile formats (issue #33; paper §3.1, §5).

FlashAttention-style tiling of a prefill chunk's attention, run on the INT4 × INT8 GEMM arrays
(:mod:`mcf.hdl.compute.gemm_array`: row pairs packed into one DSP48E2, ``(w1·2^k + w0)·a``).
A tile is a set of query rows (token × query head of one KV head) against one KV block; the KV
extent of a tile **is** the KV block of :mod:`mcf.golden.attention`, so the per-block state
``(m_b, l_b, o_b)`` and the in-order ``merge_state`` are those of today's golden model.

``S = Q·Kᵀ`` — K is the weight operand (INT4, rows = keys paired into one DSP), Q the
activation (INT8 codes, per-channel K: the query folded by the group's header,
:func:`mcf.abi.kv.fold_query`); the dot product over ``head_dim`` is **one group**, so the
packed accumulator splits exactly (:func:`qk_pack_shift`) into the exact integer
``acc = Σ q·k`` of :func:`mcf.abi.kv.score`, :func:`qk_acc_bits` signed bits (19 at
``head_dim`` 128). Scores, ``m_b``, ``p = exp2_neg(m_b − t)`` and ``w = v_weight(p, sv)`` are
unchanged.

``P·V`` — V is the weight operand (INT4, rows = channels paired), the probability row the
activation. Two formats for it:

* :data:`PV_W` — today's ``w`` unpacked: UQ4.16 in :data:`W_BITS` = 20 bits (``p ≤ 2^16``,
  ``sv ≤ 2^16 − 1``). It does not fit the multiplier's 18-bit B port, so it takes the 27-bit
  A port with V on B: **one MAC per DSP48E2**, no packing (two INT4 V on B would need
  ``k ≥ 24`` bits per field, two ``w`` on A 40 bits). Bit-exact with today's golden model.
* :data:`P8` (**the choice**, docs/attention.md "Prefill on the arrays: formats") — 8 unsigned
  bits with a **per-row scale** ``2^s``, one per (query row, KV block)::

      w_max = max over the block's unmasked keys of w        (0 if none)
      s     = p8_row_shift(w_max) = max(0, bitlen(w_max) − 8)
      w8    = quantize_p8(w, s) = min(round_half_up(w, s), 255)   (the maximum → 128..255)
      o_b   = (Σ w8 · v) · 2^s                                 (exact integer, then STATE_O)

  ``l_b = Σ p`` stays exact (the unquantised ``p``), ``m_b`` is unchanged. The products
  ``w8·v`` (|·| ≤ 2040) pack two V channels per DSP48E2 like the GEMM's INT4 × INT8 pairs:
  :func:`pv_pack_shift` bits per field hold a sum over :data:`PV_SPLIT_KEYS` = 128 keys within
  the arrays' packing shift (``pack_shift(GROUP_SIZE)`` = 19); a longer block is split into
  128-key groups whose exact sums are added after the split. The arrays take ``w8``
  zero-extended (B is 18 bits: 9 bits, sign bit 0) — the one change to the INT8 activation
  path. The row shift depends on the block's keys, so ``P8`` is defined for SINGLE mode only:
  FIXED mode (two-phase) keeps :data:`PV_W`, whose per-key rounding is what makes its sums
  independent of the split.

:data:`PV_W` **on the packed arrays, in bytes**: ``w = Σ_j 2^(8j)·w_j`` with :data:`PV_LIMBS` =
3 unsigned bytes ``w_j`` (:func:`w_limbs`), each in :data:`P8`'s range, so each byte's P·V packs
and splits exactly as ``P8``'s does, and ``o_b = Σ_j 2^(8j)·Σ w_j·v`` is today's exact ``Σ w·v``
(:func:`pv_w_acc_bits` signed bits) — today's bits, in every mode, at :data:`PV_LIMBS` × the P·V
steps of ``P8``.
"""

from __future__ import annotations

import numpy as np
from amaranth.hdl import signed, unsigned
from amaranth.lib import data

from .fixed import FixedFormat, saturate
from .kv import ATTN_OUT, KV_ELEM, KV_POS_BITS, KV_SCALE, Q_ELEM, AttnMode, v_weight
from .quant import GROUP_SIZE, SCALE_EXP_BITS, SCALE_MANT_BITS, bitlen, group_sum_bits, pack_shift
from .softmax import EXP_FRAC, STATE_L, STATE_M, STATE_O

__all__ = [
    "P_ONE", "W_MAX", "W_BITS", "PV_W", "P8", "P8_MAX_PRODUCT", "PV_SPLIT_KEYS",
    "qk_acc_bits", "qk_pack_shift", "p8_row_shift", "quantize_p8", "pv_pack_shift",
    "pv_p8_out", "P8_SHIFT_MAX", "score_beat_layout", "p8_beat_layout", "PV_SHIFT",
    "pv_acc_bits", "v_beat_layout", "tile_state_layout", "merge_in_layout", "merge_beat_layout",
    "score_row_beat_layout", "pv_out_layout", "qk_tile_keys", "k_word_layout",
    "score_q_layout", "row_mode_fields", "kv_rows_layout", "fold_row_layout", "fold_header_layout",
    "chunk_layout", "query_row_layout", "block_desc_layout", "tile_rows_layout",
    "norm_beat_layout", "pv_word_layout", "PV_LIMB_BITS", "PV_LIMBS", "w_limbs",
    "pv_w_acc_bits", "pv_sum_bits",
]

P_ONE = 1 << EXP_FRAC
"""``exp2_neg(0)``: the probability of a row's maximum key (UQ1.16)."""

W_MAX = int(v_weight(P_ONE, KV_SCALE.max_int))
"""Largest ``w = v_weight(p, sv)`` (1,048,560)."""
W_BITS = W_MAX.bit_length()
PV_W = FixedFormat("pv_w", W_BITS, EXP_FRAC, signed=False)
"""Today's probability-times-V-scale weight, unpacked: UQ4.16 in 20 bits."""

P8 = FixedFormat("pv_p8", 8, 0, signed=False)
"""8-bit probability row of the packed P·V, in units of the row's ``2^s``."""

P8_MAX_PRODUCT = P8.max_int * -KV_ELEM.min_int
"""Largest ``|w8 · v|`` (255 · 8 = 2040)."""


def qk_acc_bits(head_dim: int) -> int:
    """Signed bits of the exact ``acc = Σ q·k`` over ``head_dim`` INT8 × INT4 products."""
    return group_sum_bits(head_dim)


def qk_pack_shift(head_dim: int) -> int:
    """Field shift ``k`` of two keys packed into one DSP (``(k1·2^k + k0)·q``), accumulated over
    one dot product of ``head_dim`` products and split exactly."""
    return pack_shift(head_dim)


def pv_pack_shift(keys: int) -> int:
    """Field shift of two V channels packed into one DSP (``(v1·2^k + v0)·w8``) whose packed sum
    over ``keys`` keys splits exactly: the signed bits of ``keys · P8_MAX_PRODUCT``."""
    return int(keys * P8_MAX_PRODUCT).bit_length() + 1


PV_SPLIT_KEYS = max(n for n in (1 << i for i in range(16))
                    if pv_pack_shift(n) <= pack_shift(GROUP_SIZE))
"""Keys per packed P·V group on the arrays (their shift is ``pack_shift(GROUP_SIZE)``): 128."""

PV_SHIFT = pv_pack_shift(PV_SPLIT_KEYS)
"""Field shift of the packed P·V (``(v1·2^k + v0)·w8``, 19): exact for a packed group of up to
:data:`PV_SPLIT_KEYS` keys."""


def pv_acc_bits(keys: int) -> int:
    """Signed bits of a channel's exact ``Σ w8·v`` over ``keys`` keys."""
    return pv_pack_shift(keys)


PV_LIMB_BITS = P8.width
"""Bits of one byte (limb) of :data:`PV_W` on the packed arrays: a :data:`P8`-range activation."""
PV_LIMBS = -(-W_BITS // PV_LIMB_BITS)
"""Bytes of :data:`PV_W` (3): P·V dot products per channel group in today's ``w``."""


def w_limbs(w) -> np.ndarray:
    """``w`` (:data:`PV_W` codes, any shape) → its bytes ``[..., j] = (w >> 8j) & 255``, ``j <``
    :data:`PV_LIMBS`, least significant first: ``w = Σ_j 2^(8j)·w_j``."""
    w = np.asarray(w, dtype=np.int64)
    return np.stack([(w >> (PV_LIMB_BITS * j)) & P8.max_int for j in range(PV_LIMBS)], axis=-1)


def pv_w_acc_bits(keys: int) -> int:
    """Signed bits of a channel's exact ``Σ w·v`` over ``keys`` keys in today's ``w``."""
    return int(keys * W_MAX * -KV_ELEM.min_int).bit_length() + 1


def p8_row_shift(w_max, fmt: FixedFormat = P8):
    """Per (query row, KV block): ``s = max(0, bitlen(w_max) − fmt.width)`` so the row's largest
    ``w`` lands in ``2^(fmt.width−1) .. 2^fmt.width − 1`` (or below, unshifted). ``fmt`` is
    :data:`P8`; another unsigned width only for measurements."""
    return np.maximum(bitlen(np.asarray(w_max, dtype=np.int64)) - fmt.width, 0)


def quantize_p8(w, s, fmt: FixedFormat = P8):
    """``w8 = min(round_half_up(w, s), fmt.max_int)`` (``s`` broadcast per row; ``s = 0``
    passes ``w`` unchanged)."""
    w = np.asarray(w, dtype=np.int64)
    s = np.asarray(s, dtype=np.int64)
    half = (np.int64(1) << s) >> 1
    return saturate((w + half) >> s, fmt.width, signed=fmt.signed)


def pv_p8_out(acc, s):
    """A block's ``o_b`` before saturation: the exact packed-P·V sum ``acc = Σ w8·v`` times the
    row's ``2^s``."""
    return np.asarray(acc, dtype=np.int64) << np.asarray(s, dtype=np.int64)


# --- the tile softmax stage's streams (mcf.hdl.compute.tile_softmax) ----------------------------

P8_SHIFT_MAX = W_BITS - P8.width
"""Largest row shift :func:`p8_row_shift` gives (``w_max = W_MAX``: 12)."""


def row_mode_fields() -> dict:
    """A row's softmax mode on its way through the tiled chain (the rows of
    :func:`mcf.golden.attention_tiled.attend_tiled_rows`' modes): ``mode``
    (:class:`mcf.abi.kv.AttnMode`: SINGLE — the block maximum, merged online; MAX — only the
    row's maximum is kept; FIXED — every ``p`` against the given maximum ``m_fix``
    (:data:`mcf.abi.softmax.SCORE`), exact sums wrapped to 32 bits). MAX and FIXED are defined
    in :data:`PV_W` only (a stage in :data:`P8` runs every row as SINGLE). ``p8``: on stages
    built for :data:`PV_W`, the row's P·V in :data:`P8` instead (SINGLE; the tiled prefill on
    the chain the engine's jobs use) — a stage built for :data:`P8` runs every row so."""
    return {"mode": AttnMode, "m_fix": signed(STATE_M.width), "p8": unsigned(1)}


def score_beat_layout(keys: int, head_dim: int) -> data.StructLayout:
    """A beat of one (query row, KV block) on its way from ``S = Q·Kᵀ`` to the row softmax:
    ``keys`` consecutive keys of the row, each its exact ``acc = Σ q·k``
    (:func:`qk_acc_bits` signed bits), its ``sk`` and ``sv`` (:data:`mcf.abi.kv.KV_SCALE`) and
    ``masked`` (no probability: causal ``pos > q_pos``, or padding of a block that is not a
    whole number of beats); the query's scale ``(scale_m, scale_e)``
    (:class:`mcf.abi.quant.Scale`, per-channel K: the folded ``(m', e')`` of the keys' group,
    :func:`mcf.abi.kv.fold_query`) shared by the beat's keys; ``last`` on the row's final beat.
    The key's score is ``score(acc, sk, q_multiplier(scale_m, head_dim),
    score_shift(scale_e))``. The row's ``mode`` and ``m_fix`` (:func:`row_mode_fields`) are
    equal on every beat of the row."""
    key = data.StructLayout({
        "acc": signed(qk_acc_bits(head_dim)),
        "sk": unsigned(KV_SCALE.width),
        "sv": unsigned(KV_SCALE.width),
        "masked": unsigned(1),
    })
    return data.StructLayout({
        "keys": data.ArrayLayout(key, keys),
        "scale_m": unsigned(SCALE_MANT_BITS),
        "scale_e": signed(SCALE_EXP_BITS),
        **row_mode_fields(),
        "last": unsigned(1),
    })


def pv_sum_bits(keys: int, p_format: FixedFormat = P8) -> int:
    """Signed bits of a channel's exact P·V sum over ``keys`` keys in ``p_format``
    (:data:`P8`: :func:`pv_acc_bits`; :data:`PV_W`, today's ``w`` in bytes:
    :func:`pv_w_acc_bits`)."""
    if p_format not in (P8, PV_W):
        raise ValueError(f"no P·V on the arrays in {p_format}")
    return pv_acc_bits(keys) if p_format == P8 else pv_w_acc_bits(keys)


def p8_beat_layout(keys: int, p_format: FixedFormat = P8) -> data.StructLayout:
    """A beat of a row's :data:`P8` probabilities for the P·V arrays: ``w8`` of ``keys``
    consecutive keys (0 for masked keys), and the row's record for the merge, equal on every
    beat of the row: the block maximum ``m`` (:data:`mcf.abi.softmax.STATE_M`, ``M_EMPTY`` if
    every key is masked), ``l = Σ p`` (:data:`mcf.abi.softmax.STATE_L`), the row shift ``s``
    (``o_b = (Σ w8·v) · 2^s``, :func:`pv_p8_out`); ``last`` on the row's final beat. With
    ``p_format = PV_W`` the ``w8`` fields carry today's ``w`` (20 bits) and ``s`` is 0 — or,
    with ``p8`` (the row's, :func:`row_mode_fields`), the row's ``w8`` and ``s``."""
    pv_sum_bits(1, p_format)
    return data.StructLayout({
        "w8": data.ArrayLayout(unsigned(p_format.width), keys),
        "m": signed(STATE_M.width),
        "l": unsigned(STATE_L.width),
        "s": unsigned(P8_SHIFT_MAX.bit_length()),
        "p8": unsigned(1),
        "last": unsigned(1),
    })


# --- the P·V arrays and the merge (mcf.hdl.compute.tile_pv, mcf.hdl.compute.tile_merge) ----------

def v_beat_layout(keys: int, head_dim: int, max_rows: int) -> data.StructLayout:
    """A beat of a KV block's V for the P·V arrays: ``keys`` consecutive keys' V rows
    (``v[key][channel]``, :data:`mcf.abi.kv.KV_ELEM` codes; padding keys 0), as many beats as the
    block's P rows have; ``rows``, read on the ``last`` beat: the query rows that run against the
    block (1 .. ``max_rows``; 0: the block is dropped)."""
    return data.StructLayout({
        "v": data.ArrayLayout(data.ArrayLayout(signed(KV_ELEM.width), head_dim), keys),
        "rows": unsigned(int(max_rows).bit_length()),
        "last": unsigned(1),
    })


def tile_state_layout(head_dim: int) -> data.StructLayout:
    """One row's softmax state ``(m, l, o)`` (:data:`mcf.abi.softmax.STATE_M`, ``STATE_L``,
    ``STATE_O``): a row's merged state."""
    return data.StructLayout({
        "m": signed(STATE_M.width),
        "l": unsigned(STATE_L.width),
        "o": data.ArrayLayout(signed(STATE_O.width), head_dim),
    })


def pv_out_layout(channels: int, max_block: int, p_format: FixedFormat = P8) -> data.StructLayout:
    """A beat of a row's block state out of the P·V arrays: ``m_b``, ``l_b``, the row shift
    ``s`` (the same on each of the row's beats) and per channel of ``channels`` consecutive
    ones the exact ``acc = Σ w8·v`` (:func:`pv_acc_bits` of ``max_block``), so that
    ``o_b = sat(pv_p8_out(acc, s))`` (``STATE_O``) — the shift and saturation are left to the
    merge, which takes a few channels per cycle; ``last`` on the row's final beat (a row is
    ``head_dim / channels`` beats in channel order: one with ``channels = head_dim``, TilePV's;
    one per channel group with ArrayPV's). ``p_format = PV_W``: ``acc = Σ w·v`` in
    :func:`pv_w_acc_bits`, ``s`` 0."""
    return data.StructLayout({
        "m": signed(STATE_M.width),
        "l": unsigned(STATE_L.width),
        "s": unsigned(P8_SHIFT_MAX.bit_length()),
        "acc": data.ArrayLayout(signed(pv_sum_bits(max_block, p_format)), channels),
        "last": unsigned(1),
    })


def merge_in_layout(channels: int, rows: int, max_block: int,
                    p_format: FixedFormat = P8) -> data.StructLayout:
    """A block state's beat on its way into the merge (:func:`pv_out_layout` of ``channels``),
    the row (``0 .. rows−1`` of the query tile), ``first`` (the row's first block: merged into
    the empty state), ``final`` (its last block: the merged state is emitted) and the row's
    ``mode`` (:func:`row_mode_fields`), the same on each of the row's beats."""
    return data.StructLayout({
        "state": pv_out_layout(channels, max_block, p_format),
        "row": unsigned(max(1, (rows - 1).bit_length())),
        "first": unsigned(1),
        "final": unsigned(1),
        "mode": AttnMode,
    })


def score_row_beat_layout(keys: int, head_dim: int, rows: int) -> data.StructLayout:
    """A beat of :func:`score_beat_layout` with the row's place in the tile for the merge
    (read on the row's first beat): ``row``, ``first``, ``final`` as in
    :func:`merge_in_layout`."""
    return data.StructLayout({
        "beat": score_beat_layout(keys, head_dim),
        "row": unsigned(max(1, (rows - 1).bit_length())),
        "first": unsigned(1),
        "final": unsigned(1),
    })


def merge_beat_layout(lanes: int, rows: int) -> data.StructLayout:
    """A beat of a row's merged state after its final block: ``m``, ``l`` and ``lanes``
    channels of ``o`` (a row's beats in channel order), the row on each, ``last`` on its
    final one."""
    return data.StructLayout({
        "state": tile_state_layout(lanes),
        "row": unsigned(max(1, (rows - 1).bit_length())),
        "last": unsigned(1),
    })


# --- the S = Q·Kᵀ arrays (mcf.hdl.compute.tile_score) --------------------------------------------

def qk_tile_keys(keys: int, head_dim: int, lanes: int) -> int:
    """Keys of one key tile of the ``S`` arrays: ``keys × head_dim / lanes`` (``lanes`` channels
    per cycle, ``head_dim / lanes`` cycles per tile, so a tile's scores leave at ``keys`` per
    cycle)."""
    return keys * (head_dim // lanes)


def k_word_layout(keys: int, head_dim: int, lanes: int, max_block: int,
                  max_rows: int) -> data.StructLayout:
    """A weight word of a KV block's K for the ``S`` arrays: the :func:`qk_tile_keys` keys of a
    key tile × ``lanes`` consecutive channels (``k[key][lane]``, :data:`mcf.abi.kv.KV_ELEM`
    codes; keys at or past the block's ``n`` carry any value — every consumer masks them,
    :class:`mcf.hdl.compute.tile_kv.TileKV` leaves what its bank held), words in the order (key
    tile, channel chunk); with it the scales
    ``sk``, ``sv`` of ``keys`` keys — word ``n`` of the block carries those of keys
    ``n·keys ..``, the keys of score beat ``n``. On the ``last`` word: ``n`` (the block's keys,
    1 .. ``max_block``) and ``rows`` (the query rows that run against the block, 1 ..
    ``max_rows``; 0: the block is dropped)."""
    tile = qk_tile_keys(keys, head_dim, lanes)
    return data.StructLayout({
        "k": data.ArrayLayout(data.ArrayLayout(signed(KV_ELEM.width), lanes), tile),
        "sk": data.ArrayLayout(unsigned(KV_SCALE.width), keys),
        "sv": data.ArrayLayout(unsigned(KV_SCALE.width), keys),
        "n": unsigned(int(max_block).bit_length()),
        "rows": unsigned(int(max_rows).bit_length()),
        "last": unsigned(1),
    })


def score_q_layout(head_dim: int, max_block: int, rows: int) -> data.StructLayout:
    """A query row's beat into the ``S`` arrays, one per key tile of the block it runs against:
    the INT8 query (:data:`mcf.abi.kv.Q_ELEM` codes; per-channel K: folded by the group header
    of the tile's keys, :func:`mcf.abi.kv.fold_query`) and its scale ``(scale_m, scale_e)``;
    ``visible``: the keys of the block the row sees (keys ``≥ visible`` are masked — causal
    ``pos > q_pos`` on the diagonal tile; a block's positions increase); the row's place in the
    query tile ``row``, ``first``, ``final`` (:func:`merge_in_layout`); its ``mode`` and
    ``m_fix`` (:func:`row_mode_fields`, read on the row's first beat)."""
    return data.StructLayout({
        "q": data.ArrayLayout(signed(Q_ELEM.width), head_dim),
        "scale_m": unsigned(SCALE_MANT_BITS),
        "scale_e": signed(SCALE_EXP_BITS),
        **row_mode_fields(),
        "visible": unsigned(int(max_block).bit_length()),
        "row": unsigned(max(1, (rows - 1).bit_length())),
        "first": unsigned(1),
        "final": unsigned(1),
    })


def pv_word_layout(channels: int, lanes: int, max_block: int,
                   max_rows: int) -> data.StructLayout:
    """A weight word of a KV block's V for P·V on the GEMM's arrays
    (:class:`mcf.hdl.compute.array_pv.ArrayPV`): ``channels`` V channels (the array's rows) ×
    ``lanes`` consecutive keys (its lanes; ``v[channel][key]``, :data:`mcf.abi.kv.KV_ELEM`
    codes; keys past the block any value: their P is 0), words in the order (key step,
    channel group) — a K-style
    ``[key][channel]`` block of ``lanes`` keys and ``channels`` channels, transposed. On the
    ``last`` word: ``n`` (the block's keys, 1 .. ``max_block``) and ``rows`` (the P rows that
    run against the block, 1 .. ``max_rows``; 0: the block is dropped)."""
    return data.StructLayout({
        "v": data.ArrayLayout(data.ArrayLayout(signed(KV_ELEM.width), lanes), channels),
        "n": unsigned(int(max_block).bit_length()),
        "rows": unsigned(int(max_rows).bit_length()),
        "last": unsigned(1),
    })


# --- feeding the S and P·V arrays from the KV records (tile_kv, tile_fold) ------------------------

def kv_rows_layout(max_rows: int) -> data.StructLayout:
    """Per KV block, for :class:`mcf.hdl.compute.tile_kv.TileKV`: ``rows``, the query rows that
    run against the block (1 .. ``max_rows``; 0: the arrays drop the block) — put on the block's
    last K word (:func:`k_word_layout`) and last V beat (:func:`v_beat_layout`)."""
    return data.StructLayout({"rows": unsigned(int(max_rows).bit_length())})


def fold_row_layout(head_dim: int, max_block: int, rows: int) -> data.StructLayout:
    """A query row against one KV block, for :class:`mcf.hdl.compute.tile_fold.TileFold`: the
    row's INT8 query and scale (**not** folded), ``visible`` and the tags as in
    :func:`score_q_layout`, ``n`` (the block's keys, 1 .. ``max_block``: the row's key tiles
    and, per-channel K, its 32-key groups), ``last`` (the block's last row: its group
    headers are done with) and the row's ``mode``, ``m_fix`` (:func:`row_mode_fields`)."""
    return data.StructLayout({
        "q": data.ArrayLayout(signed(Q_ELEM.width), head_dim),
        "scale_m": unsigned(SCALE_MANT_BITS),
        "scale_e": signed(SCALE_EXP_BITS),
        **row_mode_fields(),
        "visible": unsigned(int(max_block).bit_length()),
        "n": unsigned(int(max_block).bit_length()),
        "row": unsigned(max(1, (rows - 1).bit_length())),
        "first": unsigned(1),
        "final": unsigned(1),
        "last": unsigned(1),
    })


def fold_header_layout(lanes: int) -> data.StructLayout:
    """A beat of a KV block's per-channel K group headers for
    :class:`mcf.hdl.compute.tile_fold.TileFold`: ``lanes`` K channel scale codes (channel ``i``
    of the beat in bits ``[16i, 16i+16)``, :func:`mcf.abi.kv.kv_header_layout`'s ``data``),
    ``head_dim/lanes`` beats per header, the block's headers (one per 32-key group from its
    first key) in order; ``last`` on the block's final beat."""
    return data.StructLayout({"data": unsigned(lanes * KV_SCALE.width), "last": unsigned(1)})


# --- the query sequencer and the output (tile_query, tile_normalize, tile_prefill) ---------------

def chunk_layout(max_rows: int, max_heads: int) -> data.StructLayout:
    """A prefill chunk for :class:`mcf.hdl.compute.tile_query.TileQuery`: ``pos``, the position
    of its first token (token ``t`` at ``pos + t``); ``rows``, its query rows (tokens × query
    heads of one KV head, 1 .. ``max_rows``); ``heads``, the query heads per KV head (GQA,
    1 .. ``max_heads``): row ``x`` is token ``x // heads``, head ``x % heads``."""
    return data.StructLayout({
        "pos": unsigned(KV_POS_BITS),
        "rows": unsigned(int(max_rows).bit_length()),
        "heads": unsigned(int(max_heads).bit_length()),
    })


def query_row_layout(head_dim: int) -> data.StructLayout:
    """A chunk's query row: the INT8 query (:data:`mcf.abi.kv.Q_ELEM` codes) and its scale
    ``(scale_m, scale_e)`` (:class:`mcf.abi.quant.Scale`), not folded."""
    return data.StructLayout({
        "q": data.ArrayLayout(signed(Q_ELEM.width), head_dim),
        "scale_m": unsigned(SCALE_MANT_BITS),
        "scale_e": signed(SCALE_EXP_BITS),
    })


def block_desc_layout(max_block: int) -> data.StructLayout:
    """A KV block as a query tile meets it: ``pos0``, the position of its first key (key ``i``
    at ``pos0 + i``), ``n``, its keys (1 .. ``max_block``), and ``last`` on the query tile's
    final block. The blocks come in increasing positions, all of them once per query tile."""
    return data.StructLayout({
        "pos0": unsigned(KV_POS_BITS),
        "n": unsigned(int(max_block).bit_length()),
        "last": unsigned(1),
    })


def tile_rows_layout(rows: int) -> data.StructLayout:
    """Per query tile: ``rows``, the tile's rows that see a key (0 .. ``rows``) — the merged
    states it will emit; ``last`` on the chunk's final tile."""
    return data.StructLayout({"rows": unsigned(int(rows).bit_length()), "last": unsigned(1)})


def norm_beat_layout(lanes: int, rows: int) -> data.StructLayout:
    """A beat of a normalised output row ``o / l`` (:data:`mcf.abi.kv.ATTN_OUT` codes, the
    PREFILL output, :func:`mcf.abi.softmax.normalize`): ``lanes`` channels, a row's beats in
    channel order, its row (``0 .. rows−1``) on each, ``last`` on its final one."""
    return data.StructLayout({
        "o": data.ArrayLayout(signed(ATTN_OUT.width), lanes),
        "row": unsigned(max(1, (rows - 1).bit_length())),
        "last": unsigned(1),
    })
