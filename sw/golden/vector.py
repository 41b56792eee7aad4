"""Bit-exact golden model of the vector unit (paper §5 compute engine: everything of a Qwen2
layer that is not a GEMM or attention). Inputs and outputs are ACT codes (:mod:`mcf.abi.quant`)
unless stated; every function mirrors the hardware's order of rounding and saturation.

* :func:`residual_add` — ``sat32(a + b)``.
* :func:`rmsnorm` — ``xs = x >> NORM_IN_SHIFT``; ``ss = Σ xs²`` (Q.24, 72-bit);
  ``ms = ⌊ss / N⌋ + ε``; ``(rm, tr) = rsqrt_mantissa(ms)``;
  ``y = round_half_even(x · rm, NORM_RECIP_BITS − ACT_FRAC − tr)``;
  ``z = sat32(round_half_even(y · γ, GAMMA.frac))``.
* :func:`rope` — pairs ``(x[i], x[i + d/2])`` per head: ``x0·c − x1·s`` and ``x1·c + x0·s``,
  each ``sat32(round_half_even(·, ROPE.frac))``.
* :func:`silu_mul` — ``σ(g)`` from the interpolated table, ``silu = sat32(rhe(g · σ, 16))``,
  ``out = sat32(rhe(silu · u, ACT_FRAC))``.
* :func:`requantize` — ACT → INT8 with per-token scale (from :mod:`mcf.abi.quant`).
* :func:`absmax` — ABSMAX, a shard's contribution to the row scale's ``ReduceOp.MAX``
  all-reduce in tensor-parallel decode: :func:`mcf.abi.tp.absmax_lanes` ``[max x, max ~x]``.
* :func:`requantize_ext` — REQUANT_EXT: :func:`requantize` of the token with the absolute
  maximum the MAX-reduced lanes give (:func:`mcf.abi.tp.lanes_absmax`, negative taken as 0)
  appended and dropped: the whole row's codes (:func:`mcf.abi.tp.requantize_with_absmax`).
"""

from __future__ import annotations

import numpy as np

from mcf.abi.fixed import round_shift, saturate
from mcf.abi.quant import (
    ACT,
    ACT_FRAC,
    GAMMA,
    NORM_IN_SHIFT,
    NORM_RECIP_BITS,
    ROPE,
    SIG_FRAC,
    SIG_INDEX_BITS,
    SIG_STEP_SHIFT,
    norm_eps_code,
    requantize,
    rsqrt_mantissa,
    sigmoid_lut,
)
from mcf.abi.tp import absmax_lanes, lanes_absmax

__all__ = ["residual_add", "rmsnorm", "rmsnorm_factors", "rope", "rope_pairs", "sigmoid",
           "silu_mul", "requantize", "mul_round", "absmax", "requantize_ext"]


def _rhe(x, s):
    return round_shift(np.asarray(x, dtype=np.int64), s, "half_even")


def mul_round(a, b, shift: int):
    """``round_half_even(a · b, shift)`` with exact products (Python ints when they would
    overflow int64)."""
    a = np.asarray(a, dtype=np.int64)
    b = np.asarray(b, dtype=np.int64)
    p = a.astype(object) * b.astype(object)
    half = 1 << (shift - 1) if shift else 0

    def one(v):
        if shift == 0:
            return v
        q, r = v >> shift, v & ((1 << shift) - 1)
        return q + (1 if (r > half or (r == half and (q & 1))) else 0)

    out = np.vectorize(one, otypes=[object])(p)
    return out


def residual_add(a, b):
    return saturate(np.asarray(a, dtype=np.int64) + np.asarray(b, dtype=np.int64), ACT.width)


def rmsnorm_factors(x, eps: float = 1e-6):
    """Per token: ``(ms, rm, tr)`` — mean square with ε (Q.24) and the rsqrt mantissa/shift."""
    x = np.atleast_2d(np.asarray(x, dtype=np.int64))
    n = x.shape[-1]
    xs = x >> NORM_IN_SHIFT
    out = []
    for row in xs:
        ss = sum(int(v) * int(v) for v in row)   # exact (the hardware sums in 72 bits)
        ms = ss // n + norm_eps_code(eps)
        rm, tr = rsqrt_mantissa(ms)
        out.append((ms, rm, tr))
    return out


