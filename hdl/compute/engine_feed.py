"""The K and V feed of the attention engine on the arrays (issue #33;
:class:`~.array_engine.ArrayEngine`): the engine's ``k`` and ``v`` streams — blocks of token rows
as :class:`~.attention.AttentionEngine` takes them, possibly malformed — shaped into the blocks
:class:`~.tile_kv.TileKV` needs (whole rows, at most ``max_block`` of them, as many V rows as K
rows), each block's key count and visible count taken on the way.
"""

from __future__ import annotations

from amaranth import Module, Mux, Signal
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.attn_tile import kv_rows_layout
from mcf.abi.kv import KV_POS_BITS, kv_beat_layout

__all__ = ["BlockShaper", "KVFeed", "feed_job_layout", "block_count_layout"]


def shaper_cmd_layout(max_block: int) -> data.StructLayout:
    """One block for :class:`BlockShaper`: ``n`` (the rows wanted: the cap, or with ``exact``
    the count), ``exact`` (pad a short block with zero rows up to ``n``), ``gen`` (no input:
    ``n`` zero rows), ``drop`` (the input block consumed, nothing emitted), ``causal`` and
    ``q_pos`` (a row is visible when ``pos ≤ q_pos`` or not ``causal``)."""
    return data.StructLayout({"n": range(max_block + 1), "exact": 1, "gen": 1, "drop": 1,
                              "causal": 1, "q_pos": KV_POS_BITS})


def block_count_layout(max_block: int) -> data.StructLayout:
    """A shaped block's ``rows`` (1 .. ``max_block``) and ``visible`` rows (a prefix when the
    block's positions increase)."""
    return data.StructLayout({"rows": range(max_block + 1), "visible": range(max_block + 1)})


def feed_job_layout(max_heads: int) -> data.StructLayout:
    """A job as the feed sees it: ``n_blocks`` K blocks (and V blocks unless ``max``),
    ``drop`` (a rejected job: its blocks consumed, nothing emitted), ``max`` (MAX mode: no V
    blocks come; zero V rows are generated), ``causal``, ``q_pos`` and ``heads`` (the rows
    each block meets on the arrays)."""
    return data.StructLayout({"n_blocks": 16, "drop": 1, "max": 1, "causal": 1,
                              "q_pos": KV_POS_BITS, "heads": range(max_heads + 1)})


