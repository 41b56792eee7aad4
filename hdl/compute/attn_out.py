"""Output side of the attention engine (paper §5): the ``o / l`` normaliser
(:func:`mcf.abi.softmax.normalize`, bit for bit), the packer of 32-bit words into payload
beats (:func:`mcf.abi.framing.beat_layout`) and the job output sequencer around them."""

from __future__ import annotations

from amaranth import Array, Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from mcf.abi.framing import beat_layout
from mcf.abi.kv import AttnMode
from mcf.abi.softmax import LANE_BITS, RECIP_IN_BITS

from .fixed_ops import round_shift_var, sat
from .recip import Recip

__all__ = ["Normalizer", "OutputStage", "WordPacker", "word_layout"]


def word_layout(bits: int = LANE_BITS) -> data.StructLayout:
    """A ``bits``-bit payload word (32 unless said); ``last`` ends its payload."""
    return data.StructLayout({"word": unsigned(bits), "last": unsigned(1)})


class Normalizer(wiring.Component):
    """``o / l``: ``l`` normalised by its leading one (truncated to RECIP_IN_BITS, registered:
    the leading-one search and shift do not reach the reciprocal's table), its reciprocal ``r``
    (:class:`Recip`), then per word ``sat32(round(o·r >> e))``.

    Members
    -------
    l : In(unsigned(32))
        The head's ``l``, stable from ``start`` until ``done``.
    start : In(1)
    done : Out(1)
        :data:`LATENCY` cycles after ``start``; the factors are then held until the next start.
        ``e`` and the zero flag change at the edge after ``start``, ``r`` at ``done``: a word
        presented in the ``start`` cycle or earlier is still divided by the previous ``l``.
    x : In(signed(32))
        An ``o`` word.
    y : Out(unsigned(32))
        ``o / l`` of the ``x`` presented :data:`WORD_LATENCY` cycles earlier (0 when ``l = 0``).
    """

    LATENCY = Recip.LATENCY + 1
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
        xn = Signal(RECIP_IN_BITS)
        with m.If(self.start):
            m.d.sync += xn.eq(((self.l << (RECIP_IN_BITS - 1)) >> lead)[:RECIP_IN_BITS])
        m.d.comb += recip.x.eq(xn)
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
    """``word_bits``-bit words (32, the attention engine's; 16, the KV quantiser's units) →
    ``data_width`` payload beats, through a FIFO of ``depth`` words.

    Members
    -------
    i : In(stream.Signature(word_layout(word_bits)))
    level : Out(range(depth + 1))
        Words in the FIFO (producers that cannot stall check space before issuing).
    o : Out(stream.Signature(beat_layout(data_width)))
        Beats of ``data_width/word_bits`` words, little-endian; a word with ``last`` closes its
        beat (``keep`` = the bytes of the words it holds) and carries ``last``.

    Latency: a word reaches ``o`` 2 cycles after it enters ``i`` at the earliest. ``o`` raises
    ``valid`` without waiting for ``ready`` and holds the beat.
    """

    def __init__(self, data_width: int, depth: int, word_bits: int = LANE_BITS):
        if word_bits % 8 or data_width % word_bits:
            raise ValueError(f"data_width must be a multiple of {word_bits}, whole bytes")
        self.data_width, self.depth, self.word_bits = data_width, depth, word_bits
        super().__init__({
            "i": In(stream.Signature(word_layout(word_bits))),
            "level": Out(range(depth + 1)),
            "o": Out(stream.Signature(beat_layout(data_width))),
        })

    def elaborate(self, platform):
        m = Module()
        wl = word_layout(self.word_bits)
        m.submodules.fifo = fifo = SyncFIFOBuffered(width=wl.size, depth=self.depth)
        m.d.comb += [fifo.w_data.eq(self.i.payload), fifo.w_en.eq(self.i.valid),
                     self.i.ready.eq(fifo.w_rdy), self.level.eq(fifo.level)]
        WPB, WB = self.data_width // self.word_bits, self.word_bits // 8
        buf = Array(Signal(self.word_bits, name=f"pk{n}") for n in range(WPB))
        cnt = Signal(range(WPB + 1))
        full = Signal()
        last = Signal()
        keep = Array(Const((1 << (WB * n)) - 1, self.data_width // 8) for n in range(WPB + 1))
        m.d.comb += [
            self.o.valid.eq(full), self.o.payload.data.eq(Cat(*buf)),
            self.o.payload.last.eq(last), self.o.payload.keep.eq(keep[cnt]),
            fifo.r_en.eq(~full),
        ]
        rd = wl(fifo.r_data)
        with m.If(full), m.If(self.o.ready):
            m.d.sync += [full.eq(0), cnt.eq(0)]
        with m.Elif(fifo.r_rdy):
            m.d.sync += [buf[cnt].eq(rd.word), cnt.eq(cnt + 1), last.eq(rd.last)]
            with m.If(rd.last | (cnt == WPB - 1)):
                m.d.sync += full.eq(1)
        return m


class OutputStage(wiring.Component):
    """Emits a finished job (:func:`mcf.abi.kv.job_out_words` words in
    :func:`mcf.abi.kv.job_payloads` payloads): per head ``m, l, o[head_dim]`` (state), or
    ``o / l`` (``normalize``), or ``m`` alone (MAX), one 32-bit word per cycle through the
    :class:`Normalizer` into a :class:`WordPacker`.

    Members
    -------
    start : In(1)
        Starts a job; ``mode``, ``normalize``, ``heads`` and the head values must hold until
        ``busy`` falls.
    mode : In(AttnMode), normalize : In(1), heads : In(range(max_heads + 1))
    busy : Out(1)
        From the cycle after ``start`` until the job's last word is in the packer.
    h : Out(range(max_heads))
        The head being emitted; ``m_word`` / ``l_word`` are its ``m`` and ``l`` (combinational).
    m_word, l_word : In(unsigned(32))
    addr : Out(range(max_heads · head_dim/lanes))
        Word address of the ``o`` lanes being read; ``o_lanes`` is its data the cycle after.
    o_lanes : In(unsigned(lanes · 32))
    o : Out(stream.Signature(beat_layout(data_width)))

    Latency: per head 6 cycles (the normalised ``l`` and its reciprocal) before its first word;
    words leave at one per cycle while the packer FIFO has room.
    """

    def __init__(self, head_dim: int, lanes: int, max_heads: int, data_width: int,
                 fifo_depth: int = 16):
        self.head_dim, self.lanes, self.max_heads = head_dim, lanes, max_heads
        self.data_width, self.fifo_depth = data_width, fifo_depth
        super().__init__({
            "start": In(1), "mode": In(AttnMode), "normalize": In(1),
            "heads": In(range(max_heads + 1)), "busy": Out(1),
            "h": Out(range(max_heads)),
            "m_word": In(unsigned(LANE_BITS)), "l_word": In(unsigned(LANE_BITS)),
            "addr": Out(range(max_heads * (head_dim // lanes))),
            "o_lanes": In(unsigned(lanes * LANE_BITS)),
            "o": Out(stream.Signature(beat_layout(data_width))),
        })

    def elaborate(self, platform):
        m = Module()
        D, L = self.head_dim, self.lanes
        NB = D // L
        LB = max(0, (L - 1).bit_length())
        m.submodules.norm = nz = Normalizer()
        m.submodules.packer = pk = WordPacker(self.data_width, self.fifo_depth)
        wiring.connect(m, pk.o, wiring.flipped(self.o))

        mh = self.h
        wait = Signal(3)
        widx = Signal(range(D + 3))
        n_words = Signal(range(D + 3))
        o_first = Signal(range(3))     # index of the first o word in a head (2, or 0)
        o_idx = widx - o_first
        issue, last_word = Signal(), Signal()
        w1, w1_last, w1_isO = Signal(), Signal(), Signal()
        w1_val = Signal(LANE_BITS)
        w1_lane = Signal(range(L))
        w2, w2_last, w2_isO = Signal(), Signal(), Signal()
        w2_val = Signal(LANE_BITS)
        w3, w3_last = Signal(), Signal()
        w3_val = Signal(LANE_BITS)
        m.d.sync += [
            w1.eq(issue), w1_last.eq(last_word),
            w1_isO.eq((self.mode != AttnMode.MAX) & (widx >= o_first)),
            w1_val.eq(Mux(widx == 0, self.m_word, self.l_word)),
            w1_lane.eq(o_idx[:max(1, LB)] if L > 1 else 0),
        ]
        w1_o = Array(self.o_lanes[n * LANE_BITS:(n + 1) * LANE_BITS] for n in range(L))[w1_lane]
        m.d.comb += [nz.x.eq(w1_o.as_signed()), nz.l.eq(self.l_word)]
        m.d.sync += [
            w2.eq(w1), w2_last.eq(w1_last), w2_isO.eq(w1_isO),
            w2_val.eq(Mux(w1_isO, w1_o, w1_val)),
            w3.eq(w2), w3_last.eq(w2_last),
            w3_val.eq(Mux(self.normalize & w2_isO, nz.y, w2_val)),
        ]
        m.d.comb += [pk.i.valid.eq(w3), pk.i.payload.word.eq(w3_val),
                     pk.i.payload.last.eq(w3_last),
                     self.addr.eq(mh * NB + (o_idx >> LB))]
        space = pk.level <= self.fifo_depth - 5

        with m.FSM() as fsm:
            with m.State("IDLE"), m.If(self.start):
                m.d.sync += [mh.eq(0), wait.eq(0)]
                m.next = "HEAD"
            with m.State("HEAD"):
                # word count and the reciprocal of l: start in the HEAD's second cycle, when
                # the previous head's last word (issued in the cycle before HEAD) is in the
                # normaliser's output stage, which still uses the old l (Normalizer: e and the
                # zero flag change at the edge after start)
                with m.If(wait != 7):
                    m.d.sync += wait.eq(wait + 1)
                m.d.comb += nz.start.eq(wait == 1)
                with m.If(wait == 0):
                    m.d.sync += widx.eq(0)
                    with m.If(self.mode == AttnMode.MAX):
                        m.d.sync += [n_words.eq(1), o_first.eq(0)]
                    with m.Elif(self.normalize):
                        m.d.sync += [n_words.eq(D), o_first.eq(0)]
                    with m.Else():
                        m.d.sync += [n_words.eq(D + 2), o_first.eq(2)]
                with m.If(nz.done):
                    m.next = "RUN"
            with m.State("RUN"), m.If(space):
                per_head = (self.mode != AttnMode.MAX) & ~self.normalize
                m.d.comb += [issue.eq(1),
                             last_word.eq(((mh == self.heads - 1) | per_head)
                                          & (widx == n_words - 1))]
                m.d.sync += widx.eq(widx + 1)
                with m.If(widx == n_words - 1):
                    with m.If(mh == self.heads - 1):
                        m.next = "DRAIN"
                    with m.Else():
                        m.d.sync += [mh.eq(mh + 1), wait.eq(0)]
                        m.next = "HEAD"
            with m.State("DRAIN"), m.If(~(w1 | w2 | w3)):
                m.next = "IDLE"
        m.d.comb += self.busy.eq(~fsm.ongoing("IDLE"))
        return m
