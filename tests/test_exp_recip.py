"""Exp (2^-d LUT + shift) and reciprocal (LUT + Newton) approximations: exhaustive error bounds.

Stated maxima (asserted, measured over the whole input range):
* ``exp2_neg``: |2^-d·2^16 − exp2_neg(d)| < 1 LSB of 2^-16 (0.998) for every d in 0..65535 (16 bits,
  exhaustive); the result is 0 for d ≥ 17·256, where the exact value is below 2^-17.
* ``recip_mant``: |2^31/x − r| < 1.36 LSB for all 2^15 normalised x, |round(2^31/x) − r| ≤ 1.
* ``normalize``: |o/l − out| ≤ 2^-13·|o/l| + 1 LSB for every l in 1..2^16 and random 32-bit l.
"""

from __future__ import annotations

import numpy as np
import pytest

from mcf.abi.softmax import (
    EXP_FRAC,
    NORM_OUT,
    RECIP_FRAC,
    RECIP_IN_BITS,
    SCORE_FRAC,
    exp2_lut,
    exp2_neg,
    normalize,
    recip_lut,
    recip_mant,
)

EXP_MAX_ERR_LSB = 1.0
RECIP_MAX_ERR_LSB = 1.36


def test_exp2_neg_exhaustive_16bit():
    d = np.arange(1 << 16, dtype=np.int64)
    got = exp2_neg(d)
    exact = np.exp2(-d / (1 << SCORE_FRAC)) * (1 << EXP_FRAC)
    err = np.abs(got - exact)
    assert err.max() <= EXP_MAX_ERR_LSB
    assert err.max() > 0.5           # the bound is tight: the truncating shift does cost
    assert got[0] == 1 << EXP_FRAC
    assert np.all(np.diff(got) <= 0)  # monotonic non-increasing
    assert np.all(got[(EXP_FRAC + 1) << SCORE_FRAC:] == 0)


def test_exp2_lut_shape():
    lut = exp2_lut()
    assert lut.size == 1 << SCORE_FRAC
    assert lut.max() == 1 << EXP_FRAC and lut.min() > 1 << (EXP_FRAC - 1)


def test_exp2_neg_rejects_negative():
    with pytest.raises(ValueError):
        exp2_neg([-1])


def test_recip_exhaustive():
    x = np.arange(1 << (RECIP_IN_BITS - 1), 1 << RECIP_IN_BITS, dtype=np.int64)
    r = recip_mant(x)
    exact = (1 << RECIP_FRAC) / x
    assert np.abs(r - exact).max() <= RECIP_MAX_ERR_LSB
    assert np.abs(r - np.floor(exact + 0.5)).max() <= 1
    assert r.max() < 1 << RECIP_IN_BITS and r.min() >= 1 << (RECIP_IN_BITS - 1)
    assert recip_lut().max() < 1 << RECIP_IN_BITS
    with pytest.raises(ValueError):
        recip_mant([(1 << (RECIP_IN_BITS - 1)) - 1])


def _check_normalize(l_vals, o_vals):
    for lv, ov in zip(l_vals, o_vals):
        got = normalize(int(lv), np.array([ov]))[0]
        exact = ov / lv * (1 << NORM_OUT.frac)
        bound = abs(exact) * 2.0 ** -13 + 1.0
        if abs(exact) < 2 ** 31 - 2:
            assert abs(got - exact) <= bound, (lv, ov, got, exact)
        else:
            assert got == (NORM_OUT.max_int if exact > 0 else NORM_OUT.min_int)


def test_normalize_exhaustive_small_l():
    rng = np.random.default_rng(11)
    l_vals = np.arange(1, (1 << 16) + 1)
    o_vals = rng.integers(-(1 << 31), 1 << 31, l_vals.size)
    # vectorised check: same arithmetic as _check_normalize, all l in 1..2^16
    got = np.array([normalize(int(lv), np.array([ov]))[0] for lv, ov in zip(l_vals, o_vals)])
    exact = o_vals / l_vals * (1 << NORM_OUT.frac)
    inside = np.abs(exact) < 2 ** 31 - 2
    err = np.abs(got - exact)[inside]
    assert np.all(err <= np.abs(exact[inside]) * 2.0 ** -13 + 1.0)
    assert np.all(got[~inside] == np.where(exact[~inside] > 0, NORM_OUT.max_int,
                                           NORM_OUT.min_int))


def test_normalize_random_wide():
    rng = np.random.default_rng(12)
    l_vals = rng.integers(1, 1 << 32, 4000)
    o_vals = rng.integers(-(1 << 31), 1 << 31, 4000)
    _check_normalize(l_vals, o_vals)
    assert normalize(0, np.array([5, -5])).tolist() == [0, 0]
