"""Fixed-point formats and integer rounding shared by the HDL and the golden models.

Every format the datapath uses is a :class:`FixedFormat` defined once in ``mcf.abi``; the
hardware takes ``width``/``frac``/``signed`` from it and the numpy golden models call the same
rounding and saturation helpers, so the two cannot drift apart.

INT4 packing (paper §6.1: weights and KV in INT4): two's-complement nibbles in -8..7, two per
byte, element ``2i`` in the low nibble and ``2i + 1`` in the high nibble; bytes in order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = [
    "FixedFormat", "round_shift", "saturate", "wrap",
    "INT4", "INT8", "INT32", "pack_int4", "unpack_int4",
]


def wrap(x, width: int, signed: bool = True):
    """Two's-complement wrap-around to ``width`` bits (what a plain adder does)."""
    x = np.asarray(x, dtype=np.int64)
    mask = (1 << width) - 1
    x = x & mask
    if signed:
        x = np.where(x >= (1 << (width - 1)), x - (1 << width), x)
    return x


def saturate(x, width: int, signed: bool = True):
    x = np.asarray(x, dtype=np.int64)
    lo, hi = (-(1 << (width - 1)), (1 << (width - 1)) - 1) if signed else (0, (1 << width) - 1)
    return np.clip(x, lo, hi)


def round_shift(x, shift: int, mode: str = "half_up"):
    """Arithmetic right shift by ``shift`` with rounding.

    ``half_up``: add half an LSB then floor (ties toward +inf) — one adder in hardware.
    ``half_even``: round to nearest, ties to even (what requantisation to INT8 uses).
    ``floor``: plain arithmetic shift.
    """
    x = np.asarray(x, dtype=np.int64)
    if shift == 0:
        return x
    if mode == "floor":
        return x >> shift
    if mode == "half_up":
        return (x + (1 << (shift - 1))) >> shift
    if mode == "half_even":
        q = x >> shift
        rem = x & ((1 << shift) - 1)
        half = 1 << (shift - 1)
        up = (rem > half) | ((rem == half) & ((q & 1) == 1))
        return q + up.astype(np.int64)
    raise ValueError(f"unknown rounding mode {mode!r}")


@dataclass(frozen=True)
class FixedFormat:
    """A two's-complement (or unsigned) integer of ``width`` bits with ``frac`` fraction bits."""
    name: str
    width: int
    frac: int = 0
    signed: bool = True

    @property
    def min_int(self) -> int:
        return -(1 << (self.width - 1)) if self.signed else 0

    @property
    def max_int(self) -> int:
        return (1 << (self.width - 1)) - 1 if self.signed else (1 << self.width) - 1

    @property
    def lsb(self) -> float:
        return 2.0 ** -self.frac

    def quantize(self, x, mode: str = "half_even"):
        """float → saturated integer code (``half_even`` or ``half_up`` rounding)."""
        scaled = np.asarray(x, dtype=np.float64) * (1 << self.frac)
        if mode == "half_even":
            q = np.rint(scaled)
        elif mode == "half_up":
            q = np.floor(scaled + 0.5)
        else:
            raise ValueError(f"unknown rounding mode {mode!r}")
        return saturate(q.astype(np.int64), self.width, self.signed)

    def to_float(self, code):
        return np.asarray(code, dtype=np.float64) * self.lsb

    def saturate(self, code):
        return saturate(code, self.width, self.signed)


INT4 = FixedFormat("int4", 4)
INT8 = FixedFormat("int8", 8)
INT32 = FixedFormat("int32", 32)


def pack_int4(values) -> np.ndarray:
    """Pack an even-length sequence of ints in -8..7 into bytes (low nibble first)."""
    v = np.asarray(values, dtype=np.int64).ravel()
    if v.size % 2:
        raise ValueError("INT4 packing needs an even number of elements")
    if v.size and (v.min() < INT4.min_int or v.max() > INT4.max_int):
        raise ValueError("INT4 values must lie in -8..7")
    nib = (v & 0xF).astype(np.uint8)
    return (nib[0::2] | (nib[1::2] << 4)).astype(np.uint8)


def unpack_int4(packed) -> np.ndarray:
    """Inverse of :func:`pack_int4`: bytes → int8 array of twice the length."""
    b = np.asarray(packed, dtype=np.uint8).ravel()
    out = np.empty(b.size * 2, dtype=np.int8)
    out[0::2] = b & 0xF
    out[1::2] = b >> 4
    return np.where(out >= 8, out - 16, out).astype(np.int8)
