"""The tiled prefill's stages chained (issue #33; paper §3.1, §5): :class:`TileAttend` from the
arrays' ``S = Q·Kᵀ`` accumulators on (softmax, P·V, merge), :class:`TileAttention` from the query
and the KV blocks' K and V (``S`` first) — the rows' merged SINGLE-mode states out,
:func:`mcf.golden.attention_tiled.attend_tiled_rows` (``p_format = P8``, ``array=True``) bit for
bit.
"""

from __future__ import annotations

from amaranth import Cat, Module, Signal
from amaranth.lib import fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.attn_tile import (
    k_word_layout,
    merge_beat_layout,
    score_q_layout,
    score_row_beat_layout,
    v_beat_layout,
)

from .tile_merge import TileMerge
from .tile_pv import TilePV
from .tile_score import TileScore
from .tile_softmax import TileSoftmax

__all__ = ["TileAttend", "TileAttention", "attend_chain"]


class TileAttend(wiring.Component):
    """:class:`~.tile_softmax.TileSoftmax` → :class:`~.tile_pv.TilePV` →
    :class:`~.tile_merge.TileMerge`, each row's place in the tile (``row``, ``first``,
    ``final``) carried beside them in a FIFO of ``tags`` entries.

    Members
    -------
    s : In(stream.Signature(score_row_beat_layout(keys, head_dim, rows)))
        Score rows in the order of :func:`mcf.golden.attention_tiled.tile_schedule` (per query
        tile, per KV block, the tile's rows that see the block, their causal masks in
        ``masked``); ``row``, ``first``, ``final`` read on a row's first beat.
    v : In(stream.Signature(v_beat_layout(keys, head_dim, rows)))
        Each block's V with its count of rows, in the same block order (TilePV's ``v``).
    o : Out(stream.Signature(merge_beat_layout(merge_lanes, rows)))
        A row's merged ``(m, l, o)`` after its final block, in beats of ``merge_lanes``
        channels (TileMerge's ``o``).

    Rate: one score beat (``keys`` keys) per cycle and ``keys × head_dim`` P·V MACs per cycle
    while TileSoftmax runs at its full rate (``slots · N ≥ 3N + HOLD`` for rows of ``N``
    beats) and ``N ≥`` :meth:`TileMerge.row_cycles`; measured in ``tests/test_tile_attend.py``.
    Latency: TileSoftmax's, TilePV's and TileMerge's in sequence.
    """

    def __init__(self, keys: int = 4, head_dim: int = 128, max_block: int = 256,
                 rows: int = 64, slots: int = 4, merge_lanes: int = 4, tags: int = 16,
                 dsp: str = "model"):
        self.keys, self.head_dim, self.max_block, self.rows = keys, head_dim, max_block, rows
        self.softmax = TileSoftmax(keys=keys, head_dim=head_dim, max_block=max_block,
                                   slots=slots)
        self.pv = TilePV(keys=keys, head_dim=head_dim, max_block=max_block, max_rows=rows,
                         dsp=dsp)
        self.merge = TileMerge(head_dim=head_dim, rows=rows, lanes=merge_lanes,
                               max_block=max_block)
        self.tags = tags
        super().__init__({
            "s": In(stream.Signature(score_row_beat_layout(keys, head_dim, rows))),
            "v": In(stream.Signature(v_beat_layout(keys, head_dim, rows))),
            "o": Out(stream.Signature(merge_beat_layout(merge_lanes, rows))),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.softmax, m.submodules.pv = self.softmax, self.pv
        m.submodules.merge = self.merge
        attend_chain(m, self.s, self.softmax, self.pv, self.merge, self.tags)
        wiring.connect(m, wiring.flipped(self.v), self.pv.v)
        wiring.connect(m, self.merge.o, wiring.flipped(self.o))
        return m


def attend_chain(m: Module, s, softmax, pv, merge, tags: int):
    """Score rows on ``s`` (the parent's In member) through ``softmax`` → ``pv`` (its ``p``;
    any P·V stage emitting a row as :func:`~mcf.abi.attn_tile.pv_out_layout` beats, ``last`` on
    its final one, rows in order) → ``merge``'s ``i``, each row's ``row``, ``first``, ``final``,
    ``mode`` carried beside them in a FIFO of ``tags`` entries (a row's first beat enters only
    with room for its tag; the tag goes with each of the row's beats, out with the last)."""
    tag_w = len(s.payload.row) + 2 + len(s.payload.beat.mode.as_value())
    m.submodules.tag = tag = fifo.SyncFIFOBuffered(width=tag_w, depth=tags)
    sm, mg = softmax, merge
    in_row = Signal()
    room = in_row | tag.w_rdy
    m.d.comb += [sm.i.payload.eq(s.payload.beat), sm.i.valid.eq(s.valid & room),
                 s.ready.eq(sm.i.ready & room),
                 tag.w_data.eq(Cat(s.payload.row, s.payload.first, s.payload.final,
                                   s.payload.beat.mode)),
                 tag.w_en.eq(s.valid & s.ready & ~in_row)]
    with m.If(s.valid & s.ready):
        m.d.sync += in_row.eq(~s.payload.beat.last)
    wiring.connect(m, sm.o, pv.p)
    # a block state meets its row's tag (rows stay in order through both stages)
    tag_v = Cat(mg.i.payload.row, mg.i.payload.first, mg.i.payload.final, mg.i.payload.mode)
    m.d.comb += [mg.i.payload.state.eq(pv.o.payload), tag_v.eq(tag.r_data),
                 mg.i.valid.eq(pv.o.valid & tag.r_rdy), pv.o.ready.eq(mg.i.ready & tag.r_rdy),
                 tag.r_en.eq(pv.o.valid & mg.i.ready & pv.o.payload.last)]


class TileAttention(wiring.Component):
    """:class:`~.tile_score.TileScore` → :class:`TileAttend`: query beats and each block's K and
    V in, the rows' merged states out.

    Members
    -------
    q : In(stream.Signature(score_q_layout(head_dim, max_block, rows)))
        Per row of :func:`mcf.golden.attention_tiled.tile_schedule`'s order (per query tile,
        per KV block, the tile's rows that see the block) one beat per key tile of the block:
        the query (per-channel K: folded by the tile's group header), its scale, ``visible``
        (the causal mask), ``row``, ``first``, ``final`` (TileScore's ``q``).
    k : In(stream.Signature(k_word_layout(keys, head_dim, lanes, max_block, rows)))
        Each block's K words with its keys' ``sk``, ``sv``, its count of keys and of rows, in
        the schedule's block order (TileScore's ``k``).
    v : In(stream.Signature(v_beat_layout(keys, head_dim, rows)))
        Each block's V with its count of rows, in the same order (TilePV's ``v``).
    o : Out(stream.Signature(merge_beat_layout(merge_lanes, rows)))
        A row's merged ``(m, l, o)`` after its final block, in beats of ``merge_lanes``
        channels (TileMerge's ``o``).

    Rate: one score beat per cycle — ``keys × head_dim`` QKᵀ and as many P·V MACs per cycle —
    when the block's keys are a whole number of TileScore key tiles and TileAttend runs at its
    full rate; measured in ``tests/test_tile_attend.py``.
    Latency: TileScore's, then TileAttend's.
    """

    def __init__(self, keys: int = 4, head_dim: int = 128, lanes: int = 16,
                 max_block: int = 256, rows: int = 64, slots: int = 4, merge_lanes: int = 4,
                 tags: int = 16, dsp: str = "model"):
        self.keys, self.head_dim, self.max_block, self.rows = keys, head_dim, max_block, rows
        self.score = TileScore(keys=keys, head_dim=head_dim, lanes=lanes, max_block=max_block,
                               max_rows=rows, dsp=dsp)
        self.attend = TileAttend(keys=keys, head_dim=head_dim, max_block=max_block, rows=rows,
                                 slots=slots, merge_lanes=merge_lanes, tags=tags, dsp=dsp)
        super().__init__({
            "q": In(stream.Signature(score_q_layout(head_dim, max_block, rows))),
            "k": In(stream.Signature(k_word_layout(keys, head_dim, lanes, max_block, rows))),
            "v": In(stream.Signature(v_beat_layout(keys, head_dim, rows))),
            "o": Out(stream.Signature(merge_beat_layout(merge_lanes, rows))),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.score, m.submodules.attend = sc, at = self.score, self.attend
        wiring.connect(m, wiring.flipped(self.q), sc.q)
        wiring.connect(m, wiring.flipped(self.k), sc.k)
        wiring.connect(m, sc.o, at.s)
        wiring.connect(m, wiring.flipped(self.v), at.v)
        wiring.connect(m, at.o, wiring.flipped(self.o))
        return m