def rmsnorm(x, gamma, eps: float = 1e-6):
    """RMSNorm of ACT codes ``x[M, N]`` with GAMMA codes ``gamma[N]`` → ACT codes."""
    x = np.atleast_2d(np.asarray(x, dtype=np.int64))
    gamma = np.asarray(gamma, dtype=np.int64)
    out = np.empty_like(x)
    for i, (_, rm, tr) in enumerate(rmsnorm_factors(x, eps)):
        y = mul_round(x[i], rm, NORM_RECIP_BITS - ACT_FRAC - tr)
        z = mul_round(y.astype(np.int64), gamma, GAMMA.frac)
        out[i] = saturate(z.astype(np.int64), ACT.width)
    return out


def rope(x, cos, sin, head_dim: int):
    """Rotate ``x[M, H·d]`` per head with per-token tables ``cos/sin[M, d/2]`` (ROPE codes)."""
    x = np.atleast_2d(np.asarray(x, dtype=np.int64))
    m, width = x.shape
    h = head_dim // 2
    xr = x.reshape(m, width // head_dim, 2, h)
    c = np.asarray(cos, dtype=np.int64)[:, None, :]
    s = np.asarray(sin, dtype=np.int64)[:, None, :]
    x0, x1 = xr[:, :, 0, :], xr[:, :, 1, :]
    y0 = saturate(_rhe(x0 * c - x1 * s, ROPE.frac), ACT.width)
    y1 = saturate(_rhe(x1 * c + x0 * s, ROPE.frac), ACT.width)
    return np.stack([y0, y1], axis=2).reshape(m, width)


def rope_pairs(xp, words):
    """ROPE as the vector unit computes it: ``xp`` in :func:`rope_pair_order`, ``words`` from
    :func:`mcf.abi.quant.rope_words` (same results as :func:`rope`, permuted)."""
    xp = np.atleast_2d(np.asarray(xp, dtype=np.int64))
    w = np.atleast_2d(np.asarray(words, dtype=np.int64))
    c = ((w & 0xFFFF) ^ 0x8000) - 0x8000
    s = (((w >> 16) & 0xFFFF) ^ 0x8000) - 0x8000
    x0, x1 = xp[:, 0::2], xp[:, 1::2]
    out = np.empty_like(xp)
    out[:, 0::2] = saturate(_rhe(x0 * c[:, 0::2] - x1 * s[:, 0::2], ROPE.frac), ACT.width)
    out[:, 1::2] = saturate(_rhe(x1 * c[:, 1::2] + x0 * s[:, 1::2], ROPE.frac), ACT.width)
    return out


_SIG = sigmoid_lut()


def sigmoid(g):
    """Interpolated table sigmoid of ACT codes → Q.SIG_FRAC codes."""
    g = np.asarray(g, dtype=np.int64)
    half = 1 << (SIG_INDEX_BITS - 1)
    i = g >> SIG_STEP_SHIFT
    f = g & ((1 << SIG_STEP_SHIFT) - 1)
    lo_clip, hi_clip = i < -half, i >= half
    f = np.where(lo_clip | hi_clip, 0, f)
    i = np.clip(i, -half, half) + half
    a = _SIG[i]
    b = _SIG[np.minimum(i + 1, 2 * half)]
    return a + (((b - a) * f) >> SIG_STEP_SHIFT)


def silu_mul(g, u):
    """``silu(g) · u`` on ACT codes."""
    g = np.asarray(g, dtype=np.int64)
    s = sigmoid(g)
    silu = saturate(_rhe(g * s, SIG_FRAC), ACT.width)
    return saturate(mul_round(silu, u, ACT_FRAC).astype(np.int64), ACT.width)


def absmax(x):
    """ABSMAX of ACT codes ``x[..., N]`` → ``[..., 2]``: ``[max x, max ~x]`` per token (the
    vector unit's one output beat holds them in lanes 0 and 1, zeros in the others)."""
    return absmax_lanes(x)


def requantize_ext(x, lanes):
    """REQUANT_EXT of ACT codes ``x[..., N]`` with MAX-reduced ABSMAX lanes ``lanes[..., 2]``:
    ``requantize`` of ``x`` with ``max(lanes_absmax(lanes), 0)`` appended, the appended code
    dropped. Returns ``(q, m, e)`` as :func:`requantize`. With the all-reduced lanes of a row's
    shards this is :func:`mcf.abi.tp.requantize_with_absmax`, the whole row's codes."""
    x = np.asarray(x, dtype=np.int64)
    a = np.maximum(lanes_absmax(lanes), 0)
    q, m, e = requantize(np.concatenate([x, np.asarray(a)[..., None]], axis=-1))
    return q[..., :-1], m, e
