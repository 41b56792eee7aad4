"""Quantisation formats of the matrix engine (paper §5 compute engine, §6.1: weights and KV in
INT4). The GEMM kernel, the vector unit, the host quantiser and the golden models all take their
widths, fraction bits and rounding rules from here.

Weights
    INT4 two's complement (-8..7), symmetric (no zero point), packed two per byte as in
    :func:`mcf.abi.fixed.pack_int4`. One scale per output row and per group of
    :data:`GROUP_SIZE` consecutive K elements (128 for Qwen2.5; a parameter everywhere).

Scales (:class:`Scale`)
    A small unsigned float: a :data:`SCALE_MANT_BITS`-bit unsigned mantissa ``m`` and a signed
    :data:`SCALE_EXP_BITS`-bit exponent ``e``, value ``m · 2^e``. Weight group scales of one
    tensor share one exponent (block floating point): the GEMM multiplies integer group sums by
    the mantissas and the shared exponent becomes part of a single output shift. Per-token
    activation scales carry their own exponent with a normalised mantissa
    (``2^15 <= m < 2^16``; ``m = 0`` means an all-zero token).

Activations
    * GEMM inputs: INT8 codes with a per-token :class:`Scale` (``x ≈ q · m · 2^e``) produced by
      the vector unit's requantisation (:func:`token_scale`, :func:`requantize`).
    * Everything between GEMMs (residual stream, norm outputs, Q/K/V, MLP): :data:`ACT`, a
      signed 32-bit code with :data:`ACT_FRAC` fraction bits, saturating.

Accumulation
    A group sum of INT4×INT8 products needs :func:`group_sum_bits` bits (19 for G = 128) and is
    held in 32-bit; group sums times 16-bit scale mantissas accumulate in :data:`ACC_BITS` = 48
    bits (the DSP48E2 P register), which cannot overflow for ``K < 2^21``.

Requantisation to INT8 rounds to nearest, ties to even, and saturates to -128..127.

Other vector formats: :data:`GAMMA` (RMSNorm weight), :data:`ROPE` (cos/sin tables),
the sigmoid table of the SiLU (:func:`sigmoid_lut`), and the RMSNorm reciprocal square root
(:func:`rsqrt_mantissa`: exact integer square root, then a restoring division).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from amaranth.lib import enum

from .fixed import INT4, INT8, INT32, FixedFormat, round_shift, saturate

__all__ = [
    "GROUP_SIZE", "WEIGHT", "XQ", "ACT_FRAC", "ACT", "ACC_BITS", "SCALE_MANT_BITS",
    "SCALE_EXP_BITS", "Scale", "group_sum_bits", "pack_shift", "QMAX_SHIFT", "RECIP_BITS",
    "token_scale", "requantize", "epilogue_shift", "SHIFT_MAX", "GAMMA", "ROPE",
    "NORM_IN_SHIFT", "NORM_SQRT_SHIFT", "NORM_RECIP_BITS", "RSQRT_MANT_BITS", "norm_eps_code",
    "rsqrt_mantissa", "SIG_STEP_SHIFT", "SIG_INDEX_BITS", "SIG_FRAC", "sigmoid_lut",
    "rope_table", "bitlen", "VectorOp", "ReadDest", "WriteSrc", "rope_pair_order", "rope_words",
]


class ReadDest(enum.Enum, shape=2):
    """Matrix engine routing: where a DMA port's read data go."""
    GEMM_X = 0
    GEMM_W = 1
    VEC_A = 2
    VEC_B = 3


class WriteSrc(enum.Enum, shape=1):
    """Matrix engine routing: which result stream the DMA write path takes."""
    GEMM = 0
    VECTOR = 1


class VectorOp(enum.Enum, shape=3):
    """Vector unit operations (one per token vector; see :mod:`mcf.golden.vector`)."""
    ADD = 0        # o = sat32(a + b)                    (residual add)
    SILU_MUL = 1   # o = silu(a) · b                     (gate, up)
    ROPE = 2       # a in pair order, b = rope_words      (Q, K)
    RMSNORM = 3    # o = rmsnorm(a) · γ, b = γ codes      (two passes over a buffered token)
    REQUANT = 4    # o = INT8 codes of a, then one scale word (two passes)
    ABSMAX = 5     # o = one beat: lanes 0, 1 = mcf.abi.tp.absmax_lanes(a), the rest 0 (TP)
    REQUANT_EXT = 6  # REQUANT, the absmax also over b's lanes 0, 1 (MAX-reduced ABSMAX lanes)

GROUP_SIZE = 128
"""Default weight-scale group along K (Qwen2.5 INT4 checkpoints use 128)."""

WEIGHT = INT4
XQ = INT8
ACT_FRAC = 16
ACT = FixedFormat("act", INT32.width, ACT_FRAC, signed=True)
ACC_BITS = 48

