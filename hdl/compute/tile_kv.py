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

from amaranth import Array, Cat, Module, Mux, Signal, signed
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from mcf.abi.attn_tile import (
    k_word_layout,
    kv_rows_layout,
    pv_word_layout,
    qk_tile_keys,
    v_beat_layout,
)
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
    and the ``sk``, ``sv`` of the tile's keys ``c·keys ..``; keys past a block's end hold
    stale values, :func:`~mcf.abi.attn_tile.k_word_layout`). The V
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
        Per block ``ceil(n / keys)`` beats, ``rows`` on the ``last`` one (TilePV's V).
    vw : Out(stream.Signature(pv_word_layout(*pv_words, max_block, max_rows)))
        Instead of ``vb`` with ``pv_words = (channels, keys)``: the GEMM arrays' V words
        (:class:`~.array_pv.ArrayPV`'s ``v``) — V through the K side's tile banks (tiles of
        ``keys`` keys, words of ``channels`` channels, transposed to ``[channel][key]``), per
        block ``ceil(n / keys)·head_dim/channels`` words in (key step, channel group) order,
        ``n`` and ``rows`` on the last. Rate: as the K side's.

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
                 max_block: int = 256, max_rows: int = 64, rows_fifo: int = 4,
                 pv_words: tuple[int, int] | None = None):
        if head_dim % lanes or head_dim % in_lanes:
            raise ValueError("lanes and in_lanes must divide head_dim")
        self.keys, self.head_dim, self.lanes, self.in_lanes = keys, head_dim, lanes, in_lanes
        self.max_block, self.max_rows, self.rows_fifo = max_block, max_rows, rows_fifo
        self.tile = qk_tile_keys(keys, head_dim, lanes)
        if max_block % self.tile:
            raise ValueError("max_block must be a multiple of the key tile")
        self.pv_words = pv_words
        members = {
            "k": In(stream.Signature(kv_beat_layout(in_lanes))),
            "v": In(stream.Signature(kv_beat_layout(in_lanes))),
            "blk": In(stream.Signature(kv_rows_layout(max_rows))),
            "kw": Out(stream.Signature(k_word_layout(keys, head_dim, lanes, max_block,
                                                     max_rows))),
        }
        if pv_words is None:
            members["vb"] = Out(stream.Signature(v_beat_layout(keys, head_dim, max_rows)))
        else:
            va, vl = pv_words
            if head_dim % va or head_dim % vl or max_block % vl:
                raise ValueError("the V words' channels and keys must divide head_dim, the "
                                 "keys max_block")
            members["vw"] = Out(stream.Signature(pv_word_layout(va, vl, max_block, max_rows)))
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        K, D, L, LI, R = self.keys, self.head_dim, self.lanes, self.in_lanes, self.tile
        NC = D // LI                                 # beats per row
        rw = len(self.blk.payload.rows)
        m.submodules.krows = kq = fifo.SyncFIFOBuffered(width=rw, depth=self.rows_fifo)
        m.submodules.vrows = vq = fifo.SyncFIFOBuffered(width=rw, depth=self.rows_fifo)
        m.d.comb += [self.blk.ready.eq(kq.w_rdy & vq.w_rdy),
                     kq.w_data.eq(self.blk.payload.rows), vq.w_data.eq(self.blk.payload.rows),
                     kq.w_en.eq(self.blk.valid & self.blk.ready), vq.w_en.eq(kq.w_en)]

        # ---- K: key tiles of R keys out as S words of L channels ------------------------------
        kp = self.kw.payload
        _tile_words(m, "k", self.k, self.kw, kp.k, kq, R, L, D, LI, self.max_block,
                    scales=(kp.sk, kp.sv, K))
        if self.pv_words is not None:
            # the arrays' V words: tiles of VL keys out as words of VA channels, transposed
            VA, VL = self.pv_words
            vw = self.vw
            word = Signal(data.ArrayLayout(data.ArrayLayout(signed(NIB), VA), VL))
            m.d.comb += [vw.payload.v[c][i].eq(word[i][c]) for c in range(VA) for i in range(VL)]
            _tile_words(m, "v", self.v, vw, word, vq, VL, VA, D, LI, self.max_block)
            return m

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


def _tile_words(m: Module, name: str, src, out, word, rq, R: int, L: int, D: int, LI: int,
                max_block: int, scales=None):
    """Token-major rows on ``src`` (``kv_beat_layout(LI)``, ``D / LI`` beats a row) → per tile of
    ``R`` rows (keys) ``D / L`` words on ``out``, word ``c`` = the tile's ``R`` keys × channels
    ``c·L ..`` driven onto ``word`` (``[key][channel]``; keys past a block's end stale), ``n`` and
    ``rows`` (from the FIFO ``rq``) on the block's last word, ``last``. Two tile banks (per key
    ``J`` small memories of ``U``-channel units, read asynchronously): one fills while the
    other leaves. ``scales = (sk, sv, K)``: each key's ``scale_k``/``scale_v`` (read on its
    row's first beat) also go out, ``K`` keys per word (word ``c``: keys ``c·K ..``)."""
    S, NC = D // L, D // LI
    # per key of the tile J memories ("ways") of U-channel units, both banks: unit u of a row
    # (channels u·U ..) in way u mod J at bank·D/(U·J) + u div J; a beat writes one unit per
    # way, a word reads P units of one way (or one unit of each, muxed)
    U, J = min(LI, L), max(1, LI // L)
    P = L // U
    WD = D // (U * J)                                  # entries of a way per bank
    ways = [[Memory(shape=U * NIB, depth=2 * WD, init=[]) for _ in range(J)] for _ in range(R)]
    for i in range(R):
        for j in range(J):
            m.submodules[f"{name}{i}_{j}"] = ways[i][j]
    skb = Array(Signal(R * SW, name=f"{name}skb{b}") for b in range(2))
    svb = Array(Signal(R * SW, name=f"{name}svb{b}") for b in range(2))
    full = Array(Signal(name=f"{name}full{b}") for b in range(2))
    blast = Array(Signal(name=f"{name}last{b}") for b in range(2))
    bn = Array(Signal(range(max_block + 1), name=f"{name}n{b}") for b in range(2))
    wb, kr = Signal(name=f"{name}_wb"), Signal(range(R), name=f"{name}_row")
    kc = Signal(range(NC), name=f"{name}_beat")
    cnt = Signal(range(max_block + 1), name=f"{name}_cnt")   # keys of the block before
    take = Signal(name=f"{name}_take")
    m.d.comb += [src.ready.eq(~full[wb]), take.eq(src.valid & src.ready)]
    for i in range(R):
        for j in range(J):
            wp = ways[i][j].write_port()
            m.d.comb += [wp.addr.eq(Mux(wb, WD, 0) + kc),
                         wp.data.eq(src.payload.data.word_select(j, U * NIB)),
                         wp.en.eq(take & (kr == i))]
    with m.If(take):
        if scales is not None:
            for b in range(2):
                with m.If((wb == b) & (kc == 0)):
                    m.d.sync += [skb[b].word_select(kr, SW).eq(src.payload.scale_k),
                                 svb[b].word_select(kr, SW).eq(src.payload.scale_v)]
        m.d.sync += kc.eq(Mux(kc == NC - 1, 0, kc + 1))
        with m.If(kc == NC - 1):
            m.d.sync += kr.eq(kr + 1)
            with m.If((kr == R - 1) | src.payload.last):
                m.d.sync += [full[wb].eq(1), blast[wb].eq(
                    src.payload.last), bn[wb].eq(cnt + kr + 1), wb.eq(~wb), kr.eq(0),
                    cnt.eq(Mux(src.payload.last, 0, cnt + R))]

    # read a bank out as S words
    rb, c = Signal(name=f"{name}_rb"), Signal(range(S), name=f"{name}_word")
    wlast = blast[rb] & (c == S - 1)
    for i in range(R):
        if J == 1:
            rd = [ways[i][0].read_port(domain="comb") for _ in range(P)]
            for p_, port in enumerate(rd):
                m.d.comb += port.addr.eq(Mux(rb, WD, 0) + c * P + p_)
            w = Cat(*(port.data for port in rd))
        else:
            rd = [ways[i][j].read_port(domain="comb") for j in range(J)]
            for port in rd:
                m.d.comb += port.addr.eq(Mux(rb, WD, 0) + c // J)
            w = Array(port.data for port in rd)[c % J]
        # keys past the block's end: whatever the bank held (every consumer masks keys at or
        # past ``n``: their scores are not used, their P is 0), so no zeroing multiplexer
        m.d.comb += word[i].as_value().eq(w)
    if scales is not None:
        sk, sv, K = scales
        skr, svr = skb[rb], svb[rb]
        for j in range(K):
            m.d.comb += [sk[j].eq(skr.word_select(c * K + j, SW)),
                         sv[j].eq(svr.word_select(c * K + j, SW))]
    op = out.payload
    m.d.comb += [op.n.eq(Mux(wlast, bn[rb], 0)), op.rows.eq(Mux(wlast, rq.r_data, 0)),
                 op.last.eq(wlast), out.valid.eq(full[rb] & (~wlast | rq.r_rdy)),
                 rq.r_en.eq(out.valid & out.ready & wlast)]
    with m.If(out.valid & out.ready):
        m.d.sync += c.eq(Mux(c == S - 1, 0, c + 1))
        with m.If(c == S - 1):
            m.d.sync += [full[rb].eq(0), rb.eq(~rb)]
