"""Output side of the attention engine (paper §5): the ``o / l`` normaliser
(:func:`mcf.abi.softmax.normalize`, bit for bit) and the packer of 32-bit words into payload
beats (:func:`mcf.abi.framing.beat_layout`)."""

from __future__ import annotations

from amaranth import Array, Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from mcf.abi.framing import beat_layout
from mcf.abi.softmax import LANE_BITS, RECIP_IN_BITS

from .fixed_ops import round_shift_var, sat
from .recip import Recip

__all__ = ["Normalizer", "WordPacker", "word_layout"]


def word_layout() -> data.StructLayout:
    """A 32-bit payload word; ``last`` ends its payload."""
    return data.StructLayout({"word": unsigned(LANE_BITS), "last": unsigned(1)})


class Normalizer(wiring.Component):
    """``o / l``: ``l`` normalised by its leading one (truncated to RECIP_IN_BITS), its
    reciprocal ``r`` (:class:`Recip`), then per word ``sat32(round(o·r >> e))``.

    Members
    -------
    l : In(unsigned(32))
        The head's ``l``, stable from ``start`` until ``done``.
    start : In(1)
    done : Out(1)
        :data:`LATENCY` cycles after ``start``; the factors are then held until the next start.
    x : In(signed(32))
        An ``o`` word.
    y : Out(unsigned(32))
        ``o / l`` of the ``x`` presented :data:`WORD_LATENCY` cycles earlier (0 when ``l = 0``).
    """

    LATENCY = Recip.LATENCY
    WORD_LATENCY = 1

    def __init__(self):
        super().__init__({
            "l": In(unsigned(LANE_BITS)), "start": In(1), "done": Out(1),
            "x": In(signed(LANE_BITS)), "y": Out(unsigned(LANE_BITS)),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.recip = recip = Recip()
        lead = Signal(range(LANE_BITS))
        for n in range(LANE_BITS):
            with m.If(self.l[n]):
                m.d.comb += lead.eq(n)
        m.d.comb += recip.x.eq(((self.l << (RECIP_IN_BITS - 1)) >> lead)[:RECIP_IN_BITS])
        e = Signal(range(LANE_BITS))
        zero = Signal()
        r = Signal(RECIP_IN_BITS + 1)
        with m.If(self.start):
            m.d.sync += [e.eq(lead), zero.eq(self.l == 0)]
        pend = Signal(self.LATENCY)
        m.d.sync += pend.eq(Cat(self.start, pend[:-1]))
        m.d.comb += self.done.eq(pend[-1])
        with m.If(self.done):
            m.d.sync += r.eq(recip.r)
        prod = Signal(signed(LANE_BITS + RECIP_IN_BITS + 2))
        m.d.sync += prod.eq(self.x * r)
        m.d.comb += self.y.eq(Mux(zero, 0, sat(round_shift_var(prod, e, 63), LANE_BITS, True)))
        return m


class WordPacker(wiring.Component):
    """32-bit words → ``data_width`` payload beats, through a FIFO of ``depth`` words.

    Members
    -------
    i : In(stream.Signature(word_layout()))
    level : Out(range(depth + 1))
        Words in the FIFO (producers that cannot stall check space before issuing).
    o : Out(stream.Signature(beat_layout(data_width)))
        Beats of ``data_width/32`` words, little-endian; a word with ``last`` closes its beat
        (``keep`` = the bytes of the words it holds) and carries ``last``.

    Latency: a word reaches ``o`` 2 cycles after it enters ``i`` at the earliest. ``o`` raises
    ``valid`` without waiting for ``ready`` and holds the beat.
    """

    def __init__(self, data_width: int, depth: int):
        if data_width % LANE_BITS:
            raise ValueError("data_width must be a multiple of 32")
        self.data_width, self.depth = data_width, depth
        super().__init__({
            "i": In(stream.Signature(word_layout())),
            "level": Out(range(depth + 1)),
            "o": Out(stream.Signature(beat_layout(data_width))),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.fifo = fifo = SyncFIFOBuffered(width=word_layout().size, depth=self.depth)
        m.d.comb += [fifo.w_data.eq(self.i.payload), fifo.w_en.eq(self.i.valid),
                     self.i.ready.eq(fifo.w_rdy), self.level.eq(fifo.level)]
        WPB = self.data_width // LANE_BITS
        buf = Array(Signal(LANE_BITS, name=f"pk{n}") for n in range(WPB))
        cnt = Signal(range(WPB + 1))
        full = Signal()
        last = Signal()
        keep = Array(Const((1 << (4 * n)) - 1, self.data_width // 8) for n in range(WPB + 1))
        m.d.comb += [
            self.o.valid.eq(full), self.o.payload.data.eq(Cat(*buf)),
            self.o.payload.last.eq(last), self.o.payload.keep.eq(keep[cnt]),
            fifo.r_en.eq(~full),
        ]
        rd = word_layout()(fifo.r_data)
        with m.If(full), m.If(self.o.ready):
            m.d.sync += [full.eq(0), cnt.eq(0)]
        with m.Elif(fifo.r_rdy):
            m.d.sync += [buf[cnt].eq(rd.word), cnt.eq(cnt + 1), last.eq(rd.last)]
            with m.If(rd.last | (cnt == WPB - 1)):
                m.d.sync += full.eq(1)
        return m