SCALE_MANT_BITS = 16
SCALE_EXP_BITS = 8

QMAX_SHIFT = 7
"""A token's INT8 scale is ``absmax / 2^QMAX_SHIFT``; the element equal to absmax saturates to
127 (never 128), so one code of range is traded for a division-free scale."""

RECIP_BITS = 31
"""Requantisation reciprocal ``r = floor(2^RECIP_BITS / m)`` (``2^15 < r <= 2^16``)."""

SHIFT_MAX = 63
"""GEMM epilogue shifts are clamped to ``0..SHIFT_MAX`` (both in hardware and golden)."""

GAMMA = FixedFormat("gamma", 16, 10, signed=True)
ROPE = FixedFormat("rope", 16, 14, signed=True)

NORM_IN_SHIFT = 4
"""RMSNorm squares ``x >> NORM_IN_SHIFT`` (28 bits), so squares and the mean square are
Q.(2·(ACT_FRAC − NORM_IN_SHIFT)) = Q.24 (sum in a 72-bit accumulator)."""
NORM_SQRT_SHIFT = 2 * NORM_IN_SHIFT
"""The mean square is shifted left by this before the integer square root → a Q.ACT_FRAC rms."""
NORM_RECIP_BITS = 48
"""``rinv = floor(2^NORM_RECIP_BITS / rms_code)``, then normalised to RSQRT_MANT_BITS bits."""
RSQRT_MANT_BITS = 18

SIG_STEP_SHIFT = 10
"""SiLU: the sigmoid table is indexed by ``g >> SIG_STEP_SHIFT`` (step 2^-6 in ACT units)."""
SIG_INDEX_BITS = 11
"""Table indices cover -2^10 .. 2^10 (inputs clamp to [-16, 16)); 2^11 + 1 entries."""
SIG_FRAC = 16


def bitlen(x) -> np.ndarray:
    """Bit length of non-negative integers (0 → 0), element-wise."""
    x = np.asarray(x, dtype=np.int64)
    out = np.zeros(x.shape, dtype=np.int64)
    v = x.copy()
    for s in (32, 16, 8, 4, 2, 1):
        big = v >= (1 << s)
        out += np.where(big, s, 0)
        v = np.where(big, v >> s, v)
    return out + (v > 0)


def group_sum_bits(group_size: int = GROUP_SIZE) -> int:
    """Signed bits holding any sum of ``group_size`` INT4×INT8 products."""
    worst = group_size * (INT4.min_int * XQ.min_int)  # -8 · -128 = 1024 per product
    return int(worst).bit_length() + 1


def pack_shift(group_size: int = GROUP_SIZE) -> int:
    """DSP packing: ``(w1·2^k + w0)·a`` accumulated over one group keeps the low field exact
    when ``k = group_sum_bits``; returns that ``k``."""
    return group_sum_bits(group_size)


@dataclass(frozen=True)
class Scale:
    """``m · 2^e`` (``m`` unsigned SCALE_MANT_BITS bits, ``e`` signed SCALE_EXP_BITS bits)."""
    m: int
    e: int

    def __post_init__(self):
        if not 0 <= self.m < (1 << SCALE_MANT_BITS):
            raise ValueError(f"scale mantissa {self.m} out of range")
        if not -(1 << (SCALE_EXP_BITS - 1)) <= self.e < (1 << (SCALE_EXP_BITS - 1)):
            raise ValueError(f"scale exponent {self.e} out of range")

    @property
    def value(self) -> float:
        return float(self.m) * 2.0 ** self.e


def token_scale(x):
    """Per-token INT8 scale from ACT codes ``x[..., N]``: returns ``(m, e, t)`` arrays where
    ``absmax ≈ m·2^t`` (``m`` normalised to SCALE_MANT_BITS bits by truncation) and the scale is
    ``m · 2^e``, ``e = t − QMAX_SHIFT − ACT_FRAC``. An all-zero token gives ``m = e = t = 0``."""
    x = np.asarray(x, dtype=np.int64)
    a = np.max(np.abs(x), axis=-1)
    n = bitlen(a)
    t = np.where(a > 0, n - SCALE_MANT_BITS, 0)
    m = np.where(t >= 0, a >> np.maximum(t, 0), a << np.maximum(-t, 0))
    e = np.where(a > 0, t - QMAX_SHIFT - ACT_FRAC, 0)
    return m.astype(np.int64), e.astype(np.int64), t.astype(np.int64)


