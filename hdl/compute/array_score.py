"""S = Q·Kᵀ of prefill attention on the GEMM's arrays (issue #33; paper §3.1, §5;
docs/attention.md "The arrays' attention products"): :class:`~.tile_score.TileScore`'s streams
and beats, computed by ``arrays`` token-parallel :class:`~.gemm_array.GemmArray` (an
:class:`~.array_bank.ArrayBank`) — four query rows against one K word per step, the form in which
the kr260's GEMM arrays take their weight words."""

from __future__ import annotations

from amaranth import Array, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from mcf.abi.attn_tile import (
    k_word_layout,
    qk_acc_bits,
    qk_tile_keys,
    score_q_layout,
    score_row_beat_layout,
)
from mcf.abi.kv import KV_ELEM, KV_SCALE, Q_ELEM
from mcf.abi.kv_channel import KV_GROUP
from mcf.abi.quant import SCALE_EXP_BITS, SCALE_MANT_BITS

from .array_bank import ArrayBank, bank_result_layout, bank_step_layout

__all__ = ["ArrayScore"]


class ArrayScore(wiring.Component):
    """``acc = Σ q·k`` of query rows against a KV block's K on ``arrays`` GEMM arrays of
    ``array_rows`` keys × ``lanes`` channels, emitted as TileSoftmax's score rows — the beats
    of :class:`~.tile_score.TileScore` with the same parameters, in the same order.

    Rows run in **quads** of up to ``arrays`` consecutive rows of a block (the block's last
    quad may be short): array ``i`` takes row ``i`` of the quad, all take the same K word. Per
    key tile ``t`` (``R`` = :func:`~mcf.abi.attn_tile.qk_tile_keys` keys, the query beat's
    tile) and sub-tile ``h`` (``array_rows`` of its keys; sub-tiles wholly past the block's
    keys are skipped) one dot product of ``S = head_dim / lanes`` steps — one group, scale
    mantissas 1, so each array returns its row's exact ``acc`` of ``array_rows`` keys.

    Buffers: K in two banks of ``max_block`` keys (the next block loads while rows run against
    the current one; a bank is freed when its last quad has left); two quad buffers for the
    query beats (a quad fills while the other is issued; freed at its last result) and two for
    the scores (a quad's results while the other is emitted). Results are never refused: a
    quad is issued only into a free score buffer.

    Parameters
    ----------
    keys, head_dim, lanes, max_block, max_rows : as :class:`~.tile_score.TileScore`.
    arrays : query rows per step (the GEMM's token-parallel arrays; 4 on the kr260).
    array_rows : keys per dot product (even, divides ``R``, a multiple of ``keys``).
    chain, dsp : the arrays' lane sums (:class:`~.gemm_array.GemmArray`).
    own_arrays : build the :class:`~.array_bank.ArrayBank` inside (default); ``False``:
        expose its ports (``st``, ``res``) for arrays shared with others.

    Members
    -------
    k, q, o : as :class:`~.tile_score.TileScore` (``visible``, ``row``, ``first``, ``final``
        read from a row's first query beat, the scale from each tile's).
    st : Out(stream.Signature(bank_step_layout(arrays, array_rows, lanes))) — ``own_arrays =
        False`` only: the steps.
    res : In(stream.Signature(bank_result_layout(arrays, array_rows))) — ``own_arrays =
        False`` only: the dot products' results, in step order (always ready).

    Rate: a quad takes ``S·Σ_t (sub-tiles of t)`` cycles of the arrays — ``S·ceil(n /
    array_rows)`` for a block of ``n`` keys, ``arrays × keys × head_dim`` MACs per cycle per
    array step (twice TileScore's at the kr260 shape) — and leaves at one beat per cycle,
    ``ceil(n / keys)`` per row: the output, not the arrays, sets the rate when ``arrays·S·
    ceil(n / keys) > S·ceil(n / array_rows)`` (always at ``keys < arrays·array_rows``).
    Latency: a quad's first beat leaves after its last query beat, its ``S·(sub-tiles)``
    steps and the arrays' latency.
    """

    def __init__(self, keys: int = 4, head_dim: int = 128, lanes: int = 16,
                 max_block: int = 256, max_rows: int = 64, arrays: int = 4,
                 array_rows: int = 16, chain: int = 1, dsp: str = "fabric",
                 own_arrays: bool = True):
        if head_dim % lanes:
            raise ValueError("lanes must divide head_dim")
        tile = qk_tile_keys(keys, head_dim, lanes)
        if KV_GROUP % tile or max_block % tile:
            raise ValueError(f"a key tile of {tile} keys must divide {KV_GROUP} and max_block")
        if array_rows % 2 or tile % array_rows or array_rows % keys:
            raise ValueError("array_rows must be even, divide the key tile and be a multiple "
                             "of keys")
        self.keys, self.head_dim, self.lanes, self.max_block = keys, head_dim, lanes, max_block
        self.max_rows, self.tile, self.steps = max_rows, tile, head_dim // lanes
        self.n_arrays, self.array_rows, self.own_arrays = arrays, array_rows, own_arrays
        # the arrays: built here only when owned (an unused one would warn)
        self.bank = ArrayBank(arrays, array_rows, lanes, head_dim, chain, dsp) \
            if own_arrays else None
        sig = {
            "k": In(stream.Signature(k_word_layout(keys, head_dim, lanes, max_block, max_rows))),
            "q": In(stream.Signature(score_q_layout(head_dim, max_block, max_rows))),
            "o": Out(stream.Signature(score_row_beat_layout(keys, head_dim, max_rows))),
        }
        if not own_arrays:
            sig["st"] = Out(stream.Signature(bank_step_layout(arrays, array_rows, lanes)))
            sig["res"] = In(stream.Signature(bank_result_layout(arrays, array_rows)))
        super().__init__(sig)

    def elaborate(self, platform):
        m = Module()
        K, L, S, R, D = self.keys, self.lanes, self.steps, self.tile, self.head_dim
        A, AR = self.n_arrays, self.array_rows
        H = R // AR                                   # sub-tiles (dot products) per key tile
        NT = self.max_block // R                      # key tiles of a bank
        NW = self.max_block // K                      # K words (= score beats) of a bank
        AB = qk_acc_bits(D)
        if self.own_arrays:
            m.submodules.bank = bank = self.bank
            st, res = bank.i, bank.o
        else:
            st, res = self.st, self.res

        # ---- K banks (TileScore's): words in (tile, chunk) order, the keys' scales per beat --
        wlay = data.ArrayLayout(data.ArrayLayout(signed(KV_ELEM.width), L), R)
        slay = data.StructLayout({"sk": data.ArrayLayout(unsigned(KV_SCALE.width), K),
                                  "sv": data.ArrayLayout(unsigned(KV_SCALE.width), K)})
        m.submodules.kmem = kmem = Memory(shape=wlay, depth=2 * NW, init=[])
        m.submodules.smem = smem = Memory(shape=slay, depth=2 * NW, init=[])
        k_wr, k_rd = kmem.write_port(), kmem.read_port()
        s_wr, s_rd = smem.write_port(), smem.read_port(domain="comb")
        full = Signal(2)                              # loaded, not yet emitted
        loaded = Signal(2)                            # loaded, rows to fill
        nrows = Array(Signal(range(self.max_rows + 1), name=f"nrows{b}") for b in range(2))
        nkeys = Array(Signal(range(self.max_block + 1), name=f"nkeys{b}") for b in range(2))
        wb = Signal()
        kword = Signal(range(NW))
        k = self.k
        m.d.comb += [k.ready.eq(~full.bit_select(wb, 1)),
                     k_wr.addr.eq(Mux(wb, NW, 0) + kword), k_wr.data.eq(k.payload.k),
                     k_wr.en.eq(k.valid & k.ready),
                     s_wr.addr.eq(k_wr.addr), s_wr.en.eq(k_wr.en),
                     s_wr.data.sk.eq(k.payload.sk), s_wr.data.sv.eq(k.payload.sv)]
        with m.If(k.valid & k.ready):
            m.d.sync += kword.eq(Mux(k.payload.last, 0, kword + 1))
            with m.If(k.payload.last & (k.payload.rows != 0)):
                m.d.sync += [full.bit_select(wb, 1).eq(1), loaded.bit_select(wb, 1).eq(1),
                             nrows[wb].eq(k.payload.rows), nkeys[wb].eq(k.payload.n),
                             wb.eq(~wb)]

        # ---- quad buffers: the query beats of up to A rows -----------------------------------
        o = self.o
        q = self.q
        scale_l = data.StructLayout({"m": unsigned(SCALE_MANT_BITS),
                                     "e": signed(SCALE_EXP_BITS)})
        rmeta_l = data.StructLayout({"row": o.payload.row.shape(), "first": 1, "final": 1,
                                     "lim": range(self.max_block + 1)})
        qinfo_l = data.StructLayout({"bank": 1, "rows": range(A + 1),
                                     "nkeys": range(self.max_block + 1),
                                     "ntiles": range(NT + 1), "blast": 1})
        qmems, tscs = [], []
        for i in range(A):
            qm = Memory(shape=unsigned(D * Q_ELEM.width), depth=2 * NT, init=[])
            ts = Memory(shape=scale_l, depth=2 * NT, init=[])
            m.submodules[f"qmem{i}"], m.submodules[f"tsc{i}"] = qm, ts
            qmems.append(qm)
            tscs.append(ts)
        rmeta = [[Signal(rmeta_l, name=f"rmeta{h}_{i}") for i in range(A)] for h in range(2)]
        qinfo = Array(Signal(qinfo_l, name=f"qinfo{h}") for h in range(2))
        qfull = Signal(2)                             # a quad filled, results not all back
        qissued = Signal(2)                           # its steps all issued

        fb, fh = Signal(), Signal()                   # bank / quad buffer being filled
        frow = Signal(range(self.max_rows + 1))       # rows of bank fb filled
        fi = Signal(range(A))                         # row of the quad
        ft = Signal(range(NT))                        # key tile of the row
        f_tiles = Signal(range(NT + 1))
        f_rows = Signal(range(A + 1))
        left = Signal(range(self.max_rows + 1))
        m.d.comb += [f_tiles.eq((nkeys[fb] + R - 1) // R), left.eq(nrows[fb] - frow),
                     f_rows.eq(Mux(left < A, left, A)),
                     q.ready.eq(loaded.bit_select(fb, 1) & ~qfull.bit_select(fh, 1))]
        take = q.valid & q.ready
        for i, (qm, ts) in enumerate(zip(qmems, tscs)):
            wq, wt = qm.write_port(), ts.write_port()
            m.d.comb += [wq.addr.eq(Cat2(ft, fh, NT)), wq.data.eq(q.payload.q),
                         wq.en.eq(take & (fi == i)), wt.addr.eq(wq.addr),
                         wt.data.m.eq(q.payload.scale_m), wt.data.e.eq(q.payload.scale_e),
                         wt.en.eq(wq.en)]
            with m.If(take & (fi == i) & (ft == 0)):
                for h in range(2):
                    with m.If(fh == h):
                        vis = q.payload.visible
                        m.d.sync += [rmeta[h][i].row.eq(q.payload.row),
                                     rmeta[h][i].first.eq(q.payload.first),
                                     rmeta[h][i].final.eq(q.payload.final),
                                     rmeta[h][i].lim.eq(Mux(vis < nkeys[fb], vis, nkeys[fb]))]
        with m.If(take):
            m.d.sync += ft.eq(ft + 1)
            with m.If(ft == f_tiles - 1):
                m.d.sync += [ft.eq(0), fi.eq(fi + 1)]
                with m.If(fi == f_rows - 1):
                    blast = frow + f_rows == nrows[fb]
                    m.d.sync += [fi.eq(0), qfull.bit_select(fh, 1).eq(1), fh.eq(~fh),
                                 frow.eq(frow + f_rows)]
                    for h in range(2):
                        with m.If(fh == h):
                            m.d.sync += [qinfo[h].bank.eq(fb), qinfo[h].rows.eq(f_rows),
                                         qinfo[h].nkeys.eq(nkeys[fb]),
                                         qinfo[h].ntiles.eq(f_tiles), qinfo[h].blast.eq(blast)]
                    with m.If(blast):
                        m.d.sync += [frow.eq(0), loaded.bit_select(fb, 1).eq(0), fb.eq(~fb)]

        # ---- issue: the steps of quad ih into score buffer ish --------------------------------
        ih, ish = Signal(), Signal()
        sbusy = Signal(2)                             # score buffer reserved until emitted
        issuing = Signal()
        it = Signal(range(NT))
        ihh = Signal(range(max(H, 2)))
        ic = Signal(range(S))
        tag_l = data.StructLayout({"qh": 1, "sh": 1, "t": range(NT), "h": range(max(H, 2)),
                                   "qlast": 1})
        m.submodules.tags = tags = fifo.SyncFIFOBuffered(width=tag_l.size, depth=8)
        qi = qinfo[ih]
        with m.If(~issuing & qfull.bit_select(ih, 1) & ~qissued.bit_select(ih, 1) &
                  ~sbusy.bit_select(ish, 1)):
            m.d.sync += [issuing.eq(1), sbusy.bit_select(ish, 1).eq(1), it.eq(0), ihh.eq(0),
                         ic.eq(0)]
        adv = Signal()
        go = Signal()
        m.d.comb += [adv.eq(~st.valid | st.ready), go.eq(adv & issuing & tags.w_rdy)]
        dend = ic == S - 1                            # the dot product's last step
        nh_end = Signal()                             # no further sub-tile in this tile
        if H > 1:
            m.d.comb += nh_end.eq((ihh == H - 1) | (it * R + (ihh + 1) * AR >= qi.nkeys))
        else:
            m.d.comb += nh_end.eq(1)
        qend = dend & nh_end & (it == qi.ntiles - 1)
        h_reg = Signal.like(ihh)
        c_reg = Signal.like(ic)
        l_reg = Signal()
        with m.If(adv):
            m.d.sync += [st.valid.eq(go), h_reg.eq(ihh), c_reg.eq(ic), l_reg.eq(dend)]
        tag_w = Signal(tag_l)
        m.d.comb += [k_rd.en.eq(adv), k_rd.addr.eq(Mux(qi.bank, NW, 0) + it * S + ic),
                     st.payload.glast.eq(l_reg), st.payload.last.eq(l_reg),
                     tag_w.qh.eq(ih), tag_w.sh.eq(ish), tag_w.t.eq(it), tag_w.h.eq(ihh),
                     tag_w.qlast.eq(qend), tags.w_en.eq(go & dend), tags.w_data.eq(tag_w)]
        with m.If(go):
            m.d.sync += ic.eq(ic + 1)
            with m.If(dend):
                m.d.sync += [ic.eq(0), ihh.eq(ihh + 1)]
                with m.If(nh_end):
                    m.d.sync += [ihh.eq(0), it.eq(it + 1)]
                    with m.If(qend):
                        m.d.sync += [issuing.eq(0), qissued.bit_select(ih, 1).eq(1),
                                     ih.eq(~ih), ish.eq(~ish)]
        kbits = k_rd.data.as_value()
        sub = AR * L * KV_ELEM.width
        m.d.comb += [st.payload.w.eq(kbits.word_select(h_reg, sub) if H > 1 else kbits),
                     st.payload.ua.eq(0)]
        for r in range(AR):
            m.d.comb += st.payload.scale[r].eq(1)
        for i, qm in enumerate(qmems):
            rp = qm.read_port()
            m.d.comb += [rp.en.eq(adv), rp.addr.eq(Cat2(it, ih, NT)),
                         st.payload.a[i].eq(rp.data.word_select(c_reg, L * Q_ELEM.width))]

        # ---- results into the score buffers (with each tile's query scale) -------------------
        sres, sscale = [], []
        smeta = [[Signal(rmeta_l, name=f"smeta{h}_{i}") for i in range(A)] for h in range(2)]
        sinfo = Array(Signal(qinfo_l, name=f"sinfo{h}") for h in range(2))
        sready = Signal(2)                            # a quad's scores all in
        tag = data.View(tag_l, tags.r_data)
        got = res.valid & res.ready
        m.d.comb += [res.ready.eq(1), tags.r_en.eq(got)]
        for i in range(A):
            sr = Memory(shape=data.ArrayLayout(signed(AB), AR), depth=2 * NT * H, init=[])
            sc = Memory(shape=scale_l, depth=2 * NT, init=[])
            m.submodules[f"sres{i}"], m.submodules[f"sscale{i}"] = sr, sc
            sres.append(sr)
            sscale.append(sc)
            w_r, w_s = sr.write_port(), sc.write_port()
            t_rd = tscs[i].read_port(domain="comb")
            m.d.comb += [w_r.addr.eq(Cat2(tag.t * H + tag.h, tag.sh, NT * H)), w_r.en.eq(got),
                         t_rd.addr.eq(Cat2(tag.t, tag.qh, NT)),
                         w_s.addr.eq(Cat2(tag.t, tag.sh, NT)), w_s.data.eq(t_rd.data),
                         w_s.en.eq(got & (tag.h == 0))]
            for r in range(AR):
                m.d.comb += w_r.data[r].eq(res.payload[i][r][:AB])
        with m.If(got & tag.qlast):
            m.d.sync += [qfull.bit_select(tag.qh, 1).eq(0), qissued.bit_select(tag.qh, 1).eq(0),
                         sready.bit_select(tag.sh, 1).eq(1)]
            for h in range(2):
                with m.If(tag.qh == h):
                    for s_ in range(2):
                        with m.If(tag.sh == s_):
                            m.d.sync += [smeta[s_][i].eq(rmeta[h][i]) for i in range(A)]
                            m.d.sync += sinfo[s_].eq(qinfo[h])

        # ---- emit: score buffer eh, row ei, beat eb -----------------------------------------
        eh = Signal()
        ei = Signal(range(A))
        eb = Signal(range(NW))
        si = sinfo[eh]
        nb = Signal(range(NW + 1))
        m.d.comb += nb.eq((si.nkeys + K - 1) // K)
        load = Signal()
        m.d.comb += load.eq(sready.bit_select(eh, 1) & (~o.valid | o.ready))
        with m.If(o.valid & o.ready):
            m.d.sync += o.valid.eq(0)
        kpw = AR // K                                 # beats per result word
        keys_sel = Signal(data.ArrayLayout(signed(AB), K))
        scale_sel = Signal(scale_l)
        meta_sel = Signal(rmeta_l)
        accs, scs = [], []
        for i in range(A):
            rr = sres[i].read_port(domain="comb")
            rs = sscale[i].read_port(domain="comb")
            m.d.comb += [rr.addr.eq(Cat2(eb // kpw if kpw > 1 else eb, eh, NT * H)),
                         rs.addr.eq(Cat2(eb // S if S > 1 else eb, eh, NT))]
            accs.append(rr.data.as_value())
            scs.append(rs.data.as_value())
        word = Signal(AR * AB)
        m.d.comb += [word.eq(Array(accs)[ei]),
                     keys_sel.eq(word.word_select(eb % kpw, K * AB) if kpw > 1 else word),
                     scale_sel.eq(Array(scs)[ei]),
                     meta_sel.eq(Array(Array(smeta[h][i] for i in range(A))
                                       for h in range(2))[eh][ei]),
                     s_rd.addr.eq(Mux(si.bank, NW, 0) + eb)]
        ol = o.payload.beat
        beat_last = eb == nb - 1
        with m.If(load):
            m.d.sync += [o.valid.eq(1), ol.scale_m.eq(scale_sel.m), ol.scale_e.eq(scale_sel.e),
                         ol.last.eq(beat_last), o.payload.row.eq(meta_sel.row),
                         o.payload.first.eq(meta_sel.first), o.payload.final.eq(meta_sel.final)]
            for j in range(K):
                m.d.sync += [ol.keys[j].acc.eq(keys_sel[j]), ol.keys[j].sk.eq(s_rd.data.sk[j]),
                             ol.keys[j].sv.eq(s_rd.data.sv[j]),
                             ol.keys[j].masked.eq(eb * K + j >= meta_sel.lim)]
            m.d.sync += eb.eq(eb + 1)
            with m.If(beat_last):
                m.d.sync += [eb.eq(0), ei.eq(ei + 1)]
                with m.If(ei == si.rows - 1):
                    m.d.sync += [ei.eq(0), sready.bit_select(eh, 1).eq(0),
                                 sbusy.bit_select(eh, 1).eq(0), eh.eq(~eh)]
                    with m.If(si.blast):
                        m.d.sync += full.bit_select(si.bank, 1).eq(0)
        return m


def Cat2(low, half, n: int):
    """The address ``half · n + low`` of a two-half memory."""
    return Mux(half, n, 0) + low
