"""The output stage of the tiled prefill (issue #33; paper §5): a row's merged state
``(m, l, o)`` (:class:`~.tile_merge.TileMerge`'s ``o``) → ``o / l`` in the PREFILL output format
(:data:`mcf.abi.kv.ATTN_OUT` codes), :func:`mcf.abi.softmax.normalize` bit for bit — the
arithmetic of :class:`~.attn_out.Normalizer` (the reciprocal :class:`~.recip.Recip` of ``l``
normalised by its leading one, then ``sat32(round(o·r >> e))``), ``lanes`` channels per cycle.
"""

from __future__ import annotations

from amaranth import Cat, Module, Mux, Signal, signed
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.attn_tile import merge_out_layout, norm_beat_layout
from mcf.abi.kv import ATTN_OUT
from mcf.abi.softmax import RECIP_IN_BITS, STATE_L, STATE_O

from .fixed_ops import round_shift_var, sat
from .recip import Recip

__all__ = ["TileNormalize"]


class TileNormalize(wiring.Component):
    """``o / l`` of a merged row, ``lanes`` channels per cycle, through one :class:`Recip`.

    A row is taken into a register; ``l``'s leading one ``e`` and the normalised mantissa go to
    the reciprocal (:data:`Recip.LATENCY` cycles); then per word of ``lanes`` channels (picked
    from the held row by a tree of 2:1 multiplexers on the word counter) the products ``o·r``
    (registered, one DSP product per lane) and ``sat(round_half_up(o·r, e))`` (0 when
    ``l = 0``) go out as a beat — the two stages wait while a beat is not taken.

    Members
    -------
    i : In(stream.Signature(merge_out_layout(head_dim, rows)))
        A row's merged ``(m, l, o)`` and its row; ready while no row is in work.
    o : Out(stream.Signature(norm_beat_layout(lanes, rows)))
        The row's ``o / l``, ``head_dim/lanes`` beats of ``lanes`` channels (``lanes · 32``
        bits: 128 at 4 lanes, a DMA beat).

    Rate: one row per ``head_dim/lanes + LATENCY + 2`` cycles (:meth:`row_cycles`: 37 at
    ``head_dim`` 128 and 4 lanes, within TileMerge's 38), while ``o`` is taken. Latency: a
    row's first beat valid ``LATENCY + 3`` cycles after the cycle it is taken in, its last
    :meth:`row_cycles` cycles after (both measured in ``tests/test_tile_prefill.py``).
    """

    LATENCY = Recip.LATENCY

    def __init__(self, head_dim: int = 128, rows: int = 64, lanes: int = 4):
        if head_dim % lanes:
            raise ValueError("lanes must divide head_dim")
        self.head_dim, self.rows, self.lanes = head_dim, rows, lanes
        super().__init__({
            "i": In(stream.Signature(merge_out_layout(head_dim, rows))),
            "o": Out(stream.Signature(norm_beat_layout(lanes, rows))),
        })

    def row_cycles(self) -> int:
        """Cycles per row at full rate."""
        return self.head_dim // self.lanes + self.LATENCY + 2

    def elaborate(self, platform):
        m = Module()
        D, L = self.head_dim, self.lanes
        NW = D // L
        W = STATE_L.width
        m.submodules.recip = recip = Recip()
        i, o = self.i, self.o

        # ---- take a row: l's leading one, the normalised mantissa ----------------------------
        busy = Signal()
        lo = Signal(D * STATE_O.width)
        row = Signal.like(o.payload.row)
        e = Signal(range(W))
        zero = Signal()
        xn = Signal(RECIP_IN_BITS)
        lead = Signal(range(W))
        for n in range(W):
            with m.If(i.payload.state.l[n]):
                m.d.comb += lead.eq(n)
        m.d.comb += [i.ready.eq(~busy), recip.x.eq(xn)]
        c = Signal(range(self.LATENCY + NW + 2))
        with m.If(i.valid & i.ready):
            m.d.sync += [busy.eq(1), c.eq(0), lo.eq(i.payload.state.o.as_value()),
                         row.eq(i.payload.row), e.eq(lead), zero.eq(i.payload.state.l == 0),
                         xn.eq(((i.payload.state.l << (RECIP_IN_BITS - 1)) >> lead)
                               [:RECIP_IN_BITS])]

        # ---- per word: o·r (registered), then the rounding shift into the output beat --------
        # recip.r is valid from c = LATENCY (xn is held); word w's products at c = LATENCY + w,
        # its beat at c = LATENCY + w + 1; both stages wait while a beat is not taken
        w = Signal(range(NW + 1))
        m.d.comb += w.eq(c - self.LATENCY)
        run = busy & ((c < self.LATENCY) | ~o.valid | o.ready)
        # the row's o is held as taken (no load/shift multiplexer per bit); word w is picked by a
        # binary tree of 2:1 multiplexers on w's bits
        words = [lo.word_select(n, L * STATE_O.width) for n in range(NW)]
        for b in range((NW - 1).bit_length()):
            words = [Mux(w[b], words[min(2 * n + 1, len(words) - 1)], words[2 * n])
                     for n in range((len(words) + 1) // 2)]
        word = words[0]
        prod = [Signal(signed(STATE_O.width + RECIP_IN_BITS + 2), name=f"prod{j}")
                for j in range(L)]
        with m.If(o.valid & o.ready):
            m.d.sync += o.valid.eq(0)
        with m.If(run):
            m.d.sync += c.eq(c + 1)
            with m.If((c >= self.LATENCY) & (w < NW)):
                m.d.sync += [prod[j].eq(word.word_select(j, STATE_O.width).as_signed() * recip.r)
                             for j in range(L)]
            with m.If(c >= self.LATENCY + 1):
                y = [Mux(zero, 0, sat(round_shift_var(prod[j], e, W - 1), ATTN_OUT.width, True))
                     for j in range(L)]
                m.d.sync += [o.payload.o.as_value().eq(Cat(*y)), o.valid.eq(1),
                             o.payload.row.eq(row), o.payload.last.eq(w == NW)]
                with m.If(w == NW):
                    m.d.sync += busy.eq(0)
        return m
