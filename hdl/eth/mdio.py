"""An IEEE 802.3 clause 22 MDIO station for one PHY (issue #36; :mod:`mcf.abi.mdio`,
docs/eth.md "PHY management (MDIO)")."""

from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.cdc import FFSynchronizer
from amaranth.lib.wiring import In, Out

from mcf.abi.csrmap import COUNTER_BITS
from mcf.abi.mdio import FRAME_BITS, MDC_HALF_PERIOD, READ_DRIVEN_BITS, frame_word

__all__ = ["MdioMaster"]

_SAMPLED = 17                   # the second TA bit and the 16 data bits: the last 17 samples


class MdioMaster(wiring.Component):
    """One clause 22 frame at a time on one MDC/MDIO pair, all in aclk (``sync``).

    Members
    -------
    start : ``In(1)`` — with ``read``, ``phy`` ``In(5)``, ``reg`` ``In(5)``, ``wdata``
        ``In(16)``: begin a frame at this edge (ignored and counted in ``cmd_busy`` while
        ``busy``).
    busy : ``Out(1)`` — a frame is under way (from the edge after ``start``).
    done : ``Out(1)`` — the last frame has ended; cleared by the next ``start``.
    rdata : ``Out(16)`` — the last read's data (``0xFFFF`` if nobody answered), held.
    no_answer : ``Out(1)`` — the last read sampled its second TA bit high (0 after a write).
    reads / writes / no_answers / cmd_busy : ``Out(32)`` — counters (wrapping): frames begun,
        reads ended with ``no_answer``, commands ignored while busy.
    mdc : ``Out(1)`` — the management clock, low while idle.
    mdio_o / mdio_oe : ``Out(1)`` — the MDIO driver (the pin's output buffer enable).
    mdio_i : ``In(1)`` — the MDIO pin (pulled up on the board), synchronised here (2 flops).

    Timing (``H = half_period``, :data:`mcf.abi.mdio.MDC_HALF_PERIOD` by default): bit ``k``
    of :func:`mcf.abi.mdio.frame_word` (k = 0 the first on the wire) occupies cycles
    ``2Hk .. 2Hk + 2H - 1`` after the ``start`` edge; MDC is low for the first ``H`` of them
    and high for the next ``H`` (period ``2H`` aclk cycles); ``mdio_o``/``mdio_oe`` change with
    MDC's falling edge (setup and hold ``H`` cycles at the PHY). MDIO is sampled at cycle
    ``H - 1`` of each bit, just before MDC rises (the synchronised value, 2 cycles older). In a
    read ``mdio_oe`` is low from bit 46 (TA) on. ``busy`` falls and ``done``/``rdata``/
    ``no_answer`` update ``64 x 2H`` cycles after ``start``; a new ``start`` is taken the
    same cycle ``busy`` is low.
    """

    def __init__(self, half_period: int = MDC_HALF_PERIOD):
        if half_period < 2:
            raise ValueError(f"MDC half period {half_period} aclk cycles: at least 2 "
                             "(the input synchroniser's 2-cycle lag must end before sampling)")
        self.half_period = half_period
        super().__init__({
            "start": In(1), "read": In(1), "phy": In(5), "reg": In(5), "wdata": In(16),
            "busy": Out(1), "done": Out(1), "rdata": Out(16), "no_answer": Out(1),
            "reads": Out(COUNTER_BITS), "writes": Out(COUNTER_BITS),
            "no_answers": Out(COUNTER_BITS), "cmd_busy": Out(COUNTER_BITS),
            "mdc": Out(1), "mdio_o": Out(1), "mdio_oe": Out(1), "mdio_i": In(1),
        })

    def elaborate(self, platform):
        m = Module()
        h = self.half_period
        mdio_in = Signal(init=1)
        m.submodules.mdio_sync = FFSynchronizer(self.mdio_i, mdio_in, init=1)

        shift = Signal(FRAME_BITS)          # bit 63 is on the wire
        phase = Signal(range(2 * h))
        bits = Signal(range(FRAME_BITS))
        sampled = Signal(_SAMPLED)
        is_read = Signal()

        m.d.comb += [self.mdc.eq(self.busy & (phase >= h)),
                     self.mdio_o.eq(shift[-1]), self.mdio_oe.eq(
                         self.busy & (~is_read | (bits < READ_DRIVEN_BITS)))]

        # the frame word with its fields in place: frame_word(read, 0, 0) | fields
        write_word = Cat(self.wdata, Const(0, 2), self.reg, self.phy) | frame_word(False, 0, 0)
        read_word = Cat(Const(0, 18), self.reg, self.phy) | frame_word(True, 0, 0)

        with m.If(self.busy):
            with m.If(self.start):
                m.d.sync += self.cmd_busy.eq(self.cmd_busy + 1)
            m.d.sync += phase.eq(phase + 1)
            with m.If(phase == h - 1):
                m.d.sync += sampled.eq(Cat(mdio_in, sampled[:-1]))
            with m.If(phase == 2 * h - 1):
                m.d.sync += [phase.eq(0), bits.eq(bits + 1),
                             shift.eq(shift << 1)]
                with m.If(bits == FRAME_BITS - 1):
                    ta = sampled[-1]
                    m.d.sync += [self.busy.eq(0), self.done.eq(1),
                                 self.no_answer.eq(is_read & ta)]
                    with m.If(is_read):
                        m.d.sync += self.rdata.eq(sampled[:16])
                        with m.If(ta):
                            m.d.sync += self.no_answers.eq(self.no_answers + 1)
        with m.Elif(self.start):
            m.d.sync += [
                self.busy.eq(1), self.done.eq(0), phase.eq(0), bits.eq(0),
                is_read.eq(self.read),
                shift.eq(Mux(self.read, read_word, write_word)),
            ]
            with m.If(self.read):
                m.d.sync += self.reads.eq(self.reads + 1)
            with m.Else():
                m.d.sync += self.writes.eq(self.writes + 1)
        return m