def requantize(x):
    """ACT codes ``x[..., N]`` → (INT8 codes, scale mantissa, scale exponent), per token:
    ``q = sat8(round_half_even(x · r, RECIP_BITS − QMAX_SHIFT + t))``, ``r = ⌊2^31 / m⌋``."""
    x = np.asarray(x, dtype=np.int64)
    m, e, t = token_scale(x)
    r = np.where(m > 0, (1 << RECIP_BITS) // np.maximum(m, 1), 0)
    sh = RECIP_BITS - QMAX_SHIFT + t
    prod = x * r[..., None]
    q = np.empty_like(prod)
    flat_q, flat_p, flat_s = q.reshape(-1, q.shape[-1]), prod.reshape(-1, q.shape[-1]), sh.ravel()
    for i in range(flat_q.shape[0]):
        flat_q[i] = round_shift(flat_p[i], int(flat_s[i]), "half_even")
    q = saturate(q, XQ.width)
    return q.astype(np.int64), m, e


def epilogue_shift(w_exp: int, x_exp) -> np.ndarray:
    """Right shift turning ``acc · x_m`` into ACT codes: ``−(w_exp + x_exp + ACT_FRAC)``,
    clamped to ``0..SHIFT_MAX``."""
    return np.clip(-(int(w_exp) + np.asarray(x_exp, dtype=np.int64) + ACT_FRAC), 0, SHIFT_MAX)


def norm_eps_code(eps: float) -> int:
    """RMSNorm ε as a mean-square code (Q.24), at least 1 (so the square root is never 0)."""
    return max(1, int(round(eps * (1 << (2 * ACT_FRAC - 2 * NORM_IN_SHIFT)))))


def rsqrt_mantissa(ms_code: int) -> tuple[int, int]:
    """Reciprocal square root of a mean square (Q.24 code ``ms_code``, ε already added):
    ``rms = isqrt(ms_code << NORM_SQRT_SHIFT)`` (a Q.16 code, exact floor),
    ``rinv = ⌊2^NORM_RECIP_BITS / rms⌋``, normalised (truncated) to RSQRT_MANT_BITS bits:
    returns ``(rm, tr)`` with ``rinv ≈ rm · 2^tr``."""
    import math
    rms = math.isqrt(int(ms_code) << NORM_SQRT_SHIFT)
    rms = max(rms, 1)
    rinv = (1 << NORM_RECIP_BITS) // rms
    tr = rinv.bit_length() - RSQRT_MANT_BITS
    rm = rinv >> tr if tr >= 0 else rinv << -tr
    return rm, tr


def sigmoid_lut() -> np.ndarray:
    """``SIG[i] = round(2^SIG_FRAC · σ(j · 2^(SIG_STEP_SHIFT − ACT_FRAC)))`` for
    ``j = i − 2^(SIG_INDEX_BITS−1)``, ``i = 0 .. 2^SIG_INDEX_BITS`` (one extra entry so the
    interpolation at the top index has a right neighbour)."""
    half = 1 << (SIG_INDEX_BITS - 1)
    j = np.arange(-half, half + 1, dtype=np.float64)
    xv = j * 2.0 ** (SIG_STEP_SHIFT - ACT_FRAC)
    return np.floor((1 << SIG_FRAC) / (1.0 + np.exp(-xv)) + 0.5).astype(np.int64)


def rope_table(positions, head_dim: int, theta: float = 1e6):
    """RoPE cos/sin tables in :data:`ROPE` codes, shape ``[len(positions), head_dim // 2]``
    each: ``cos(p · θ^(−2i/d))`` and ``sin(...)`` (Qwen2/HF ``rotate_half`` convention)."""
    pos = np.asarray(positions, dtype=np.float64)[:, None]
    inv = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    ang = pos * inv[None, :]
    return ROPE.quantize(np.cos(ang)), ROPE.quantize(np.sin(ang))


def rope_pair_order(width: int, head_dim: int) -> np.ndarray:
    """Permutation putting each rotated pair ``(x[i], x[i + d/2])`` of every head side by side
    (``x[perm]``). The host stores the Q and K projection rows (and biases) in this order, so
    the GEMM emits pairs in neighbouring lanes; attention scores are unchanged because q and k
    share the permutation."""
    h = head_dim // 2
    heads = width // head_dim
    base = np.arange(heads)[:, None] * head_dim
    i = np.arange(h)[None, :]
    return np.stack([base + i, base + i + h], axis=2).ravel()


def rope_words(positions, width: int, head_dim: int, theta: float = 1e6) -> np.ndarray:
    """The vector unit's ROPE operand ``[len(positions), width]``: lane ``2j`` and ``2j + 1`` of
    a pair both hold ``cos | sin << 16`` (ROPE codes) of their frequency."""
    c, s = rope_table(positions, head_dim, theta)
    w = (c & 0xFFFF) | ((s & 0xFFFF) << 16)
    per_head = np.repeat(w, 2, axis=1)
    return np.tile(per_head, (1, width // head_dim))
