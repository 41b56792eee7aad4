"""Rounding, saturation and INT4 packing (mcf.abi.fixed)."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcf.abi import INT4, INT8, FixedFormat, pack_int4, round_shift, saturate, unpack_int4
from mcf.abi.fixed import wrap


def test_round_shift_ties():
    x = np.array([5, 6, 7, 10, -5, -6, -7, -10])  # /4: 1.25 1.5 1.75 2.5 -1.25 -1.5 -1.75 -2.5
    assert round_shift(x, 2, "floor").tolist() == [1, 1, 1, 2, -2, -2, -2, -3]
    assert round_shift(x, 2, "half_up").tolist() == [1, 2, 2, 3, -1, -1, -2, -2]
    assert round_shift(x, 2, "half_even").tolist() == [1, 2, 2, 2, -1, -2, -2, -2]
    with pytest.raises(ValueError):
        round_shift(x, 1, "bogus")


def test_saturate_and_wrap():
    assert saturate([-200, 200, 5], 8).tolist() == [-128, 127, 5]
    assert saturate([-1, 300], 8, signed=False).tolist() == [0, 255]
    assert wrap([128, -129, 255], 8).tolist() == [-128, 127, -1]


def test_fixed_format():
    q = FixedFormat("q3.4", 8, 4)
    assert (q.min_int, q.max_int, q.lsb) == (-128, 127, 1 / 16)
    assert q.quantize([0.03125, 0.09375, 100.0, -100.0]).tolist() == [0, 2, 127, -128]
    assert INT8.quantize([2.5, 3.5]).tolist() == [2, 4]  # ties to even


def test_int4_packing_by_hand():
    assert pack_int4([1, -1, -8, 7]).tolist() == [0xF1, 0x78]
    assert unpack_int4([0xF1, 0x78]).tolist() == [1, -1, -8, 7]
    with pytest.raises(ValueError, match="-8..7"):
        pack_int4([8, 0])
    with pytest.raises(ValueError, match="even"):
        pack_int4([1])


@given(st.lists(st.integers(INT4.min_int, INT4.max_int), min_size=0, max_size=64)
       .filter(lambda v: len(v) % 2 == 0))
def test_int4_round_trip(values):
    assert unpack_int4(pack_int4(values)).tolist() == values
