"""amaranth.sim tests of the GEMM array's attention products (issue #33, docs/attention.md
"Prefill on the arrays"): S = Q·Kᵀ (K the weight operand, ``rows`` keys per dot product, the
``head_dim`` channels one group) and P·V with unsigned P8 activations (``ua`` steps, V the
weight operand, ``rows`` channels per dot product over a block's keys in groups of
``PV_SPLIT_KEYS``) on the GEMM's :class:`GemmArray` with scale mantissas of 1 — every result
equal to the golden model's exact sums (:func:`mcf.golden.attention_tiled.qk_acc`,
:func:`~mcf.golden.attention_tiled.pv_p8_acc`, packed and plain), with GEMM dot products (signed
activations, real scales) interleaved, source gaps and sink backpressure."""

from __future__ import annotations

import numpy as np
import pytest
from test_gemm_array import run_steps

from mcf.abi.attn_tile import P8, PV_SPLIT_KEYS, qk_pack_shift
from mcf.abi.fixed import pack_int4
from mcf.abi.quant import GROUP_SIZE, pack_shift
from mcf.golden.attention_tiled import pv_p8_acc, qk_acc
from mcf.golden.gemm import accumulate, group_sums
from mcf.hdl.compute.gemm_array import GemmArray


def _word(blk) -> int:
    """A ``rows × lanes`` INT4 block as the step's weight word (row r, lane l at r·lanes + l)."""
    return int.from_bytes(pack_int4(np.asarray(blk).ravel()).tobytes(), "little")


def _bytes(a) -> int:
    return int.from_bytes((np.asarray(a) & 0xFF).astype(np.uint8).tobytes(), "little")


def dot_steps(a, w, scales, group, lanes, ua=False):
    """The k-steps of one dot product: activations ``a[K]`` against weight rows ``w[R, K]``,
    ``scales[R, K/group]`` (the last group may be partial: ``K`` a multiple of ``lanes``)."""
    r, k = w.shape
    spg = group // lanes
    n = k // lanes
    out = []
    for s in range(n):
        g = s // spg
        out.append({"w": _word(w[:, s * lanes:(s + 1) * lanes]),
                    "a": _bytes(a[s * lanes:(s + 1) * lanes]),
                    "scale": int.from_bytes(np.asarray(scales[:, g]).astype("<u2").tobytes(),
                                            "little"),
                    "glast": int(s % spg == spg - 1 or s == n - 1), "last": int(s == n - 1),
                    "ua": int(ua)})
    return out


def s_dots(q, k, rows, lanes):
    """S = Q·Kᵀ: per query row, per key tile of ``rows`` keys, one dot product over the
    ``head_dim`` channels (one group: ``head_dim`` = the array's group), mantissas 1."""
    d = q.shape[1]
    t = k.shape[0]
    kp = np.concatenate([k, np.zeros((-t % rows, d), dtype=np.int64)])
    ones = np.ones((rows, 1), dtype=np.int64)
    return [dot_steps(q[i], kp[j:j + rows], ones, d, lanes)
            for i in range(len(q)) for j in range(0, len(kp), rows)]


