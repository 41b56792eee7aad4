"""Online-softmax merge of a block state into the running state (paper §5,
:func:`mcf.abi.softmax.merge_state`, bit for bit): ``m = max(m_run, m_blk)``, scale factors
``fa = 2^-(m − m_run)``, ``fb = 2^-(m − m_blk)``, ``l`` and ``o`` lanes rescaled with half-up
rounding and saturated."""

from __future__ import annotations

from amaranth import Array, Cat, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.softmax import EXP_FRAC, LANE_BITS, SCORE, STATE_L, STATE_O

from .exp2 import Exp2Neg
from .fixed_ops import lane, round_shift, sat

__all__ = ["MergeStage", "MergeUnit", "merge_head_state"]


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


def merge_head_state(m: Module, mu: MergeUnit, started: Signal, *, then: str, on_done) -> None:
    """The ``HEAD`` state of an FSM that drives ``mu`` (:class:`MergeStage`, TileMerge): on its
    first cycle (``started`` low, cleared by whoever enters the state) ``mu.start`` takes
    ``m_new``; :data:`MergeUnit.LATENCY` cycles later, with ``mu.done``, the scale factors are
    taken, ``on_done`` (sync statements) runs and the FSM goes to ``then``."""
    with m.State("HEAD"):
        m.d.comb += mu.start.eq(~started)
        m.d.sync += started.eq(1)
        with m.If(mu.done):
            m.d.sync += on_done
            m.next = then


class MergeStage(wiring.Component):
    """Merges a finished block's accumulator into the running state, head by head and word by
    word (SINGLE mode), ``merge_lanes`` lanes per cycle through a :class:`MergeUnit`.

    Members
    -------
    go : In(1)
        Starts a merge of heads ``0 .. heads-1``; ``m_blk`` (the block maxima) is taken here.
    heads : In(range(max_heads + 1)), m_blk : In(data.ArrayLayout(signed(32), max_heads))
    busy : Out(1)
        From the cycle after ``go`` until the last head is merged.
    h : Out(range(max_heads))
        The head being merged; ``m_run``, ``l_run`` (running state) and ``l_blk`` (the block's
        ``l``) are its values (combinational).
    m_run : In(signed(32)), l_run, l_blk : In(unsigned(32))
    set_run : Out(1)
        At the end of a head: the running ``m``, ``l`` become ``m_new``, ``l_new`` and the
        block's ``l`` is cleared.
    m_new : Out(signed(32)), l_new : Out(unsigned(32))
    addr : Out(range(max_heads · head_dim/lanes))
        Word of the running ``o`` and of the block accumulator being read (data the cycle
        after on ``o_run_data`` / ``acc_data``) and, on ``wr``, written: the merged word to the
        running ``o`` (``wr_data``), 0 to the accumulator.
    o_run_data : In(lanes · 32), acc_data : In(lanes · acc_width)
    wr : Out(1), wr_data : Out(lanes · 32)

    Cycles per head: ``MergeUnit.LATENCY + 1 + head_dim/lanes · (lanes/merge_lanes + 1) + 1``.
    """

    def __init__(self, head_dim: int, lanes: int, max_heads: int, merge_lanes: int,
                 acc_width: int):
        if lanes % merge_lanes:
            raise ValueError("merge_lanes must divide lanes")
        self.head_dim, self.lanes, self.max_heads = head_dim, lanes, max_heads
        self.merge_lanes, self.acc_width = merge_lanes, acc_width
        nb = head_dim // lanes
        super().__init__({
            "go": In(1), "heads": In(range(max_heads + 1)),
            "m_blk": In(data.ArrayLayout(signed(SCORE.width), max_heads)), "busy": Out(1),
            "h": Out(range(max_heads)),
            "m_run": In(signed(SCORE.width)), "l_run": In(unsigned(LANE_BITS)),
            "l_blk": In(unsigned(LANE_BITS)),
            "set_run": Out(1), "m_new": Out(signed(SCORE.width)),
            "l_new": Out(unsigned(LANE_BITS)),
            "addr": Out(range(max_heads * nb)),
            "o_run_data": In(unsigned(lanes * LANE_BITS)),
            "acc_data": In(unsigned(lanes * acc_width)),
            "wr": Out(1), "wr_data": Out(unsigned(lanes * LANE_BITS)),
        })

    def elaborate(self, platform):
        m = Module()
        L, G, ML, ACC_W = self.lanes, self.max_heads, self.merge_lanes, self.acc_width
        NB = self.head_dim // L
        S = L // ML
        m.submodules.unit = mu = MergeUnit(ML, ACC_W)
        gh = self.h
        started = Signal()
        mm = Array(Signal(signed(SCORE.width), name=f"mm{h}") for h in range(G))
        mc = Signal(range(NB + 1))
        ms = Signal(range(S + 1))    # 0: read latency, 1..S: chunk ms-1
        osh = Signal(L * LANE_BITS)
        ash = Signal(L * ACC_W)
        wbuf = Signal(L * LANE_BITS)
        o_src = Mux(ms == 1, self.o_run_data, osh)
        a_src = Mux(ms == 1, self.acc_data, ash)
        merged = Cat(wbuf[ML * LANE_BITS:], mu.o_out)    # chunk 0 ends up lowest
        m.d.comb += [
            mu.m_run.eq(self.m_run), mu.m_blk.eq(mm[gh]), mu.l_run.eq(self.l_run),
            mu.l_blk.eq(self.l_blk), mu.o_run.eq(o_src[:ML * LANE_BITS]),
            mu.o_blk.eq(a_src[:ML * ACC_W]),
            self.m_new.eq(mu.m_new), self.l_new.eq(mu.l_out),
            self.addr.eq(gh * NB + mc), self.wr_data.eq(merged),
        ]
        with m.FSM() as fsm:
            with m.State("IDLE"), m.If(self.go):
                m.d.sync += [gh.eq(0), started.eq(0)]
                m.d.sync += [mm[h].eq(self.m_blk[h]) for h in range(G)]
                m.next = "HEAD"
            # m_new, then the two scale factors through the exp units
            merge_head_state(m, mu, started, then="RUN", on_done=[mc.eq(0), ms.eq(0)])
            with m.State("RUN"):
                # read a word of the running o and of the block accumulator, rescale it chunk by
                # chunk, write the merged word (and clear the accumulator word)
                with m.If(ms == 0):
                    m.d.sync += ms.eq(1)
                with m.Else():
                    m.d.sync += [osh.eq(o_src[ML * LANE_BITS:]), ash.eq(a_src[ML * ACC_W:]),
                                 wbuf.eq(merged)]
                    with m.If(ms == S):
                        m.d.comb += self.wr.eq(1)
                        m.d.sync += [ms.eq(0), mc.eq(mc + 1)]
                        with m.If(mc == NB - 1):
                            m.d.comb += self.set_run.eq(1)
                            m.d.sync += started.eq(0)
                            m.next = "NEXT"
                    with m.Else():
                        m.d.sync += ms.eq(ms + 1)
            with m.State("NEXT"):
                with m.If(gh == self.heads - 1):
                    m.next = "IDLE"
                with m.Else():
                    m.d.sync += gh.eq(gh + 1)
                    m.next = "HEAD"
        m.d.comb += self.busy.eq(~fsm.ongoing("IDLE"))
        return m
