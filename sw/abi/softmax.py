"""Online-softmax state formats and the exp method shared by attention and the NIC reduction.

Decode attention on each node yields, per head, a partial state ``(m, l, o)`` over its KV shard;
the reduction engine merges states pairwise (paper §4 end, §5):

    m = max(m1, m2);  l = l1·2^(m1−m) + l2·2^(m2−m);  o = o1·2^(m1−m) + o2·2^(m2−m)

Scores live in the **log2 domain** (``t = q·k·scale·log2 e``) so every exponential is a power of
two: ``2^−d`` for ``d ≥ 0`` splits into ``d = i + f/2^SCORE_FRAC`` and becomes
``EXP_LUT[f] >> i`` — one 2^SCORE_FRAC-entry ROM and a barrel shifter, exact on its grid up to the
ROM's rounding (≤ 2^−17 absolute).

Formats (all lanes are 32-bit little-endian words in a payload):

* ``m`` — :data:`STATE_M`, signed, SCORE_FRAC fraction bits; :data:`M_EMPTY` marks an empty shard.
* ``l`` — :data:`STATE_L`, unsigned, EXP_FRAC fraction bits, saturating.
* ``o`` — :data:`STATE_O`, signed 32-bit, saturating; its fraction bits are the attention
  kernel's business (the merge scales ``o`` exactly like ``l`` and never looks at its units).

Merge rounding: each scaled term is rounded half-up (``(x·f + 2^(EXP_FRAC−1)) >> EXP_FRAC``)
before the two terms are added; the operand holding the maximum has ``f = 2^EXP_FRAC`` and passes
unchanged. The merge is commutative but not associative, so reductions are defined in arrival
order. Plain reductions (``ReduceOp.MAX``/``SUM``) act on signed 32-bit lanes; SUM wraps.
"""

from __future__ import annotations

import numpy as np

from .fixed import FixedFormat, round_shift, saturate, wrap

__all__ = [
    "SCORE_FRAC", "EXP_FRAC", "LANE_BITS", "SCORE", "STATE_M", "STATE_L", "STATE_O", "M_EMPTY",
    "exp2_lut", "exp2_neg", "merge_state", "empty_state", "reduce_lanes",
    "state_words", "pack_state", "unpack_state",
    "RECIP_IN_BITS", "RECIP_LUT_BITS", "RECIP_FRAC", "NORM_OUT", "recip_lut", "recip_mant",
    "normalize", "merge_states", "sum_states",
]

LANE_BITS = 32
SCORE_FRAC = 8
EXP_FRAC = 16

SCORE = FixedFormat("score_log2", LANE_BITS, SCORE_FRAC, signed=True)
STATE_M = SCORE
STATE_L = FixedFormat("state_l", LANE_BITS, EXP_FRAC, signed=False)
STATE_O = FixedFormat("state_o", LANE_BITS, EXP_FRAC, signed=True)
M_EMPTY = STATE_M.min_int


def exp2_lut() -> np.ndarray:
    """``EXP_LUT[f] = round(2^EXP_FRAC · 2^(−f / 2^SCORE_FRAC))``: 2^SCORE_FRAC entries."""
    f = np.arange(1 << SCORE_FRAC, dtype=np.float64)
    return np.floor((1 << EXP_FRAC) * np.exp2(-f / (1 << SCORE_FRAC)) + 0.5).astype(np.int64)


_LUT = exp2_lut()


def exp2_neg(d) -> np.ndarray:
    """``2^−d`` in UQ1.EXP_FRAC for ``d ≥ 0`` in score units (LUT + truncating shift)."""
    d = np.asarray(d, dtype=np.int64)
    if np.any(d < 0):
        raise ValueError("exp2_neg takes non-negative differences")
    i = d >> SCORE_FRAC
    f = d & ((1 << SCORE_FRAC) - 1)
    return np.where(i <= EXP_FRAC, _LUT[f] >> np.minimum(i, EXP_FRAC + 1), 0)


def empty_state(head_dim: int):
    return np.int64(M_EMPTY), np.int64(0), np.zeros(head_dim, dtype=np.int64)


def merge_state(a, b):
    """Merge two ``(m, l, o)`` states bit-exactly as the hardware does.

    Works on one head (``m``, ``l`` scalars, ``o[d]``) or on rows of heads at once (``m[R]``,
    ``l[R]``, ``o[R, d]``): every row is merged on its own, with the same bits."""
    ma, la, oa = (np.asarray(x, dtype=np.int64) for x in a)
    mb, lb, ob = (np.asarray(x, dtype=np.int64) for x in b)
    m = np.maximum(ma, mb)
    fa = exp2_neg(m - ma)
    fb = exp2_neg(m - mb)

    def scale(x, f):
        return round_shift(x * f, EXP_FRAC, "half_up")

    l_out = saturate(scale(la, fa) + scale(lb, fb), STATE_L.width, signed=False)
    o_out = saturate(scale(oa, fa[..., None]) + scale(ob, fb[..., None]), STATE_O.width,
                     signed=True)
    return m[()], np.asarray(l_out, dtype=np.int64)[()], o_out.astype(np.int64)


