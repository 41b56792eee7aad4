"""Lane arithmetic of the reduction engine (paper §5 compute-NIC, :mod:`.reduce`): one beat of
a contribution merged with the slot's accumulator — MAX (signed), SUM (wrapping) or the
online-softmax merge of ``(m, l, o)`` with the exp2 LUT + shift, per-term half-up rounding and
saturation of :mod:`mcf.abi.softmax` (:func:`mcf.abi.softmax.merge_state` bit for bit).
"""

from __future__ import annotations

from amaranth import Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from mcf.abi.meta import ReduceOp
from mcf.abi.softmax import EXP_FRAC, LANE_BITS, SCORE_FRAC, STATE_L, STATE_O, exp2_lut

__all__ = ["ReduceLanes", "reduce_s1_layout", "reduce_s2_layout"]


def reduce_s1_layout(data_width: int, addr_bits: int, meta_bits: int) -> data.StructLayout:
    """S1 of the engine: an accepted beat, the slot-buffer word it merges with (``addr``), its
    head / fresh-slot / final flags and op, and for a head beat the softmax exponents
    ``da = m_new − m_acc`` and ``db = m_new − m_in`` (≥ 0) and the new maximum ``mnew``."""
    return data.StructLayout({
        "valid": 1, "head": 1, "fresh": 1, "final": 1, "op": ReduceOp,
        "addr": addr_bits, "data": data_width, "last": 1, "meta": meta_bits,
        "da": LANE_BITS + 1, "db": LANE_BITS + 1, "mnew": signed(LANE_BITS)})


def reduce_s2_layout(data_width: int, addr_bits: int, meta_bits: int) -> data.StructLayout:
    """S2 of the engine: the merged beat to write back at ``addr``."""
    return data.StructLayout({
        "valid": 1, "final": 1, "addr": addr_bits, "data": data_width, "last": 1,
        "meta": meta_bits})


class ReduceLanes(wiring.Component):
    """Merges the beat in S1 with its accumulator word, all ``data_width // 32`` lanes.

    Members
    -------
    s1 : In(reduce_s1_layout(...))
        The beat (the engine's S1 register).
    acc_rd : In(data_width)
        The slot buffer's word at ``s1.addr`` (read port data, addressed a cycle earlier).
    s2 : Out(reduce_s2_layout(...))
        The S2 register: the merged beat. A beat of a fresh slot is taken unchanged. When S2
        holds the word S1 reads, S2's data is used instead of ``acc_rd`` (forwarding).

    Latency: 1 cycle (``s1`` → ``s2``), one beat per cycle. The softmax factors of a packet
    are computed from its head beat and held for its other beats.
    """

    def __init__(self, *, data_width: int, addr_bits: int, meta_bits: int):
        self._dw = data_width
        super().__init__({
            "s1": In(reduce_s1_layout(data_width, addr_bits, meta_bits)),
            "acc_rd": In(data_width),
            "s2": Out(reduce_s2_layout(data_width, addr_bits, meta_bits)),
        })

    def elaborate(self, platform):
        m = Module()
        s1, s2, L = self.s1, self.s2, self._dw // LANE_BITS
        SOFT, MAX, SUM = ReduceOp.SOFTMAX_MERGE, ReduceOp.MAX, ReduceOp.SUM
        m.submodules.lut = lut = Memory(shape=unsigned(EXP_FRAC + 1), depth=1 << SCORE_FRAC,
                                        init=[int(x) for x in exp2_lut()])
        fa_r = Signal(EXP_FRAC + 1)
        fb_r = Signal(EXP_FRAC + 1)

        def exp2neg(d, name):
            rp = lut.read_port(domain="comb")
            i_part = d[SCORE_FRAC:]
            out = Signal(EXP_FRAC + 1, name=name)
            m.d.comb += [rp.addr.eq(d[:SCORE_FRAC]),
                         out.eq(Mux(i_part <= EXP_FRAC, rp.data >> i_part[:5], 0))]
            return out

        fa_h = exp2neg(s1.da, "fa_head")
        fb_h = exp2neg(s1.db, "fb_head")
        fa = Mux(s1.head, fa_h, fa_r)
        fb = Mux(s1.head, fb_h, fb_r)
        with m.If(s1.valid & s1.head):
            m.d.sync += [fa_r.eq(fa_h), fb_r.eq(fb_h)]

        # forwarding: S2 writes the address S1 read one cycle too late for the read port
        acc = Signal(self._dw)
        m.d.comb += acc.eq(Mux(s2.valid & (s2.addr == s1.addr), s2.data, self.acc_rd))
        word0 = s1.head         # beat 0 of a packet holds m (lane 0) and l (lane 1)
        result = Signal(self._dw)
        half = 1 << (EXP_FRAC - 1)
        for lane in range(L):
            a = acc[lane * LANE_BITS:(lane + 1) * LANE_BITS]
            b = s1.data[lane * LANE_BITS:(lane + 1) * LANE_BITS]
            r = result[lane * LANE_BITS:(lane + 1) * LANE_BITS]
            is_m = word0 if lane == 0 else Const(0)
            is_l = word0 if lane == 1 else Const(0)
            a_ext = Mux(is_l, a.as_unsigned(), a.as_signed())
            b_ext = Mux(is_l, b.as_unsigned(), b.as_signed())
            ta = Signal(signed(LANE_BITS + 2), name=f"ta{lane}")
            tb = Signal(signed(LANE_BITS + 2), name=f"tb{lane}")
            m.d.comb += [
                ta.eq(((a_ext * fa) + half) >> EXP_FRAC),
                tb.eq(((b_ext * fb) + half) >> EXP_FRAC),
            ]
            tsum = Signal(signed(LANE_BITS + 3), name=f"tsum{lane}")
            m.d.comb += tsum.eq(ta + tb)
            sat_l = Mux(tsum > STATE_L.max_int, STATE_L.max_int, tsum)
            sat_o = Mux(tsum > STATE_O.max_int, STATE_O.max_int,
                        Mux(tsum < STATE_O.min_int, STATE_O.min_int, tsum))
            soft = Mux(is_m, s1.mnew, Mux(is_l, sat_l, sat_o))
            with m.If(s1.fresh):
                m.d.comb += r.eq(b)
            with m.Elif(s1.op == SOFT):
                m.d.comb += r.eq(soft)
            with m.Elif(s1.op == MAX):
                m.d.comb += r.eq(Mux(a.as_signed() > b.as_signed(), a, b))
            with m.Elif(s1.op == SUM):
                m.d.comb += r.eq(a + b)

        m.d.sync += [s2.valid.eq(s1.valid), s2.final.eq(s1.final), s2.addr.eq(s1.addr),
                     s2.data.eq(result), s2.last.eq(s1.last), s2.meta.eq(s1.meta)]
        return m
