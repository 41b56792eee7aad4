"""Per-channel-K group fold of the attention engine's QK side (``KVFormat.PER_CHANNEL_K``, paper
§5, issue #10 §5): the job's raw query heads are kept, each group header of a K block is
buffered, and every head is folded with it (:class:`~.attn_fold.QueryFold`,
:func:`mcf.abi.kv.fold_query`) into the query memory of the QK bank."""

from __future__ import annotations

from amaranth import Array, Module, Mux, Signal, unsigned
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from mcf.abi.kv import Q_ELEM, kv_header_layout

from .attn_fold import QueryFold
from .attn_score import bits_for, q_load_layout

__all__ = ["GroupFold"]


class GroupFold(wiring.Component):
    """Raw query store, group-header buffer and the fold feed for the QK side.

    Members
    -------
    raw : In(q_load_layout(lanes, head_dim, max_heads))
        A raw query beat to keep (``en``): head ``h``, chunk ``c``; the head's ``scale_m``,
        ``scale_e`` are taken on ``c = 0``.
    hdr_clear : In(1)
        Empties the header buffer (the next group's header follows).
    hdr_wr : In(1), hdr : In(kv_header_layout(lanes))
        Stores a header beat (channel order) while ``hdr_full`` is low.
    hdr_full : Out(1)
        ``head_dim/lanes`` header beats are stored.
    start : In(1)
        Rewinds the fold to head 0, chunk 0 (the header must be full).
    run : In(1), heads : In(range(max_heads + 1))
        While ``run``: feeds (raw beat, header beat) pairs head by head into the
        :class:`~.attn_fold.QueryFold` and puts its folded beats on ``load``.
    load : Out(q_load_layout(lanes, head_dim, max_heads))
        The folded beats for :class:`~.attn_score.ScorePipe`'s ``load`` (``en`` only while
        ``run``).
    done : Out(1)
        The last head's last folded beat is on ``load`` (``run`` may fall the next cycle).

    Latency: after ``start``, one pair per cycle into the fold; the fold's own latency
    (:class:`~.attn_fold.QueryFold`) to the first ``load`` beat; ``done`` about
    ``heads · (2·head_dim/lanes + 6)`` cycles after ``start``.
    """

    def __init__(self, head_dim: int, lanes: int, max_heads: int):
        self.head_dim, self.lanes, self.max_heads = head_dim, lanes, max_heads
        ld = q_load_layout(lanes, head_dim, max_heads)
        super().__init__({
            "raw": In(ld),
            "hdr_clear": In(1), "hdr_wr": In(1), "hdr": In(kv_header_layout(lanes)),
            "hdr_full": Out(1),
            "start": In(1), "run": In(1), "heads": In(range(max_heads + 1)),
            "load": Out(ld), "done": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        D, L, G = self.head_dim, self.lanes, self.max_heads
        NB = D // L
        raw = self.raw
        m.submodules.fold = qf = QueryFold(D, L)
        m.submodules.rawq = rawq = Memory(shape=unsigned(L * Q_ELEM.width), depth=G * NB,
                                          init=[])
        m.submodules.hbuf = hbuf = Memory(shape=unsigned(len(self.hdr.as_value())), depth=NB,
                                          init=[])
        rq_wr, rq_rd = rawq.write_port(), rawq.read_port()
        hb_wr, hb_rd = hbuf.write_port(), hbuf.read_port()
        r_m = Array(Signal(len(raw.scale_m), name=f"rawm{h}") for h in range(G))
        r_e = Array(Signal(len(raw.scale_e), name=f"rawe{h}") for h in range(G))
        fh, fc, rh = Signal(bits_for(G + 1)), Signal(bits_for(NB)), Signal(bits_for(G))
        hc = Signal(range(NB + 1))
        f_last_c = fc == NB - 1
        f_adv = qf.i.valid & qf.i.ready
        m.d.comb += [
            rq_rd.addr.eq(fh * NB + fc), hb_rd.addr.eq(fc),
            qf.i.payload.q.eq(rq_rd.data), qf.i.payload.s.eq(hb_rd.data),
            qf.i.payload.scale_m.eq(r_m[fh]), qf.i.payload.scale_e.eq(r_e[fh]),
            hb_wr.addr.eq(hc), hb_wr.data.eq(self.hdr.data),
            self.hdr_full.eq(hc == NB),
        ]

        # raw query beats, kept for every group of the job
        with m.If(raw.en):
            m.d.comb += [rq_wr.addr.eq(raw.h * NB + raw.c), rq_wr.data.eq(raw.data),
                         rq_wr.en.eq(1)]
            with m.If(raw.c == 0):
                m.d.sync += [r_m[raw.h].eq(raw.scale_m), r_e[raw.h].eq(raw.scale_e)]

        # the group header
        with m.If(self.hdr_clear):
            m.d.sync += hc.eq(0)
        with m.If(self.hdr_wr):
            m.d.comb += hb_wr.en.eq(1)
            m.d.sync += hc.eq(hc + 1)

        with m.If(self.start):
            m.d.comb += [rq_rd.addr.eq(0), hb_rd.addr.eq(0)]   # the first beat
            m.d.sync += [fh.eq(0), fc.eq(0), rh.eq(0)]

        # the fold: (raw q, header) beats head by head in, folded beats to the query memory
        with m.If(self.run):
            m.d.comb += qf.i.valid.eq(fh < self.heads)
            with m.If(f_adv):
                m.d.sync += [fc.eq(Mux(f_last_c, 0, fc + 1)), fh.eq(Mux(f_last_c, fh + 1, fh))]
                m.d.comb += [rq_rd.addr.eq(Mux(f_last_c, (fh + 1) * NB, fh * NB + fc + 1)),
                             hb_rd.addr.eq(Mux(f_last_c, 0, fc + 1))]
            m.d.comb += [qf.o.ready.eq(1),
                         self.load.en.eq(qf.o.valid), self.load.h.eq(rh),
                         self.load.c.eq(qf.o.payload.c), self.load.data.eq(qf.o.payload.q),
                         self.load.scale_m.eq(qf.o.payload.scale_m),
                         self.load.scale_e.eq(qf.o.payload.scale_e)]
            with m.If(qf.o.valid & (qf.o.payload.c == NB - 1)):
                m.d.sync += rh.eq(rh + 1)
                with m.If(rh == self.heads - 1):
                    m.d.comb += self.done.eq(1)
        return m
