"""Group emission of the PER_CHANNEL_K KV emitter (:mod:`.attention_kvq`, paper §5 prefill path,
issue #10 §5): the header of K-channel scales, then per token its scales and INT4 record
(:func:`mcf.abi.kv.pack_kv_channel_block`), and for an open group the in-place prescale pass
(:func:`mcf.abi.kv.quantize_k_open`) — all through one multiplier pipeline.
"""

from __future__ import annotations

from amaranth import Array, Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.kv import KV_ELEM, KV_SCALE
from mcf.abi.kv_channel import KV_ONE
from mcf.abi.quant import ACT
from mcf.abi.softmax import RECIP_FRAC, RECIP_IN_BITS

from .kvq_scale import HALF, KVQ_LANES, PAR_RMUL_BITS, PAR_SHIFT_BITS, KvqScaleUnit, kvq_par_layout

__all__ = ["KvqGroupEmit", "kvq_writeback_layout"]


def kvq_writeback_layout(head_dim: int, group: int) -> data.StructLayout:
    """A prescaled K word written back in place (``lastw``: the row's last word, with the
    row's absmax ``kmax`` for token ``tok``)."""
    TW = 2 * head_dim // KVQ_LANES
    return data.StructLayout({"valid": 1, "addr": range(group * TW),
                              "data": KVQ_LANES * ACT.width, "lastw": 1, "tok": range(group),
                              "kmax": ACT.width})