class BlockShaper(wiring.Component):
    """One block per ``cmd``: input beats (rows of ``head_dim/lanes`` beats, ``last`` on the
    block's final beat) → whole rows out, ``last`` on the final one.

    Per block: rows pass until ``n`` rows are out (the beats after are consumed and dropped
    up to the input's ``last``); a partial row at the input's end is completed with zero beats
    and not counted visible (it is the block's last row: masked, it has no score);
    with ``exact`` a block of fewer than ``n`` rows is completed with zero rows; ``gen``: ``n``
    zero rows, no input; ``drop``: the input block consumed, nothing out. Anything completed
    or dropped raises ``err`` once (one cycle) for the block.

    Members
    -------
    cmd : In(stream.Signature(shaper_cmd_layout(max_block))) — taken while idle.
    i : In(stream.Signature(kv_beat_layout(lanes))); o : Out(the same)
        Beats pass combinationally (``o.valid`` with ``i.valid``); zero beats are ``valid``
        without input. ``scale_k``, ``scale_v``, ``pos`` of a padded beat are 0.
    res : Out(stream.Signature(block_count_layout(max_block)))
        After a block that was not dropped: its ``rows`` and ``visible`` rows (held until
        taken; the next ``cmd`` is taken after).
    err : Out(1)

    Rate: one beat per cycle; one idle cycle per block (the ``cmd``), one more with ``res``.
    """

    def __init__(self, head_dim: int, lanes: int, max_block: int):
        self.nb, self.max_block = head_dim // lanes, max_block
        beat = stream.Signature(kv_beat_layout(lanes))
        super().__init__({
            "cmd": In(stream.Signature(shaper_cmd_layout(max_block))),
            "i": In(beat), "o": Out(beat),
            "res": Out(stream.Signature(block_count_layout(max_block))),
            "err": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        NB, i, o = self.nb, self.i, self.o
        cmd = Signal(self.cmd.payload.shape())
        r = Signal(range(self.max_block + 1))          # rows out
        c = Signal(range(NB))                          # beat of the row
        vis = Signal(range(self.max_block + 1))
        pad_to = Signal(range(self.max_block + 1))     # padding ends with row pad_to − 1
        bad, part = Signal(), Signal()                  # part: the last row was partial
        row_end = c == NB - 1
        nxt_c = Mux(row_end, 0, c + 1)

        def finish(err):
            m.d.comb += self.err.eq(err)
            m.next = "RES"

        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.cmd.ready.eq(1)
                with m.If(self.cmd.valid):
                    p = self.cmd.payload
                    m.d.sync += [cmd.eq(p), r.eq(0), c.eq(0), vis.eq(0), bad.eq(0),
                                 part.eq(0), pad_to.eq(p.n)]
                    with m.If(p.drop):
                        m.next = "DROP"
                    with m.Elif(p.gen):
                        m.next = "PAD"
                    with m.Else():
                        m.next = "PASS"
            with m.State("PASS"):
                m.d.comb += [o.payload.eq(i.payload), o.valid.eq(i.valid), i.ready.eq(o.ready)]
                cap = row_end & (r + 1 == cmd.n)
                short = i.payload.last & ~cap             # the input ends before n rows
                m.d.comb += o.payload.last.eq(cap | (i.payload.last & row_end & ~cmd.exact))
                with m.If(i.valid & o.ready):
                    m.d.sync += c.eq(nxt_c)
                    with m.If(row_end):
                        m.d.sync += r.eq(r + 1)
                    with m.If((c == 0) & (~cmd.causal | (i.payload.pos <= cmd.q_pos))):
                        m.d.sync += vis.eq(vis + 1)
                    with m.If(cap):
                        with m.If(i.payload.last):
                            finish(0)
                        with m.Else():
                            m.d.sync += bad.eq(1)
                            m.next = "SKIP"
                    with m.Elif(short):
                        with m.If(row_end & ~cmd.exact):
                            finish(0)
                        with m.Else():
                            # a partial row completed; with exact the rows up to n too
                            m.d.sync += [bad.eq(1), part.eq(~row_end),
                                         pad_to.eq(Mux(cmd.exact, cmd.n, r + 1)),
                                         r.eq(Mux(row_end, r + 1, r))]
                            m.next = "PAD"
            with m.State("PAD"):
                done = row_end & (r + 1 == pad_to)
                m.d.comb += [o.valid.eq(1), o.payload.last.eq(done)]
                with m.If(o.ready):
                    m.d.sync += c.eq(nxt_c)
                    with m.If(row_end):
                        m.d.sync += r.eq(r + 1)
                    with m.If(done):
                        finish(bad)
            with m.State("SKIP"):
                m.d.comb += i.ready.eq(1)
                with m.If(i.valid & i.payload.last):
                    finish(1)
            with m.State("DROP"):
                m.d.comb += i.ready.eq(1)
                with m.If(i.valid & i.payload.last):
                    m.next = "IDLE"
            with m.State("RES"):
                # a completed partial row (the block's last) is not visible: it has no score
                m.d.comb += [self.res.valid.eq(1), self.res.payload.rows.eq(r),
                             self.res.payload.visible.eq(
                                 Mux(cmd.gen, r, Mux(part & (vis == r), r - 1, vis)))]
                with m.If(self.res.ready):
                    m.next = "IDLE"
        return m


class KVFeed(wiring.Component):
    """The engine's K and V streams → :class:`~.tile_kv.TileKV`'s ``k``, ``v`` and ``blk``, per
    job (:func:`feed_job_layout`, one record on ``kjob`` and one on ``vjob``) its blocks in
    order.

    K: per block of a kept job, its ``rows`` (``heads``) to ``blk``, then its K rows through a
    :class:`BlockShaper` capped at ``max_block`` rows; the block's ``rows`` and ``visible``
    out on ``blocks`` (and into a FIFO of ``bv_depth`` for V). V: per block the V rows through
    a second shaper, exactly the K block's row count (a MAX job: that many zero rows). A
    rejected job's K blocks and (unless MAX) V blocks are consumed and dropped.

    Members
    -------
    kjob, vjob : In(stream.Signature(feed_job_layout(max_heads)))
    k, v : In(stream.Signature(kv_beat_layout(lanes))) — the engine's.
    tk, tv : Out(the same) — TileKV's ``k``, ``v``.
    blk : Out(stream.Signature(kv_rows_layout(max_heads))) — TileKV's ``blk``.
    blocks : Out(stream.Signature(block_count_layout(max_block)))
        A kept block's rows and visible rows, once its K rows are in (the query rows' issue).
    block, err : Out(1) — strobes: a kept block's K rows done; a malformed K or V block.
    busy : Out(1)
    """

    def __init__(self, head_dim: int, lanes: int, max_heads: int, max_block: int,
                 bv_depth: int = 4):
        self.head_dim, self.lanes, self.max_heads = head_dim, lanes, max_heads
        self.max_block, self.bv_depth = max_block, bv_depth
        beat = stream.Signature(kv_beat_layout(lanes))
        job = stream.Signature(feed_job_layout(max_heads))
        super().__init__({
            "kjob": In(job), "vjob": In(job), "k": In(beat), "v": In(beat),
            "tk": Out(beat), "tv": Out(beat),
            "blk": Out(stream.Signature(kv_rows_layout(max_heads))),
            "blocks": Out(stream.Signature(block_count_layout(self.max_block))),
            "block": Out(1), "err": Out(1), "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        D, L, T = self.head_dim, self.lanes, self.max_block
        m.submodules.ks = ks = BlockShaper(D, L, T)
        m.submodules.vs = vs = BlockShaper(D, L, T)
        clay = block_count_layout(T)
        m.submodules.bv = bv = fifo.SyncFIFOBuffered(width=clay.size, depth=self.bv_depth)
        for sh, src, dst in ((ks, self.k, self.tk), (vs, self.v, self.tv)):
            wiring.connect(m, wiring.flipped(src), sh.i)
            wiring.connect(m, sh.o, wiring.flipped(dst))
        # a kept K block's counts: to the query issue and to the V side together
        both = self.blocks.ready & bv.w_rdy
        m.d.comb += [self.blocks.payload.eq(ks.res.payload), bv.w_data.eq(ks.res.payload),
                     self.blocks.valid.eq(ks.res.valid & bv.w_rdy),
                     bv.w_en.eq(ks.res.valid & both), ks.res.ready.eq(both),
                     self.block.eq(ks.res.valid & both), self.err.eq(ks.err | vs.err)]
        vs_res = vs.res
        m.d.comb += vs_res.ready.eq(1)

        busy = []
        for name, sh in (("k", ks), ("v", vs)):
            jq = getattr(self, f"{name}job")
            job = Signal(jq.payload.shape(), name=f"{name}_job")
            left = Signal(16, name=f"{name}_left")
            busy.append(left != 0)
            sc = sh.cmd.payload
            m.d.comb += jq.ready.eq(left == 0)
            with m.If(jq.valid & jq.ready):
                p = jq.payload
                # a rejected MAX job's V: none comes
                n = Mux(p.drop & p.max, 0, p.n_blocks) if name == "v" else p.n_blocks
                m.d.sync += [job.eq(p), left.eq(n)]
            m.d.comb += [sc.drop.eq(job.drop), sc.causal.eq(job.causal),
                         sc.q_pos.eq(job.q_pos)]
            if name == "k":
                m.d.comb += [sc.n.eq(T), self.blk.payload.rows.eq(job.heads),
                             sh.cmd.valid.eq((left != 0) & (job.drop | self.blk.ready)),
                             self.blk.valid.eq((left != 0) & ~job.drop & sh.cmd.ready)]
            else:
                cnt = data.View(clay, bv.r_data)
                m.d.comb += [sc.n.eq(cnt.rows), sc.exact.eq(1), sc.gen.eq(job.max),
                             sh.cmd.valid.eq((left != 0) & (job.drop | bv.r_rdy)),
                             bv.r_en.eq((left != 0) & ~job.drop & sh.cmd.ready)]
            with m.If(sh.cmd.valid & sh.cmd.ready):
                m.d.sync += left.eq(left - 1)
        m.d.comb += self.busy.eq(busy[0] | busy[1] | bv.r_rdy)
        return m
