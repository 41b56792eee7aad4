"""Prefill attention tiled for the GEMM arrays (issue #33 step 1): the formats of
:mod:`mcf.abi.attn_tile` and the golden model :mod:`mcf.golden.attention_tiled`.

With today's unpacked ``w`` the tiled model gives the bits of :mod:`mcf.golden.attention` in every
mode; with ``P8`` its error is bounded against ``w`` (per row, from the row shifts) and against
float64."""

from __future__ import annotations

import numpy as np
import pytest

from mcf.abi.attn_tile import (
    P8,
    P8_MAX_PRODUCT,
    PV_LIMB_BITS,
    PV_LIMBS,
    PV_SPLIT_KEYS,
    PV_W,
    W_BITS,
    W_MAX,
    p8_row_shift,
    pv_pack_shift,
    pv_w_acc_bits,
    qk_acc_bits,
    qk_pack_shift,
    quantize_p8,
    w_limbs,
)
from mcf.abi.kv import KV_ELEM, KV_SCALE, Q_ELEM, dequantize_q, v_weight
from mcf.abi.quant import ACT, GROUP_SIZE, pack_shift
from mcf.abi.softmax import EXP_FRAC, NORM_OUT, SCORE_FRAC, exp2_neg
from mcf.golden.attention import (
    KVBlock,
    KVChannelCache,
    State,
    attend_causal_rows,
    attend_exact_rows,
    attend_fixed,
    attend_max,
    attend_prefill,
    attend_single,
    dequantize,
    dequantize_k,
    normalize_state,
    random_blocks,
    random_query,
)
from mcf.golden.attention_tiled import (
    attend_prefill_tiled,
    attend_tiled_rows,
    packed_matmul,
    pv_w_acc,
    tile_scores,
)
from mcf.hdl.compute.dsp48 import MULT_B_BITS, PREADD_BITS

D, G = 128, 6          # Qwen2.5-1.5B head_dim and GQA 6:1


def _channel_blocks(rng, lens, outliers=True):
    """Per-channel-K blocks from ACT rows (closed groups) plus an open group at the end."""
    cache = KVChannelCache(D)
    bias = rng.normal(0, 1, D) if outliers else np.zeros(D)
    total = sum(lens)
    kf = rng.normal(0, 1, (total, D)) + bias
    if outliers:
        kf[:, :4] *= 8
    cache.append(ACT.quantize(kf), ACT.quantize(rng.normal(0, 1, (total, D))))
    return cache.blocks(max_block=max(lens))


def _chunk(rng, blocks, chunk, peaked=False):
    """Query rows of the last ``chunk`` tokens of the keys (causal prefill, ``G`` heads each)."""
    n = sum(len(b) for b in blocks)
    pos = np.repeat(np.arange(n - chunk, n), G)
    if peaked:                    # each token's heads aligned to one earlier key (per-token K)
        allb = KVBlock.concat(blocks)
        qs = [random_query(rng, G, D, peak=allb, peak_row=int(rng.integers(0, n)))
              for _ in range(chunk)]
        return np.concatenate([a for a, _ in qs]), np.concatenate([s for _, s in qs]), pos
    q, sq = random_query(rng, chunk * G, D)
    return q, sq, pos


@pytest.fixture(scope="module")
def token_case():
    rng = np.random.default_rng(33)
    blocks = random_blocks(rng, [64, 64, 64, 45], D)
    return (blocks, *_chunk(rng, blocks, 40))


@pytest.fixture(scope="module")
def channel_case():
    rng = np.random.default_rng(34)
    blocks = _channel_blocks(rng, [64, 64, 64, 45])
    return (blocks, *_chunk(rng, blocks, 40))


# --- formats -----------------------------------------------------------------------------------

def test_format_widths():
    assert int(v_weight(exp2_neg(0), KV_SCALE.max_int)) == W_MAX
    assert W_MAX < 1 << W_BITS and W_MAX >= 1 << (W_BITS - 1) and PV_W.width == W_BITS == 20
    # today's w (signed: one more bit) does not fit the DSP48E2's 18-bit B port: one MAC per
    # DSP on the 27-bit A port; P8 zero-extended does
    assert W_BITS + 1 > MULT_B_BITS and W_BITS + 1 <= PREADD_BITS
    assert P8.width + 1 <= MULT_B_BITS and not P8.signed
    # QK: two keys per DSP over one head_dim dot product, exact in the group-sum field
    assert qk_acc_bits(D) == 19 and qk_pack_shift(D) == pack_shift(GROUP_SIZE)
    worst = D * Q_ELEM.min_int * KV_ELEM.min_int
    assert worst < 1 << (qk_acc_bits(D) - 1)
    assert qk_pack_shift(D) + KV_ELEM.width + 1 <= PREADD_BITS
    # PV: two V channels per DSP, 128-key groups within the arrays' packing shift
    assert P8_MAX_PRODUCT == 2040 and PV_SPLIT_KEYS == 128
    assert pv_pack_shift(PV_SPLIT_KEYS) <= pack_shift(GROUP_SIZE) < pv_pack_shift(
        2 * PV_SPLIT_KEYS)
    assert 1 << (pv_pack_shift(PV_SPLIT_KEYS) - 1) > PV_SPLIT_KEYS * P8_MAX_PRODUCT