class KvqGroupEmit(wiring.Component):
    """Emission of one buffered PER_CHANNEL_K group.

    Members
    -------
    start, pre : In(1)
        Start the group (``pre``: an open group, run the prescale pass first).
    ntok, blk_last, opened : In
        Tokens in the group, whether it ends the block, whether it is an open group (held
        from ``start`` until ``done``).
    lead, sc, over, zero, rmul : In
        The shared :class:`~.kvq_scale.KvqScaleUnit`, fed with the token's V (``which``) or K
        row absmax of token ``etok``: read ``LATENCY`` cycles after ``which`` / ``etok`` change.
    which, etok : Out
        The scale unit's source: row (1 = V) and token.
    rd_addr, csc_addr, par_addr : Out; rd_data, hdr_data, par_data : In
        The synchronous read ports of the row buffer, the header-scale memory and the
        per-channel parameter memory.
    space : In(1)
        The output FIFO can take four more units.
    w_data, w_en : Out
        16-bit payload units (+ ``last`` of the block) into the output FIFO.
    wb : Out(kvq_writeback_layout(head_dim, group))
        Prescaled K words to write back into the row buffer.
    sat, busy, done : Out(1)
        A token scale saturated; the pipeline holds units; ``done``: the group's last unit was
        issued this cycle (it is in the pipeline while ``busy``).

    Latency: from ``start``, open group: ``head_dim / 4 · ntok`` cycles of prescale and its
    2-cycle drain; ``head_dim`` header units; per token ``LATENCY + 1`` (V scale; open
    groups: K scale too) then ``2 + head_dim / 2`` units, one per cycle with ``space``. Units
    reach the FIFO 3 cycles after issue.
    """

    def __init__(self, head_dim: int, group: int):
        self.head_dim, self.group = head_dim, group
        D, NL, G = head_dim, KVQ_LANES, group
        RB = D // NL
        AW = ACT.width
        super().__init__({
            "start": In(1), "pre": In(1), "ntok": In(range(G + 1)), "blk_last": In(1),
            "opened": In(1),
            "lead": In(range(AW + 1)), "sc": In(KV_SCALE.width), "over": In(1),
            "zero": In(1), "rmul": In(PAR_RMUL_BITS),
            "which": Out(1), "etok": Out(range(G)),
            "rd_addr": Out(range(G * 2 * RB)), "csc_addr": Out(range(RB)),
            "par_addr": Out(range(RB)),
            "rd_data": In(NL * AW), "hdr_data": In(NL * HALF),
            "par_data": In(NL * kvq_par_layout().size),
            "space": In(1), "w_data": Out(HALF + 1), "w_en": Out(1),
            "wb": Out(kvq_writeback_layout(D, G)),
            "sat": Out(1), "busy": Out(1), "done": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        D, NL, G, AW = self.head_dim, KVQ_LANES, self.group, ACT.width
        RB, LB = D // NL, (NL - 1).bit_length()
        TW = 2 * RB
        RW, SW, PW = PAR_RMUL_BITS, PAR_SHIFT_BITS, kvq_par_layout().size
        LAT = KvqScaleUnit.LATENCY
        opened, etok, ntok, which = self.opened, self.etok, self.ntok, self.which
        unit = Signal(range(max(D, 2 + TW) + 1))
        wait = Signal(3)
        row_par = data.StructLayout({"rmul": RW, "rsh": SW, "zero": 1, "sc": KV_SCALE.width})
        kp, vp = Signal(row_par), Signal(row_par)     # the token's K / V row parameters

        # issue → e1 (memory words) → e2 (products) → e3 (unit) → FIFO. Value sources: 0 header
        # scale, 1 sk (KV_ONE or the token's), 2 sv, 3 INT4 codes; codes use per-lane channel
        # parameters (closed K) or the token's K / V row parameters (bc)
        issue = data.StructLayout({"v": 1, "src": 2, "bc": 1, "isv": 1, "last": 1})
        e, e1 = Signal(issue), Signal(issue)
        e1_lane = Signal(LB)
        e2, e2_src, e2_last = Signal(), Signal(2), Signal()
        e2_p = [Signal(signed(AW + RW + 1), name=f"e2_p{k}") for k in range(NL)]
        e2_sh = [Signal(SW, name=f"e2_sh{k}") for k in range(NL)]
        e2_zero = [Signal(name=f"e2_zero{k}") for k in range(NL)]
        e2_sc = Signal(HALF)
        e3, e3_val, e3_last = Signal(), Signal(HALF), Signal()
        # prescale pass of an open group (issue → pre1 → pre2: write y back, K row absmax)
        pre = data.StructLayout({"v": 1, "first": 1, "lastw": 1, "addr": range(G * TW),
                                 "tok": range(G)})
        e_pre, pre1, pre2 = Signal(), Signal(pre), Signal(pre)
        kmax = Signal(AW)
        m.d.comb += [self.csc_addr.eq(unit >> LB), self.par_addr.eq(unit - 2),
                     self.rd_addr.eq(etok * TW + unit - 2)]
        m.d.sync += [e1.eq(e), e1_lane.eq(unit[:LB])]
        hdr_val = Array(self.hdr_data[k * HALF:(k + 1) * HALF] for k in range(NL))[e1_lane]
        m.d.sync += [e2.eq(e1.v), e2_src.eq(e1.src), e2_last.eq(e1.last),
                     e2_sc.eq(Mux(e1.src == 0, hdr_val,
                                  Mux(e1.src == 1, Mux(opened, kp.sc, KV_ONE), vp.sc)))]
        t_rmul, t_rsh, t_zero = (Mux(e1.isv, vp[f], kp[f]) for f in ("rmul", "rsh", "zero"))
        for k in range(NL):
            lane = self.par_data[k * PW:(k + 1) * PW]
            rm = Mux(e1.bc, t_rmul, lane[:RW])
            m.d.sync += [e2_p[k].eq(self.rd_data[k * AW:(k + 1) * AW].as_signed() * rm),
                         e2_sh[k].eq(Mux(e1.bc, t_rsh, lane[RW:RW + SW])),
                         e2_zero[k].eq(Mux(e1.bc, t_zero, lane[RW + SW]))]
        codes, ys = [], []
        for k in range(NL):
            q = (e2_p[k] + ((Const(1, 64) << e2_sh[k]) >> 1)) >> e2_sh[k]
            lo, hi = KV_ELEM.min_int, KV_ELEM.max_int
            codes.append(Mux(e2_zero[k], 0, Mux(q > hi, hi, Mux(q < lo, lo, q)))[:KV_ELEM.width])
            ys.append(Mux(q > ACT.max_int, ACT.max_int, Mux(q < ACT.min_int, ACT.min_int, q))[:AW])
        m.d.sync += [pre1.v.eq(e_pre), pre1.first.eq(unit == 2), pre1.lastw.eq(unit == 1 + RB),
                     pre1.addr.eq(etok * TW + unit - 2), pre1.tok.eq(etok), pre2.eq(pre1)]
        kcur = Mux(pre2.first, 0, kmax)
        for y in ys:
            mag = Mux(y.as_signed() < 0, -y.as_signed(), y.as_signed())[:AW]
            mx = Signal(AW)
            m.d.comb += mx.eq(Mux(mag > kcur, mag, kcur))
            kcur = mx
        m.d.sync += [e3.eq(e2), e3_last.eq(e2_last),
                     e3_val.eq(Mux(e2_src == 3, Cat(*codes), e2_sc))]
        m.d.comb += [self.w_data.eq(Cat(e3_val, e3_last)), self.w_en.eq(e3),
                     self.busy.eq(e1.v | e2 | e3)]
        with m.If(pre2.v):
            m.d.sync += kmax.eq(kcur)
        m.d.comb += [self.wb.valid.eq(pre2.v), self.wb.addr.eq(pre2.addr),
                     self.wb.data.eq(Cat(*ys)), self.wb.lastw.eq(pre2.lastw),
                     self.wb.tok.eq(pre2.tok), self.wb.kmax.eq(kcur)]

        rec_last = unit == 2 + TW - 1
        with m.FSM(name="emit"):
            with m.State("IDLE"), m.If(self.start):
                with m.If(self.pre):
                    m.d.sync += [unit.eq(2), etok.eq(0)]
                    m.next = "PRE"
                with m.Else():
                    m.d.sync += unit.eq(0)
                    m.next = "HDR"
            with m.State("PRE"):
                # open group: y = prescale(x) for every K word, written back in place, one word
                # per cycle through the emission multipliers (per-lane header reciprocals)
                m.d.comb += e_pre.eq(1)
                m.d.sync += unit.eq(unit + 1)
                with m.If(unit == 1 + RB):
                    m.d.sync += [unit.eq(2), etok.eq(etok + 1)]
                    with m.If(etok == ntok - 1):
                        m.next = "PREDRAIN"
            with m.State("PREDRAIN"), m.If(~pre1.v & ~pre2.v):
                m.d.sync += unit.eq(0)
                m.next = "HDR"
            with m.State("HDR"), m.If(self.space):
                m.d.comb += [e.v.eq(1), e.src.eq(0)]
                m.d.sync += unit.eq(unit + 1)
                with m.If(unit == D - 1):
                    m.d.sync += [etok.eq(0), wait.eq(0), unit.eq(0), which.eq(~opened)]
                    m.next = "VSC"
            with m.State("VSC"):
                m.d.sync += wait.eq(wait + 1)
                with m.If(wait == LAT):
                    m.d.sync += [wait.eq(0), which.eq(1)]
                    vals = (self.rmul, RECIP_FRAC - RECIP_IN_BITS + self.lead, self.zero,
                            self.sc)
                    with m.If(which):
                        m.d.sync += [s.eq(v) for s, v in zip((vp.rmul, vp.rsh, vp.zero, vp.sc),
                                                             vals)]
                        m.d.sync += unit.eq(0)
                        m.next = "REC"
                    with m.Else():
                        m.d.sync += [s.eq(v) for s, v in zip((kp.rmul, kp.rsh, kp.zero, kp.sc),
                                                             vals)]
                    m.d.comb += self.sat.eq(self.over)
            with m.State("REC"), m.If(self.space):
                m.d.comb += [e.v.eq(1), e.src.eq(Mux(unit == 0, 1, Mux(unit == 1, 2, 3))),
                             e.isv.eq(unit >= 2 + RB), e.bc.eq(opened | (unit >= 2 + RB)),
                             e.last.eq(rec_last & (etok == ntok - 1) & self.blk_last)]
                m.d.sync += unit.eq(unit + 1)
                with m.If(rec_last):
                    m.d.sync += [etok.eq(etok + 1), wait.eq(0), which.eq(~opened)]
                    with m.If(etok == ntok - 1):
                        m.d.comb += self.done.eq(1)
                        m.next = "IDLE"
                    with m.Else():
                        m.next = "VSC"
        return m
