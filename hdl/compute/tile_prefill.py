"""The tiled prefill's compute chain (issue #33; paper §3.1, §5): :class:`~.tile_query.TileQuery`
→ :class:`~.tile_fold.TileFold` → :class:`~.tile_attend.TileAttention` (with
:class:`~.tile_kv.TileKV` in front of its K and V) → :class:`~.tile_normalize.TileNormalize`. A
prefill chunk's query rows, the KV blocks' descriptors and the KV reader's K/V beats (and,
per-channel K, the group headers) in; the chunk's normalised rows ``o / l`` out —
:func:`mcf.golden.attention_tiled.attend_prefill_tiled` (``p_format = P8``, ``array=True``) bit
for bit.
"""

from __future__ import annotations

from amaranth import Module, Signal
from amaranth.lib import fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.attn_tile import (
    P8,
    PV_W,
    block_desc_layout,
    chunk_layout,
    fold_header_layout,
    norm_beat_layout,
    query_row_layout,
)
from mcf.abi.kv import kv_beat_layout
from mcf.abi.kv_channel import KVFormat

from .array_attend import ArrayAttention
from .array_engine import ArrayEngine
from .chain_share import share_chain
from .tile_attend import TileAttention
from .tile_fold import TileFold
from .tile_kv import TileKV
from .tile_normalize import TileNormalize
from .tile_query import TileQuery

__all__ = ["TilePrefill"]


