"""Reciprocal of a normalised mantissa: LUT + one Newton step (paper §5: the final ``o / l``).

Bit-exact with :func:`mcf.abi.softmax.recip_mant` (max error over all inputs in
tests/test_exp_recip.py).
"""

from __future__ import annotations

from amaranth import Module, Signal, unsigned
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from mcf.abi.softmax import RECIP_FRAC, RECIP_IN_BITS, RECIP_LUT_BITS, recip_lut

__all__ = ["Recip"]


class Recip(wiring.Component):
    """``r ≈ 2^RECIP_FRAC / x`` for ``x`` with its MSB set.

    Members
    -------
    x : In(unsigned(RECIP_IN_BITS))
    r : Out(unsigned(RECIP_IN_BITS + 1))
        Result for the ``x`` presented :data:`LATENCY` cycles earlier. Fully pipelined.
    """

    LATENCY = 3

    def __init__(self):
        super().__init__({"x": In(unsigned(RECIP_IN_BITS)), "r": Out(unsigned(RECIP_IN_BITS + 1))})

    def elaborate(self, platform):
        m = Module()
        m.submodules.lut = lut = Memory(shape=unsigned(RECIP_IN_BITS), depth=1 << RECIP_LUT_BITS,
                                        init=[int(v) for v in recip_lut()])
        rd = lut.read_port()
        lo = RECIP_IN_BITS - 1 - RECIP_LUT_BITS
        m.d.comb += rd.addr.eq(self.x[lo:RECIP_IN_BITS - 1])
        x1 = Signal(RECIP_IN_BITS)
        r0 = Signal(RECIP_IN_BITS)
        err = Signal(RECIP_FRAC + 2)
        m.d.sync += [
            x1.eq(self.x),
            r0.eq(rd.data),
            err.eq((1 << (RECIP_FRAC + 1)) - x1 * rd.data),
            self.r.eq((r0 * err + (1 << (RECIP_FRAC - 1))) >> RECIP_FRAC),
        ]
        return m
