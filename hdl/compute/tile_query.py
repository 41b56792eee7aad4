"""The query sequencer of the tiled prefill (issue #33; paper §3.1, §5): a prefill chunk's query
rows held on chip, issued against the KV blocks in the order of
:func:`mcf.golden.attention_tiled.tile_schedule` as :class:`~.tile_fold.TileFold`'s row beats
(:func:`mcf.abi.attn_tile.fold_row_layout`), with the causal mask (``visible``) and each row's
place in its query tile (``row``, ``first``, ``final``).
"""

from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from mcf.abi.attn_tile import (
    block_desc_layout,
    chunk_layout,
    fold_row_layout,
    kv_rows_layout,
    query_row_layout,
    tile_rows_layout,
)

__all__ = ["TileQuery"]


class TileQuery(wiring.Component):
    """A chunk's rows (row ``x``: token ``x // heads``, position ``pos + x // heads``, as
    :func:`mcf.golden.attention_tiled.attend_prefill_tiled` orders them) in a ring of two query
    tiles (a ``2·rows``-deep :class:`~amaranth.lib.memory.Memory`: tile ``t`` in half ``t mod
    2``, its rows taken once tile ``t − 2`` is done); per query tile of ``rows`` rows, per KV
    block descriptor, the tile's rows that are not wholly before the block.

    For a block at ``pos0`` the rows issued are ``s .. len−1`` of the tile (``s`` the first row
    whose token is at ``≥ pos0``: ``(pos0 − pos)·heads`` less the tile's first row, clamped),
    each with ``visible = clamp(q_pos − pos0 + 1, 0, n)`` (the keys it sees: the block's keys are
    at ``pos0 .. pos0+n−1``), ``first`` on the tile's first block (every row that sees a key
    sees that one: the blocks' positions increase), ``final`` when the tile's next block starts
    after the row's position or this is the tile's last block (the next descriptor is looked
    at, not taken, so the blocks need not be contiguous), ``n`` and ``last`` on the block's
    last row. A row that sees no key of its tile's blocks gets no beat (and no state).

    Members
    -------
    chunk : In(stream.Signature(chunk_layout(max_rows, max_heads)))
        Taken while idle (the last chunk's last row gone): the chunk's first position, row
        count and GQA heads.
    q : In(stream.Signature(query_row_layout(head_dim)))
        The chunk's ``rows`` query rows in order, written at one per cycle while their ring
        half is free (``ready`` low while the tile two before is in work); a query tile runs
        once its rows are written — so the executor sends rows and descriptors side by side.
    desc : In(stream.Signature(block_desc_layout(max_block)))
        Per query tile every KV block (``pos0``, ``n ≥ 1``; positions increasing, ``last`` on
        the tile's final block), as the executor requests them again per query tile. After the
        last tile's last block the chunk is done and the next one is taken.
    o : Out(stream.Signature(fold_row_layout(head_dim, max_block, rows)))
        TileFold's ``i``.
    kv : Out(stream.Signature(kv_rows_layout(rows)))
        Per descriptor the rows issued against the block (0: TileKV and the arrays drop it) —
        TileKV's ``blk``; sent as the descriptor is taken, before its rows.
    tile : Out(stream.Signature(tile_rows_layout(rows)))
        Per query tile the rows that see a key (those of its first block): the merged states
        the tile will emit, ``last`` on the chunk's final tile; sent with the tile's first
        ``kv`` beat.

    Rate: one row per cycle while ``o`` is ready, and one cycle per descriptor (taking it):
    ``rows + 1`` cycles for a block met by ``rows`` rows, against the ``rows · ceil(n/R) ·
    head_dim/lanes`` cycles the arrays spend on it (TileFold holds a row for its ``ceil(n/R)``
    key tiles, TileScore takes ``head_dim/lanes`` cycles per tile), so the sequencer keeps
    ahead of the arrays — one score beat per cycle through TilePrefill is measured in
    ``tests/test_tile_prefill.py``. Latency: a block's first row beat is valid 2 cycles after
    its descriptor is taken (the issue, the memory's read), then one per cycle (measured in
    ``tests/test_tile_query.py``).
    Positions are compared as plain unsigned numbers (no wrap within a chunk's blocks).
    ``ram_style`` is the row memory's synthesis attribute: ``"block"`` (block RAM) or
    ``"ultra"`` (URAM288, with yosys ``synth_xilinx -uram``); it changes no cycle or bit.
    ``row_words``: a row is kept as that many words of a ``2·rows·row_words``-deep memory
    (a row's 1,059 bits at head_dim 128 take 15 BRAM36 as one word at 128 deep, 4 as four
    quarters filling the BRAM's 512 words): a row is written in ``row_words`` cycles (``q``
    ready on its last) and issued in as many (the words before the last read into registers),
    so the rate above becomes one row per ``row_words`` cycles on both sides.
    """

    RAM_STYLES = ("block", "ultra")

    def __init__(self, head_dim: int = 128, max_block: int = 256, rows: int = 64,
                 max_rows: int = 1536, max_heads: int = 8, ram_style: str = "block",
                 row_words: int = 1):
        if ram_style not in self.RAM_STYLES:
            raise ValueError(f"ram_style must be one of {self.RAM_STYLES}")
        if row_words < 1:
            raise ValueError("row_words must be >= 1")
        self.head_dim, self.max_block, self.rows = head_dim, max_block, rows
        self.max_rows, self.max_heads, self.ram_style = max_rows, max_heads, ram_style
        self.row_words = row_words
        super().__init__({
            "chunk": In(stream.Signature(chunk_layout(max_rows, max_heads))),
            "q": In(stream.Signature(query_row_layout(head_dim))),
            "desc": In(stream.Signature(block_desc_layout(max_block))),
            "o": Out(stream.Signature(fold_row_layout(head_dim, max_block, rows))),
            "kv": Out(stream.Signature(kv_rows_layout(rows))),
            "tile": Out(stream.Signature(tile_rows_layout(rows))),
        })

    def elaborate(self, platform):
        m = Module()
        MR, QT = self.max_rows, self.rows
        qlay = query_row_layout(self.head_dim)
        elay = data.StructLayout({"row": qlay, "tok": range(MR)})
        P = self.row_words
        WW = -(-elay.size // P)                       # bits of a row's word
        # a ring of two query tiles: tile t's rows in half t mod 2, written while tile t − 1
        # runs, the half free again when tile t − 2 is done; row r's word j at r·P + j
        m.submodules.mem = mem = Memory(shape=WW, depth=2 * QT * P, init=[],
                                        attrs={"ram_style": self.ram_style})
        wr, rd = mem.write_port(), mem.read_port(transparent_for=())
        wj, rj = Signal(range(P)), Signal(range(P))   # the word written, read of the row

        # ---- the chunk and its rows ---------------------------------------------------------
        ck = Signal(self.chunk.payload.shape())
        act = Signal()
        wa = Signal(range(MR + 1))
        tok, hd = Signal(range(MR)), Signal(range(self.max_heads))
        wh, wo = Signal(), Signal(range(QT))          # the write's ring half and row in it
        rh = Signal()                                 # the issued tile's ring half
        lo = Signal(range(MR + QT))                   # the issued tile's first row
        m.d.comb += self.chunk.ready.eq(~act & ~self.o.valid)
        with m.If(self.chunk.valid & self.chunk.ready):
            m.d.sync += [ck.eq(self.chunk.payload), act.eq(1), wa.eq(0), tok.eq(0), hd.eq(0),
                         wh.eq(0), wo.eq(0), rh.eq(0)]
        q = self.q
        room = act & (wa < ck.rows) & (wa < lo + 2 * QT)
        wrow = Signal(elay)
        m.d.comb += [wrow.row.eq(q.payload), wrow.tok.eq(tok),
                     q.ready.eq(room & (wj == P - 1)),
                     wr.addr.eq((Mux(wh, QT, 0) + wo) * P + wj),
                     wr.data.eq(Cat(wrow.as_value(), Const(0, WW * P - elay.size))
                                .word_select(wj, WW) if P > 1 else wrow.as_value()),
                     wr.en.eq(q.valid & room)]
        if P > 1:
            with m.If(q.valid & room):
                m.d.sync += wj.eq(Mux(wj == P - 1, 0, wj + 1))
        with m.If(q.valid & q.ready):
            m.d.sync += [wa.eq(wa + 1), hd.eq(Mux(hd == ck.heads - 1, 0, hd + 1)),
                         wo.eq(wo + 1)]
            with m.If(wo == QT - 1):
                m.d.sync += [wo.eq(0), wh.eq(~wh)]
            with m.If(hd == ck.heads - 1):
                m.d.sync += tok.eq(tok + 1)

        # ---- the query tile and the block descriptor ------------------------------------------
        left = Signal(range(MR + 1))
        tlen = Signal(range(QT + 1))
        m.d.comb += [left.eq(ck.rows - lo), tlen.eq(Mux(left < QT, left, QT))]
        tfirst = Signal(init=1)                        # the next descriptor is the tile's first
        d = self.desc
        cur = Signal(d.payload.shape())
        have, cfirst = Signal(), Signal()
        x = Signal(range(QT + 1))
        # the tile's first row seeing the block: token (pos0 − pos), row (pos0 − pos)·heads
        dk = Signal(range(MR + 1))
        kg = Signal(range(MR * self.max_heads + 1))
        s = Signal(range(QT + 1))
        m.d.comb += [dk.eq(Mux(d.payload.pos0 <= ck.pos, 0,
                               Mux(d.payload.pos0 - ck.pos > MR, MR, d.payload.pos0 - ck.pos))),
                     kg.eq(dk * ck.heads),
                     s.eq(Mux(kg <= lo, 0, Mux(kg - lo >= tlen, tlen, kg - lo)))]
        kv, tile = self.kv, self.tile
        loaded = (wa >= lo + tlen)
        take = (act & loaded & ~have & d.valid & (~kv.valid | kv.ready)
                & (~tfirst | ~tile.valid | tile.ready))
        m.d.comb += d.ready.eq(take)
        with m.If(kv.ready):
            m.d.sync += kv.valid.eq(0)
        with m.If(tile.ready):
            m.d.sync += tile.valid.eq(0)
        with m.If(take):
            m.d.sync += [cur.eq(d.payload), have.eq(1), cfirst.eq(tfirst), tfirst.eq(0),
                         x.eq(s), kv.valid.eq(1), kv.payload.rows.eq(tlen - s)]
            with m.If(tfirst):
                m.d.sync += [tile.valid.eq(1), tile.payload.rows.eq(tlen - s),
                             tile.payload.last.eq(lo + QT >= ck.rows)]

        # ---- issue: the memory read, the output register -------------------------------------
        o = self.o
        adv = ~o.valid | o.ready
        meta = Signal(data.StructLayout({"x": range(QT), "pos0": d.payload.pos0.shape(),
                                         "n": d.payload.n.shape(), "next": d.payload.pos0.shape(),
                                         "tlast": 1, "first": 1, "last": 1}))
        ready_row = have & (x < tlen) & adv & (cur.last | d.valid)
        issue = ready_row & (rj == P - 1)             # the row's last word read: o next cycle
        done = have & ((x >= tlen) | (issue & (x == tlen - 1)))
        m.d.comb += [rd.addr.eq((Mux(rh, QT, 0) + x) * P + rj), rd.en.eq(adv)]
        with m.If(adv):
            m.d.sync += o.valid.eq(issue)
        words = rd.data                               # the row: its words before the last held
        if P > 1:
            held = [Signal(WW, name=f"held{j}") for j in range(P - 1)]
            cap = Signal(range(P))                    # the word on rd.data to hold (P − 1: none)
            m.d.sync += cap.eq(Mux(ready_row & (rj != P - 1), rj, P - 1))
            for j, h in enumerate(held):
                with m.If(cap == j):
                    m.d.sync += h.eq(rd.data)
            with m.If(ready_row):
                m.d.sync += rj.eq(Mux(rj == P - 1, 0, rj + 1))
            words = Cat(*held, rd.data)
        row = data.View(elay, words[:elay.size])
        with m.If(issue):
            m.d.sync += [x.eq(x + 1), meta.x.eq(x), meta.pos0.eq(cur.pos0), meta.n.eq(cur.n),
                         meta.next.eq(d.payload.pos0), meta.tlast.eq(cur.last),
                         meta.first.eq(cfirst), meta.last.eq(x == tlen - 1)]
        with m.If(done):
            m.d.sync += have.eq(0)
            with m.If(cur.last):
                m.d.sync += [lo.eq(lo + QT), tfirst.eq(1), rh.eq(~rh)]
                with m.If(lo + QT >= ck.rows):
                    m.d.sync += [act.eq(0), lo.eq(0)]

        qpos = Signal(range(2 ** len(ck.pos) + MR))
        vis = Signal(range(2 ** len(ck.pos) + MR + 1))
        m.d.comb += [qpos.eq(ck.pos + row.tok), vis.eq(qpos + 1 - meta.pos0)]
        p = o.payload
        m.d.comb += [p.q.eq(row.row.q), p.scale_m.eq(row.row.scale_m),
                     p.scale_e.eq(row.row.scale_e),
                     p.visible.eq(Mux(qpos < meta.pos0, 0, Mux(vis > meta.n, meta.n, vis))),
                     p.n.eq(meta.n), p.row.eq(meta.x), p.first.eq(meta.first),
                     p.final.eq(meta.tlast | (qpos < meta.next)), p.last.eq(meta.last)]
        return m