def reduce_lanes(op: str, a, b):
    """Element-wise MAX (signed) or SUM (wrapping) of 32-bit lanes."""
    a = np.asarray(a, dtype=np.int64)
    b = np.asarray(b, dtype=np.int64)
    if op == "max":
        return np.maximum(a, b)
    if op == "sum":
        return wrap(a + b, LANE_BITS, signed=True)
    raise ValueError(f"unknown lane reduction {op!r}")


def state_words(head_dim: int) -> int:
    """32-bit words of one head's state in a payload: m, l, then o[0..head_dim)."""
    return 2 + head_dim


def pack_state(m, l_sum, o) -> bytes:
    words = np.concatenate([[int(m)], [int(l_sum)], np.asarray(o, dtype=np.int64)])
    return (words & 0xFFFFFFFF).astype("<u4").tobytes()


def unpack_state(payload: bytes, head_dim: int):
    w = np.frombuffer(payload, dtype="<u4").astype(np.int64)
    if w.size != state_words(head_dim):
        raise ValueError(f"state payload has {w.size} words, expected {state_words(head_dim)}")
    signed = np.where(w >= 1 << 31, w - (1 << 32), w)
    return np.int64(signed[0]), np.int64(w[1]), signed[2:]


# --- Additions (attention engine): normalisation o / l and reductions of many states ----------
#
# The final division by ``l`` happens where the merged state lands (prefill: in the attention
# engine; decode: after the reduction). It uses a reciprocal of a normalised mantissa:
#
#   x in [2^(RECIP_IN_BITS-1), 2^RECIP_IN_BITS)          (l shifted so its leading one is the MSB)
#   r0 = RECIP_LUT[top RECIP_LUT_BITS bits of x after the leading one]  ≈ 2^RECIP_FRAC / x
#   r  = round_half_up(r0 · (2^(RECIP_FRAC+1) − x·r0), RECIP_FRAC)     (one Newton step)
#
# so ``r ≈ 2^RECIP_FRAC / x`` (RECIP_FRAC = 2·RECIP_IN_BITS − 1, r in (2^15, 2^16]); the maximum
# error over all 2^15 inputs is measured exhaustively by tests/test_exp_recip.py (≤ 1 LSB).

RECIP_IN_BITS = 16
RECIP_LUT_BITS = 7
RECIP_FRAC = 2 * RECIP_IN_BITS - 1
NORM_OUT = FixedFormat("norm_out", LANE_BITS, EXP_FRAC, signed=True)
"""``o / l`` in the units of ``o`` (real value · 2^EXP_FRAC), saturating 32-bit lanes."""


def recip_lut() -> np.ndarray:
    """``RECIP_LUT[i] = round(2^RECIP_FRAC / x_mid(i))``, ``x_mid`` the midpoint of the segment."""
    n = 1 << RECIP_LUT_BITS
    seg = 1 << (RECIP_IN_BITS - 1 - RECIP_LUT_BITS)
    x_mid = (1 << (RECIP_IN_BITS - 1)) + np.arange(n, dtype=np.float64) * seg + seg / 2
    return np.floor((1 << RECIP_FRAC) / x_mid + 0.5).astype(np.int64)


_RLUT = recip_lut()


def recip_mant(x) -> np.ndarray:
    """``≈ 2^RECIP_FRAC / x`` for normalised ``x`` (MSB of RECIP_IN_BITS set), LUT + Newton."""
    x = np.asarray(x, dtype=np.int64)
    if np.any((x >> (RECIP_IN_BITS - 1)) != 1):
        raise ValueError("recip_mant takes normalised mantissas")
    idx = (x >> (RECIP_IN_BITS - 1 - RECIP_LUT_BITS)) & ((1 << RECIP_LUT_BITS) - 1)
    r0 = _RLUT[idx]
    err = (1 << (RECIP_FRAC + 1)) - x * r0
    return round_shift(r0 * err, RECIP_FRAC, "half_up")


def normalize(l_sum, o) -> np.ndarray:
    """``o / l`` as :data:`NORM_OUT` codes, bit-exactly as the hardware normaliser: ``l`` is
    normalised by its leading one (truncating), inverted by :func:`recip_mant`, and
    ``out = sat32(round_half_up(o · r, e))`` with ``e`` the leading-one position of ``l``.
    ``l == 0`` (empty state) gives 0."""
    lv = int(l_sum)
    o = np.asarray(o, dtype=np.int64)
    if lv <= 0:
        return np.zeros_like(o)
    e = lv.bit_length() - 1
    top = RECIP_IN_BITS - 1
    x = lv >> (e - top) if e >= top else lv << (top - e)
    r = int(recip_mant(x))
    return saturate(round_shift(o * r, e, "half_up"), NORM_OUT.width, NORM_OUT.signed)


def merge_states(states):
    """Left fold of :func:`merge_state` in list order (the reduction engine's arrival order)."""
    it = iter(states)
    acc = next(it)
    for s in it:
        acc = merge_state(acc, s)
    return acc


def sum_states(a, b):
    """Two-phase states (same ``m``): ``l`` and ``o`` lanes summed with 32-bit wrap-around
    (``ReduceOp.SUM``), ``m`` by ``ReduceOp.MAX``. Associative and commutative."""
    ma, la, oa = a
    mb, lb, ob = b
    l_out = int(reduce_lanes("sum", la, lb)) & ((1 << LANE_BITS) - 1)
    return (np.int64(max(int(ma), int(mb))), np.int64(l_out),
            reduce_lanes("sum", oa, ob).astype(np.int64))