def test_p8_row_rule():
    w = np.array([0, 1, 127, 255, 256, 511, 1000, W_MAX], dtype=np.int64)
    s = p8_row_shift(w)
    assert list(s) == [0, 0, 0, 0, 1, 1, 2, W_BITS - P8.width]
    w8 = quantize_p8(w, s)
    assert list(w8[:4]) == [0, 1, 127, 255]            # s = 0: unchanged
    assert np.all((w8[4:] >= 1 << (P8.width - 1)) & (w8[4:] <= P8.max_int))
    assert quantize_p8(511, 1) == 255                   # 255.5 rounds to 256, saturates
    assert quantize_p8(3, 1) == 2 and quantize_p8(2, 2) == 1 and quantize_p8(1, 2) == 0
    rng = np.random.default_rng(1)
    ww = rng.integers(0, W_MAX + 1, (50, 200))
    ss = p8_row_shift(ww.max(axis=1))[:, None]
    err = np.abs(quantize_p8(ww, ss) * (1 << ss) - ww)
    assert np.all(err <= np.maximum(1 << ss >> 1, (1 << ss) - 1))
    assert np.all(quantize_p8(ww, ss).max(axis=1) >= 1 << (P8.width - 1))


def test_packed_matmul_exact_at_extremes():
    rng = np.random.default_rng(2)
    # QK: keys as the weight operand, one head_dim dot product per group
    q = np.vstack([np.full(D, Q_ELEM.min_int), np.full(D, Q_ELEM.max_int),
                   rng.integers(Q_ELEM.min_int, Q_ELEM.max_int + 1, (6, D))])
    k = np.vstack([np.full(D, KV_ELEM.min_int), np.full(D, KV_ELEM.max_int),
                   rng.integers(KV_ELEM.min_int, KV_ELEM.max_int + 1, (7, D))])
    k[3] = np.where(np.arange(D) % 2, KV_ELEM.min_int, KV_ELEM.max_int)
    assert np.array_equal(packed_matmul(q, k, qk_pack_shift(D), D), q @ k.T)
    # PV: V channels as the weight operand, 255 × −8 over whole 128-key groups and a tail
    keys = 2 * PV_SPLIT_KEYS + 37
    w8 = np.vstack([np.full(keys, P8.max_int), rng.integers(0, P8.max_int + 1, (5, keys))])
    v = rng.integers(KV_ELEM.min_int, KV_ELEM.max_int + 1, (keys, 16))
    v[:, 0] = KV_ELEM.min_int
    v[:, 1] = KV_ELEM.min_int
    sh = pv_pack_shift(PV_SPLIT_KEYS)
    assert np.array_equal(packed_matmul(w8, v.T, sh, PV_SPLIT_KEYS), w8 @ v)
    # one bit less and the extreme group no longer splits exactly
    assert not np.array_equal(packed_matmul(w8, v.T, sh - 1, PV_SPLIT_KEYS), w8 @ v)


def test_w_in_bytes_on_the_arrays_exact_at_extremes():
    """Today's ``w`` in :data:`PV_LIMBS` bytes, each byte's P·V packed as P8's: the sums are
    ``w @ v`` exactly at ``W_MAX`` × −8 over a 256-key block (and random ``w``), within
    :func:`pv_w_acc_bits`; the bytes rebuild ``w``."""
    rng = np.random.default_rng(7)
    keys = 2 * PV_SPLIT_KEYS
    w = np.vstack([np.full(keys, W_MAX), rng.integers(0, W_MAX + 1, (5, keys)),
                   np.full(keys, 255), np.full(keys, 256)])
    v = rng.integers(KV_ELEM.min_int, KV_ELEM.max_int + 1, (keys, 16))
    v[:, 0] = KV_ELEM.min_int
    v[:, 1] = KV_ELEM.max_int
    limbs = w_limbs(w)
    assert PV_LIMBS == 3 and limbs.shape == (*w.shape, 3) and limbs.max() <= P8.max_int
    assert np.array_equal(sum(limbs[..., j] << (PV_LIMB_BITS * j) for j in range(PV_LIMBS)), w)
    ref = w @ v
    assert np.array_equal(pv_w_acc(w, v, array=True), ref) and np.array_equal(
        pv_w_acc(w, v), ref)
    assert -ref.min() <= 1 << (pv_w_acc_bits(keys) - 1) and pv_w_acc_bits(keys) == 32
    assert -ref.min() > 1 << (pv_w_acc_bits(keys) - 2)   # the extreme needs every bit


