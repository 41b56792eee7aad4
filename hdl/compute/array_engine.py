"""Attention on the GEMM's arrays with the attention engine's own streams (issue #33; paper §3.1,
§5; docs/attention.md "The engine on the arrays"): a job's query heads are the rows of one query
tile of :class:`~.array_attend.ArrayAttention` in today's ``w`` (``p_format = PV_W``), so every
mode gives :class:`~.attention.AttentionEngine`'s words bit for bit — decode states, the causal
``o / l`` of PREFILL, MAX's maxima, FIXED's wrapped sums — while S and P·V run on arrays it can
share with the GEMM.
"""

from __future__ import annotations

from amaranth import Module
from amaranth.lib import fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.attn_tile import PV_W
from mcf.abi.framing import beat_layout
from mcf.abi.kv import attn_job_layout, attn_status_layout, kv_beat_layout, q_beat_layout
from mcf.abi.kv_channel import KVFormat
from mcf.abi.softmax import LANE_BITS

from .array_attend import ArrayAttention
from .engine_feed import KVFeed
from .engine_out import StateOut
from .engine_query import QueryFront
from .tile_fold import TileFold
from .tile_kv import TileKV

__all__ = ["ArrayEngine"]


def via_fifo(m: Module, name: str, src, dst, depth: int):
    """``src`` (an Out stream) → a FIFO of ``depth`` → ``dst`` (an In stream)."""
    width = len(src.payload.as_value())
    m.submodules[name] = f = fifo.SyncFIFOBuffered(width=width, depth=depth)
    m.d.comb += [f.w_data.eq(src.payload.as_value()), f.w_en.eq(src.valid),
                 src.ready.eq(f.w_rdy), dst.payload.as_value().eq(f.r_data),
                 dst.valid.eq(f.r_rdy), f.r_en.eq(dst.ready)]
    return f


