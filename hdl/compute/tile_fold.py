"""The query fold of the tiled prefill (issue #33; paper §3.1, §5): a query row against a KV block
→ :class:`~.tile_score.TileScore`'s query beats, one per key tile of the block
(:func:`mcf.abi.attn_tile.score_q_layout`). Per-token K: the row's query as it is. Per-channel K:
the query folded by the header of the tile's 32-key group (:func:`mcf.abi.kv.fold_query`, the
arithmetic of :class:`~.attn_fold.QueryFold`, instantiated here), once per (row, group).
"""

from __future__ import annotations

from amaranth import Array, Module, Mux, Signal
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from mcf.abi.attn_tile import (
    fold_header_layout,
    fold_row_layout,
    qk_tile_keys,
    row_mode_fields,
    score_q_layout,
)
from mcf.abi.kv import KV_SCALE, Q_ELEM
from mcf.abi.kv_channel import KV_GROUP, KVFormat

from .attn_fold import QueryFold

__all__ = ["TileFold"]


class TileFold(wiring.Component):
    """Query rows (one per row and KV block, in :func:`mcf.golden.attention_tiled.tile_schedule`'s
    order) → one query beat per key tile (``R`` = :func:`~mcf.abi.attn_tile.qk_tile_keys`
    keys; ``ceil(n / R)`` per row), ``visible`` and the tags passed on.

    ``kv_format = PER_TOKEN``: the beat is the row itself (combinational; the row is taken with
    its last beat). ``PER_CHANNEL_K``: the block's group headers are loaded into one of two
    banks (the next block's while rows run against the current one); per row and group a
    feeder sends the row and the header, ``head_dim/fold_lanes`` beats, to one of ``folds``
    :class:`~.attn_fold.QueryFold` units in turn; the folded row is collected (in the same
    order) into a register, moved to the output register and sent as the group's
    ``ceil(min(32, n − 32g) / R)`` beats with ``(m', e')``.

    Members
    -------
    i : In(stream.Signature(fold_row_layout(head_dim, max_block, rows)))
        A row against a block: the query (not folded), its scale, ``visible``, the tags, the
        block's ``n`` keys, ``last`` (the block's last row) and the row's ``mode``, ``m_fix``,
        ``p8`` (passed on with the tags).
    kh : In(stream.Signature(fold_header_layout(fold_lanes))) — ``PER_CHANNEL_K`` only
        Per block its ``ceil(n / 32)`` group headers, ``last`` on the final beat; in the
        blocks' order.
    o : Out(stream.Signature(score_q_layout(head_dim, max_block, rows)))
        TileScore's ``q``.

    Rate (``PER_CHANNEL_K``): one fold per ``head_dim/fold_lanes`` cycles (the feeder's beat
    per cycle) when ``folds · head_dim/fold_lanes ≥ 2·head_dim/fold_lanes + 5`` (a
    QueryFold's cycles per head) — at the kr260 shape (head_dim 128, 16 lanes, 3 folds) one
    group per 8 cycles, the arrays' rate (a 32-key group is ``32/keys`` = 8 score beats).
    Latency: the first beat of a (row, group) ``2·head_dim/fold_lanes + 6`` cycles after its
    first beat is fed (measured in ``tests/test_tile_fold.py``). ``PER_TOKEN``: 0 cycles, one
    beat per cycle.
    """

    def __init__(self, keys: int = 4, head_dim: int = 128, lanes: int = 16,
                 max_block: int = 256, rows: int = 64,
                 kv_format: KVFormat = KVFormat.PER_TOKEN, fold_lanes: int = 16,
                 folds: int = 3):
        if head_dim % fold_lanes:
            raise ValueError("fold_lanes must divide head_dim")
        self.keys, self.head_dim, self.lanes, self.max_block, self.rows = (
            keys, head_dim, lanes, max_block, rows)
        self.kv_format, self.fold_lanes, self.folds = KVFormat(kv_format), fold_lanes, folds
        self.tile = qk_tile_keys(keys, head_dim, lanes)
        if KV_GROUP % self.tile:
            raise ValueError(f"a key tile of {self.tile} keys must divide {KV_GROUP}")
        members = {
            "i": In(stream.Signature(fold_row_layout(head_dim, max_block, rows))),
            "o": Out(stream.Signature(score_q_layout(head_dim, max_block, rows))),
        }
        if self.kv_format == KVFormat.PER_CHANNEL_K:
            members["kh"] = In(stream.Signature(fold_header_layout(fold_lanes)))
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        i, o = self.i, self.o
        R = self.tile
        ntiles = Signal(range(self.max_block // R + 2))
        t = Signal.like(ntiles)
        meta = ("visible", "row", "first", "final", "mode", "m_fix", "p8")
        if self.kv_format == KVFormat.PER_TOKEN:
            m.d.comb += ntiles.eq((i.payload.n + R - 1) // R)
            m.d.comb += [o.payload.q.eq(i.payload.q), o.payload.scale_m.eq(i.payload.scale_m),
                         o.payload.scale_e.eq(i.payload.scale_e), o.valid.eq(i.valid),
                         i.ready.eq(o.ready & (t >= ntiles - 1))]
            m.d.comb += [getattr(o.payload, f).eq(getattr(i.payload, f)) for f in meta]
            with m.If(o.valid & o.ready):
                m.d.sync += t.eq(Mux(i.ready, 0, t + 1))
            return m

        D, LF, N = self.head_dim, self.fold_lanes, self.folds
        NB = D // LF                                   # beats of a fold
        GM = -(-self.max_block // KV_GROUP)            # headers of a bank
        kh = self.kh

        # ---- header banks --------------------------------------------------------------------
        m.submodules.hmem = hmem = Memory(shape=LF * KV_SCALE.width, depth=2 * GM * NB, init=[])
        h_wr, h_rd = hmem.write_port(), hmem.read_port(domain="comb")
        hfull = Array(Signal(name=f"hfull{b}") for b in range(2))
        hw, hr = Signal(), Signal()
        hc = Signal(range(GM * NB))
        m.d.comb += [kh.ready.eq(~hfull[hw]), h_wr.addr.eq(Mux(hw, GM * NB, 0) + hc),
                     h_wr.data.eq(kh.payload.data), h_wr.en.eq(kh.valid & kh.ready)]
        with m.If(kh.valid & kh.ready):
            m.d.sync += hc.eq(hc + 1)
            with m.If(kh.payload.last):
                m.d.sync += [hfull[hw].eq(1), hw.eq(~hw), hc.eq(0)]

        # ---- the feeder: a row, group by group, to the folds in turn ---------------------------
        mlay = data.StructLayout({"visible": o.payload.visible.shape(),
                                  "row": o.payload.row.shape(), "first": 1, "final": 1,
                                  **row_mode_fields(), "tiles": range(KV_GROUP // R + 1)})
        m.submodules.meta = mq = fifo.SyncFIFOBuffered(width=mlay.size, depth=N + 3)
        cur = Signal(i.payload.shape())
        busy = Signal()
        g, fc = Signal(range(GM)), Signal(range(NB))
        fw = Signal(range(N))                          # fold fed next
        ngroups = Signal(range(GM + 1))
        m.d.comb += ngroups.eq((cur.n + KV_GROUP - 1) // KV_GROUP)
        qf = [QueryFold(D, LF) for _ in range(N)]
        for n_, u in enumerate(qf):
            m.submodules[f"fold{n_}"] = u
        left = Signal(range(self.max_block + 1))
        m.d.comb += left.eq(cur.n - g * KV_GROUP)
        gtiles = Mux(left >= KV_GROUP, KV_GROUP // R, (left + R - 1) // R)
        mw = Signal(mlay)
        m.d.comb += [mw.visible.eq(cur.visible), mw.row.eq(cur.row), mw.first.eq(cur.first),
                     mw.final.eq(cur.final), mw.mode.eq(cur.mode), mw.m_fix.eq(cur.m_fix),
                     mw.p8.eq(cur.p8),
                     mw.tiles.eq(gtiles), mq.w_data.eq(mw)]
        h_addr = Mux(hr, GM * NB, 0) + g * NB + fc
        m.d.comb += h_rd.addr.eq(h_addr)
        f_rdy = Array(u.i.ready for u in qf)[fw]
        feed = busy & f_rdy & ((fc != 0) | mq.w_rdy)
        for n_, u in enumerate(qf):
            m.d.comb += [u.i.payload.q.eq(cur.q.as_value().word_select(fc, LF * Q_ELEM.width)),
                         u.i.payload.s.eq(h_rd.data), u.i.payload.scale_m.eq(cur.scale_m),
                         u.i.payload.scale_e.eq(cur.scale_e), u.i.valid.eq(feed & (fw == n_))]
        m.d.comb += mq.w_en.eq(feed & (fc == 0))
        with m.If(feed):
            m.d.sync += fc.eq(Mux(fc == NB - 1, 0, fc + 1))
            with m.If(fc == NB - 1):
                m.d.sync += [fw.eq(Mux(fw == N - 1, 0, fw + 1)), g.eq(g + 1)]
                with m.If(g == ngroups - 1):
                    m.d.sync += busy.eq(0)
                    with m.If(cur.last):
                        m.d.sync += [hfull[hr].eq(0), hr.eq(~hr)]
        # the next row is taken as the current one's last beat is fed
        finish = feed & (fc == NB - 1) & (g == ngroups - 1)
        m.d.comb += i.ready.eq((~busy | finish) & hfull[Mux(finish & cur.last, ~hr, hr)])
        with m.If(i.valid & i.ready):
            m.d.sync += [cur.eq(i.payload), busy.eq(1), g.eq(0), fc.eq(0)]

        # ---- the collector: the folds' rows in turn, chunk by chunk ---------------------------
        asm = Signal(data.ArrayLayout(Q_ELEM.width, D))
        a_m = Signal.like(o.payload.scale_m)
        a_e = Signal.like(o.payload.scale_e)
        afull = Signal()
        fr = Signal(range(N))
        fo = Array(u.o for u in qf)[fr]

        # ---- the output register: a group's tiles --------------------------------------------
        ometa = Signal(mlay)
        oq = Signal.like(asm)
        o_m, o_e = Signal.like(a_m), Signal.like(a_e)
        ovalid = Signal()
        oend = o.valid & o.ready & (t == ometa.tiles - 1)
        move = afull & mq.r_rdy & (~ovalid | oend)
        m.d.comb += mq.r_en.eq(move)
        with m.If(o.valid & o.ready):
            m.d.sync += t.eq(t + 1)
            with m.If(oend):
                m.d.sync += ovalid.eq(0)
        with m.If(move):
            m.d.sync += [oq.eq(asm), o_m.eq(a_m), o_e.eq(a_e), ometa.eq(mq.r_data),
                         ovalid.eq(1), t.eq(0), afull.eq(0)]
        m.d.comb += [o.valid.eq(ovalid), o.payload.q.as_value().eq(oq), o.payload.scale_m.eq(o_m),
                     o.payload.scale_e.eq(o_e)]
        m.d.comb += [getattr(o.payload, f).eq(getattr(ometa, f)) for f in meta]

        # the collector (after the move: a row collected as the previous one moves out)
        coll = ~afull | move
        for n_, u in enumerate(qf):
            m.d.comb += u.o.ready.eq(coll & (fr == n_))
        with m.If(fo.valid & coll):
            m.d.sync += [asm.as_value().word_select(fo.payload.c, LF * Q_ELEM.width).eq(
                fo.payload.q), a_m.eq(fo.payload.scale_m), a_e.eq(fo.payload.scale_e)]
            with m.If(fo.payload.c == NB - 1):
                m.d.sync += [afull.eq(1), fr.eq(Mux(fr == N - 1, 0, fr + 1))]
        return m
