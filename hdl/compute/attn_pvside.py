"""PV side of the attention engine (paper §5): the V rows of each scored block against its
scores (:class:`~.attn_pv.PVPipe`) into a block accumulator bank (:class:`~.attn_acc.AccBank`),
the online-softmax merge of SINGLE mode (:class:`~.attn_merge.MergeStage`), the running state and
a finished job's output (:class:`~.attn_out.OutputStage`)."""

from __future__ import annotations

from amaranth import Array, Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import stream, wiring
from amaranth.lib.memory import Memory, ReadPort
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from mcf.abi.framing import beat_layout
from mcf.abi.kv import AttnMode, kv_beat_layout
from mcf.abi.softmax import LANE_BITS, M_EMPTY, SCORE

from .attn_acc import AccBank
from .attn_merge import MergeStage
from .attn_out import OutputStage
from .attn_pv import PVPipe, acc_width
from .attn_ring import (
    job_read_signature,
    row_mem_depth,
    score_mem_depth,
    score_row_layout,
    slot_read_signature,
)
from .attn_score import bits_for

__all__ = ["PVSide"]


class PVSide(wiring.Component):
    """V rows, block accumulation, SINGLE-mode merge and output of the attention engine's jobs.

    Members
    -------
    v : In(stream.Signature(kv_beat_layout(lanes)))
        The engine's ``v`` stream (see :class:`~.attention.AttentionEngine`).
    o : Out(stream.Signature(beat_layout(data_width)))
        The engine's ``o`` stream (from :class:`~.attn_out.OutputStage`).
    ctx : In(:func:`~.attn_ring.job_read_signature`)
        The next job's context; released when the job's output is in the packer (a dropped job:
        when its V blocks are consumed).
    slot : In(:func:`~.attn_ring.slot_read_signature`)
        The next scored block; released when its V rows are done (MAX mode: when taken).
    s_rd : In(ReadPort.Signature) — score memory; r_rd, r_nx : In(ReadPort.Signature) —
        row-record memory (the row being weighted; the validity of the row about to start).
    err_rows, block, job, err_max : Out(1)
        Status pulses: V row count ≠ K row count or a partial row; a block done; a job's
        output done; a FIXED-mode score above the maximum (:class:`~.attn_pv.PVPipe`).
    busy : Out(1)
        A job is in progress or a merge runs.

    Latency: a job is taken in the first cycle its context is visible (``count`` ≠ 0), then its
    ``heads · head_dim/lanes`` accumulator words are cleared, one per cycle. A block is taken
    when its slot is visible; its V beats from two cycles later, one (V beat, head) pair per
    cycle (masked rows one beat per cycle); the slot is released in the first cycle after the
    last V beat with the PVPipe empty (:data:`~.attn_pv.PVPipe.LATENCY`). A SINGLE-mode block's
    merge starts the next cycle (once the previous merge is done) and runs while the next
    block's V rows are weighted. The output starts after the last block (SINGLE: its merge);
    the context is released when the job's last word is in the packer.
    """

    def __init__(self, head_dim: int, lanes: int, max_heads: int, max_block: int,
                 data_width: int, out_fifo_depth: int, merge_lanes: int, score_slots: int):
        self.head_dim, self.lanes, self.max_heads = head_dim, lanes, max_heads
        self.max_block, self.data_width, self.out_fifo_depth = max_block, data_width, out_fifo_depth
        self.merge_lanes, self.score_slots = merge_lanes, score_slots
        G, T, NS = max_heads, max_block, score_slots
        r_port = ReadPort.Signature(addr_width=ceil_log2(row_mem_depth(T, NS)),
                                    shape=score_row_layout())
        super().__init__({
            "v": In(stream.Signature(kv_beat_layout(lanes))),
            "o": Out(stream.Signature(beat_layout(data_width))),
            "ctx": In(job_read_signature(G)),
            "slot": In(slot_read_signature(G, T, NS)),
            "s_rd": In(ReadPort.Signature(addr_width=ceil_log2(score_mem_depth(G, T, NS)),
                                          shape=signed(SCORE.width))),
            "r_rd": In(r_port), "r_nx": In(r_port),
            "err_rows": Out(1), "block": Out(1), "job": Out(1), "err_max": Out(1),
            "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        D, L, G, T = self.head_dim, self.lanes, self.max_heads, self.max_block
        NB = D // L
        TB = bits_for(T)
        ACC_W = acc_width(T)
        SW = SCORE.width
        AW = G * NB
        vp = self.v.payload
        s_rd, r_rd, r_nx = self.s_rd, self.r_rd, self.r_nx
        j_cnt, sr, s_cnt = self.ctx.count, self.slot.slot, self.slot.count

        m.submodules.pv = pv = PVPipe(D, L, G, T)
        m.submodules.merge = mg = MergeStage(D, L, G, self.merge_lanes, ACC_W)
        m.submodules.out = ost = OutputStage(D, L, G, self.data_width, self.out_fifo_depth)
        wiring.connect(m, ost.o, wiring.flipped(self.o))
        # block accumulators, two banks: the PV bank fills one while the merge empties the other
        banks = [AccBank(AW, L * ACC_W) for _ in range(2)]
        m.submodules.oacc0, m.submodules.oacc1 = banks
        m.submodules.orun = orun = Memory(shape=unsigned(L * LANE_BITS), depth=AW, init=[])
        o_wr, o_rd = orun.write_port(), orun.read_port()

        pmode = Signal(AttnMode)
        pnorm = Signal()
        pheads = Signal.like(self.ctx.head.heads)
        pnb = Signal.like(self.ctx.head.n_blocks)
        pblk = Signal.like(self.ctx.head.n_blocks)
        pmfix = Array(Signal(signed(SW), name=f"pmfix{h}") for h in range(G))
        pm = Array(Signal(signed(SW), name=f"pm{h}") for h in range(G))
        pnk = Signal(TB + 2)
        mrun = Array(Signal(signed(SW), name=f"mrun{h}") for h in range(G))
        lrun = Array(Signal(unsigned(LANE_BITS), name=f"lrun{h}") for h in range(G))
        lacc = Array(Array(Signal(unsigned(LANE_BITS), name=f"lacc{b}_{h}") for h in range(G))
                     for b in range(2))
        pa = Signal()                # accumulator bank of the PV bank
        mb = Signal()                # accumulator bank under merge
        pv_acc = Mux(pa, banks[1].rd_data, banks[0].rd_data)
        mg_acc = Mux(mb, banks[1].rd_data, banks[0].rd_data)
        ph = Signal(bits_for(G))
        pc = Signal(bits_for(NB))
        jv = Signal(TB + 2)          # V rows seen in this block
        clr = Signal(range(G * NB + 1))
        fixed = pmode == AttnMode.FIXED
        p_last_c = pc == NB - 1
        p_last_head = ph == pheads - 1

        v_issue, v_row_done = Signal(), Signal()
        m.d.comb += [
            s_rd.addr.eq(Cat(jv[:TB], sr * G + ph)), r_rd.addr.eq(Cat(jv[:TB], sr)),
            r_nx.addr.eq(Cat(Mux(v_row_done, jv + 1, jv)[:TB], sr)),
            pv.i.valid.eq(v_issue), pv.i.h.eq(ph), pv.i.c.eq(pc),
            pv.i.ok.eq((jv < pnk) & (jv < T)), pv.i.v.eq(vp.data),
            pv.t.eq(s_rd.data), pv.sv.eq(r_rd.data.sv), pv.kvalid.eq(r_rd.data.kvalid),
            pv.fixed.eq(fixed), pv.acc_data.eq(pv_acc), self.err_max.eq(pv.err_max),
        ]
        m.d.comb += [pv.m_base[h].eq(Mux(fixed, pmfix[h], pm[h])) for h in range(G)]
        v_skip = ~r_nx.data.kvalid | (jv >= pnk) | (jv >= T)
        with m.If(pv.l_en):
            m.d.sync += lacc[pa][pv.l_h].eq(lacc[pa][pv.l_h] + pv.l_p)
        # the PV bank's accumulator update has its bank's write port whenever it is active
        for b, bank in enumerate(banks):
            m.d.comb += [bank.wr_addr.eq(pv.acc_wr_addr), bank.wr_data.eq(pv.acc_wr_data),
                         bank.wr_en.eq(pv.acc_wr_en & (pa == b))]

        # merge (SINGLE mode): the block's bank ``mb`` into the running state, head ``mh``
        mh = mg.h
        m.d.comb += [mg.heads.eq(pheads), mg.m_run.eq(mrun[mh]), mg.l_run.eq(lrun[mh]),
                     mg.l_blk.eq(lacc[mb][mh]), mg.o_run_data.eq(o_rd.data), mg.acc_data.eq(mg_acc)]
        m.d.comb += [mg.m_blk[h].eq(pm[h]) for h in range(G)]
        with m.If(mg.set_run):
            m.d.sync += [lrun[mh].eq(mg.l_new), lacc[mb][mh].eq(0), mrun[mh].eq(mg.m_new)]
        with m.If(mg.wr):
            m.d.comb += [o_wr.addr.eq(mg.addr), o_wr.data.eq(mg.wr_data), o_wr.en.eq(1)]
            for b, bank in enumerate(banks):
                with m.If(mb == b):
                    m.d.comb += bank.zero.eq(Const(1, AW) << mg.addr)

        # output of a finished job: the head's m and l words, the o lanes of the word it reads
        oh = ost.h
        m.d.comb += [
            ost.mode.eq(pmode), ost.normalize.eq(pnorm), ost.heads.eq(pheads),
            ost.m_word.eq(Mux(fixed, pmfix[oh], mrun[oh])),
            ost.l_word.eq(Mux(fixed, lacc[pa][oh], lrun[oh])),
            ost.o_lanes.eq(Mux(fixed, Cat(*(pv_acc[n * ACC_W:n * ACC_W + LANE_BITS]
                                            for n in range(L))), o_rd.data)),
        ]
        for b, bank in enumerate(banks):
            m.d.comb += bank.rd_addr.eq(Mux(pa == b, Mux(pv.acc_rd, pv.acc_addr, ost.addr),
                                            mg.addr))
        m.d.comb += o_rd.addr.eq(Mux(mg.busy, mg.addr, ost.addr))

        with m.FSM(name="pv") as pv_fsm:
            with m.State("IDLE"), m.If(j_cnt != 0):
                c = self.ctx.head
                m.d.sync += [pmode.eq(c.mode), pnorm.eq(c.normalize),
                             pheads.eq(c.heads), pnb.eq(c.n_blocks)]
                m.d.sync += [pmfix[h].eq(c.mfix[h]) for h in range(G)]
                with m.If(c.drop):
                    with m.If((c.mode == AttnMode.MAX) | (c.n_blocks == 0)):
                        m.d.comb += self.ctx.rel.eq(1)
                    with m.Else():
                        m.next = "DROP_V"
                with m.Else():
                    m.next = "CLEAR"
                m.d.sync += [mrun[h].eq(M_EMPTY) for h in range(G)]
                m.d.sync += [lrun[h].eq(0) for h in range(G)]
                m.d.sync += [lacc[b][h].eq(0) for b in range(2) for h in range(G)]
                m.d.sync += [pblk.eq(0), clr.eq(0)]

            with m.State("DROP_V"):
                m.d.comb += self.v.ready.eq(1)
                with m.If(self.v.valid & vp.last):
                    m.d.sync += pblk.eq(pblk + 1)
                    with m.If(pblk + 1 == pnb):
                        m.d.comb += self.ctx.rel.eq(1)
                        m.next = "IDLE"

            with m.State("CLEAR"):
                # the job's accumulator and running-state words start at zero
                m.d.comb += [banks[0].zero.eq(Const(1, AW) << clr),
                             banks[1].zero.eq(Const(1, AW) << clr),
                             o_wr.addr.eq(clr), o_wr.data.eq(0), o_wr.en.eq(1)]
                m.d.sync += clr.eq(clr + 1)
                with m.If(clr == pheads * NB - 1):
                    m.next = "PWAIT"
                    with m.If(pnb == 0):
                        m.next = "OUT"

            with m.State("PWAIT"), m.If(s_cnt != 0):
                hd = self.slot.head
                m.d.sync += pnk.eq(hd.nk)
                m.d.sync += [pm[h].eq(hd.m[h]) for h in range(G)]
                with m.If(pmode == AttnMode.MAX):
                    m.d.sync += [mrun[h].eq(Mux(hd.m[h] > mrun[h], hd.m[h], mrun[h]))
                                 for h in range(G)]
                m.d.sync += [jv.eq(0), ph.eq(0), pc.eq(0)]
                with m.If(pmode == AttnMode.MAX):
                    # phase 1 needs only the block maximum: no V rows
                    m.d.comb += [self.slot.rel.eq(1), self.block.eq(1)]
                    m.d.sync += [pblk.eq(pblk + 1)]
                    with m.If(pblk + 1 == pnb):
                        m.next = "OUT"
                with m.Else():
                    m.next = "PSTART"

            with m.State("PSTART"):
                m.next = "VPHASE"        # the look-ahead read of row 0's validity

            with m.State("VPHASE"), m.If(self.v.valid):
                # masked rows (and rows without a score) add nothing: one cycle per beat
                done = v_skip | p_last_head
                m.d.comb += [v_issue.eq(~v_skip), self.v.ready.eq(done),
                             v_row_done.eq(done & p_last_c)]
                m.d.sync += ph.eq(Mux(done, 0, ph + 1))
                with m.If(done):
                    m.d.sync += pc.eq(Mux(p_last_c, 0, pc + 1))
                    with m.If(p_last_c):
                        m.d.sync += jv.eq(jv + 1)
                    with m.If(vp.last):
                        m.next = "PDRAIN"
                        with m.If(~p_last_c):
                            m.d.comb += self.err_rows.eq(1)

            with m.State("PDRAIN"), m.If(~pv.busy):
                m.d.comb += [self.slot.rel.eq(1), self.block.eq(1)]
                m.d.sync += [pblk.eq(pblk + 1)]
                with m.If(jv != pnk):
                    m.d.comb += self.err_rows.eq(1)
                with m.If(pmode == AttnMode.SINGLE):
                    m.next = "HANDOFF"
                with m.Elif(pblk + 1 == pnb):
                    m.next = "OUT"
                with m.Else():
                    m.next = "PWAIT"

            with m.State("HANDOFF"), m.If(~mg.busy):
                # the merge takes this block's accumulator bank; the next block fills the other
                m.d.comb += mg.go.eq(1)
                m.d.sync += [pa.eq(~pa), mb.eq(pa)]
                with m.If(pblk == pnb):
                    m.next = "MWAIT"
                with m.Else():
                    m.next = "PWAIT"

            with m.State("MWAIT"), m.If(~mg.busy):
                m.next = "OUT"

            with m.State("OUT"):
                m.d.comb += ost.start.eq(1)
                m.next = "OUT_WAIT"

            with m.State("OUT_WAIT"), m.If(~ost.busy):
                m.d.comb += [self.job.eq(1), self.ctx.rel.eq(1)]
                m.next = "IDLE"

        m.d.comb += self.busy.eq(~pv_fsm.ongoing("IDLE") | mg.busy)
        return m
