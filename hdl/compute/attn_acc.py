"""A block-accumulator bank of the attention engine's PV side (paper §5): ``words`` accumulator
words with a "reads as zero" flag each, so that clearing a word (job start, after its merge)
sets one flag instead of writing the word's ``lanes · acc_width`` zero bits."""

from __future__ import annotations

from amaranth import Const, Module, Mux, Signal, unsigned
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

__all__ = ["AccBank"]


class AccBank(wiring.Component):
    """One accumulator bank: a memory of ``words`` × ``width`` bits and its zero flags.

    Members
    -------
    rd_addr : In(range(words))
    rd_data : Out(unsigned(width))
        The word at ``rd_addr`` one cycle later — 0 if its flag was set — with the write of the
        ``rd_addr`` cycle seen (read transparent for the write port).
    wr_en, wr_addr, wr_data : In
        Writes a word and clears its flag.
    zero : In(words)
        One bit per word: sets its flag (a word written in the same cycle keeps it clear).

    Latency: one cycle (registered read, registered flag). All flags are set at reset.
    """

    def __init__(self, words: int, width: int):
        self.words, self.width = words, width
        super().__init__({
            "rd_addr": In(range(words)), "rd_data": Out(unsigned(width)),
            "wr_en": In(1), "wr_addr": In(range(words)), "wr_data": In(unsigned(width)),
            "zero": In(words),
        })

    def elaborate(self, platform):
        m = Module()
        AW = self.words
        m.submodules.mem = mem = Memory(shape=unsigned(self.width), depth=AW, init=[])
        wr = mem.write_port()
        rd = mem.read_port(transparent_for=(wr,))
        m.d.comb += [wr.addr.eq(self.wr_addr), wr.data.eq(self.wr_data), wr.en.eq(self.wr_en),
                     rd.addr.eq(self.rd_addr)]
        # the flag is read like the word (registered, transparent); the gate sits on the read
        # data, no write-data multiplexer on the wide port
        zf = Signal(AW, init=(1 << AW) - 1)
        zf_new = Signal(AW)
        zf_q = Signal()
        clr_w = Mux(wr.en, Const(1, AW) << wr.addr, 0)
        m.d.comb += zf_new.eq((zf | self.zero) & ~clr_w)
        m.d.sync += [zf.eq(zf_new), zf_q.eq(zf_new.bit_select(rd.addr, 1))]
        m.d.comb += self.rd_data.eq(Mux(zf_q, 0, rd.data))
        return m
