"""Ping-pong (double) buffer between the DMA loader and a kernel (paper §5, Fig. 2: "the memory
frontend streams local chunks through ping-pong buffers"): one bank fills from the read stream
while the kernel reads the other at random addresses."""

from __future__ import annotations

from amaranth import Module, Mux, Signal, unsigned
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["PingPongBuffer", "fill_layout"]

COUNTER_BITS = 32


def fill_layout(width: int) -> data.StructLayout:
    return data.StructLayout({"data": unsigned(width), "last": unsigned(1)})


class PingPongBuffer(wiring.Component):
    """Two banks of ``depth`` words of ``width`` bits (BRAM/URAM).

    Members
    -------
    w : In(stream.Signature(fill_layout))
        Fill stream; a block ends with ``last`` (or when a bank is full: the words up to
        ``last`` are then dropped and counted in ``overflow``). ``w.ready`` is low while both
        banks hold unreleased blocks.
    r_valid : Out(1)
        The read bank holds a complete block of ``r_len`` words.
    r_addr : In, r_data : Out
        Random read of the read bank; ``r_data`` is valid one cycle after ``r_addr``.
    r_release : In(1)
        Pulse: the kernel is done with the read bank; it is refilled, reading moves on.
    overflow, blocks : Out
        Words dropped (blocks longer than ``depth``), blocks completed.

    Latency: a block is readable the cycle after its ``last`` word is written; read data one
    cycle after the address. A full bank frees on the cycle after ``r_release``.
    """

    def __init__(self, width: int, depth: int):
        self.width, self.depth = width, depth
        super().__init__({
            "w": In(stream.Signature(fill_layout(width))),
            "r_valid": Out(1), "r_len": Out(range(depth + 1)),
            "r_addr": In(range(depth)), "r_data": Out(width), "r_release": In(1),
            "overflow": Out(COUNTER_BITS), "blocks": Out(COUNTER_BITS),
        })

    def elaborate(self, platform):
        m = Module()
        D = self.depth
        m.submodules.mem = mem = memory.Memory(shape=unsigned(self.width), depth=2 * D, init=[])
        wp = mem.write_port()
        rp = mem.read_port()
        full = Signal(2)
        lens = [Signal(range(D + 1), name=f"len{i}") for i in range(2)]
        wb = Signal()
        rb = Signal()
        cnt = Signal(range(D + 1))
        m.d.comb += self.w.ready.eq(~full.bit_select(wb, 1))
        m.d.comb += [wp.addr.eq(cnt + Mux(wb, D, 0)), wp.data.eq(self.w.payload.data)]
        with m.If(self.w.valid & self.w.ready):
            with m.If(cnt < D):
                m.d.comb += wp.en.eq(1)
                m.d.sync += cnt.eq(cnt + 1)
            with m.Else():
                m.d.sync += self.overflow.eq(self.overflow + 1)
            with m.If(self.w.payload.last):
                new_len = Mux(cnt < D, cnt + 1, D)
                m.d.sync += [full.bit_select(wb, 1).eq(1), wb.eq(~wb), cnt.eq(0),
                             self.blocks.eq(self.blocks + 1)]
                with m.If(wb):
                    m.d.sync += lens[1].eq(new_len)
                with m.Else():
                    m.d.sync += lens[0].eq(new_len)
        m.d.comb += [self.r_valid.eq(full.bit_select(rb, 1)),
                     self.r_len.eq(Mux(rb, lens[1], lens[0])),
                     rp.addr.eq(self.r_addr + Mux(rb, D, 0)), self.r_data.eq(rp.data)]
        with m.If(self.r_release & self.r_valid):
            m.d.sync += [full.bit_select(rb, 1).eq(0), rb.eq(~rb)]
        return m
