"""Query fold of the per-channel-K KV format (paper §5; issue #10 §5, KIVI-style groups):
a group header's K channel scales folded into one query head, bit for bit as
:func:`mcf.abi.kv.fold_query`, so that the group's records are scored by the unchanged
per-token path (:class:`~.attn_score.ScorePipe`) with the folded query and ``(m', e')``."""

from __future__ import annotations

from amaranth import Cat, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from mcf.abi.kv import KV_SCALE, Q_ELEM
from mcf.abi.kv_channel import FOLD_E_BASE, FOLD_M_SHIFT, FOLD_Q_SHIFT_BASE
from mcf.abi.quant import SCALE_EXP_BITS, SCALE_MANT_BITS
from mcf.abi.softmax import RECIP_IN_BITS

from .attn_score import bits_for
from .fixed_ops import lane, round_shift, round_shift_var, sat
from .recip import Recip

__all__ = ["QueryFold", "fold_in_layout", "fold_out_layout"]

P_W = Q_ELEM.width + KV_SCALE.width      # q·s, exact (|p| < 2^23)


def fold_in_layout(lanes: int) -> data.StructLayout:
    """One beat of a head: ``lanes`` INT8 query codes and the matching ``lanes`` K channel
    scale codes of the group header; the head's scale ``(m, e)`` on its first beat."""
    return data.StructLayout({
        "q": unsigned(lanes * Q_ELEM.width),
        "s": unsigned(lanes * KV_SCALE.width),
        "scale_m": unsigned(SCALE_MANT_BITS),
        "scale_e": unsigned(SCALE_EXP_BITS),
    })


