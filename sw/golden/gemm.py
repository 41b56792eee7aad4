"""Bit-exact golden model of the INT4 GEMM engine (paper §5 compute engine; formats in
:mod:`mcf.abi.quant`).

For tokens ``m``, output rows ``n`` and weight groups ``j`` of ``G`` K-elements:

1. group sums ``g[m, n, j] = Σ_{k ∈ j} wq[n, k] · xq[m, k]`` (exact; ``group_sum_bits(G)``);
2. ``acc[m, n] = Σ_j g[m, n, j] · w_m[n, j]`` (exact in ACC_BITS = 48 bits);
3. epilogue ``y = sat32(round_half_even(acc · x_m[m], sh[m]))`` with
   ``sh = epilogue_shift(w_e, x_e[m])``, then ``sat32(y + bias[n])``.

The two tensor-parallel job flags (:data:`mcf.abi.compute.GEMM_JOB`, docs/cluster.md
"Tensor-parallel decode"): ``acc_out`` writes step 2's accumulators as the SUM lanes of
:func:`mcf.abi.tp.acc_lanes` instead of step 3 (:func:`partial_lanes`); ``acc_in`` takes the
accumulators from summed lanes (:func:`lanes_in`: :func:`mcf.abi.tp.lanes_acc` wrapped to
ACC_BITS) instead of steps 1–2 and runs step 3 on them (:func:`lanes_epilogue`).

:func:`dsp_pack` / :func:`dsp_unpack` model the DSP48E2 packing the array uses: two rows' weights
share one multiplier as ``(w1 · 2^k + w0) · a``; a whole group is accumulated packed and split
at the group end (``low`` is the sign-extended bottom k bits, ``high = (P − low) >> k``).
"""

from __future__ import annotations

import numpy as np

from mcf.abi.fixed import round_shift, saturate, wrap
from mcf.abi.quant import ACC_BITS, ACT, GROUP_SIZE, epilogue_shift, pack_shift
from mcf.abi.tp import acc_lanes, lanes_acc

__all__ = ["group_sums", "accumulate", "epilogue", "gemm", "dsp_pack", "dsp_unpack",
           "packed_group_sums", "partial_lanes", "lanes_in", "lanes_epilogue"]


def group_sums(xq, wq, group: int = GROUP_SIZE) -> np.ndarray:
    """``[M, N, K/G]`` exact integer group sums."""
    xq = np.asarray(xq, dtype=np.int64)
    wq = np.asarray(wq, dtype=np.int64)
    m, k = xq.shape
    n = wq.shape[0]
    xg = xq.reshape(m, k // group, group)
    wg = wq.reshape(n, k // group, group)
    return np.einsum("mjg,njg->mnj", xg, wg)


def accumulate(gs, w_m) -> np.ndarray:
    """``acc[m, n] = Σ_j gs[m, n, j] · w_m[n, j]`` in ACC_BITS (checked: never wraps)."""
    acc = np.einsum("mnj,nj->mn", gs, np.asarray(w_m, dtype=np.int64))
    if np.any(acc != wrap(acc, ACC_BITS)):
        raise OverflowError("GEMM accumulator exceeded 48 bits")
    return acc


def epilogue(acc, x_m, x_e, w_e: int, bias=None) -> np.ndarray:
    """Per-token dequantisation to ACT codes plus bias, as the engine's epilogue does it."""
    acc = np.asarray(acc, dtype=np.int64)
    x_m = np.asarray(x_m, dtype=np.int64)
    sh = epilogue_shift(w_e, x_e)
    out = np.empty_like(acc)
    for i in range(acc.shape[0]):
        # acc (≤ 2^41) · x_m (< 2^16) stays inside int64
        out[i] = round_shift(acc[i] * x_m[i], int(sh[i]), "half_even")
    out = saturate(out, ACT.width)
    if bias is not None:
        out = saturate(out + np.asarray(bias, dtype=np.int64)[None, :], ACT.width)
    return out


def gemm(xq, x_m, x_e, wq, w_m, w_e: int, bias=None, group: int = GROUP_SIZE) -> np.ndarray:
    """INT8 activations ``xq[M, K]`` (scales ``x_m·2^x_e`` per token) times INT4 weights
    ``wq[N, K]`` (scales ``w_m[N, K/G]·2^w_e``) → ACT codes ``[M, N]``."""
    return epilogue(accumulate(group_sums(xq, wq, group), w_m), x_m, x_e, w_e, bias)


def partial_lanes(xq, wq, w_m, group: int = GROUP_SIZE) -> np.ndarray:
    """An ``acc_out`` job: the exact accumulators of ``xq[M, K] · wq[N, K]ᵀ`` as SUM lanes
    ``[M, 2N]`` (:func:`mcf.abi.tp.acc_lanes`: ``lo, hi`` per element); no epilogue."""
    return acc_lanes(accumulate(group_sums(xq, wq, group), w_m))


def lanes_in(lanes) -> np.ndarray:
    """The accumulators an ``acc_in`` job takes from lanes ``[M, 2N]`` (signed 32-bit
    values): ``hi · 2^ACC_LO_BITS + lo`` wrapped to ACC_BITS, as the engine's 48-bit datapath
    does (the sum of a TP split's partial accumulators is the whole K's, which
    :func:`accumulate` holds in ACC_BITS)."""
    return wrap(lanes_acc(lanes), ACC_BITS)


def lanes_epilogue(lanes, x_m, x_e, w_e: int, bias=None) -> np.ndarray:
    """An ``acc_in`` job: the epilogue (and bias) of the accumulators in ``lanes[M, 2N]``."""
    return epilogue(lanes_in(lanes), x_m, x_e, w_e, bias)


def dsp_pack(w0, w1, group: int = GROUP_SIZE) -> np.ndarray:
    """The 23-bit multiplicand ``w1 · 2^k + w0`` of one DSP (k = :func:`pack_shift`)."""
    k = pack_shift(group)
    return np.asarray(w1, dtype=np.int64) * (1 << k) + np.asarray(w0, dtype=np.int64)


def dsp_unpack(p, group: int = GROUP_SIZE):
    """Split a packed accumulator into (low, high) field sums."""
    k = pack_shift(group)
    p = np.asarray(p, dtype=np.int64)
    low = wrap(p, k)
    return low, (p - low) >> k


def packed_group_sums(xq, wq, group: int = GROUP_SIZE) -> np.ndarray:
    """Group sums computed the way the array does: rows paired (2i, 2i+1) into one packed
    product per lane, accumulated packed over the group in 48 bits, then unpacked."""
    xq = np.asarray(xq, dtype=np.int64)
    wq = np.asarray(wq, dtype=np.int64)
    m, k = xq.shape
    n = wq.shape[0]
    packed = dsp_pack(wq[0::2], wq[1::2], group)                     # [N/2, K]
    prod = xq[:, None, :] * packed[None, :, :]                       # [M, N/2, K]
    p = wrap(prod.reshape(m, n // 2, k // group, group).sum(axis=3), ACC_BITS)
    low, high = dsp_unpack(p, group)
    out = np.empty((m, n, k // group), dtype=np.int64)
    out[:, 0::2] = low
    out[:, 1::2] = high
    return out