def pv_dots(w8, v, rows, lanes, group):
    """P·V: per P row, per ``rows`` channels of V, one dot product over the block's keys
    (padded with P = 0 to whole groups: the array's group ends must be ``rows / scalers`` =
    ``group / lanes`` cycles apart), groups of ``group`` keys, mantissas 1, ``ua``."""
    t, d = v.shape
    pad = -t % group
    vp = np.concatenate([v, np.zeros((pad, d), dtype=np.int64)])
    wp = np.concatenate([w8, np.zeros((len(w8), pad), dtype=np.int64)], axis=1)
    ones = np.ones((rows, -(-len(vp) // group)), dtype=np.int64)
    return [dot_steps(wp[i], vp[:, c:c + rows].T, ones, group, lanes, ua=True)
            for i in range(len(w8)) for c in range(0, d, rows)]


def run_dots(dots, rows, lanes, group, chain=1, dsp="fabric", seed=0, idle=0):
    """Every dot product's ``rows`` accumulators (``test_gemm_array.run_steps``: steps with
    random gaps, random ``o.ready``, ``idle`` moving cycles before each dot product's last)."""
    dut = GemmArray(rows=rows, lanes=lanes, group=group, chain=chain, dsp=dsp)
    return run_steps(dut, dots, np.random.default_rng(seed), stall=0.4, gap=0.2, idle=idle)


def _s_want(q, k, rows):
    acc = qk_acc(q, k, array=True)
    np.testing.assert_array_equal(acc, qk_acc(q, k))
    t = k.shape[0]
    acc = np.concatenate([acc, np.zeros((len(q), -t % rows), dtype=np.int64)], axis=1)
    return acc.reshape(-1, rows)


def _pv_want(w8, v, rows):
    acc = pv_p8_acc(w8, v, array=True)
    np.testing.assert_array_equal(acc, pv_p8_acc(w8, v))
    return acc.reshape(-1, rows)


def test_field_bounds():
    """The formats the arrays rely on: one 128-channel dot product is one packed group at the
    arrays' shift, and a P·V group of ``PV_SPLIT_KEYS`` unsigned P8 products fits it too."""
    assert qk_pack_shift(GROUP_SIZE) == pack_shift(GROUP_SIZE)
    assert PV_SPLIT_KEYS == GROUP_SIZE
    assert PV_SPLIT_KEYS * P8.max_int * 8 < 1 << (pack_shift(GROUP_SIZE) - 1)


@pytest.mark.parametrize("chain,dsp", [(1, "fabric"), (16, "model")])
def test_scores_and_pv_at_head_dim_128(chain, dsp):
    """The kr260 array (16 × 16, group 128): S of 3 query rows against 40 keys (a partial key
    tile), P·V of 3 P rows against a 200-key block (a whole and a partial 128-key group,
    padded with P = 0 to a whole one), a GEMM dot product between them — every sum exact."""
    rows, lanes, group = 16, 16, GROUP_SIZE
    rng = np.random.default_rng(33)
    q = rng.integers(-128, 128, (3, 128))
    k = rng.integers(-8, 8, (40, 128))
    w8 = rng.integers(0, 256, (3, 200))
    w8[0, :] = 255                                   # the P8 maximum on every key
    v = rng.integers(-8, 8, (200, 128))
    v[:, 0], v[:, 1] = -8, 7                         # a packed pair at both extremes
    xg = rng.integers(-128, 128, 256)
    wg = rng.integers(-8, 8, (rows, 256))
    mg = rng.integers(0, 1 << 16, (rows, 2))
    gemm = dot_steps(xg, wg, mg, group, lanes)
    dots = s_dots(q, k, rows, lanes) + [gemm] + pv_dots(w8, v, rows, lanes, PV_SPLIT_KEYS)
    got = run_dots(dots, rows, lanes, group, chain, dsp, seed=chain)
    ns = 3 * 3
    np.testing.assert_array_equal(got[:ns], _s_want(q, k, rows))
    np.testing.assert_array_equal(got[ns], accumulate(group_sums(xg[None], wg, group), mg)[0])
    np.testing.assert_array_equal(got[ns + 1:], _pv_want(w8, v, rows))


@pytest.mark.parametrize("a,vv", [(255, -8), (255, 7), (128, -8), (0, -8)])
def test_pv_extremes(a, vv):
    """A whole 128-key group at the P8 extremes against V's (the largest field sums the split
    must keep exact: 128 · 255 · −8 = −261,120 against the 19-bit field's ±262,144), both
    channels of every packed pair, and the other channel of the pair opposite."""
    rows, lanes = 4, 16
    w8 = np.full((1, 256), a)
    v = np.full((256, 4), vv)
    v[:, 1] = -vv if vv != -8 else 7
    got = run_dots(pv_dots(w8, v, rows, lanes, PV_SPLIT_KEYS), rows, lanes, GROUP_SIZE)
    np.testing.assert_array_equal(got, _pv_want(w8, v, rows))


def test_signed_after_unsigned():
    """``ua`` is per step: the same activation bytes (≥ 128) read as INT8 in a GEMM dot product
    right after a P·V one, and the P·V one reads them as 0..255 — through a modelled cascade."""
    rows, lanes, group = 4, 8, 32
    rng = np.random.default_rng(5)
    a = rng.integers(128, 256, 64)
    w = rng.integers(-8, 8, (rows, 64))
    ones = np.ones((rows, 2), dtype=np.int64)
    dots = [dot_steps(a, w, ones, group, lanes, ua=True), dot_steps(a - 256, w, ones, group,
                                                                    lanes)] * 2
    got = run_dots(dots, rows, lanes, group, chain=8, dsp="model", seed=3)
    want_u = w @ a
    want_s = w @ (a - 256)
    np.testing.assert_array_equal(got, np.array([want_u, want_s] * 2))


def test_short_group_with_idle_cycles():
    """A partial last P·V group (72 keys: 5 steps of 16) is exact unpadded when idle cycles
    before its last step put its end ``rows / scalers`` = 8 moving cycles after the previous
    one's (3 are enough; 2 are not — the scaler's passes of the previous group still run)."""
    rows, lanes = 16, 16
    rng = np.random.default_rng(8)
    w8 = rng.integers(0, 256, (2, 200))
    v = rng.integers(-8, 8, (200, 32))
    t = 208                                      # whole steps only
    vp = np.concatenate([v, np.zeros((t - 200, 32), dtype=np.int64)])
    wp = np.concatenate([w8, np.zeros((2, t - 200), dtype=np.int64)], axis=1)
    ones = np.ones((rows, 2), dtype=np.int64)
    dots = [dot_steps(wp[i], vp[:, c:c + rows].T, ones, PV_SPLIT_KEYS, lanes, ua=True)
            for i in range(2) for c in (0, 16)]
    assert len(dots[0]) == 13
    got = run_dots(dots, rows, lanes, GROUP_SIZE, seed=4, idle=3)
    np.testing.assert_array_equal(got, _pv_want(w8, v, rows))