# --- today's w: the tiled model gives today's bits ---------------------------------------------

@pytest.mark.parametrize("case", ["token_case", "channel_case"])
def test_tiled_single_causal_bit_exact(case, request):
    blocks, q, sq, pos = request.getfixturevalue(case)
    ref = attend_causal_rows(q, sq, blocks, pos)
    for q_tile in (G, 64, 1000):
        assert attend_tiled_rows(q, sq, blocks, pos, q_tile=q_tile) == ref
    # S = Q·Kᵀ and P·V through the packed array model: the same bits
    sel = slice(0, 4 * G)
    assert attend_tiled_rows(q[sel], sq[sel], blocks, pos[sel], array=True) == State(
        ref.m[sel], ref.l[sel], ref.o[sel])


def test_tiled_scores_through_the_array(channel_case):
    blocks, q, sq, _ = channel_case
    from mcf.golden.attention import job_scores
    for blk in blocks:
        assert np.array_equal(tile_scores(q[:G], sq[:G], blk, array=True),
                              job_scores(q[:G], sq[:G], blk)[0])


@pytest.mark.parametrize("case", ["token_case", "channel_case"])
def test_tiled_modes_per_job(case, request):
    """Rows of different jobs (decode-like, not causal; and causal) against the per-job golden
    functions: SINGLE, MAX, FIXED (with violations)."""
    blocks, q, sq, pos = request.getfixturevalue(case)
    jobs = [slice(j * G, (j + 1) * G) for j in (0, 7, 39)]
    rows = np.concatenate([np.arange(s.start, s.stop) for s in jobs])
    qr, sr, pr = q[rows], sq[rows], pos[rows]
    for causal, array in ((False, False), (True, False), (False, True)):
        kw = {"causal": causal, "q_tile": 4, "array": array}   # array: w in bytes (pv_w_acc)
        single = attend_tiled_rows(qr, sr, blocks, pr, "single", **kw)
        mx = attend_tiled_rows(qr, sr, blocks, pr, "max", **kw)
        m_fix = mx.copy()
        m_fix[1] -= 300                                   # a bad maximum: counted violations
        fixed, bad = attend_tiled_rows(qr, sr, blocks, pr, "fixed", m_fix=m_fix, **kw)
        total_bad = 0
        for j, s in enumerate(jobs):
            r = slice(j * G, (j + 1) * G)
            qp = int(pos[s.start])
            assert State(single.m[r], single.l[r], single.o[r]) == attend_single(
                q[s], sq[s], blocks, qp, causal)
            assert np.array_equal(mx[r], attend_max(q[s], sq[s], blocks, qp, causal))
            st, b = attend_fixed(q[s], sq[s], blocks, m_fix[r], qp, causal)
            assert State(fixed.m[r], fixed.l[r], fixed.o[r]) == st
            total_bad += b
        assert bad == total_bad > 0


@pytest.mark.parametrize("case", ["token_case", "channel_case"])
def test_tiled_prefill_both_rules(case, request):
    blocks, q, sq, pos = request.getfixturevalue(case)
    t = len(q) // G
    qc, sc, tp = q.reshape(t, G, D), sq.reshape(t, G, 2), pos[::G]
    for exact in (False, True):
        assert np.array_equal(attend_prefill_tiled(qc, sc, blocks, tp, exact=exact, q_tile=48),
                              attend_prefill(qc, sc, blocks, tp, exact=exact))
    st = attend_tiled_rows(q, sq, blocks, pos, "fixed",
                           m_fix=attend_tiled_rows(q, sq, blocks, pos, "max"))[0]
    assert st == attend_exact_rows(q, sq, blocks, pos)


# --- P8: bounded against w and against float64 --------------------------------------------------

def _p8_bound(q, sq, blocks, pos, st_w):
    """Per row and channel, in NORM_OUT codes: |o/l(P8) − o/l(w)| ≤ (Σ_b f_b · Σ_k |w8_k·2^s_b
    − w_k| · |v_k| + blocks) · 2^EXP_FRAC / l + 2 — the weights' actual rounding errors with no
    sign cancellation, ``f_b = 2^−(m − m_b)`` (1 % slack for the exp LUT) the block's merge
    factor, one LSB per merge, ``l`` (exact, shared with w) divides, the normaliser rounds."""
    terms = []
    for blk in blocks:
        t = tile_scores(q, sq, blk)
        valid = np.asarray(blk.pos)[None, :] <= pos[:, None]
        m = np.where(valid, t, np.iinfo(np.int64).min).max(axis=1)
        p = np.where(valid, exp2_neg(np.where(valid, m[:, None] - t, 0)), 0)
        w = v_weight(p, np.asarray(blk.sv)[None, :])
        s = p8_row_shift(w.max(axis=1))[:, None]
        err = np.abs(quantize_p8(w, s) * (np.int64(1) << s) - w)
        terms.append((m, np.where(valid.any(axis=1)[:, None], err @ np.abs(blk.v), 0)))
    acc = np.zeros((len(q), D))
    for m, e in terms:
        seen = m > np.iinfo(np.int64).min
        f = np.where(seen, np.exp2(-np.where(seen, st_w.m - m, 0) / (1 << SCORE_FRAC)), 0)
        acc += 1.01 * f[:, None] * e + 1
    return acc * (1 << EXP_FRAC) / np.maximum(st_w.l, 1)[:, None] + 2


