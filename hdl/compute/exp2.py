"""``2^-d`` unit of the attention engine: LUT + truncating shift (paper §5, mcf.abi.softmax).

Bit-exact with :func:`mcf.abi.softmax.exp2_neg`: ``d = i·2^SCORE_FRAC + f`` →
``EXP_LUT[f] >> i`` (0 once ``i > EXP_FRAC``). One 2^SCORE_FRAC × (EXP_FRAC+1)-bit ROM and a
barrel shifter; no multiplier.
"""

from __future__ import annotations

from amaranth import Module, Signal, unsigned
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from mcf.abi.softmax import EXP_FRAC, SCORE_FRAC, exp2_lut

__all__ = ["Exp2Neg"]


class Exp2Neg(wiring.Component):
    """``p = 2^-d`` in UQ1.EXP_FRAC for a non-negative difference ``d`` in score units.

    Members
    -------
    d : In(unsigned(d_width))
        The difference (callers clamp negative values to 0 before).
    p : Out(unsigned(EXP_FRAC + 1))
        ``exp2_neg(d)`` of the ``d`` presented :data:`LATENCY` cycles earlier.

    Fully pipelined, one result per cycle, no handshake: callers carry their side information
    through :data:`LATENCY` register stages of their own.
    """

    LATENCY = 2

    def __init__(self, d_width: int = 33):
        self._d_width = d_width
        super().__init__({"d": In(unsigned(d_width)), "p": Out(unsigned(EXP_FRAC + 1))})

    def elaborate(self, platform):
        m = Module()
        m.submodules.lut = lut = Memory(shape=unsigned(EXP_FRAC + 1), depth=1 << SCORE_FRAC,
                                        init=[int(v) for v in exp2_lut()])
        rd = lut.read_port()
        m.d.comb += rd.addr.eq(self.d[:SCORE_FRAC])
        ipart = self.d[SCORE_FRAC:]
        shift = Signal(range(EXP_FRAC + 2))
        zero = Signal()
        m.d.sync += [
            zero.eq(ipart > EXP_FRAC),
            shift.eq(ipart[:len(shift)]),
        ]
        with m.If(zero):
            m.d.sync += self.p.eq(0)
        with m.Else():
            m.d.sync += self.p.eq(rd.data >> shift)
        return m
