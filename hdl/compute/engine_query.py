"""The query side of the attention engine on the arrays (issue #33;
:class:`~.array_engine.ArrayEngine`): job intake, the query heads kept in one of two slots, and
per KV block one query row per head for :class:`~.tile_fold.TileFold` — a job's heads are the
rows of one query tile on the arrays.
"""

from __future__ import annotations

from amaranth import Array, Cat, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from mcf.abi.attn_tile import fold_row_layout
from mcf.abi.kv import Q_ELEM, AttnMode, attn_job_layout, q_beat_layout
from mcf.abi.quant import SCALE_EXP_BITS, SCALE_MANT_BITS
from mcf.abi.softmax import SCORE

from .engine_feed import block_count_layout, feed_job_layout

__all__ = ["QueryFront", "out_job_layout"]


def out_job_layout(max_heads: int) -> data.StructLayout:
    """A kept job as its output needs it: ``mode``, ``normalize``, ``heads``, ``empty`` (no KV
    block: every head's state is the empty one, FIXED's with its ``m_fix``) and the heads'
    ``m_fix``."""
    return data.StructLayout({"mode": AttnMode, "normalize": 1, "heads": range(max_heads + 1),
                              "empty": 1,
                              "m_fix": data.ArrayLayout(signed(SCORE.width), max_heads)})


