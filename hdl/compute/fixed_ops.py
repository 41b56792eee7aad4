"""Fixed-point helpers shared by the compute datapaths (the Amaranth side of
:mod:`mcf.abi.fixed`): saturation and half-up rounding shifts by constant or variable amounts,
and the lane slicer of packed vectors."""

from __future__ import annotations

from amaranth import Const, Mux

__all__ = ["sat", "round_shift", "round_shift_var", "lane"]


def sat(value, width: int, is_signed: bool):
    """Saturate an Amaranth value to ``width`` bits (signed or unsigned)."""
    if is_signed:
        lo, hi = -(1 << (width - 1)), (1 << (width - 1)) - 1
        return Mux(value > hi, hi, Mux(value < lo, lo, value))[:width]
    hi = (1 << width) - 1
    return Mux(value > hi, hi, Mux(value < 0, 0, value))[:width]


def round_shift(value, shift: int):
    """Half-up rounding arithmetic shift by a constant (``mcf.abi.fixed.round_shift``)."""
    return (value + (1 << (shift - 1))) >> shift


def round_shift_var(value, shift, max_shift: int):
    """Half-up rounding arithmetic shift by a signal ``shift`` (``1 ≤ shift ≤ max_shift``;
    ``shift = 0`` gives the value unchanged)."""
    half = (Const(1, max_shift + 1) << shift) >> 1
    return (value + half) >> shift


def lane(vector, i: int, width: int, signed: bool = True):
    """Element ``i`` of a packed vector (element ``i`` in bits ``[i·width, (i+1)·width)``)."""
    v = vector[i * width:(i + 1) * width]
    return v.as_signed() if signed else v
