"""Online-softmax merge of a block state into the running state (paper §5,
:func:`mcf.abi.softmax.merge_state`, bit for bit): ``m = max(m_run, m_blk)``, scale factors
``fa = 2^-(m − m_run)``, ``fb = 2^-(m − m_blk)``, ``l`` and ``o`` lanes rescaled with half-up
rounding and saturated."""

from __future__ import annotations

from amaranth import Cat, Module, Mux, Signal, signed, unsigned
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.softmax import EXP_FRAC, LANE_BITS, SCORE, STATE_L, STATE_O

from .exp2 import Exp2Neg
from .fixed_ops import lane, round_shift, sat

__all__ = ["MergeUnit"]


class MergeUnit(wiring.Component):
    """Scale factors of one head's merge and ``lanes`` rescaled ``o`` lanes per cycle.

    Members
    -------
    m_run, m_blk : In(signed(32))
        The running and the block maximum of the head (stable from ``start`` to ``done``).
    start : In(1)
        Takes ``m_new = max(m_run, m_blk)``; ``done`` pulses :data:`LATENCY` cycles later, when
        ``fa`` and ``fb`` are taken (they then hold until the next ``start``).
    m_new : Out(signed(32)), fa, fb : Out(unsigned(17)), done : Out(1)
    l_run, l_blk : In(unsigned(32))
    l_out : Out(unsigned(32))
        ``sat(round(l_run·fa) + round(l_blk·fb))`` (combinational, with the held factors).
    o_run : In(lanes · 32), o_blk : In(lanes · acc_width)
    o_out : Out(lanes · 32)
        Per lane ``sat32(round(o_run·fa) + round(sat32(o_blk)·fb))`` (combinational).
    """

    LATENCY = Exp2Neg.LATENCY + 1

    def __init__(self, lanes: int, acc_width: int):
        self.lanes, self.acc_width = lanes, acc_width
        super().__init__({
            "m_run": In(signed(SCORE.width)), "m_blk": In(signed(SCORE.width)),
            "start": In(1), "done": Out(1),
            "m_new": Out(signed(SCORE.width)),
            "fa": Out(unsigned(EXP_FRAC + 1)), "fb": Out(unsigned(EXP_FRAC + 1)),
            "l_run": In(unsigned(LANE_BITS)), "l_blk": In(unsigned(LANE_BITS)),
            "l_out": Out(unsigned(LANE_BITS)),
            "o_run": In(unsigned(lanes * LANE_BITS)), "o_blk": In(unsigned(lanes * acc_width)),
            "o_out": Out(unsigned(lanes * LANE_BITS)),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.exp_a = exp_a = Exp2Neg(SCORE.width + 1)
        m.submodules.exp_b = exp_b = Exp2Neg(SCORE.width + 1)
        with m.If(self.start):
            m.d.sync += self.m_new.eq(Mux(self.m_blk > self.m_run, self.m_blk, self.m_run))
        m.d.comb += [exp_a.d.eq(self.m_new - self.m_run), exp_b.d.eq(self.m_new - self.m_blk)]
        pend = Signal(self.LATENCY)
        m.d.sync += pend.eq(Cat(self.start, pend[:-1]))
        m.d.comb += self.done.eq(pend[-1])
        with m.If(self.done):
            m.d.sync += [self.fa.eq(exp_a.p), self.fb.eq(exp_b.p)]
        fa, fb = self.fa, self.fb
        out = []
        for n in range(self.lanes):
            ro = lane(self.o_run, n, LANE_BITS)
            bo = sat(lane(self.o_blk, n, self.acc_width), LANE_BITS, True).as_signed()
            s = round_shift(ro * fa, EXP_FRAC) + round_shift(bo * fb, EXP_FRAC)
            out.append(sat(s, STATE_O.width, True))
        m.d.comb += [
            self.o_out.eq(Cat(*out)),
            self.l_out.eq(sat(round_shift(self.l_run * fa, EXP_FRAC)
                              + round_shift(self.l_blk * fb, EXP_FRAC), STATE_L.width, False)),
        ]
        return m