class TilePrefill(wiring.Component):
    """One KV head's prefill attention for a chunk, on the tiled datapath.

    Inside: TileQuery issues the rows per (query tile, block) and each block's row count
    (TileKV's ``blk``, and per-channel K a flag in a FIFO of ``rows_fifo`` blocks: the group
    headers of a block no row meets are dropped here, so TileFold sees only the blocks rows
    meet); TileFold (folds the query per 32-key group, per-channel K) → TileAttention (``S``,
    softmax, P·V, merge) with TileKV's K words and V beats → TileNormalize. The output rows'
    place in the chunk: the query tile's first row (counted here from TileQuery's ``tile``
    stream through a FIFO: a tile's rows that see a key, the chunk's last tile) plus the row
    in the tile.

    Members
    -------
    chunk, q, desc : TileQuery's (the chunk's first position, rows and GQA heads; its query
        rows; per query tile every block's ``pos0``, ``n``, ``last``).
    k, v : In(stream.Signature(kv_beat_layout(in_lanes)))
        Per descriptor the block's K and V rows as the KV reader delivers them (TileKV's
        ``k``, ``v``), also for a block no row of the tile meets (dropped by the arrays).
    kh : In(stream.Signature(fold_header_layout(fold_lanes))) — ``PER_CHANNEL_K`` only
        Per descriptor the block's group headers (TileFold's ``kh``).
    o : Out(stream.Signature(norm_beat_layout(merge_lanes, max_rows)))
        Each row's ``o / l`` (ATTN_OUT codes, ``head_dim/merge_lanes`` beats) and its row in the
        chunk, in the order the rows finish (per query tile, by their final block).
    score_st, score_res, pv_st, pv_res : ``arrays`` with ``own_arrays = False`` only
        The S and P·V client ports of :class:`~.array_attend.ArrayAttention` (the GEMM's
        arrays, through its :class:`~.array_share.ArrayShare`).

    ``arrays`` (default 0: TileAttention, S and P·V on arrays of their own): S and P·V on
    ``arrays`` GEMM arrays of ``array_rows × lanes`` (``chain``: their lane sums) taking turns
    (:class:`~.array_attend.ArrayAttention`, TileKV's V as the arrays' words) — the same bits;
    ``own_arrays``: the arrays inside, else reached through the client ports above.

    ``query_ram``: TileQuery's ``ram_style`` (``"ultra"``: the row memory in URAM288);
    ``query_words``: its ``row_words`` (a row in that many words of a deeper memory, one row
    per ``query_words`` cycles in and out: 4 BRAM36 instead of 15 at the kr260 shape).

    ``engine_width`` (with ``arrays``, PER_TOKEN K; default 0: none): the chain also runs
    :class:`~.attention.AttentionEngine`'s jobs — an :class:`~.array_engine.ArrayEngine`
    without a chain of its own inside (its ``job``, ``q``, ``o``, ``status`` as ``ejob``,
    ``eq``, ``eo``, ``estatus``, payload beats ``engine_width`` bits wide; its K and V from
    ``k``, ``v``), ArrayAttention in today's ``w`` with this chunk's rows in P8 (their ``p8``)
    — the same bits as either alone. ``sel`` (In(1), stable while a record runs): the chunk's
    path (1) or the engine's (0) (:func:`~.chain_share.share_chain`).

    Rate: the arrays' — one score beat (``keys`` keys: ``2·keys·head_dim`` QKᵀ + P·V MACs) per
    cycle while TileFold, TileKV and the row stages keep up (their docstrings); measured in
    ``tests/test_tile_prefill.py``. Latency: TileQuery's, TileFold's, TileAttention's and
    TileNormalize's in sequence.
    """

    def __init__(self, keys: int = 4, head_dim: int = 128, lanes: int = 16, in_lanes: int = 64,
                 max_block: int = 256, rows: int = 64, max_rows: int = 1536, max_heads: int = 8,
                 kv_format: KVFormat = KVFormat.PER_TOKEN, fold_lanes: int = 16,
                 folds: int = 3, slots: int = 4, merge_lanes: int = 4,
                 rows_fifo: int = 4, dsp: str = "model", query_ram: str = "block",
                 arrays: int = 0, array_rows: int = 16, chain: int = 1,
                 own_arrays: bool = True, engine_width: int = 0, query_words: int = 1):
        self.keys, self.head_dim, self.rows, self.max_rows = keys, head_dim, rows, max_rows
        self.kv_format, self.rows_fifo = KVFormat(kv_format), rows_fifo
        self.query = TileQuery(head_dim=head_dim, max_block=max_block, rows=rows,
                               max_rows=max_rows, max_heads=max_heads, ram_style=query_ram,
                               row_words=query_words)
        self.fold = TileFold(keys=keys, head_dim=head_dim, lanes=lanes, max_block=max_block,
                             rows=rows, kv_format=kv_format, fold_lanes=fold_lanes, folds=folds)
        self.arrays = arrays
        self.kv = TileKV(keys=keys, head_dim=head_dim, lanes=lanes, in_lanes=in_lanes,
                         max_block=max_block, max_rows=rows, rows_fifo=rows_fifo,
                         pv_words=(array_rows, lanes) if arrays else None)
        self.engine = None
        if engine_width:
            if not arrays or self.kv_format != KVFormat.PER_TOKEN:
                raise ValueError("the engine shares the chain on arrays, PER_TOKEN K")
            # AttentionEngine's jobs on this chain (chain_share), its words engine_width wide
            self.engine = ArrayEngine(head_dim, in_lanes, max_heads, max_block,
                                      data_width=engine_width, keys=keys, arr_lanes=lanes,
                                      merge_lanes=merge_lanes, inner=False)
        if arrays:
            # S and P·V on the GEMM's kind of arrays, taking turns (:class:`ArrayAttention`)
            self.att = ArrayAttention(keys=keys, head_dim=head_dim, lanes=lanes,
                                      max_block=max_block, rows=rows, slots=slots,
                                      merge_lanes=merge_lanes, arrays=arrays,
                                      array_rows=array_rows, chain=chain,
                                      dsp="fabric" if dsp == "model" and chain == 1 else dsp,
                                      own_arrays=own_arrays,
                                      p_format=PV_W if engine_width else P8)
        else:
            self.att = TileAttention(keys=keys, head_dim=head_dim, lanes=lanes,
                                     max_block=max_block, rows=rows, slots=slots,
                                     merge_lanes=merge_lanes, dsp=dsp)
        self.norm = TileNormalize(head_dim=head_dim, rows=rows, lanes=merge_lanes)
        members = {
            "chunk": In(stream.Signature(chunk_layout(max_rows, max_heads))),
            "q": In(stream.Signature(query_row_layout(head_dim))),
            "desc": In(stream.Signature(block_desc_layout(max_block))),
            "k": In(stream.Signature(kv_beat_layout(in_lanes))),
            "v": In(stream.Signature(kv_beat_layout(in_lanes))),
            "o": Out(stream.Signature(norm_beat_layout(merge_lanes, max_rows))),
        }
        if self.kv_format == KVFormat.PER_CHANNEL_K:
            members["kh"] = In(stream.Signature(fold_header_layout(fold_lanes)))
        if arrays and not own_arrays:
            for name in ("score_st", "score_res", "pv_st", "pv_res"):
                members[name] = self.att.signature.members[name]
        if self.engine is not None:
            em = self.engine.signature.members
            members.update({"ejob": em["job"], "eq": em["q"], "eo": em["o"],
                            "estatus": em["status"], "sel": In(1)})
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        qs, fd, kv, at, nz = self.query, self.fold, self.kv, self.att, self.norm
        m.submodules.query, m.submodules.fold, m.submodules.kv = qs, fd, kv
        m.submodules.att, m.submodules.norm = at, nz
        for name in ("chunk", "q", "desc"):
            wiring.connect(m, wiring.flipped(getattr(self, name)), getattr(qs, name))
        e = self.engine
        if e is None:
            wiring.connect(m, wiring.flipped(self.k), kv.k)
            wiring.connect(m, wiring.flipped(self.v), kv.v)
            wiring.connect(m, qs.o, fd.i)
            wiring.connect(m, at.o, nz.i)
        else:
            m.submodules.engine = e
            for mine, its in (("ejob", "job"), ("eq", "q")):
                wiring.connect(m, wiring.flipped(getattr(self, mine)), getattr(e, its))
            wiring.connect(m, e.o, wiring.flipped(self.eo))
            m.d.comb += [self.estatus.eq(e.status), e.err_max.eq(at.softmax.err_fixed)]
            share_chain(m, self.sel, k=wiring.flipped(self.k), v=wiring.flipped(self.v),
                        query_rows=qs.o, query_blk=qs.kv, fold_in=fd.i, kv=kv,
                        att_out=at.o, norm_in=nz.i, engine=e)
        wiring.connect(m, fd.o, at.q)
        wiring.connect(m, kv.kw, at.k)
        wiring.connect(m, kv.vw if self.arrays else kv.vb, at.v)
        if self.arrays and "score_st" in self.signature.members:
            for name in ("score_st", "pv_st"):
                wiring.connect(m, getattr(at, name), wiring.flipped(getattr(self, name)))
            for name in ("score_res", "pv_res"):
                wiring.connect(m, wiring.flipped(getattr(self, name)), getattr(at, name))

        # ---- a block's row count to TileKV and (per-channel K) to the header filter ----------
        per_channel = self.kv_format == KVFormat.PER_CHANNEL_K
        rw = len(qs.tile.payload.rows)
        if per_channel:
            m.d.comb += kv.blk.payload.eq(qs.kv.payload)
            m.submodules.hq = hq = fifo.SyncFIFOBuffered(width=1, depth=self.rows_fifo)
            m.d.comb += [kv.blk.valid.eq(qs.kv.valid & hq.w_rdy),
                         qs.kv.ready.eq(kv.blk.ready & hq.w_rdy),
                         hq.w_data.eq(qs.kv.payload.rows == 0),
                         hq.w_en.eq(qs.kv.valid & qs.kv.ready)]
            kh, drop = self.kh, hq.r_data[0]
            m.d.comb += [fd.kh.payload.eq(kh.payload), fd.kh.valid.eq(kh.valid & hq.r_rdy & ~drop),
                         kh.ready.eq(hq.r_rdy & (drop | fd.kh.ready)),
                         hq.r_en.eq(kh.valid & kh.ready & kh.payload.last)]
        elif e is None:
            wiring.connect(m, qs.kv, kv.blk)

        # ---- the rows' place in the chunk ----------------------------------------------------
        m.submodules.tq = tq = fifo.SyncFIFOBuffered(width=rw + 1, depth=self.rows_fifo)
        m.d.comb += [tq.w_data.eq(qs.tile.payload.as_value()), tq.w_en.eq(qs.tile.valid),
                     qs.tile.ready.eq(tq.w_rdy)]
        t_rows, t_last = tq.r_data[:rw], tq.r_data[rw]
        base = Signal(range(self.max_rows + self.rows))
        cnt = Signal(range(self.rows + 1))
        o = self.o
        m.d.comb += [o.payload.o.eq(nz.o.payload.o), o.payload.row.eq(base + nz.o.payload.row),
                     o.payload.last.eq(nz.o.payload.last),
                     o.valid.eq(nz.o.valid & tq.r_rdy & (t_rows != 0)),
                     nz.o.ready.eq(o.ready & tq.r_rdy & (t_rows != 0))]
        # a tile is done after its rows that see a key (none: at once)
        row_out = o.valid & o.ready & o.payload.last
        end = tq.r_rdy & ((t_rows == 0) | (row_out & (cnt + 1 == t_rows)))
        m.d.comb += tq.r_en.eq(end)
        with m.If(row_out):
            m.d.sync += cnt.eq(cnt + 1)
        with m.If(end):
            m.d.sync += [cnt.eq(0), base.eq(base + self.rows)]
            with m.If(t_last):
                m.d.sync += base.eq(0)
        return m
