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

from mcf.abi.attn_tile import merge_beat_layout, norm_beat_layout
from mcf.abi.kv import ATTN_OUT
from mcf.abi.softmax import RECIP_IN_BITS, STATE_L, STATE_O

from .fixed_ops import round_shift_var, sat
from .recip import Recip

__all__ = ["TileNormalize"]


class TileNormalize(wiring.Component):
    """``o / l`` of a merged row, ``lanes`` channels per cycle, through one :class:`Recip`.

    A row's first beat is held while ``l``'s leading one ``e`` and the normalised mantissa go
    to the reciprocal (:data:`Recip.LATENCY` cycles); then per beat of ``lanes`` channels the
    products ``o·r`` (registered, one DSP product per lane, ``e`` beside them) and
    ``sat(round_half_up(o·r, e))`` (0 when ``l = 0``) go out as a beat — the two stages wait
    while a beat is not taken.

    Members
    -------
    i : In(stream.Signature(merge_beat_layout(lanes, rows)))
        A row's merged ``(m, l, o)`` beats (TileMerge's ``o``, built with the same ``lanes``);
        ``l`` is read from the row's first beat.
    o : Out(stream.Signature(norm_beat_layout(lanes, rows)))
        The row's ``o / l``, ``head_dim/lanes`` beats of ``lanes`` channels (``lanes · 32``
        bits: 128 at 4 lanes, a DMA beat).

    Rate: one row per ``head_dim/lanes + LATENCY + 1`` cycles (:meth:`row_cycles`: 36 at
    ``head_dim`` 128 and 4 lanes, within TileMerge's 38) while beats come and go at once.
    Latency: a beat out 2 cycles after it is taken; a row's first beat is taken ``LATENCY + 1``
    cycles after it is valid (both measured in ``tests/test_tile_prefill.py``).
    """

    LATENCY = Recip.LATENCY

    def __init__(self, head_dim: int = 128, rows: int = 64, lanes: int = 4):
        if head_dim % lanes:
            raise ValueError("lanes must divide head_dim")
        self.head_dim, self.rows, self.lanes = head_dim, rows, lanes
        super().__init__({
            "i": In(stream.Signature(merge_beat_layout(lanes, rows))),
            "o": Out(stream.Signature(norm_beat_layout(lanes, rows))),
        })

    def row_cycles(self) -> int:
        """Cycles per row at full rate."""
        return self.head_dim // self.lanes + self.LATENCY + 1

    def elaborate(self, platform):
        m = Module()
        L = self.lanes
        W = STATE_L.width
        m.submodules.recip = recip = Recip()
        i, o = self.i, self.o
        ip = i.payload

        # ---- a row's first beat: l's leading one, the normalised mantissa (the beat waits) ----
        e = Signal(range(W))
        zero = Signal()
        xn = Signal(RECIP_IN_BITS)
        lead = Signal(range(W))
        for n in range(W):
            with m.If(ip.state.l[n]):
                m.d.comb += lead.eq(n)
        m.d.comb += recip.x.eq(xn)
        c = Signal(range(self.LATENCY))
        adv = Signal()
        m.d.comb += adv.eq(~o.valid | o.ready)
        with m.FSM():
            with m.State("FIRST"), m.If(i.valid):
                m.d.sync += [c.eq(0), e.eq(lead), zero.eq(ip.state.l == 0),
                             xn.eq(((ip.state.l << (RECIP_IN_BITS - 1)) >> lead)
                                   [:RECIP_IN_BITS])]
                m.next = "RECIP"
            with m.State("RECIP"):
                # recip.r is valid LATENCY cycles after xn is set
                m.d.sync += c.eq(c + 1)
                with m.If(c == self.LATENCY - 1):
                    m.next = "RUN"
            with m.State("RUN"):
                m.d.comb += i.ready.eq(adv)
                with m.If(i.valid & adv & ip.last):
                    m.next = "FIRST"

        # ---- per beat: o·r (registered, with e and the zero flag), then the rounding shift ----
        prod = [Signal(signed(STATE_O.width + RECIP_IN_BITS + 2), name=f"prod{j}")
                for j in range(L)]
        s1, s1_e, s1_zero = Signal(), Signal.like(e), Signal()
        s1_row, s1_last = Signal.like(ip.row), Signal()
        with m.If(o.valid & o.ready):
            m.d.sync += o.valid.eq(0)
        with m.If(adv):
            m.d.sync += [s1.eq(i.valid & i.ready), s1_e.eq(e), s1_zero.eq(zero),
                         s1_row.eq(ip.row), s1_last.eq(ip.last)]
            m.d.sync += [prod[j].eq(ip.state.o[j] * recip.r) for j in range(L)]
            with m.If(s1):
                y = [Mux(s1_zero, 0, sat(round_shift_var(prod[j], s1_e, W - 1), ATTN_OUT.width,
                                         True)) for j in range(L)]
                m.d.sync += [o.payload.o.as_value().eq(Cat(*y)), o.valid.eq(1),
                             o.payload.row.eq(s1_row), o.payload.last.eq(s1_last)]
        return m
