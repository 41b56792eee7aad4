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
    row_mode_fields,
    score_q_layout,
    score_row_beat_layout,
)
from mcf.abi.kv import KV_ELEM, Q_ELEM
from mcf.abi.kv_channel import KV_GROUP
from mcf.abi.quant import SCALE_EXP_BITS, SCALE_MANT_BITS

from .array_bank import ArrayBank
from .array_quads import QuadFlow, at, client_members, client_ports
from .tile_score import k_banks

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
    the current one; a bank is freed when its last quad has left), stored as the dot products'
    weight words (``array_rows`` keys × ``lanes`` channels): a K word of ``R`` keys is written
    in ``R / array_rows`` cycles, one sub-tile each (the memory as wide as a step reads, not
    ``R / array_rows`` times that: block RAM is bound by width here); two quad buffers for the
    query beats (a quad fills while the other is issued; freed at its last result; a beat kept
    as ``QW`` words — the largest power of two up to 4 and ``S / 2`` dividing ``S``, 4 at the
    kr260 shape — written in ``QW`` cycles, a query beat taken every ``QW``-th cycle at most,
    against ``S`` cycles of score beats per beat; read a word per step: the LUT-RAM's depth
    used, a ``QW``-th of the chunk select; at the kr260 shape 7.2k → 5.3k LUT with LUT-RAM)
    and two for the scores (a quad's results while the other is emitted). Results are never
    refused: a quad is issued only into a free score buffer.

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
    k, q, o : as :class:`~.tile_score.TileScore` (``visible``, ``row``, ``first``, ``final``,
        ``mode``, ``m_fix``, ``p8`` read from a row's first query beat, the scale from each
        tile's; ``mode``, ``m_fix``, ``p8`` go out on every beat of the row).
    st : Out(stream.Signature(bank_step_layout(arrays, array_rows, lanes))) — ``own_arrays =
        False`` only: the steps.
    res : In(stream.Signature(bank_result_layout(arrays, array_rows))) — ``own_arrays =
        False`` only: the dot products' results, in step order (always ready).

    Rate: a quad takes ``S·Σ_t (sub-tiles of t)`` steps of the arrays — ``S·ceil(n /
    array_rows)`` for a block of ``n`` keys, ``arrays · array_rows · lanes`` MACs a step
    (1,024 at the kr260 shape: twice TileScore's, on twice its DSPs) — and leaves at one beat
    per cycle,
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
            sig.update(client_members(arrays, array_rows, lanes))
        super().__init__(sig)

    def elaborate(self, platform):
        m = Module()
        K, L, S, R, D = self.keys, self.lanes, self.steps, self.tile, self.head_dim
        A, AR = self.n_arrays, self.array_rows
        H = R // AR                                   # sub-tiles (dot products) per key tile
        NT = self.max_block // R                      # key tiles of a bank
        NW = self.max_block // K                      # K words (= score beats) of a bank
        AB = qk_acc_bits(D)
        st, res = client_ports(m, self)
        o, q = self.o, self.q
        scale_l = data.StructLayout({"m": unsigned(SCALE_MANT_BITS),
                                     "e": signed(SCALE_EXP_BITS)})
        meta_l = data.StructLayout({"row": o.payload.row.shape(), "first": 1, "final": 1,
                                    "lim": range(self.max_block + 1), **row_mode_fields()})
        qf = QuadFlow(m, A, self.max_rows, self.max_block, meta_l, {"ntiles": range(NT + 1)})

        # ---- K banks (TileScore's): words in (tile, chunk) order, the keys' scales per beat --
        # the words as H sub-tiles of array_rows keys (a dot product's weight word), written
        # one per cycle: BRAM36 bound by the read width (a step's word), not twice it
        k_wr, k_rd, s_wr, s_rd = k_banks(m, K, L, AR, NW * H)
        kin = stream.Signature(self.k.payload.shape()).create()
        hw = Signal(range(H))                         # the sub-tile written
        wend = hw == H - 1
        m.d.comb += [kin.payload.eq(self.k.payload), kin.valid.eq(self.k.valid & wend),
                     self.k.ready.eq(kin.ready & wend)]
        addr, _ = qf.load(m, kin, s_wr, NW)           # the scales once per word
        sub_en = self.k.valid & kin.ready
        m.d.comb += [k_wr.addr.eq(addr * H + hw), k_wr.en.eq(sub_en),
                     k_wr.data.eq(self.k.payload.k.as_value().word_select(
                         hw, AR * L * KV_ELEM.width) if H > 1 else self.k.payload.k),
                     s_wr.data.sk.eq(self.k.payload.sk), s_wr.data.sv.eq(self.k.payload.sv)]
        with m.If(sub_en):
            m.d.sync += hw.eq(Mux(wend, 0, hw + 1))

        # ---- quad buffers: the query beats of up to A rows, a beat per key tile -------------
        # a beat as QW words of S/QW chunks (LUT-RAM is 32 or 64 deep: 2·NT entries of a whole
        # beat would leave most of it empty, and each word needs a QW-th of the chunk select),
        # written in QW cycles — the beat is taken in the last, its payload held by the
        # stream until then — and read a word per step. QW ≤ S/2: a quad's beats of a key
        # tile fill in at most half the cycles its score beats take to leave (A·S)
        QW = 1
        while QW < 4 and 2 * QW <= S // 2 and S % (2 * QW) == 0:
            QW *= 2
        CW = S // QW                                  # chunks per word
        qmems, tscs = [], []
        for i in range(A):
            qm = Memory(shape=unsigned(D * Q_ELEM.width // QW), depth=2 * NT * QW, init=[])
            ts = Memory(shape=scale_l, depth=2 * NT, init=[])
            m.submodules[f"qmem{i}"], m.submodules[f"tsc{i}"] = qm, ts
            qmems.append(qm)
            tscs.append(ts)
        ft = Signal(range(NT))                        # key tile of the row
        f_tiles = Signal(range(NT + 1))
        nk = qf.nkeys[qf.fb]
        qw = Signal(range(QW))                        # the word of the beat written
        qw_last = qw == QW - 1
        m.d.comb += [f_tiles.eq((nk + R - 1) // R), q.ready.eq(qf.fill_ready & qw_last)]
        take = q.valid & q.ready
        put = q.valid & qf.fill_ready                 # a word of the beat written
        with m.If(put):
            m.d.sync += qw.eq(Mux(qw_last, 0, qw + 1))
        for i, (qm, ts) in enumerate(zip(qmems, tscs)):
            wq, wt = qm.write_port(), ts.write_port()
            m.d.comb += [wq.addr.eq(at(qf.fh, NT, ft) * QW + qw),
                         wq.data.eq(q.payload.q.as_value().word_select(qw, len(wq.data))),
                         wq.en.eq(put & (qf.fi == i)), wt.addr.eq(at(qf.fh, NT, ft)),
                         wt.data.m.eq(q.payload.scale_m), wt.data.e.eq(q.payload.scale_e),
                         wt.en.eq(take & (qf.fi == i))]
        vis = q.payload.visible
        qf.set_meta(m, take & (ft == 0), row=q.payload.row, first=q.payload.first,
                    final=q.payload.final, lim=Mux(vis < nk, vis, nk), mode=q.payload.mode,
                    m_fix=q.payload.m_fix, p8=q.payload.p8)
        row_end = ft == f_tiles - 1
        with m.If(take):
            m.d.sync += ft.eq(Mux(row_end, 0, ft + 1))
        qf.fill(m, take, row_end, ntiles=f_tiles)

        # ---- issue: the steps of quad ih into score buffer ish --------------------------------
        it = Signal(range(NT))
        ihh = Signal(range(max(H, 2)))
        ic = Signal(range(S))
        tag_l = data.StructLayout({"qh": 1, "sh": 1, "t": range(NT), "h": range(max(H, 2)),
                                   "qlast": 1})
        m.submodules.tags = tags = fifo.SyncFIFOBuffered(width=tag_l.size, depth=8)
        qi = qf.qinfo[qf.ih]
        qf.start(m, it, ihh, ic)
        adv = Signal()
        go = Signal()
        m.d.comb += [adv.eq(~st.valid | st.ready), go.eq(adv & qf.issuing & tags.w_rdy)]
        dend = ic == S - 1                            # the dot product's last step
        nh_end = Signal()                             # no further sub-tile in this tile
        if H > 1:
            m.d.comb += nh_end.eq((ihh == H - 1) | (it * R + (ihh + 1) * AR >= qi.nkeys))
        else:
            m.d.comb += nh_end.eq(1)
        qend = dend & nh_end & (it == qi.ntiles - 1)
        c_reg = Signal.like(ic)
        l_reg = Signal()
        with m.If(adv):
            m.d.sync += [st.valid.eq(go), c_reg.eq(ic), l_reg.eq(dend)]
        tag_w = Signal(tag_l)
        m.d.comb += [k_rd.en.eq(adv), k_rd.addr.eq(at(qi.bank, NW, it * S + ic) * H + ihh),
                     st.payload.glast.eq(l_reg), st.payload.last.eq(l_reg),
                     tag_w.qh.eq(qf.ih), tag_w.sh.eq(qf.ish), tag_w.t.eq(it), tag_w.h.eq(ihh),
                     tag_w.qlast.eq(qend), tags.w_en.eq(go & dend), tags.w_data.eq(tag_w)]
        with m.If(go):
            m.d.sync += ic.eq(ic + 1)
            with m.If(dend):
                m.d.sync += [ic.eq(0), ihh.eq(ihh + 1)]
                with m.If(nh_end):
                    m.d.sync += [ihh.eq(0), it.eq(it + 1)]
                    with m.If(qend):
                        qf.issued(m)
        m.d.comb += [st.payload.w.eq(k_rd.data.as_value()),     # the step's sub-tile
                     st.payload.ua.eq(0)]
        for r in range(AR):
            m.d.comb += st.payload.scale[r].eq(1)
        for i, qm in enumerate(qmems):
            rp = qm.read_port()
            m.d.comb += [rp.en.eq(adv),
                         rp.addr.eq(at(qf.ih, NT, it) * QW + (ic // CW if QW > 1 else 0)),
                         st.payload.a[i].eq(rp.data.word_select(c_reg % CW if CW > 1 else 0,
                                                                L * Q_ELEM.width))]

        # ---- results into the score buffers (with each tile's query scale) -------------------
        sres, sscale = [], []
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
            m.d.comb += [w_r.addr.eq(at(tag.sh, NT * H, tag.t * H + tag.h)), w_r.en.eq(got),
                         t_rd.addr.eq(at(tag.qh, NT, tag.t)),
                         w_s.addr.eq(at(tag.sh, NT, tag.t)), w_s.data.eq(t_rd.data),
                         w_s.en.eq(got & (tag.h == 0))]
            for r in range(AR):
                m.d.comb += w_r.data[r].eq(res.payload[i][r][:AB])
        with m.If(got & tag.qlast):
            qf.resulted(m, tag.qh, tag.sh)

        # ---- emit: score buffer eh, row ei, beat eb -----------------------------------------
        eh, ei = qf.eh, qf.ei
        eb = Signal(range(NW))
        si = qf.sinfo[eh]
        nb = Signal(range(NW + 1))
        m.d.comb += nb.eq((si.nkeys + K - 1) // K)
        load = Signal()
        m.d.comb += load.eq(qf.sready.bit_select(eh, 1) & (~o.valid | o.ready))
        with m.If(o.valid & o.ready):
            m.d.sync += o.valid.eq(0)
        kpw = AR // K                                 # beats per result word
        keys_sel = Signal(data.ArrayLayout(signed(AB), K))
        scale_sel = Signal(scale_l)
        meta_sel = Signal(meta_l)
        accs, scs = [], []
        for i in range(A):
            rr = sres[i].read_port(domain="comb")
            rs = sscale[i].read_port(domain="comb")
            m.d.comb += [rr.addr.eq(at(eh, NT * H, eb // kpw if kpw > 1 else eb)),
                         rs.addr.eq(at(eh, NT, eb // S if S > 1 else eb))]
            accs.append(rr.data.as_value())
            scs.append(rs.data.as_value())
        word = Signal(AR * AB)
        m.d.comb += [word.eq(Array(accs)[ei]),
                     keys_sel.eq(word.word_select(eb % kpw, K * AB) if kpw > 1 else word),
                     scale_sel.eq(Array(scs)[ei]), meta_sel.eq(qf.emit_meta),
                     s_rd.addr.eq(at(si.bank, NW, eb))]
        ol = o.payload.beat
        beat_last = eb == nb - 1
        with m.If(load):
            m.d.sync += [o.valid.eq(1), ol.scale_m.eq(scale_sel.m), ol.scale_e.eq(scale_sel.e),
                         ol.last.eq(beat_last), ol.mode.eq(meta_sel.mode),
                         ol.m_fix.eq(meta_sel.m_fix), ol.p8.eq(meta_sel.p8),
                         o.payload.row.eq(meta_sel.row),
                         o.payload.first.eq(meta_sel.first), o.payload.final.eq(meta_sel.final)]
            for j in range(K):
                m.d.sync += [ol.keys[j].acc.eq(keys_sel[j]), ol.keys[j].sk.eq(s_rd.data.sk[j]),
                             ol.keys[j].sv.eq(s_rd.data.sv[j]),
                             ol.keys[j].masked.eq(eb * K + j >= meta_sel.lim)]
            m.d.sync += eb.eq(eb + 1)
            with m.If(beat_last):
                m.d.sync += eb.eq(0)
                with m.If(qf.emitted(m) & si.blast):
                    m.d.sync += qf.full.bit_select(si.bank, 1).eq(0)
        return m
