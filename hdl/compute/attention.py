"""Attention engine of the MCF node (paper §3.1, §4 end, §5): local attention over the KV blocks
a node holds, with the online softmax, grouped-query heads, causal mask and three modes.

Arithmetic, formats and the order of operations are those of :mod:`mcf.abi.kv`,
:mod:`mcf.abi.softmax` and the golden model :mod:`mcf.golden.attention`, bit for bit.

Structure: a **QK side** (job intake, query load, :class:`~.attn_score.ScorePipe`) scores the K
rows of a block into one of ``score_slots`` score-memory slots while a **PV side**
(:class:`~.attn_pv.PVPipe`, :class:`~.attn_merge.MergeUnit`, :class:`~.attn_out.Normalizer`,
:class:`~.attn_out.WordPacker`) consumes the V rows of an earlier block against its finished
scores, merges and emits. K and V rows come on separate streams, so the two multiplier banks work
on different blocks (and jobs) at the same time.
"""

from __future__ import annotations

from amaranth import Array, Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from mcf.abi.framing import beat_layout
from mcf.abi.kv import (
    KV_GROUP,
    KV_SCALE,
    AttnMode,
    KVFormat,
    attn_job_layout,
    attn_status_layout,
    kv_beat_layout,
    kv_header_layout,
    q_beat_layout,
)
from mcf.abi.softmax import LANE_BITS, M_EMPTY, SCORE

from .attn_fold import QueryFold
from .attn_merge import MergeStage
from .attn_out import OutputStage
from .attn_pv import PVPipe, acc_width
from .attn_score import ScorePipe, bits_for

__all__ = ["AttentionEngine"]