class QueryFront(wiring.Component):
    """Job intake and query rows.

    A job is taken while idle. A rejected job (``heads`` outside ``1..max_heads``, mode 3) is
    counted (``err_job``), its ``heads·head_dim/lanes`` query beats dropped and its blocks
    handed to the feed to drop. A kept job's query beats are written into a free slot (two
    slots: a job loads while the previous one's rows are issued); then its records go out
    together on ``kjob``, ``vjob``, ``ojob`` and (with blocks) to the issue. Per block (its
    counts on ``blocks``, in order) the issue sends ``heads`` rows (``row`` = head, ``first`` /
    ``final`` on the job's first / last block, the job's mode and each head's ``m_fix``); the
    slot is freed after the job's last row.

    Members
    -------
    job, q : In — the engine's (:func:`mcf.abi.kv.attn_job_layout`,
        :func:`mcf.abi.kv.q_beat_layout`).
    kjob, vjob : Out(stream.Signature(feed_job_layout(max_heads)))
        To :class:`~.engine_feed.KVFeed`.
    ojob : Out(stream.Signature(out_job_layout(max_heads))) — a kept job, to the output.
    blocks : In(stream.Signature(block_count_layout(max_block))) — the kept blocks' counts.
    rows : Out(stream.Signature(fold_row_layout(head_dim, max_block, max_heads))) — TileFold's.
    err_job, busy : Out(1)

    Latency: a job's records go out the cycle after its last query beat (one per cycle); a
    block's first row the cycle after its counts are valid, a row per two cycles (a head's
    query is kept as two words).
    """

    def __init__(self, head_dim: int, lanes: int, max_heads: int, max_block: int):
        self.head_dim, self.lanes, self.max_heads, self.max_block = (
            head_dim, lanes, max_heads, max_block)
        if (head_dim // lanes) % 2:
            raise ValueError("a head's query beats (head_dim/lanes) must be even: it is kept "
                             "as two words")
        G = max_heads
        fj = stream.Signature(feed_job_layout(G))
        super().__init__({
            "job": In(stream.Signature(attn_job_layout(G))),
            "q": In(stream.Signature(q_beat_layout(lanes))),
            "kjob": Out(fj), "vjob": Out(fj),
            "ojob": Out(stream.Signature(out_job_layout(G))),
            "blocks": In(stream.Signature(block_count_layout(max_block))),
            "rows": Out(stream.Signature(fold_row_layout(head_dim, max_block, G))),
            "err_job": Out(1), "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        D, L, G = self.head_dim, self.lanes, self.max_heads
        NB = D // L
        QW = Q_ELEM.width
        slay = data.StructLayout({"scale_m": unsigned(SCALE_MANT_BITS),
                                  "scale_e": signed(SCALE_EXP_BITS), "m_fix": signed(SCORE.width)})
        # a head's query as two words (half the LUT-RAM of a row-wide memory; a row leaves in
        # two cycles, which TileFold's one beat per 32-key tile never notices)
        HB = NB // 2
        m.submodules.qmem = qmem = Memory(shape=unsigned(D * QW // 2), depth=4 * G, init=[])
        m.submodules.smem = smem = Memory(shape=slay, depth=2 * G, init=[])
        q_wr = qmem.write_port(granularity=L * QW)
        s_wr = smem.write_port()
        ilay = data.StructLayout({"heads": range(G + 1), "mode": AttnMode, "slot": 1,
                                  "n_blocks": 16})
        m.submodules.iq = iq = fifo.SyncFIFOBuffered(width=ilay.size, depth=2)

        # ---- intake --------------------------------------------------------------------------
        jp, qp = self.job.payload, self.q.payload
        job = Signal(jp.shape())
        slot, h, c = Signal(), Signal(range(G + 1)), Signal(range(NB))
        cnt = Signal(range(8 * NB + 1))               # query beats dropped
        used = Array(Signal(name=f"used{n}") for n in range(2))
        freed = Signal()
        free_slot = Signal()
        mfix = Array(Signal(signed(SCORE.width), name=f"mfix{n}") for n in range(G))
        bad = (jp.heads == 0) | (jp.heads > G) | (jp.mode.as_value() == 3)
        for o in (self.kjob, self.vjob):
            m.d.comb += [o.payload.n_blocks.eq(job.n_blocks), o.payload.heads.eq(job.heads),
                         o.payload.max.eq(job.mode == AttnMode.MAX),
                         o.payload.causal.eq(job.causal), o.payload.q_pos.eq(job.q_pos)]
        op = self.ojob.payload
        m.d.comb += [op.mode.eq(job.mode), op.normalize.eq(job.normalize), op.heads.eq(job.heads),
                     op.empty.eq(job.n_blocks == 0)] + [op.m_fix[n].eq(mfix[n]) for n in range(G)]
        iw = data.View(ilay, iq.w_data)
        m.d.comb += [iw.heads.eq(job.heads), iw.mode.eq(job.mode), iw.slot.eq(slot),
                     iw.n_blocks.eq(job.n_blocks)]
        with m.FSM() as fsm:
            with m.State("IDLE"):
                take_bad = bad & self.kjob.ready & self.vjob.ready
                m.d.comb += self.job.ready.eq(take_bad | (~bad & ~used[slot]))
                with m.If(self.job.valid & self.job.ready):
                    m.d.sync += [job.eq(jp), h.eq(0), c.eq(0), cnt.eq(0)]
                    with m.If(bad):
                        m.d.comb += [self.err_job.eq(1), self.kjob.valid.eq(1),
                                     self.vjob.valid.eq(1), self.kjob.payload.drop.eq(1),
                                     self.vjob.payload.drop.eq(1),
                                     self.kjob.payload.n_blocks.eq(jp.n_blocks),
                                     self.vjob.payload.n_blocks.eq(jp.n_blocks),
                                     self.vjob.payload.max.eq(jp.mode == AttnMode.MAX)]
                        m.next = "DROP_Q"
                    with m.Else():
                        m.next = "LOAD_Q"
            with m.State("DROP_Q"):
                with m.If(cnt == job.heads * NB):
                    m.next = "IDLE"
                with m.Else():
                    m.d.comb += self.q.ready.eq(1)
                    with m.If(self.q.valid):
                        m.d.sync += cnt.eq(cnt + 1)
            with m.State("LOAD_Q"):
                m.d.comb += [self.q.ready.eq(1), q_wr.addr.eq(Cat(c >= HB, slot * G + h)),
                             q_wr.data.eq(qp.data.replicate(HB)), s_wr.addr.eq(slot * G + h),
                             s_wr.data.scale_m.eq(qp.scale_m), s_wr.data.scale_e.eq(qp.scale_e),
                             s_wr.data.m_fix.eq(qp.m_fix)]
                with m.If(self.q.valid):
                    m.d.comb += [q_wr.en.eq(1 << (c % HB)), s_wr.en.eq(c == 0)]
                    with m.If(c == 0):
                        m.d.sync += mfix[h].eq(qp.m_fix)
                    m.d.sync += c.eq(Mux(c == NB - 1, 0, c + 1))
                    with m.If(c == NB - 1):
                        m.d.sync += h.eq(h + 1)
                        with m.If(h == job.heads - 1):
                            m.next = "PUSH"
            with m.State("PUSH"):
                blocks = job.n_blocks != 0
                go = (self.kjob.ready & self.vjob.ready & self.ojob.ready
                      & (~blocks | iq.w_rdy))
                m.d.comb += [self.kjob.valid.eq(go), self.vjob.valid.eq(go),
                             self.ojob.valid.eq(go), iq.w_en.eq(go & blocks)]
                with m.If(go):
                    with m.If(blocks):
                        m.d.sync += [used[slot].eq(1), slot.eq(~slot)]
                    m.next = "IDLE"
        with m.If(freed):
            m.d.sync += used[free_slot].eq(0)

        # ---- issue: per block, a row per head ------------------------------------------------
        ij = data.View(ilay, iq.r_data)
        b = Signal(16)
        hi = Signal(range(G))
        q_rd, s_rd = qmem.read_port(domain="comb"), smem.read_port(domain="comb")
        bc = self.blocks.payload
        r = self.rows.payload
        ph = Signal()                                 # the row's first word is held in lo
        lo = Signal(D * QW // 2)
        pending = iq.r_rdy & self.blocks.valid
        with m.If(pending & ~ph):
            m.d.sync += [lo.eq(q_rd.data), ph.eq(1)]
        m.d.comb += [q_rd.addr.eq(Cat(ph, ij.slot * G + hi)), s_rd.addr.eq(ij.slot * G + hi),
                     r.q.as_value().eq(Cat(lo, q_rd.data)), r.scale_m.eq(s_rd.data.scale_m),
                     r.scale_e.eq(s_rd.data.scale_e), r.m_fix.eq(s_rd.data.m_fix),
                     r.mode.eq(ij.mode), r.visible.eq(bc.visible), r.n.eq(bc.rows),
                     r.row.eq(hi), r.first.eq(b == 0), r.final.eq(b == ij.n_blocks - 1),
                     r.last.eq(hi == ij.heads - 1),
                     self.rows.valid.eq(pending & ph)]
        with m.If(self.rows.valid & self.rows.ready):
            m.d.sync += [hi.eq(hi + 1), ph.eq(0)]
            with m.If(r.last):
                m.d.comb += self.blocks.ready.eq(1)
                m.d.sync += [hi.eq(0), b.eq(b + 1)]
                with m.If(r.final):
                    m.d.comb += [iq.r_en.eq(1), freed.eq(1), free_slot.eq(ij.slot)]
                    m.d.sync += b.eq(0)
        m.d.comb += self.busy.eq(~fsm.ongoing("IDLE") | iq.r_rdy)
        return m
