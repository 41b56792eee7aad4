"""Tensor-parallel decode numerics (issue #34 items 3–4; docs/cluster.md "Tensor-parallel
decode: the golden model"): what the nodes put in the NIC's reduction lanes so that a
row-parallel GEMM split over N nodes gives the single-node GEMM's bits.

The single-node GEMM (:mod:`mcf.golden.gemm`) computes ``acc[n] = Σ_j g[n, j] · w_m[n, j]``
exactly (integer group sums times integer scale mantissas, 48 bits) and rounds **once**, in the
epilogue ``sat32(rhe(acc · x_m, sh))``. Integer addition is associative and distributes over
the mantissa product, so for any split of K over nodes — on group boundaries or inside a group
(a split group's mantissa multiplies both partial group sums) — ``Σ_i acc_i = acc`` exactly.
The TP row-parallel GEMM is therefore bit-exact when

1. every node quantises its shard of the input with the **full row's** per-token scale: each
   node contributes :func:`absmax_lanes` of its ACT shard to a ``ReduceOp.MAX`` all-reduce and
   requantises with :func:`requantize_with_absmax` (the same codes as
   :func:`mcf.abi.quant.requantize` of the whole row);
2. the partial accumulators are summed **exactly**: a 48-bit accumulator does not fit one
   32-bit lane (:data:`mcf.abi.softmax.LANE_BITS`, SUM wraps), so each element travels as two
   lanes (:func:`acc_lanes`): ``lo = acc mod 2^ACC_LO_BITS`` (non-negative) and
   ``hi = acc >> ACC_LO_BITS`` (arithmetic). Over ``N ≤ TP_MAX_NODES`` contributions neither
   lane's sum leaves the signed 32-bit range, so the wrapping SUM is exact and
   :func:`lanes_acc` recovers ``Σ acc_i``;
3. the epilogue (rounding, saturation, bias) runs once, on the summed accumulator.

Group boundaries do not enter the arithmetic; they are the engine's job format (K a whole
number of groups, :class:`mcf.abi.compute.GemmLimits`): a shard that starts or ends inside a
group is run as the whole groups it touches with zero weight codes outside its range.

The node's datapath for these steps: the vector unit's ``ABSMAX`` (the MAX contribution) and
``REQUANT_EXT`` (requantisation with the reduced lanes; :class:`mcf.abi.quant.VectorOp`,
:func:`mcf.golden.vector.absmax` / :func:`mcf.golden.vector.requantize_ext`), and the GEMM's
``acc_out`` / ``acc_in`` job flags (:data:`mcf.abi.compute.GEMM_JOB`,
:func:`mcf.golden.gemm.partial_lanes` / :func:`mcf.golden.gemm.lanes_epilogue`).

Not adopted: summing each node's epilogue output (ACT codes, one lane per element, half the
bytes) rounds N times: up to ``⌊(N + 1)/2⌋`` ACT codes off per element and projection.
"""

from __future__ import annotations

import numpy as np

from .quant import ACC_BITS, requantize
from .softmax import LANE_BITS

__all__ = ["ACC_LO_BITS", "ACC_LANES", "ABSMAX_LANES", "TP_MAX_NODES", "acc_lanes", "lanes_acc",
           "absmax_lanes", "lanes_absmax", "requantize_with_absmax"]

ACC_LO_BITS = 24
"""Bits of an accumulator's low lane (unsigned); the high lane holds ``acc >> ACC_LO_BITS``."""
ACC_LANES = 2
"""32-bit lanes per accumulator element in a row-parallel SUM payload: ``lo, hi`` interleaved."""
ABSMAX_LANES = 2
"""32-bit lanes of a node's MAX all-reduce contribution (:func:`absmax_lanes`: max x, max ~x)."""
TP_MAX_NODES = 1 << (LANE_BITS - 1 - ACC_LO_BITS)
"""Most contributions whose low lanes sum below ``2^(LANE_BITS−1)`` (128): the SUM stays exact.
The high lanes (``|hi| ≤ 2^(ACC_BITS−1−ACC_LO_BITS)``) have room for more."""

if TP_MAX_NODES << (ACC_BITS - 1 - ACC_LO_BITS) > 1 << (LANE_BITS - 1):
    raise AssertionError("the high lanes of TP_MAX_NODES accumulators overflow a lane")


def acc_lanes(acc) -> np.ndarray:
    """Accumulators ``[..., n]`` (48-bit signed) → lanes ``[..., 2n]``: ``lo, hi`` per element."""
    acc = np.asarray(acc, dtype=np.int64)
    if np.any(acc >= 1 << (ACC_BITS - 1)) or np.any(acc < -(1 << (ACC_BITS - 1))):
        raise OverflowError(f"accumulator beyond {ACC_BITS} bits")
    out = np.empty(acc.shape[:-1] + (ACC_LANES * acc.shape[-1],), dtype=np.int64)
    out[..., 0::2] = acc & ((1 << ACC_LO_BITS) - 1)
    out[..., 1::2] = acc >> ACC_LO_BITS
    return out


def lanes_acc(lanes) -> np.ndarray:
    """Summed lanes ``[..., 2n]`` (signed 32-bit values) → the summed accumulators ``[..., n]``."""
    lanes = np.asarray(lanes, dtype=np.int64)
    return lanes[..., 1::2] * (1 << ACC_LO_BITS) + lanes[..., 0::2]


def absmax_lanes(x) -> np.ndarray:
    """One node's contribution to the scale all-reduce of its ACT shard ``x[..., n]``:
    ``[max x, max ~x]`` (``~x = −x − 1``: both fit a signed 32-bit lane, even ``|−2^31|``)."""
    x = np.asarray(x, dtype=np.int64)
    return np.stack([np.max(x, axis=-1), np.max(~x, axis=-1)], axis=-1)


def lanes_absmax(lanes) -> np.ndarray:
    """The MAX-reduced lanes → the row's absolute maximum ``max(max x, max ~x + 1)``."""
    lanes = np.asarray(lanes, dtype=np.int64)
    return np.maximum(lanes[..., 0], lanes[..., 1] + 1)


def requantize_with_absmax(x, absmax):
    """INT8 codes and scale of ACT codes ``x[..., n]`` under the per-token scale of a row whose
    absolute maximum is ``absmax[...]`` (≥ every ``|x|``): :func:`mcf.abi.quant.requantize` of
    ``x`` with ``absmax`` appended — the appended element sets the scale and is dropped — so the
    codes are those of the whole row, bit for bit. Returns ``(q, m, e)`` as ``requantize``."""
    x = np.asarray(x, dtype=np.int64)
    a = np.asarray(absmax, dtype=np.int64)
    if np.any(np.abs(x) > a[..., None]):
        raise ValueError("absmax is below an element of the shard")
    q, m, e = requantize(np.concatenate([x, a[..., None]], axis=-1))
    return q[..., :-1], m, e
