"""Store-and-forward packet buffer with commit / rollback (paper §5, NIC packet parser).

The parser writes a packet's payload here while it validates it; only when the whole packet has
been checked does it *commit* the words (they become readable) or *roll back* (they vanish, as
if never written). A bad packet therefore never leaks a single beat downstream.
"""

from __future__ import annotations

from amaranth import Module, Mux, Signal, unsigned
from amaranth.lib import memory, stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["PacketBuffer"]


class PacketBuffer(wiring.Component):
    """Circular buffer of ``depth`` words of ``width`` bits with speculative writes.

    Members
    -------
    w_en : In(1), w_data : In(width)
        Write one word at the speculative write pointer. Only honoured while ``w_ready``.
    w_ready : Out(1)
        There is room for one more word (``depth`` minus committed-unread minus speculative).
    commit : In(1)
        Make every word written since the last commit/rollback readable, including a word
        written in the same cycle.
    rollback : In(1)
        Discard every word written since the last commit/rollback, including a word written in
        the same cycle. ``commit`` and ``rollback`` must not be raised together.
    r_stream : Out(stream.Signature(width))
        Committed words in write order.
    level : Out(range(depth + 1))
        Memory words in use (committed not yet read + speculative); a word moved into the
        output register frees its slot.

    Timing
    ------
    A word committed at clock edge ``t`` can transfer on ``r_stream`` at edge ``t + 2`` (the
    memory read is registered). ``r_stream`` sustains one word per cycle; writes one word per
    cycle while ``w_ready``. Backpressure on ``r_stream`` holds its payload stable (the memory
    read port is only enabled when the output is empty or being consumed).
    """

    def __init__(self, width: int, depth: int):
        if depth < 2:
            raise ValueError("depth must be at least 2")
        self._width = width
        self._depth = depth
        super().__init__({
            "w_en": In(1),
            "w_data": In(width),
            "w_ready": Out(1),
            "commit": In(1),
            "rollback": In(1),
            "r_stream": Out(stream.Signature(unsigned(width))),
            "level": Out(range(depth + 1)),
        })

    @property
    def width(self) -> int:
        return self._width

    @property
    def depth(self) -> int:
        return self._depth

    def elaborate(self, platform):
        m = Module()
        depth = self._depth
        m.submodules.mem = mem = memory.Memory(shape=self._width, depth=depth, init=[])
        wp = mem.write_port()
        rp = mem.read_port(domain="sync")

        # Pointers are kept modulo depth; occupancy counters keep full/empty unambiguous.
        wr_ptr = Signal(range(depth))        # speculative write pointer
        commit_ptr = Signal(range(depth))    # first word of the uncommitted packet
        rd_ptr = Signal(range(depth))        # next word to read from memory
        committed = Signal(range(depth + 1))   # committed words not yet read from memory
        spec = Signal(range(depth + 1))        # speculative words
        m.d.comb += self.level.eq(committed + spec)

        def nxt(ptr):
            return Mux(ptr == depth - 1, 0, ptr + 1)

        do_write = Signal()
        m.d.comb += [
            self.w_ready.eq(self.level < depth),
            do_write.eq(self.w_en & self.w_ready),
            wp.addr.eq(wr_ptr),
            wp.data.eq(self.w_data),
            wp.en.eq(do_write),
        ]

        # Read side: the memory's read register is the output register.
        advance = Signal()
        issue = Signal()
        out = self.r_stream
        m.d.comb += [
            advance.eq(~out.valid | out.ready),
            issue.eq(advance & (committed != 0)),
            rp.addr.eq(rd_ptr),
            rp.en.eq(advance),
            out.payload.eq(rp.data),
        ]
        with m.If(advance):
            m.d.sync += out.valid.eq(issue)
        with m.If(issue):
            m.d.sync += rd_ptr.eq(nxt(rd_ptr))

        wr_next = Signal.like(wr_ptr)
        m.d.comb += wr_next.eq(wr_ptr)
        with m.If(do_write):
            m.d.comb += wr_next.eq(nxt(wr_ptr))

        spec_next = Signal.like(spec)
        m.d.comb += spec_next.eq(spec + do_write)
        with m.If(self.commit):
            m.d.sync += [commit_ptr.eq(wr_next), wr_ptr.eq(wr_next), spec.eq(0)]
        with m.Elif(self.rollback):
            m.d.sync += [wr_ptr.eq(commit_ptr), spec.eq(0)]
        with m.Else():
            m.d.sync += [wr_ptr.eq(wr_next), spec.eq(spec_next)]

        committed_add = Signal.like(spec)
        m.d.comb += committed_add.eq(0)
        with m.If(self.commit):
            m.d.comb += committed_add.eq(spec_next)
        m.d.sync += committed.eq(committed + committed_add - issue)
        return m
