"""The K/V transposer of the tiled prefill (issue #33; paper §3.1, §5): a KV block's token-major
records, as the KV reader delivers them (:class:`mcf.hdl.node.kv_reader.KvReader`'s ``k`` and
``v`` beats, :func:`mcf.abi.kv_reader.block_beats`), → :class:`~.tile_score.TileScore`'s K words
(key tile × channel chunk, :func:`mcf.abi.attn_tile.k_word_layout`) and
:class:`~.tile_pv.TilePV`'s V beats (:func:`mcf.abi.attn_tile.v_beat_layout`), with each key's
``sk``/``sv`` (taken from its K row's beats). Per-channel K blocks have the same token records
(their group headers go to the query fold, :class:`~.tile_fold.TileFold`), so one transposer
serves both formats.
"""

from __future__ import annotations

from amaranth import Array, Cat, Module, Mux, Signal
from amaranth.lib import fifo, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from mcf.abi.attn_tile import k_word_layout, kv_rows_layout, qk_tile_keys, v_beat_layout
from mcf.abi.kv import KV_ELEM, KV_SCALE, kv_beat_layout

__all__ = ["TileKV"]

NIB = KV_ELEM.width
SW = KV_SCALE.width


class TileKV(wiring.Component):
    """Token-major K and V rows → the arrays' K words and V beats.

    The K side fills a **key tile** (``R`` = :func:`~mcf.abi.attn_tile.qk_tile_keys` keys, all
    ``head_dim`` channels, their ``sk``, ``sv``) into one of two banks (per key small memories
    read asynchronously; the scales in registers) while the other is read out as
    ``head_dim/lanes`` K words (word ``c``: the tile's ``R`` keys × channels ``c·lanes ..``,
    and the ``sk``, ``sv`` of the tile's keys ``c·keys ..``; keys past a block's end 0). The V
    side gathers ``keys`` V rows into a beat and hands it to an output
    register (keys past the block's end 0). A block's key count (``n``) is counted from the
    rows; its ``rows`` come on ``blk``, once per block, into two FIFOs of ``rows_fifo``
    blocks, and go on its last K word and its last V beat.

    Members
    -------
    k : In(stream.Signature(kv_beat_layout(in_lanes)))
        K rows, ``head_dim/in_lanes`` beats each (channels ``c·in_lanes ..`` in bits
        ``[4i, 4i+4)``), ``scale_k``/``scale_v`` read on a row's first beat, ``last`` on the
        block's final beat (a row's last beat).
    v : In(stream.Signature(kv_beat_layout(in_lanes)))
        V rows in the same order and format (only ``data`` and ``last`` are read).
    blk : In(stream.Signature(kv_rows_layout(max_rows)))
        Per block its ``rows``, in the blocks' order (taken while both FIFOs have room).
    kw : Out(stream.Signature(k_word_layout(keys, head_dim, lanes, max_block, max_rows)))
        Per block ``ceil(n / R)·head_dim/lanes`` words, ``n`` and ``rows`` on the ``last`` one.
    vb : Out(stream.Signature(v_beat_layout(keys, head_dim, max_rows)))
        Per block ``ceil(n / keys)`` beats, ``rows`` on the ``last`` one.

    Rate: one ``k`` beat and one ``v`` beat per cycle (``in_lanes`` channels of a key each), with
    no bubble, while ``kw`` and ``vb`` keep up: a key tile leaves in ``head_dim/lanes`` cycles
    and fills in ``R·head_dim/in_lanes``, a V beat leaves in one cycle and fills in
    ``keys·head_dim/in_lanes``. A block of ``n`` keys thus takes ``n·head_dim/in_lanes`` cycles,
    against the ``rows·n/keys`` cycles the arrays run on it (one score beat per cycle): the
    transposer keeps up when ``rows ≥ keys·head_dim/in_lanes`` (8 at the kr260 shape with the
    reader's 64 lanes). Latency: a tile's first word is valid the cycle after its last K beat
    is taken; a V beat the cycle after its last V beat.
    """

    def __init__(self, keys: int = 4, head_dim: int = 128, lanes: int = 16, in_lanes: int = 64,
                 max_block: int = 256, max_rows: int = 64, rows_fifo: int = 4):
        if head_dim % lanes or head_dim % in_lanes:
            raise ValueError("lanes and in_lanes must divide head_dim")
        self.keys, self.head_dim, self.lanes, self.in_lanes = keys, head_dim, lanes, in_lanes
        self.max_block, self.max_rows, self.rows_fifo = max_block, max_rows, rows_fifo
        self.tile = qk_tile_keys(keys, head_dim, lanes)
        if max_block % self.tile:
            raise ValueError("max_block must be a multiple of the key tile")
        super().__init__({
            "k": In(stream.Signature(kv_beat_layout(in_lanes))),
            "v": In(stream.Signature(kv_beat_layout(in_lanes))),
            "blk": In(stream.Signature(kv_rows_layout(max_rows))),
            "kw": Out(stream.Signature(k_word_layout(keys, head_dim, lanes, max_block,
                                                     max_rows))),
            "vb": Out(stream.Signature(v_beat_layout(keys, head_dim, max_rows))),
        })

    def elaborate(self, platform):
        m = Module()
        K, D, L, LI, R = self.keys, self.head_dim, self.lanes, self.in_lanes, self.tile
        S, NC = D // L, D // LI                      # words per tile, beats per row
        rw = len(self.blk.payload.rows)
        m.submodules.krows = kq = fifo.SyncFIFOBuffered(width=rw, depth=self.rows_fifo)
        m.submodules.vrows = vq = fifo.SyncFIFOBuffered(width=rw, depth=self.rows_fifo)
        m.d.comb += [self.blk.ready.eq(kq.w_rdy & vq.w_rdy),
                     kq.w_data.eq(self.blk.payload.rows), vq.w_data.eq(self.blk.payload.rows),
                     kq.w_en.eq(self.blk.valid & self.blk.ready), vq.w_en.eq(kq.w_en)]

        # ---- K: fill a tile bank row by row ----------------------------------------------------
        k, kw = self.k, self.kw
        # per key of the tile J memories ("ways") of U-channel units, both banks: unit u of
        # a row (channels u·U ..) in way u mod J at bank·D/(U·J) + u div J; a K beat writes
        # one unit per way, a word reads P units of one way (or one unit of each, muxed)
        U, J = min(LI, L), max(1, LI // L)
        P = L // U
        WD = D // (U * J)                              # entries of a way per bank
        ways = [[Memory(shape=U * NIB, depth=2 * WD, init=[]) for _ in range(J)]
                for _ in range(R)]
        for i in range(R):
            for j in range(J):
                m.submodules[f"k{i}_{j}"] = ways[i][j]
        skb = Array(Signal(R * SW, name=f"skb{b}") for b in range(2))
        svb = Array(Signal(R * SW, name=f"svb{b}") for b in range(2))
        kfull = Array(Signal(name=f"kfull{b}") for b in range(2))
        kfill = Array(Signal(range(R + 1), name=f"kfill{b}") for b in range(2))
        klast = Array(Signal(name=f"klast{b}") for b in range(2))
        kn = Array(Signal(range(self.max_block + 1), name=f"kn{b}") for b in range(2))
        wb, kr = Signal(), Signal(range(R))
        kc = Signal(range(NC))
        kcnt = Signal(range(self.max_block + 1))     # keys of the block in earlier tiles
        k_take = Signal()
        m.d.comb += [k.ready.eq(~kfull[wb]), k_take.eq(k.valid & k.ready)]
        for i in range(R):
            for j in range(J):
                wp = ways[i][j].write_port()
                m.d.comb += [wp.addr.eq(Mux(wb, WD, 0) + kc),
                             wp.data.eq(k.payload.data.word_select(j, U * NIB)),
                             wp.en.eq(k_take & (kr == i))]
        with m.If(k.valid & k.ready):
            for b in range(2):
                with m.If((wb == b) & (kc == 0)):
                    m.d.sync += [skb[b].word_select(kr, SW).eq(k.payload.scale_k),
                                 svb[b].word_select(kr, SW).eq(k.payload.scale_v)]
            m.d.sync += kc.eq(Mux(kc == NC - 1, 0, kc + 1))
            with m.If(kc == NC - 1):
                m.d.sync += kr.eq(kr + 1)
                with m.If((kr == R - 1) | k.payload.last):
                    m.d.sync += [kfull[wb].eq(1), kfill[wb].eq(kr + 1), klast[wb].eq(
                        k.payload.last), kn[wb].eq(kcnt + kr + 1), wb.eq(~wb), kr.eq(0),
                        kcnt.eq(Mux(k.payload.last, 0, kcnt + R))]

        # ---- K: read a bank out as S words ------------------------------------------------------
        rb, c = Signal(), Signal(range(S))
        fill = kfill[rb]
        skr, svr = skb[rb], svb[rb]
        wlast = klast[rb] & (c == S - 1)
        kp = kw.payload
        for i in range(R):
            if J == 1:
                rd = [ways[i][0].read_port(domain="comb") for _ in range(P)]
                for p_, port in enumerate(rd):
                    m.d.comb += port.addr.eq(Mux(rb, WD, 0) + c * P + p_)
                word = Cat(*(port.data for port in rd))
            else:
                rd = [ways[i][j].read_port(domain="comb") for j in range(J)]
                for port in rd:
                    m.d.comb += port.addr.eq(Mux(rb, WD, 0) + c // J)
                word = Array(port.data for port in rd)[c % J]
            m.d.comb += kp.k[i].as_value().eq(Mux(i < fill, word, 0))
        for j in range(K):
            on = c * K + j < fill
            m.d.comb += [kp.sk[j].eq(Mux(on, skr.word_select(c * K + j, SW), 0)),
                         kp.sv[j].eq(Mux(on, svr.word_select(c * K + j, SW), 0))]
        m.d.comb += [kp.n.eq(Mux(wlast, kn[rb], 0)), kp.rows.eq(Mux(wlast, kq.r_data, 0)),
                     kp.last.eq(wlast), kw.valid.eq(kfull[rb] & (~wlast | kq.r_rdy)),
                     kq.r_en.eq(kw.valid & kw.ready & wlast)]
        with m.If(kw.valid & kw.ready):
            m.d.sync += c.eq(Mux(c == S - 1, 0, c + 1))
            with m.If(c == S - 1):
                m.d.sync += [kfull[rb].eq(0), rb.eq(~rb)]

        # ---- V: gather `keys` rows into a beat ---------------------------------------------
        v, vb = self.v, self.vb
        vacc = Signal(K * D * NIB)
        vnext = Signal(K * D * NIB)
        vr, vc = Signal(range(K)), Signal(range(NC))
        vout = Signal(K * D * NIB)
        vvalid, vlast = Signal(), Signal()
        vtake = vb.valid & vb.ready
        done = (vc == NC - 1) & ((vr == K - 1) | v.payload.last)
        m.d.comb += [v.ready.eq(~done | ~vvalid | vtake), vnext.eq(vacc),
                     vnext.word_select(vr * NC + vc, LI * NIB).eq(v.payload.data)]
        with m.If(vtake):
            m.d.sync += vvalid.eq(0)
        with m.If(v.valid & v.ready):
            m.d.sync += [vacc.eq(vnext), vc.eq(Mux(vc == NC - 1, 0, vc + 1))]
            with m.If(vc == NC - 1):
                m.d.sync += vr.eq(vr + 1)
            with m.If(done):
                m.d.sync += [vout.eq(Cat(*(Mux(i <= vr, vnext.word_select(i, D * NIB), 0)
                                           for i in range(K)))),
                             vlast.eq(v.payload.last), vvalid.eq(1), vr.eq(0)]
        m.d.comb += [vb.payload.v.as_value().eq(vout), vb.payload.last.eq(vlast),
                     vb.payload.rows.eq(Mux(vlast, vq.r_data, 0)),
                     vb.valid.eq(vvalid & (~vlast | vq.r_rdy)),
                     vq.r_en.eq(vtake & vlast)]
        return m
