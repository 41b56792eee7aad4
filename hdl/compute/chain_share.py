"""One tiled chain for both ATTEND executors (issue #33; docs/attention.md "The engine on the
arrays"): :class:`~.tile_prefill.TilePrefill`'s TileFold, TileKV and ArrayAttention (in today's
``w``, the prefill's rows in P8 by their ``p8`` flag) serve an
:class:`~.array_engine.ArrayEngine` built without a chain of its own (``inner = False``) — the
node runs one ATTEND record at a time, so a select (``sel``: the tiled prefill's record) steers
the chain's inputs and output between the two, as the KV reader is steered.
"""

from __future__ import annotations

from amaranth import Module, Mux

__all__ = ["pick", "share_chain"]


def _copy(m: Module, dst, src, cond):
    """``dst``'s payload fields from ``src``'s of the same names where ``cond`` (others 0)."""
    names = {n for n, _ in src.payload.shape()}
    with m.If(cond):
        m.d.comb += [getattr(dst.payload, n).eq(getattr(src.payload, n))
                     for n, _ in dst.payload.shape() if n in names]


def pick(m: Module, sel, a, b, dst):
    """Stream ``a`` (``sel``) or ``b`` (not ``sel``) into ``dst``, field by field; the other
    source waits (ready low)."""
    _copy(m, dst, a, sel)
    _copy(m, dst, b, ~sel)
    m.d.comb += [dst.valid.eq(Mux(sel, a.valid, b.valid)), a.ready.eq(sel & dst.ready),
                 b.ready.eq(~sel & dst.ready)]


def split(m: Module, sel, src, a, b):
    """Stream ``src`` to ``a`` (``sel``) or ``b`` (not ``sel``), field by field."""
    _copy(m, a, src, 1)
    _copy(m, b, src, 1)
    m.d.comb += [a.valid.eq(src.valid & sel), b.valid.eq(src.valid & ~sel),
                 src.ready.eq(Mux(sel, a.ready, b.ready))]


def share_chain(m: Module, sel, *, k, v, query_rows, query_blk, fold_in, kv, att_out, norm_in,
                engine):
    """The chain's inputs and output steered: TileFold's rows from TileQuery (``sel``, in P8)
    or the engine; TileKV's K and V beats from the KV reader's ``k``, ``v`` (``sel``) or
    through the engine's feed, its block rows from TileQuery or the engine; the merged rows to
    TileNormalize (``sel``) or the engine's output."""
    pick(m, sel, query_rows, engine.rows, fold_in)
    m.d.comb += fold_in.payload.p8.eq(sel)
    for src, eng_in, eng_out, dst in ((k, engine.k, engine.tk, kv.k),
                                      (v, engine.v, engine.tv, kv.v)):
        # the reader's beats: straight into TileKV, or into the engine's feed and out of it
        m.d.comb += [eng_in.payload.eq(src.payload), eng_in.valid.eq(src.valid & ~sel),
                     dst.valid.eq(Mux(sel, src.valid, eng_out.valid)),
                     dst.payload.eq(Mux(sel, src.payload.as_value(),
                                        eng_out.payload.as_value())),
                     src.ready.eq(Mux(sel, dst.ready, eng_in.ready)),
                     eng_out.ready.eq(~sel & dst.ready)]
    pick(m, sel, query_blk, engine.blk, kv.blk)
    split(m, sel, att_out, norm_in, engine.merged)
