"""The shared exp2 LUT method and the (m, l, o) merge (mcf.abi.softmax)."""

import numpy as np
import pytest

from mcf.abi.softmax import (
    EXP_FRAC,
    M_EMPTY,
    SCORE_FRAC,
    empty_state,
    exp2_lut,
    exp2_neg,
    merge_state,
    pack_state,
    reduce_lanes,
    unpack_state,
)


def test_exp2_exhaustive_error():
    d = np.arange(0, (EXP_FRAC + 2) << SCORE_FRAC)
    got = exp2_neg(d) / (1 << EXP_FRAC)
    ref = np.exp2(-d / (1 << SCORE_FRAC))
    err = np.abs(got - ref)
    # LUT rounding (half an LSB) plus the truncating shift (< one LSB)
    assert err.max() <= 1.5 / (1 << EXP_FRAC)
    assert exp2_neg(0) == 1 << EXP_FRAC
    assert exp2_neg(1 << 40) == 0
    assert exp2_lut().max() == 1 << EXP_FRAC and len(exp2_lut()) == 1 << SCORE_FRAC
    with pytest.raises(ValueError):
        exp2_neg(-1)


def test_merge_by_hand():
    # m differs by exactly one (log2 units): the smaller side is halved
    a = (np.int64(3 << SCORE_FRAC), np.int64(1000), np.array([200, -7]))
    b = (np.int64(2 << SCORE_FRAC), np.int64(501), np.array([-3, 9]))
    m, l_sum, o = merge_state(a, b)
    assert m == 3 << SCORE_FRAC
    assert l_sum == 1000 + 251          # 501/2 = 250.5 rounds half-up
    assert o.tolist() == [200 - 1, -7 + 5]  # -1.5 -> -1, 4.5 -> 5
    assert [x.tolist() if hasattr(x, "tolist") else x for x in merge_state(b, a)] == \
        [m, l_sum, o.tolist()]


def test_merge_with_empty_is_identity():
    rng = np.random.default_rng(1)
    for _ in range(100):
        s = (np.int64(rng.integers(-(1 << 20), 1 << 20)), np.int64(rng.integers(0, 1 << 30)),
             rng.integers(-(1 << 30), 1 << 30, 8))
        m, l_sum, o = merge_state(s, empty_state(8))
        assert (m, l_sum, o.tolist()) == (s[0], s[1], s[2].tolist())
    m, l_sum, o = merge_state(empty_state(4), empty_state(4))
    assert (m, l_sum, o.tolist()) == (M_EMPTY, 0, [0, 0, 0, 0])


def test_merge_matches_float_softmax():
    rng = np.random.default_rng(7)
    for _ in range(50):
        parts = []
        for _ in range(4):
            scores = rng.normal(0, 3, 16)
            t = np.round(scores * (1 << SCORE_FRAC)).astype(np.int64)
            m = t.max()
            p = exp2_neg(m - t)
            v = rng.integers(-100, 100, (16, 4))
            parts.append((scores, v, (np.int64(m), np.int64(p.sum()), (p[:, None] * v).sum(0))))
        state = parts[0][2]
        for *_, s in parts[1:]:
            state = merge_state(state, s)
        m, l_sum, o = state
        scores = np.concatenate([p[0] for p in parts])
        v = np.concatenate([p[1] for p in parts])
        w = np.exp2(np.round(scores * (1 << SCORE_FRAC)) / (1 << SCORE_FRAC))
        ref = (w[:, None] * v).sum(0) / w.sum()
        assert np.max(np.abs(o / l_sum - ref)) < 1e-3 * 100


def test_lane_reductions_and_state_packing():
    assert reduce_lanes("max", [1, -5], [-2, 3]).tolist() == [1, 3]
    assert reduce_lanes("sum", [2**31 - 1], [1]).tolist() == [-(2**31)]
    payload = pack_state(-5, 7, [1, -1, 2**31 - 1])
    assert len(payload) == 4 * 5
    m, l_sum, o = unpack_state(payload, 3)
    assert (m, l_sum, o.tolist()) == (-5, 7, [1, -1, 2**31 - 1])
    with pytest.raises(ValueError):
        unpack_state(payload, 4)