def fold_out_layout(lanes: int, head_dim: int) -> data.StructLayout:
    """One beat of the folded head: chunk ``c`` of ``q'``, and ``(m', e')``."""
    return data.StructLayout({
        "q": unsigned(lanes * Q_ELEM.width),
        "c": unsigned(bits_for(head_dim // lanes)),
        "scale_m": unsigned(SCALE_MANT_BITS),
        "scale_e": unsigned(SCALE_EXP_BITS),
    })


class QueryFold(wiring.Component):
    """``(q', m', e') = fold_query(q, (m, e), s)`` for one query head at a time.

    Members
    -------
    i : In(stream.Signature(fold_in_layout(lanes)))
        ``head_dim/lanes`` beats per head (no framing: every ``head_dim/lanes`` beats are a head).
    o : Out(stream.Signature(fold_out_layout(lanes, head_dim)))
        ``head_dim/lanes`` beats per head, chunk ``c`` in order, ``scale_m``/``scale_e`` on every
        beat (the format of the engine's query load).

    ``p = q·s`` (``lanes`` 8×16-bit products per beat) is kept with its absmax; then the leading
    one of ``|p|max``, the reciprocal (:class:`Recip`), and per output beat ``lanes`` 24×17-bit
    products, rounded and saturated to INT8. Latency: the first output beat ``Recip.LATENCY + 2``
    cycles after the head's last input beat; one head per ``2·head_dim/lanes + 5`` cycles at
    full rate. Stream rules: ``o`` holds its beat until ``ready``; a new head is accepted once
    the previous head's last beat has left.
    """

    def __init__(self, head_dim: int, lanes: int):
        if head_dim % lanes:
            raise ValueError("head_dim must be a multiple of lanes")
        self.head_dim, self.lanes = head_dim, lanes
        super().__init__({
            "i": In(stream.Signature(fold_in_layout(lanes))),
            "o": Out(stream.Signature(fold_out_layout(lanes, head_dim))),
        })

    def elaborate(self, platform):
        m = Module()
        L, NB = self.lanes, self.head_dim // self.lanes
        ip, op = self.i.payload, self.o.payload
        m.submodules.pbuf = pbuf = Memory(shape=unsigned(L * P_W), depth=NB, init=[])
        wr, rd = pbuf.write_port(), pbuf.read_port()
        m.submodules.recip = recip = Recip()

        c = Signal(bits_for(NB) + 1)
        amax = Signal(P_W)                      # max |p| of the head so far
        sm = Signal(SCALE_MANT_BITS)
        se = Signal(signed(SCALE_EXP_BITS))
        wait = Signal(range(Recip.LATENCY + 2))
        r = Signal(RECIP_IN_BITS + 1)
        n = Signal(range(P_W + 1))              # bit length of amax
        x16 = Signal(RECIP_IN_BITS)
        zero = Signal()
        m_out = Signal(SCALE_MANT_BITS)
        e_out = Signal(SCALE_EXP_BITS)

        # p = q·s per lane and the beat's |p| maximum
        prods = [lane(ip.q, k, Q_ELEM.width) * lane(ip.s, k, KV_SCALE.width, signed=False)
                 for k in range(L)]
        mags = [Mux(p < 0, -p, p)[:P_W] for p in prods]
        while len(mags) > 1:
            mags = [Mux(mags[k] > mags[k + 1], mags[k], mags[k + 1]) if k + 1 < len(mags)
                    else mags[k] for k in range(0, len(mags), 2)]
        m.d.comb += [wr.addr.eq(c), wr.data.eq(Cat(*(p[:P_W] for p in prods)))]

        # leading one of amax → n, x16 (amax normalised to RECIP_IN_BITS bits, truncating)
        lead = Signal(range(P_W + 1))
        for k in range(P_W):
            with m.If(amax[k]):
                m.d.comb += lead.eq(k + 1)
        sb = bits_for(P_W + 1)
        norm = Mux(lead >= RECIP_IN_BITS, amax >> (lead - RECIP_IN_BITS)[:sb],
                   amax << (RECIP_IN_BITS - lead)[:sb])
        m.d.comb += recip.x.eq(norm[:RECIP_IN_BITS])

        # output beat: q'_c = sat8(round(p_c · r >> (FOLD_Q_SHIFT_BASE + n)))
        sh = Signal(range(FOLD_Q_SHIFT_BASE + P_W + 1))
        m.d.comb += sh.eq(FOLD_Q_SHIFT_BASE + n)
        qf = [Mux(zero, 0, sat(round_shift_var(lane(rd.data, k, P_W) * r, sh,
                                               FOLD_Q_SHIFT_BASE + P_W), Q_ELEM.width, True))
              for k in range(L)]
        m.d.comb += [op.q.eq(Cat(*qf)), op.c.eq(c), op.scale_m.eq(m_out), op.scale_e.eq(e_out)]

        with m.FSM():
            with m.State("IN"):
                m.d.comb += self.i.ready.eq(1)
                with m.If(self.i.valid):
                    m.d.comb += wr.en.eq(1)
                    with m.If(c == 0):
                        m.d.sync += [sm.eq(ip.scale_m), se.eq(ip.scale_e.as_signed()),
                                     amax.eq(mags[0])]
                    with m.Else():
                        m.d.sync += amax.eq(Mux(mags[0] > amax, mags[0], amax))
                    m.d.sync += c.eq(c + 1)
                    with m.If(c == NB - 1):
                        m.d.sync += wait.eq(0)
                        m.next = "CALC"
            with m.State("CALC"):
                # amax is final: n, x16, the reciprocal (Recip.LATENCY cycles), m', e'
                m.d.sync += wait.eq(wait + 1)
                m.d.comb += rd.addr.eq(0)
                with m.If(wait == 0):
                    e_new = se + lead - FOLD_E_BASE
                    m.d.sync += [n.eq(lead), x16.eq(norm[:RECIP_IN_BITS]), zero.eq(amax == 0),
                                 e_out.eq(Mux(amax == 0, 0, sat(e_new, SCALE_EXP_BITS, True)))]
                with m.If(wait == 1):
                    m.d.sync += m_out.eq(Mux(zero, 0, round_shift(sm * x16, FOLD_M_SHIFT)))
                with m.If(wait == Recip.LATENCY):
                    m.d.sync += [r.eq(recip.r), c.eq(0)]
                    m.next = "OUT"
            with m.State("OUT"):
                m.d.comb += [self.o.valid.eq(1), rd.addr.eq(Mux(self.o.ready, c + 1, c))]
                with m.If(self.o.ready):
                    m.d.sync += c.eq(c + 1)
                    with m.If(c == NB - 1):
                        m.d.sync += c.eq(0)
                        m.next = "IN"
        return m
