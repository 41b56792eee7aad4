"""QK side of the attention engine (paper §5): job intake, query load and the scoring of each K
block's rows (:class:`~.attn_score.ScorePipe`) into a score slot, handed to the PV side through
:class:`~.attn_ring.JobRing` and :class:`~.attn_ring.SlotRing`."""

from __future__ import annotations

from amaranth import Array, Cat, Module, Mux, Signal, signed
from amaranth.lib import stream, wiring
from amaranth.lib.memory import WritePort
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from mcf.abi.kv import KV_SCALE, attn_job_layout, kv_beat_layout, kv_header_layout, q_beat_layout
from mcf.abi.kv_channel import KV_GROUP, KVFormat
from mcf.abi.softmax import M_EMPTY, SCORE

from .attn_group import GroupFold
from .attn_ring import (
    JOB_CTX_ENTRIES,
    job_write_signature,
    row_mem_depth,
    score_mem_depth,
    score_row_layout,
    slot_write_signature,
)
from .attn_score import ScorePipe, bits_for

__all__ = ["QKSide"]


class QKSide(wiring.Component):
    """Job intake, query load and K-block scoring.

    Members
    -------
    job, q, k, kh : In(stream)
        The engine's streams of the same names (see :class:`~.attention.AttentionEngine`);
        ``kh`` only for ``kv_format = PER_CHANNEL_K``.
    ctx : Out(:func:`~.attn_ring.job_write_signature`)
        A taken job's context (descriptor, ``drop`` for a rejected job, per-head ``m_fix`` from
        the query beats), published after its last query beat (a rejected job: when taken).
        ``job`` is ready while fewer than two contexts are published.
    slot : Out(:func:`~.attn_ring.slot_write_signature`)
        Per K block, its row count and per-head maximum, published when its last score is
        written; a block starts only while a slot is free.
    s_wr : In(WritePort.Signature) — score memory, ``signed(SCORE.width)`` at
        ``(slot·max_heads + head, row)``; r_wr : In(WritePort.Signature) — row-record memory
        (:func:`~.attn_ring.score_row_layout`) at ``(slot, row)``.
    err_rows, err_job : Out(1)
        A malformed block (partial row, more than ``max_block`` rows) / a rejected job.
    busy : Out(1)
        Not idle (a job is being taken, loaded, scored or dropped).

    Latency: a job is taken in the cycle it is valid while the side is idle and a context is
    free; its query beats from the next cycle, one per cycle. A block starts once a slot is free
    (one cycle), then one (K beat, head) pair per cycle (a masked row's beats one per cycle); its
    slot is published in the first cycle after its last K beat with the ScorePipe empty (its last
    score written, :data:`~.attn_score.ScorePipe.LATENCY`). PER_CHANNEL_K: each group's header
    and fold (:class:`~.attn_group.GroupFold`) run before its first row is scored, after the
    rows in flight.
    """

    def __init__(self, head_dim: int, lanes: int, max_heads: int, max_block: int,
                 score_slots: int, kv_format: KVFormat = KVFormat.PER_TOKEN,
                 kv_group: int = KV_GROUP):
        self.head_dim, self.lanes, self.max_heads = head_dim, lanes, max_heads
        self.max_block, self.score_slots = max_block, score_slots
        self.kv_format, self.kv_group = KVFormat(kv_format), kv_group
        G, T, NS = max_heads, max_block, score_slots
        super().__init__({
            "job": In(stream.Signature(attn_job_layout(G))),
            "q": In(stream.Signature(q_beat_layout(lanes))),
            "k": In(stream.Signature(kv_beat_layout(lanes))),
            **({"kh": In(stream.Signature(kv_header_layout(lanes)))}
               if self.kv_format == KVFormat.PER_CHANNEL_K else {}),
            "ctx": Out(job_write_signature(G)),
            "slot": Out(slot_write_signature(G, T, NS)),
            "s_wr": In(WritePort.Signature(addr_width=ceil_log2(score_mem_depth(G, T, NS)),
                                           shape=signed(SCORE.width))),
            "r_wr": In(WritePort.Signature(addr_width=ceil_log2(row_mem_depth(T, NS)),
                                           shape=score_row_layout())),
            "err_rows": Out(1), "err_job": Out(1), "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        D, L, G, T = self.head_dim, self.lanes, self.max_heads, self.max_block
        NB = D // L
        TB = bits_for(T)
        NS = self.score_slots
        SW = SCORE.width
        PC = self.kv_format == KVFormat.PER_CHANNEL_K
        kp, qp, jobp = self.k.payload, self.q.payload, self.job.payload
        cw, sl, s_wr, r_wr = self.ctx, self.slot, self.s_wr, self.r_wr
        j_cnt, s_cnt, sw = cw.count, sl.count, sl.slot

        m.submodules.score = sc = ScorePipe(D, L, G, T)
        qheads = Signal(range(G + 1))
        drop_heads = Signal.like(jobp.heads)
        qnb = Signal.like(jobp.n_blocks)
        qblk = Signal.like(jobp.n_blocks)
        causal = Signal()
        q_pos = Signal.like(jobp.q_pos)
        h_cnt = Signal(bits_for(G))
        c_cnt = Signal(bits_for(NB))
        nk = Signal(TB + 2)          # K rows seen in this block
        row_sk = Signal(KV_SCALE.width)
        row_valid = Signal()
        qcnt = Signal(range((1 << len(jobp.heads)) * NB + 1))
        mblk = Array(Signal(signed(SW), name=f"mblk{h}") for h in range(G))
        last_c = c_cnt == NB - 1
        last_head = h_cnt == qheads - 1
        row_start = (c_cnt == 0) & (h_cnt == 0)
        pos_ok = ~causal | (kp.pos <= q_pos)
        k_issue, k_take = Signal(), Signal()
        m.d.comb += [
            sc.i.valid.eq(k_issue), sc.i.h.eq(h_cnt), sc.i.c.eq(c_cnt), sc.i.j.eq(nk),
            sc.i.ok.eq(nk < T), sc.i.kvalid.eq(Mux(row_start, pos_ok, row_valid)),
            sc.i.sk.eq(Mux(row_start, kp.scale_k, row_sk)), sc.i.k.eq(kp.data),
        ]
        with m.If(k_take & row_start):
            m.d.sync += [row_sk.eq(kp.scale_k), row_valid.eq(pos_ok)]
            m.d.comb += [r_wr.addr.eq(Cat(nk[:TB], sw)), r_wr.data.sv.eq(kp.scale_v),
                         r_wr.data.kvalid.eq(pos_ok), r_wr.en.eq(nk < T)]
        so = sc.o
        m.d.comb += [s_wr.addr.eq(Cat(so.j[:TB], sw * G + so.h)), s_wr.data.eq(so.t),
                     s_wr.en.eq(so.valid & so.ok)]
        with m.If(so.valid & so.ok & so.kvalid & (so.t > mblk[so.h])):
            m.d.sync += mblk[so.h].eq(so.t)
        m.d.comb += [sl.rec.nk.eq(nk)] + [sl.rec.m[h].eq(mblk[h]) for h in range(G)]

        # per-channel K: raw query, group header and the fold (see the engine's ``kh`` member)
        gcnt = Signal(range(self.kv_group))      # row within its group
        folded = Signal()                        # the current group's query is loaded
        g_row_done = Signal()
        with m.If(g_row_done):
            m.d.sync += [gcnt.eq(Mux(gcnt == self.kv_group - 1, 0, gcnt + 1)), folded.eq(0)]
        if PC:
            m.submodules.group = gf = GroupFold(D, L, G)
            hdrop = Signal(32)
            dgrp = Signal(16)
            m.d.comb += [gf.hdr.eq(self.kh.payload), gf.heads.eq(qheads), sc.load.eq(gf.load)]

        def k_beat():
            # a causally masked row is not scored: one cycle per beat instead of heads
            k_skip = Mux(row_start, ~pos_ok, ~row_valid)
            done = k_skip | last_head
            m.d.comb += [k_take.eq(1), k_issue.eq(~k_skip), self.k.ready.eq(done)]
            m.d.sync += h_cnt.eq(Mux(done, 0, h_cnt + 1))
            with m.If(done):
                m.d.sync += c_cnt.eq(Mux(last_c, 0, c_cnt + 1))
                with m.If(last_c):
                    m.d.comb += g_row_done.eq(1)
                    m.d.sync += nk.eq(nk + 1)
                    with m.If(nk >= T):
                        m.d.comb += self.err_rows.eq(1)
                with m.If(kp.last):
                    m.next = "KDRAIN"
                    with m.If(~last_c):
                        m.d.comb += self.err_rows.eq(1)

        with m.FSM(name="qk") as qk_fsm:
            with m.State("IDLE"):
                m.d.comb += self.job.ready.eq(j_cnt < JOB_CTX_ENTRIES)
                with m.If(self.job.valid & (j_cnt < JOB_CTX_ENTRIES)):
                    hv = jobp.heads
                    bad = (hv == 0) | (hv > G) | (jobp.mode.as_value() == 3)
                    m.d.sync += [
                        causal.eq(jobp.causal), qnb.eq(jobp.n_blocks), q_pos.eq(jobp.q_pos),
                        qblk.eq(0), qcnt.eq(0), h_cnt.eq(0), c_cnt.eq(0), gcnt.eq(0),
                        qheads.eq(hv), drop_heads.eq(hv),
                    ]
                    # a bad job: counted, its header published at once (drop), its Q drained
                    m.d.comb += [cw.hdr_en.eq(1), cw.hdr.mode.eq(jobp.mode),
                                 cw.hdr.normalize.eq(jobp.normalize), cw.hdr.heads.eq(hv),
                                 cw.hdr.n_blocks.eq(jobp.n_blocks), cw.hdr.drop.eq(bad),
                                 self.err_job.eq(bad), cw.pub.eq(bad)]
                    m.next = "LOAD_Q"
                    with m.If(bad):
                        m.next = "DROP_Q"

            with m.State("DROP_Q"):
                with m.If(qcnt == drop_heads * NB):
                    m.next = "IDLE"
                    with m.If(qnb != 0):
                        m.next = "DROP_K"
                with m.Else():
                    m.d.comb += self.q.ready.eq(1)
                    with m.If(self.q.valid):
                        m.d.sync += qcnt.eq(qcnt + 1)

            with m.State("DROP_K"):
                m.d.comb += self.k.ready.eq(1)
                with m.If(self.k.valid & kp.last):
                    m.d.sync += qblk.eq(qblk + 1)
                    with m.If(qblk + 1 == qnb):
                        m.next = "IDLE"
                if PC:
                    # the dropped block's group headers follow it on ``kh``
                    with m.If(self.k.valid):
                        m.d.sync += c_cnt.eq(Mux(last_c | kp.last, 0, c_cnt + 1))
                        m.d.comb += g_row_done.eq(last_c | kp.last)
                        with m.If((c_cnt == 0) & (gcnt == 0)):
                            m.d.sync += dgrp.eq(dgrp + 1)
                        with m.If(kp.last):
                            m.d.sync += [gcnt.eq(0), dgrp.eq(0),
                                         hdrop.eq((dgrp + ((c_cnt == 0) & (gcnt == 0))) * NB)]
                            m.next = "DROP_H"

            if PC:
                with m.State("DROP_H"):
                    with m.If(hdrop == 0):
                        m.next = "DROP_K"
                        with m.If(qblk == qnb):
                            m.next = "IDLE"
                    with m.Else():
                        m.d.comb += self.kh.ready.eq(1)
                        with m.If(self.kh.valid):
                            m.d.sync += hdrop.eq(hdrop - 1)

            with m.State("LOAD_Q"):
                m.d.comb += self.q.ready.eq(1)
                with m.If(self.q.valid):
                    ld = gf.raw if PC else sc.load   # PC: kept raw, every group folds into it
                    m.d.comb += [ld.en.eq(1), ld.h.eq(h_cnt), ld.c.eq(c_cnt),
                                 ld.data.eq(qp.data), ld.scale_m.eq(qp.scale_m),
                                 ld.scale_e.eq(qp.scale_e)]
                    with m.If(c_cnt == 0):
                        m.d.comb += [cw.mfix_en.eq(1), cw.mfix_h.eq(h_cnt),
                                     cw.mfix.eq(qp.m_fix.as_signed())]
                    m.d.sync += [qcnt.eq(qcnt + 1), c_cnt.eq(Mux(last_c, 0, c_cnt + 1))]
                    with m.If(last_c):
                        m.d.sync += h_cnt.eq(h_cnt + 1)
                    with m.If(qcnt == qheads * NB - 1):
                        m.d.comb += cw.pub.eq(1)
                        m.d.sync += [h_cnt.eq(0), c_cnt.eq(0)]
                        m.next = "IDLE"
                        with m.If(qnb != 0):
                            m.next = "KWAIT"

            with m.State("KWAIT"), m.If(s_cnt < NS):
                m.d.sync += [mblk[h].eq(M_EMPTY) for h in range(G)]
                m.d.sync += [nk.eq(0), h_cnt.eq(0), c_cnt.eq(0), gcnt.eq(0), folded.eq(0)]
                m.next = "KPHASE"

            if PC:
                with m.State("HDR"):
                    # the group's header; the fold waits for the rows in flight to be scored
                    with m.If(~gf.hdr_full):
                        m.d.comb += [self.kh.ready.eq(1), gf.hdr_wr.eq(self.kh.valid)]
                    with m.Elif(~sc.busy):
                        m.d.comb += gf.start.eq(1)
                        m.next = "FOLD"

                with m.State("FOLD"):
                    m.d.comb += gf.run.eq(1)
                    with m.If(gf.done):
                        m.d.sync += folded.eq(1)
                        m.next = "KPHASE"

            with m.State("KPHASE"), m.If(self.k.valid):
                if PC:
                    with m.If(row_start & (gcnt == 0) & ~folded):
                        m.d.comb += gf.hdr_clear.eq(1)
                        m.next = "HDR"
                    with m.Else():
                        k_beat()
                else:
                    k_beat()

            with m.State("KDRAIN"), m.If(~sc.busy):
                m.d.comb += sl.pub.eq(1)
                m.d.sync += qblk.eq(qblk + 1)
                with m.If(qblk + 1 == qnb):
                    m.next = "IDLE"
                with m.Else():
                    m.next = "KWAIT"

        m.d.comb += self.busy.eq(~qk_fsm.ongoing("IDLE"))
        return m