@pytest.mark.parametrize("case", ["token_case", "channel_case"])
def test_p8_against_w_bound(case, request):
    blocks, q, sq, pos = request.getfixturevalue(case)
    st_w = attend_tiled_rows(q, sq, blocks, pos)
    st_8 = attend_tiled_rows(q, sq, blocks, pos, p_format=P8)
    assert np.array_equal(st_8.m, st_w.m) and np.array_equal(st_8.l, st_w.l)
    diff = np.abs(normalize_state(st_8) - normalize_state(st_w))
    assert diff.max() > 0                                       # P8 is not w
    bound = _p8_bound(q, sq, blocks, pos, st_w)
    assert np.all(diff <= bound)
    assert (diff / bound).max() >= 0.3                           # and the bound is not vacuous
    sel = slice(0, 4 * G)          # through the packed array model: the same bits
    st_a = attend_tiled_rows(q[sel], sq[sel], blocks, pos[sel], p_format=P8, array=True)
    assert st_a == State(st_8.m[sel], st_8.l[sel], st_8.o[sel])


def _float_rows(q, sq, blocks, pos):
    qf = dequantize_q(q, sq)
    kf = np.concatenate([dequantize_k(b) for b in blocks])
    vf = np.concatenate([dequantize(b.v, b.sv, KV_SCALE) for b in blocks])
    kp = np.concatenate([np.asarray(b.pos) for b in blocks])
    t = np.where(kp[None, :] <= pos[:, None], qf @ kf.T / np.sqrt(D) * np.log2(np.e), -np.inf)
    p = np.exp2(t - t.max(axis=1, keepdims=True))
    return p @ vf / p.sum(axis=1, keepdims=True), np.abs(vf).max()


@pytest.mark.parametrize("peaked", [False, True])
def test_p8_error_vs_float(peaked):
    """|o/l − float64| / max|v| on the same quantised inputs (per-token K, 256-key blocks, a
    causal 32-token chunk at the end of 768 keys): w (today's arithmetic) within 5e-4, P8
    within 8e-3 (max) and 3 % relative L2 (docs/attention.md: 3.7e-3 / 1.6 % measured on
    1,024 keys)."""
    rng = np.random.default_rng(35 + peaked)
    blocks = random_blocks(rng, [256, 256, 256], D)
    q, sq, pos = _chunk(rng, blocks, 32, peaked)
    ref, vmax = _float_rows(q, sq, blocks, pos)
    errs = {}
    for name, fmt in (("w", None), ("p8", P8)):
        out = NORM_OUT.to_float(normalize_state(attend_tiled_rows(q, sq, blocks, pos,
                                                                  p_format=fmt)))
        errs[name] = (np.abs(out - ref).max() / vmax,
                      np.linalg.norm(out - ref) / np.linalg.norm(ref))
    assert errs["w"][0] <= 5e-4
    assert errs["p8"][0] <= 8e-3 and errs["p8"][1] <= 0.03
    assert errs["p8"][0] > errs["w"][0]


def test_p8_single_mode_only(token_case):
    blocks, q, sq, pos = token_case
    with pytest.raises(ValueError):
        attend_tiled_rows(q, sq, blocks, pos, "fixed", m_fix=np.zeros(len(q)), p_format=P8)
    with pytest.raises(ValueError):
        attend_prefill_tiled(q.reshape(-1, G, D), sq.reshape(-1, G, 2), blocks, pos[::G],
                             exact=True, p_format=P8)


def test_empty_and_fully_masked_rows():
    rng = np.random.default_rng(36)
    blocks = random_blocks(rng, [16, 16], D, pos0=100)
    q, sq = random_query(rng, 3, D)
    pos = np.array([50, 108, 131])            # before every key, inside block 0, after both
    for fmt in (None, P8):
        st = attend_tiled_rows(q, sq, blocks, pos, p_format=fmt)
        assert st.l[0] == 0 and not st.o[0].any()
        assert st.head(1)[0] == attend_single(q[1:2], sq[1:2], blocks, 108, True).m[0]
    assert attend_tiled_rows(q, sq, [], pos) == State.empty(3, D)