class AttentionEngine(wiring.Component):
    """Attention over local KV blocks, jobs of one query token × ``heads`` query heads sharing a
    KV head. Prefill (``normalize``, ``causal``) emits ``o / l`` for the next GEMM; decode emits
    per-head partial states ``(m, l, o)`` for the NIC reduction engine.

    Members
    -------
    job : In(stream.Signature(attn_job_layout(max_heads)))
        Job descriptor (:class:`mcf.abi.kv.AttnMode`, heads, block count, query position).
    q : In(stream.Signature(q_beat_layout(lanes)))
        ``heads · head_dim/lanes`` query beats per job, head-major.
    k : In(stream.Signature(kv_beat_layout(lanes)))
        Per job ``n_blocks`` K blocks: each block's K rows (``head_dim/lanes`` beats each,
        ``scale_k``, ``scale_v``, ``pos`` sampled on a row's first beat), ``last`` on the
        block's final beat. ``v`` is ignored.
    v : In(stream.Signature(kv_beat_layout(lanes)))
        Per job ``n_blocks`` V blocks (none for MAX-mode jobs): each block's V rows in the
        order of its K rows, ``last`` on the block's final beat. Only ``data`` and ``last`` are
        used (the V scale came with the K row).
    o : Out(stream.Signature(beat_layout(data_width)))
        Payload beats for the packetizer: per job :func:`mcf.abi.kv.job_out_words` 32-bit
        little-endian words (``pack_state`` per head, or ``o/l``, or ``m``) in
        :func:`mcf.abi.kv.job_payloads` payloads (one per head for states), ``keep`` on each
        payload's final beat, ``last`` at its end.
    kh : In(stream.Signature(kv_header_layout(lanes))) — ``kv_format = PER_CHANNEL_K`` only
        Per K block, for each group of ``kv_group`` rows from the block's first row (the last
        group may be shorter), the group header: ``head_dim/lanes`` beats of ``lanes`` K channel
        scale codes (:func:`mcf.abi.kv.pack_kv_channel_block`'s header, channel order). At
        each group's first row the QK side folds the header into every head's query
        (:class:`~.attn_fold.QueryFold`, :func:`mcf.abi.kv.fold_query`) and scores the group's
        records with the per-token path and their ``sk``. The fold is not overlapped with
        scoring: about ``heads · (2·head_dim/lanes + 6)`` cycles per group.
    status : Out(attn_status_layout())
        Counters (jobs, blocks, malformed input) and ``busy``. A job with ``heads`` outside
        ``1..max_heads`` or an undefined mode is rejected: its query beats, K blocks and (unless
        MAX) V blocks are consumed and dropped, nothing is emitted, ``err_job`` counts it.

    Throughput: the QK bank takes one (K beat, head) pair per cycle and the PV bank one
    (V beat, head) pair per cycle, concurrently on different blocks: the QK side runs up to
    ``score_slots − 1`` blocks (and one job) ahead of the PV side. Per (query, key, head) about
    ``head_dim / lanes`` cycles in steady state, plus ~10 cycles per block (drains, slot
    hand-over) and per job the query load (QK side), accumulator clear, last merge and output
    (PV side); the SINGLE-mode merge of a block (``heads·(head_dim/lanes · (lanes/merge_lanes +
    1) + 5)`` cycles) runs while the PV bank works on the next block. Causally masked K rows and
    their V rows pass at one beat per cycle, unscored. ``sim/perf/attention.py`` measures it.
    Latency: the output of a job starts ~10 cycles after its last V beat (SINGLE mode adds the
    last block's merge). Stream rules: ``o`` raises ``valid`` without waiting for ``ready`` and
    holds the beat; inputs are consumed only when needed, so sources may present beats early.
    Malformed blocks (a partial row, more K rows than ``max_block``, V row count differing from
    the K row count) are processed as far as they are well-formed and counted in ``err_rows``;
    nothing hangs on bad input.
    """

    def __init__(self, head_dim: int = 128, lanes: int = 16, max_heads: int = 6,
                 max_block: int = 256, data_width: int = 64, out_fifo_depth: int = 16,
                 merge_lanes: int | None = None, score_slots: int = 3,
                 kv_format: KVFormat = KVFormat.PER_TOKEN, kv_group: int = KV_GROUP):
        if head_dim % lanes:
            raise ValueError("head_dim must be a multiple of lanes")
        if lanes & (lanes - 1):
            raise ValueError("lanes must be a power of two")
        if data_width % LANE_BITS:
            raise ValueError("data_width must be a multiple of 32")
        if score_slots < 2:
            raise ValueError("score_slots must be at least 2 for the banks to overlap")
        self.head_dim, self.lanes, self.max_heads = head_dim, lanes, max_heads
        self.max_block, self.data_width = max_block, data_width
        self.out_fifo_depth = out_fifo_depth
        self.score_slots = score_slots
        self.kv_format, self.kv_group = KVFormat(kv_format), kv_group
        self.merge_lanes = merge_lanes if merge_lanes is not None else max(1, lanes // 4)
        if lanes % self.merge_lanes:
            raise ValueError("merge_lanes must divide lanes")
        super().__init__({
            "job": In(stream.Signature(attn_job_layout(max_heads))),
            "q": In(stream.Signature(q_beat_layout(lanes))),
            "k": In(stream.Signature(kv_beat_layout(lanes))),
            "v": In(stream.Signature(kv_beat_layout(lanes))),
            **({"kh": In(stream.Signature(kv_header_layout(lanes)))}
               if self.kv_format == KVFormat.PER_CHANNEL_K else {}),
            "o": Out(stream.Signature(beat_layout(data_width))),
            "status": Out(attn_status_layout()),
        })

    def elaborate(self, platform):
        m = Module()
        D, L, G, T = self.head_dim, self.lanes, self.max_heads, self.max_block
        NB = D // L
        TB = bits_for(T)
        NS = self.score_slots
        ACC_W = acc_width(T)
        SW = SCORE.width
        ML = self.merge_lanes
        kp, vp, qp, jobp = self.k.payload, self.v.payload, self.q.payload, self.job.payload
        st = self.status

        m.submodules.score = sc = ScorePipe(D, L, G, T)
        m.submodules.pv = pv = PVPipe(D, L, G, T)
        m.submodules.merge = mg = MergeStage(D, L, G, ML, ACC_W)
        m.submodules.out = ost = OutputStage(D, L, G, self.data_width, self.out_fifo_depth)
        wiring.connect(m, ost.o, wiring.flipped(self.o))

        # ---------------- memories -------------------------------------------------------------
        # scores of NS blocks: address (slot·G + head, row); per row: V scale, "not masked"
        m.submodules.smem = smem = Memory(shape=signed(SW), depth=(NS * G) << TB, init=[])
        m.submodules.rmem = rmem = Memory(shape=unsigned(KV_SCALE.width + 1), depth=NS << TB,
                                          init=[])
        # block accumulators, two banks: the PV bank fills one while the merge empties the other
        m.submodules.oacc0 = oacc0 = Memory(shape=unsigned(L * ACC_W), depth=G * NB, init=[])
        m.submodules.oacc1 = oacc1 = Memory(shape=unsigned(L * ACC_W), depth=G * NB, init=[])
        m.submodules.orun = orun = Memory(shape=unsigned(L * LANE_BITS), depth=G * NB, init=[])
        s_wr, s_rd = smem.write_port(), smem.read_port()
        r_wr, r_rd = rmem.write_port(), rmem.read_port()
        r_nx = rmem.read_port()      # validity of the V row about to start (masked-row skip)
        a_wr = [oacc0.write_port(), oacc1.write_port()]
        a_rd = [oacc0.read_port(transparent_for=(a_wr[0],)),
                oacc1.read_port(transparent_for=(a_wr[1],))]
        # "reads as zero" flag per accumulator word: clearing a word (job start, merge) sets
        # its flag instead of writing L·ACC_W zero bits; the PV bank's write clears it. The
        # flag is read like the word (registered, transparent), and the gate sits in the bank
        # multiplexers — no write-data multiplexer on the wide ports.
        AW = G * NB
        zf = [Signal(AW, init=(1 << AW) - 1, name=f"zf{b}") for b in range(2)]
        zf_new = [Signal(AW, name=f"zf_new{b}") for b in range(2)]
        zf_set = [Signal(AW, name=f"zf_set{b}") for b in range(2)]
        zf_q = [Signal(name=f"zf_q{b}") for b in range(2)]
        acc_q = []
        for b in range(2):
            clr_w = Mux(a_wr[b].en, Const(1, AW) << a_wr[b].addr, 0)
            m.d.comb += zf_new[b].eq((zf[b] | zf_set[b]) & ~clr_w)
            m.d.sync += [zf[b].eq(zf_new[b]), zf_q[b].eq(zf_new[b].bit_select(a_rd[b].addr, 1))]
            acc_q.append(Mux(zf_q[b], 0, a_rd[b].data))
        o_wr, o_rd = orun.write_port(), orun.read_port()

        # ---------------- job contexts (QK side writes, PV side reads), 2 entries --------------
        ctx_layout = data.StructLayout({
            "mode": AttnMode, "normalize": unsigned(1), "heads": jobp.heads.shape(),
            "n_blocks": unsigned(16), "drop": unsigned(1),
            "mfix": data.ArrayLayout(signed(SW), G),
        })
        ctx = [Signal(ctx_layout, name=f"ctx{n}") for n in range(2)]
        j_cnt = Signal(range(3))
        jw, jr = Signal(), Signal()
        j_pub, j_rel = Signal(), Signal()
        m.d.sync += j_cnt.eq(j_cnt + j_pub - j_rel)
        with m.If(j_pub):
            m.d.sync += jw.eq(~jw)
        with m.If(j_rel):
            m.d.sync += jr.eq(~jr)

        # ---------------- score slots: row count and per-head block maximum --------------------
        slot_layout = data.StructLayout({"nk": unsigned(TB + 2),
                                         "m": data.ArrayLayout(signed(SW), G)})
        slot = [Signal(slot_layout, name=f"slot{n}") for n in range(NS)]
        s_cnt = Signal(range(NS + 1))
        sw, sr = Signal(range(NS)), Signal(range(NS))
        s_pub, s_rel = Signal(), Signal()
        m.d.sync += s_cnt.eq(s_cnt + s_pub - s_rel)
        with m.If(s_pub):
            m.d.sync += sw.eq(Mux(sw == NS - 1, 0, sw + 1))
        with m.If(s_rel):
            m.d.sync += sr.eq(Mux(sr == NS - 1, 0, sr + 1))

        # status counter increments from both sides
        qk_err_rows, pv_err_rows, pv_block = Signal(), Signal(), Signal()
        qk_err_job, pv_job = Signal(), Signal()
        m.d.sync += [
            st.err_rows.eq(st.err_rows + qk_err_rows + pv_err_rows),
            st.blocks.eq(st.blocks + pv_block),
            st.err_job.eq(st.err_job + qk_err_job),
            st.jobs.eq(st.jobs + pv_job),
            st.err_max.eq(st.err_max + pv.err_max),
        ]

        # ================= QK side =============================================================
        qheads = Signal(range(G + 1))
        drop_heads = Signal.like(jobp.heads)
        qnb = Signal(16)
        qblk = Signal(16)
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
            m.d.comb += [r_wr.addr.eq(Cat(nk[:TB], sw)), r_wr.data.eq(Cat(kp.scale_v, pos_ok)),
                         r_wr.en.eq(nk < T)]
        so = sc.o
        m.d.comb += [s_wr.addr.eq(Cat(so.j[:TB], sw * G + so.h)), s_wr.data.eq(so.t),
                     s_wr.en.eq(so.valid & so.ok)]
        with m.If(so.valid & so.ok & so.kvalid & (so.t > mblk[so.h])):
            m.d.sync += mblk[so.h].eq(so.t)

        # per-channel K: raw query, group header and the fold (see the ``kh`` member)
        PC = self.kv_format == KVFormat.PER_CHANNEL_K
        gcnt = Signal(range(self.kv_group))      # row within its group
        folded = Signal()                        # the current group's query is loaded
        g_row_done = Signal()
        with m.If(g_row_done):
            m.d.sync += [gcnt.eq(Mux(gcnt == self.kv_group - 1, 0, gcnt + 1)), folded.eq(0)]
        if PC:
            m.submodules.fold = qf = QueryFold(D, L)
            m.submodules.rawq = rawq = Memory(shape=unsigned(L * 8), depth=G * NB, init=[])
            m.submodules.hbuf = hbuf = Memory(shape=unsigned(len(self.kh.payload.as_value())),
                                              depth=NB, init=[])
            rq_wr, rq_rd = rawq.write_port(), rawq.read_port()
            hb_wr, hb_rd = hbuf.write_port(), hbuf.read_port()
            r_m = Array(Signal(len(qp.scale_m), name=f"rawm{h}") for h in range(G))
            r_e = Array(Signal(len(qp.scale_e), name=f"rawe{h}") for h in range(G))
            fh, fc, rh = Signal(bits_for(G + 1)), Signal(bits_for(NB)), Signal(bits_for(G))
            hc = Signal(range(NB + 1))
            hdrop = Signal(32)
            dgrp = Signal(16)
            f_last_c = fc == NB - 1
            f_adv = qf.i.valid & qf.i.ready
            m.d.comb += [
                rq_rd.addr.eq(fh * NB + fc), hb_rd.addr.eq(fc),
                qf.i.payload.q.eq(rq_rd.data), qf.i.payload.s.eq(hb_rd.data),
                qf.i.payload.scale_m.eq(r_m[fh]), qf.i.payload.scale_e.eq(r_e[fh]),
                hb_wr.addr.eq(hc), hb_wr.data.eq(self.kh.payload.data),
            ]

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
                        m.d.comb += qk_err_rows.eq(1)
                with m.If(kp.last):
                    m.next = "KDRAIN"
                    with m.If(~last_c):
                        m.d.comb += qk_err_rows.eq(1)

        with m.FSM(name="qk") as qk_fsm:
            with m.State("IDLE"):
                m.d.comb += self.job.ready.eq(j_cnt < 2)
                with m.If(self.job.valid & (j_cnt < 2)):
                    hv = jobp.heads
                    bad = (hv == 0) | (hv > G) | (jobp.mode.as_value() == 3)
                    m.d.sync += [
                        causal.eq(jobp.causal), qnb.eq(jobp.n_blocks), q_pos.eq(jobp.q_pos),
                        qblk.eq(0), qcnt.eq(0), h_cnt.eq(0), c_cnt.eq(0), gcnt.eq(0),
                        qheads.eq(hv), drop_heads.eq(hv),
                    ]
                    for n in range(2):
                        with m.If(jw == n):
                            m.d.sync += [ctx[n].mode.eq(jobp.mode),
                                         ctx[n].normalize.eq(jobp.normalize),
                                         ctx[n].heads.eq(hv), ctx[n].n_blocks.eq(jobp.n_blocks),
                                         ctx[n].drop.eq(bad)]
                    with m.If(bad):
                        m.d.comb += [qk_err_job.eq(1), j_pub.eq(1)]
                        m.next = "DROP_Q"
                    with m.Else():
                        m.next = "LOAD_Q"

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
                    if PC:   # kept raw: every group folds its header into it
                        m.d.comb += [rq_wr.addr.eq(h_cnt * NB + c_cnt), rq_wr.data.eq(qp.data),
                                     rq_wr.en.eq(1)]
                        with m.If(c_cnt == 0):
                            m.d.sync += [r_m[h_cnt].eq(qp.scale_m), r_e[h_cnt].eq(qp.scale_e)]
                    else:
                        m.d.comb += [sc.load.en.eq(1), sc.load.h.eq(h_cnt), sc.load.c.eq(c_cnt),
                                     sc.load.data.eq(qp.data), sc.load.scale_m.eq(qp.scale_m),
                                     sc.load.scale_e.eq(qp.scale_e)]
                    with m.If(c_cnt == 0):
                        for n in range(2):
                            with m.If(jw == n):
                                m.d.sync += ctx[n].mfix[h_cnt].eq(qp.m_fix.as_signed())
                    m.d.sync += [qcnt.eq(qcnt + 1), c_cnt.eq(Mux(last_c, 0, c_cnt + 1))]
                    with m.If(last_c):
                        m.d.sync += h_cnt.eq(h_cnt + 1)
                    with m.If(qcnt == qheads * NB - 1):
                        m.d.comb += j_pub.eq(1)
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
                    with m.If(hc != NB):
                        m.d.comb += [self.kh.ready.eq(1), hb_wr.en.eq(self.kh.valid)]
                        with m.If(self.kh.valid):
                            m.d.sync += hc.eq(hc + 1)
                    with m.Elif(~sc.busy):
                        m.d.comb += [rq_rd.addr.eq(0), hb_rd.addr.eq(0)]   # the first beat
                        m.d.sync += [fh.eq(0), fc.eq(0), rh.eq(0)]
                        m.next = "FOLD"

                with m.State("FOLD"):
                    # feed (raw q, header) beats head by head; load the folded beats
                    m.d.comb += qf.i.valid.eq(fh < qheads)
                    with m.If(f_adv):
                        m.d.sync += [fc.eq(Mux(f_last_c, 0, fc + 1)),
                                     fh.eq(Mux(f_last_c, fh + 1, fh))]
                        m.d.comb += [rq_rd.addr.eq(Mux(f_last_c, (fh + 1) * NB, fh * NB + fc + 1)),
                                     hb_rd.addr.eq(Mux(f_last_c, 0, fc + 1))]
                    m.d.comb += [qf.o.ready.eq(1),
                                 sc.load.en.eq(qf.o.valid), sc.load.h.eq(rh),
                                 sc.load.c.eq(qf.o.payload.c), sc.load.data.eq(qf.o.payload.q),
                                 sc.load.scale_m.eq(qf.o.payload.scale_m),
                                 sc.load.scale_e.eq(qf.o.payload.scale_e)]
                    with m.If(qf.o.valid & (qf.o.payload.c == NB - 1)):
                        m.d.sync += rh.eq(rh + 1)
                        with m.If(rh == qheads - 1):
                            m.d.sync += folded.eq(1)
                            m.next = "KPHASE"

            with m.State("KPHASE"), m.If(self.k.valid):
                if PC:
                    with m.If(row_start & (gcnt == 0) & ~folded):
                        m.d.sync += hc.eq(0)
                        m.next = "HDR"
                    with m.Else():
                        k_beat()
                else:
                    k_beat()

            with m.State("KDRAIN"), m.If(~sc.busy):
                for n in range(NS):
                    with m.If(sw == n):
                        m.d.sync += slot[n].nk.eq(nk)
                        m.d.sync += [slot[n].m[h].eq(mblk[h]) for h in range(G)]
                m.d.comb += s_pub.eq(1)
                m.d.sync += qblk.eq(qblk + 1)
                with m.If(qblk + 1 == qnb):
                    m.next = "IDLE"
                with m.Else():
                    m.next = "KWAIT"

        # ================= PV side =============================================================
        pmode = Signal(AttnMode)
        pnorm = Signal()
        pheads = Signal.like(jobp.heads)
        pnb = Signal(16)
        pblk = Signal(16)
        pmfix = Array(Signal(signed(SW), name=f"pmfix{h}") for h in range(G))
        pm = Array(Signal(signed(SW), name=f"pm{h}") for h in range(G))
        pnk = Signal(TB + 2)
        mrun = Array(Signal(signed(SW), name=f"mrun{h}") for h in range(G))
        lrun = Array(Signal(unsigned(LANE_BITS), name=f"lrun{h}") for h in range(G))
        lacc = Array(Array(Signal(unsigned(LANE_BITS), name=f"lacc{b}_{h}") for h in range(G))
                     for b in range(2))
        pa = Signal()                # accumulator bank of the PV bank
        mb = Signal()                # accumulator bank under merge
        pv_acc = Mux(pa, acc_q[1], acc_q[0])
        mg_acc = Mux(mb, acc_q[1], acc_q[0])
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
            pv.t.eq(s_rd.data), pv.sv.eq(r_rd.data[:KV_SCALE.width]),
            pv.kvalid.eq(r_rd.data[KV_SCALE.width]), pv.fixed.eq(fixed),
            pv.acc_data.eq(pv_acc),
        ]
        m.d.comb += [pv.m_base[h].eq(Mux(fixed, pmfix[h], pm[h])) for h in range(G)]
        v_skip = ~r_nx.data[KV_SCALE.width] | (jv >= pnk) | (jv >= T)
        with m.If(pv.l_en):
            m.d.sync += lacc[pa][pv.l_h].eq(lacc[pa][pv.l_h] + pv.l_p)

        # merge (SINGLE mode): the block's bank ``mb`` into the running state, head ``mh``
        mh = mg.h
        m.d.comb += [mg.heads.eq(pheads), mg.m_run.eq(mrun[mh]), mg.l_run.eq(lrun[mh]),
                     mg.l_blk.eq(lacc[mb][mh]), mg.o_run_data.eq(o_rd.data), mg.acc_data.eq(mg_acc)]
        m.d.comb += [mg.m_blk[h].eq(pm[h]) for h in range(G)]
        with m.If(mg.set_run):
            m.d.sync += [lrun[mh].eq(mg.l_new), lacc[mb][mh].eq(0), mrun[mh].eq(mg.m_new)]
        with m.If(mg.wr):
            m.d.comb += [o_wr.addr.eq(mg.addr), o_wr.data.eq(mg.wr_data), o_wr.en.eq(1)]
            for b in range(2):
                with m.If(mb == b):
                    m.d.comb += zf_set[b].eq(Const(1, AW) << mg.addr)

        # output of a finished job: the head's m and l words, the o lanes of the word it reads
        oh = ost.h
        m.d.comb += [
            ost.mode.eq(pmode), ost.normalize.eq(pnorm), ost.heads.eq(pheads),
            ost.m_word.eq(Mux(fixed, pmfix[oh], mrun[oh])),
            ost.l_word.eq(Mux(fixed, lacc[pa][oh], lrun[oh])),
            ost.o_lanes.eq(Mux(fixed, Cat(*(pv_acc[n * ACC_W:n * ACC_W + LANE_BITS]
                                            for n in range(L))), o_rd.data)),
        ]

        out_addr = ost.addr
        mg_addr, mg_go, mg_busy = mg.addr, mg.go, mg.busy
        for b in range(2):
            m.d.comb += a_rd[b].addr.eq(Mux(pa == b, Mux(pv.acc_rd, pv.acc_addr, out_addr),
                                            mg_addr))
        m.d.comb += o_rd.addr.eq(Mux(mg_busy, mg_addr, out_addr))

        with m.FSM(name="pv") as pv_fsm:
            with m.State("IDLE"), m.If(j_cnt != 0):
                for n in range(2):
                    with m.If(jr == n):
                        c = ctx[n]
                        m.d.sync += [pmode.eq(c.mode), pnorm.eq(c.normalize),
                                     pheads.eq(c.heads), pnb.eq(c.n_blocks)]
                        m.d.sync += [pmfix[h].eq(c.mfix[h]) for h in range(G)]
                        with m.If(c.drop):
                            with m.If((c.mode == AttnMode.MAX) | (c.n_blocks == 0)):
                                m.d.comb += j_rel.eq(1)
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
                        m.d.comb += j_rel.eq(1)
                        m.next = "IDLE"

            with m.State("CLEAR"):
                # the job's accumulator and running-state words start at zero
                m.d.comb += [zf_set[0].eq(Const(1, AW) << clr), zf_set[1].eq(Const(1, AW) << clr),
                             o_wr.addr.eq(clr), o_wr.data.eq(0), o_wr.en.eq(1)]
                m.d.sync += clr.eq(clr + 1)
                with m.If(clr == pheads * NB - 1):
                    m.next = "PWAIT"
                    with m.If(pnb == 0):
                        m.next = "OUT"

            with m.State("PWAIT"), m.If(s_cnt != 0):
                for n in range(NS):
                    with m.If(sr == n):
                        m.d.sync += pnk.eq(slot[n].nk)
                        m.d.sync += [pm[h].eq(slot[n].m[h]) for h in range(G)]
                        with m.If(pmode == AttnMode.MAX):
                            m.d.sync += [mrun[h].eq(Mux(slot[n].m[h] > mrun[h], slot[n].m[h],
                                                        mrun[h])) for h in range(G)]
                m.d.sync += [jv.eq(0), ph.eq(0), pc.eq(0)]
                with m.If(pmode == AttnMode.MAX):
                    # phase 1 needs only the block maximum: no V rows
                    m.d.comb += [s_rel.eq(1), pv_block.eq(1)]
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
                            m.d.comb += pv_err_rows.eq(1)

            with m.State("PDRAIN"), m.If(~pv.busy):
                m.d.comb += [s_rel.eq(1), pv_block.eq(1)]
                m.d.sync += [pblk.eq(pblk + 1)]
                with m.If(jv != pnk):
                    m.d.comb += pv_err_rows.eq(1)
                with m.If(pmode == AttnMode.SINGLE):
                    m.next = "HANDOFF"
                with m.Elif(pblk + 1 == pnb):
                    m.next = "OUT"
                with m.Else():
                    m.next = "PWAIT"

            with m.State("HANDOFF"), m.If(~mg_busy):
                # the merge takes this block's accumulator bank; the next block fills the other
                m.d.comb += mg_go.eq(1)
                m.d.sync += [pa.eq(~pa), mb.eq(pa)]
                with m.If(pblk == pnb):
                    m.next = "MWAIT"
                with m.Else():
                    m.next = "PWAIT"

            with m.State("MWAIT"), m.If(~mg_busy):
                m.next = "OUT"

            with m.State("OUT"):
                m.d.comb += ost.start.eq(1)
                m.next = "OUT_WAIT"

            with m.State("OUT_WAIT"), m.If(~ost.busy):
                m.d.comb += [pv_job.eq(1), j_rel.eq(1)]
                m.next = "IDLE"


        # the PV bank's accumulator update has its bank's write port whenever it is active
        for b in range(2):
            m.d.comb += [a_wr[b].addr.eq(pv.acc_wr_addr), a_wr[b].data.eq(pv.acc_wr_data),
                         a_wr[b].en.eq(pv.acc_wr_en & (pa == b))]
        m.d.comb += st.busy.eq(~qk_fsm.ongoing("IDLE") | ~pv_fsm.ongoing("IDLE")
                               | mg_busy | (j_cnt != 0))
        return m