class ArrayEngine(wiring.Component):
    """:class:`~.attention.AttentionEngine`'s streams, on the arrays.

    Inside: :class:`~.engine_query.QueryFront` (jobs, the query heads in two slots, per block a
    row per head) → :class:`~.tile_fold.TileFold` → :class:`~.array_attend.ArrayAttention`
    (``PV_W``; ``rows = max_heads``) with :class:`~.engine_feed.KVFeed` (the K and V blocks
    shaped, counted, MAX's zero V) → :class:`~.tile_kv.TileKV` in front of its K and V, and
    :class:`~.engine_out.StateOut` (the merged heads → the job's words) after it.

    Members
    -------
    job, q, k, v, o, status : as :class:`~.attention.AttentionEngine` (PER_TOKEN K), the same
        words and payloads; ``status.err_max`` counts (key, head) pairs scoring above a FIXED
        job's maximum, ``err_rows`` malformed K and V blocks (completed with zero beats / rows
        or cut at ``max_block`` rows: the job still emits), ``blocks`` the kept jobs' blocks.
    score_st, score_res, pv_st, pv_res : ``own_arrays = False`` only — ArrayAttention's client
        ports, for the GEMM's arrays.
    rows, tk, tv, blk, merged, err_max : ``inner = False`` only — the chain outside (shared
        with the tiled prefill, :class:`~.tile_prefill.TilePrefill` ``engine``): the rows for
        its TileFold, the K/V beats and block rows for its TileKV, its merged rows back, its
        TileSoftmax's ``err_fixed``.

    Parameters beyond AttentionEngine's: ``keys`` (keys per score beat), ``arr_lanes``,
    ``arrays``, ``array_rows``, ``chain``, ``dsp``, ``own_arrays`` (the arrays', as
    :class:`~.array_attend.ArrayAttention`), ``merge_lanes`` (TileMerge's ``o`` lanes per
    beat, the state store's word).

    Rate: the arrays' in today's ``w`` — per quad of heads and block of ``n`` keys
    ``head_dim/arr_lanes · ceil(n / array_rows)`` steps of S and three times
    ``ceil(n / head_dim) · head_dim/arr_lanes · head_dim/array_rows`` of P·V; the K and V feed
    at one beat of ``lanes`` channels per cycle each (``n · head_dim/lanes`` cycles a block);
    the output ``head_dim/merge_lanes`` beats per head to collect, then a word per cycle.
    Measured in ``tests/test_array_engine.py``. Latency: a job's output starts after its last
    block's merge and its heads collected.
    """

    def __init__(self, head_dim: int = 128, lanes: int = 16, max_heads: int = 6,
                 max_block: int = 256, data_width: int = 64, out_fifo_depth: int = 16,
                 merge_lanes: int = 4, kv_format: KVFormat = KVFormat.PER_TOKEN,
                 keys: int = 4, arr_lanes: int = 16, arrays: int = 4, array_rows: int = 16,
                 chain: int = 1, dsp: str = "fabric", own_arrays: bool = True,
                 slots: int = 4, tags: int = 16, inner: bool = True):
        if KVFormat(kv_format) != KVFormat.PER_TOKEN:
            raise ValueError("the engine on the arrays takes PER_TOKEN K")
        if data_width % LANE_BITS:
            raise ValueError("data_width must be a multiple of 32")
        self.head_dim, self.lanes, self.max_heads = head_dim, lanes, max_heads
        self.max_block, self.data_width = max_block, data_width
        G, T = max_heads, max_block
        self.front = QueryFront(head_dim, lanes, G, T)
        self.feed = KVFeed(head_dim, lanes, G, T)
        self.out = StateOut(head_dim, merge_lanes, G, data_width, out_fifo_depth)
        self.inner = inner
        if inner:
            self.kv = TileKV(keys=keys, head_dim=head_dim, lanes=arr_lanes, in_lanes=lanes,
                             max_block=T, max_rows=G, pv_words=(array_rows, arr_lanes))
            self.fold = TileFold(keys=keys, head_dim=head_dim, lanes=arr_lanes, max_block=T,
                                 rows=G)
            self.att = ArrayAttention(keys=keys, head_dim=head_dim, lanes=arr_lanes,
                                      max_block=T, rows=G, slots=slots,
                                      merge_lanes=merge_lanes, tags=tags, arrays=arrays,
                                      array_rows=array_rows, chain=chain, dsp=dsp,
                                      own_arrays=own_arrays, p_format=PV_W)
        members = {
            "job": In(stream.Signature(attn_job_layout(G))),
            "q": In(stream.Signature(q_beat_layout(lanes))),
            "k": In(stream.Signature(kv_beat_layout(lanes))),
            "v": In(stream.Signature(kv_beat_layout(lanes))),
            "o": Out(stream.Signature(beat_layout(data_width))),
            "status": Out(attn_status_layout()),
        }
        if not inner:
            beat = stream.Signature(kv_beat_layout(lanes))
            members.update({
                "rows": self.front.signature.members["rows"],
                "tk": Out(beat), "tv": Out(beat),
                "blk": self.feed.signature.members["blk"],
                "merged": self.out.signature.members["i"],
                "err_max": In(32),
            })
        elif not own_arrays:
            for name in ("score_st", "score_res", "pv_st", "pv_res"):
                members[name] = self.att.signature.members[name]
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        fr, fd, out = self.front, self.feed, self.out
        m.submodules.front, m.submodules.feed, m.submodules.out = fr, fd, out
        wiring.connect(m, wiring.flipped(self.job), fr.job)
        wiring.connect(m, wiring.flipped(self.q), fr.q)
        wiring.connect(m, wiring.flipped(self.k), fd.k)
        wiring.connect(m, wiring.flipped(self.v), fd.v)
        jobs = [via_fifo(m, "kjobs", fr.kjob, fd.kjob, 2),
                via_fifo(m, "vjobs", fr.vjob, fd.vjob, 4),
                via_fifo(m, "ojobs", fr.ojob, out.ojob, 4)]
        wiring.connect(m, fd.blocks, fr.blocks)
        wiring.connect(m, out.o, wiring.flipped(self.o))
        if self.inner:
            kv, fo, at = self.kv, self.fold, self.att
            m.submodules.kv, m.submodules.fold, m.submodules.att = kv, fo, at
            wiring.connect(m, fd.tk, kv.k)
            wiring.connect(m, fd.tv, kv.v)
            wiring.connect(m, fd.blk, kv.blk)
            wiring.connect(m, fr.rows, fo.i)
            wiring.connect(m, fo.o, at.q)
            wiring.connect(m, kv.kw, at.k)
            wiring.connect(m, kv.vw, at.v)
            wiring.connect(m, at.o, out.i)
            err_max = at.softmax.err_fixed
        else:
            for src, dst in ((fd.tk, self.tk), (fd.tv, self.tv), (fd.blk, self.blk),
                             (fr.rows, self.rows)):
                wiring.connect(m, src, wiring.flipped(dst))
            wiring.connect(m, wiring.flipped(self.merged), out.i)
            err_max = self.err_max
        if "score_st" in self.signature.members:
            at = self.att
            for name in ("score_st", "pv_st"):
                wiring.connect(m, getattr(at, name), wiring.flipped(getattr(self, name)))
            for name in ("score_res", "pv_res"):
                wiring.connect(m, wiring.flipped(getattr(self, name)), getattr(at, name))

        st = self.status
        m.d.sync += [st.jobs.eq(st.jobs + out.job), st.blocks.eq(st.blocks + fd.block),
                     st.err_rows.eq(st.err_rows + fd.err),
                     st.err_job.eq(st.err_job + fr.err_job)]
        m.d.comb += [st.err_max.eq(err_max),
                     st.busy.eq(fr.busy | fd.busy | out.busy
                                | sum(f.r_rdy for f in jobs).bool())]
        return m
