"""The store-and-forward receive buffer of the link receivers: a frame's entries are written as
they arrive and become readable only when the frame is committed; a dropped frame's entries are
rolled back. Used by :class:`mcf.hdl.nic.link.LinkRx` (link frames, ``beat_layout`` beats) and
:class:`mcf.hdl.eth.encap.EthDecap` (Ethernet frames, bytes); each makes its own verdict.
(:class:`mcf.hdl.packet.packet_buffer.PacketBuffer`, the parser's, differs: an output register,
one cycle later, and commit / roll back to the write pointer only.)
"""

from __future__ import annotations

from amaranth import Module, Mux
from amaranth.lib import stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

__all__ = ["RxFrameBuffer"]


class RxFrameBuffer(wiring.Component):
    """``depth`` entries of ``shape`` (``depth`` a power of 2) with a write, a commit and a
    read pointer of ``log2(depth) + 1`` bits each.

    Members
    -------
    w_en, w_data : In(1), In(shape)
        Write ``w_data`` at ``wr`` and advance ``wr`` by one.
    wr_load, wr_to : In(1), In(pointer)
        ``wr := wr_to`` (roll back to ``commit``, or skip); wins over ``w_en``'s advance.
    commit_load, commit_to : In(1), In(pointer)
        ``commit := commit_to``: the entries up to it become readable.
    wr, commit, rd : Out(pointer)
        The pointers (registers).
    level : Out(pointer)
        ``wr - rd``: entries held, committed or not (``depth``: full).
    o : Out(stream.Signature(shape))
        The committed entries in order, first-word-fall-through over the synchronous read
        port (transparent for the write port).

    Latency: an entry committed in cycle t is offered in cycle t + 1; one entry per cycle.
    """

    def __init__(self, shape, depth: int):
        if depth < 2 or depth & (depth - 1):
            raise ValueError("depth must be a power of 2")
        self._shape = shape
        self._depth = depth
        ptr = (depth - 1).bit_length() + 1
        super().__init__({
            "w_en": In(1), "w_data": In(shape),
            "wr_load": In(1), "wr_to": In(ptr),
            "commit_load": In(1), "commit_to": In(ptr),
            "wr": Out(ptr), "commit": Out(ptr), "rd": Out(ptr), "level": Out(ptr),
            "o": Out(stream.Signature(shape)),
        })

    def elaborate(self, platform):
        m = Module()
        o, wr, rd = self.o, self.wr, self.rd
        abits = (self._depth - 1).bit_length()
        m.submodules.buf = buf = Memory(shape=self._shape, depth=self._depth, init=[])
        wp = buf.write_port()
        rp = buf.read_port(transparent_for=(wp,))

        o_fire = o.valid & o.ready
        m.d.comb += [o.valid.eq(rd != self.commit), o.payload.eq(rp.data),
                     rp.addr.eq(Mux(o_fire, rd + 1, rd)[:abits]),
                     self.level.eq((wr - rd)[:abits + 1]),
                     wp.addr.eq(wr[:abits]), wp.data.eq(self.w_data), wp.en.eq(self.w_en)]
        with m.If(o_fire):
            m.d.sync += rd.eq(rd + 1)
        with m.If(self.w_en):
            m.d.sync += wr.eq(wr + 1)
        with m.If(self.wr_load):
            m.d.sync += wr.eq(self.wr_to)
        with m.If(self.commit_load):
            m.d.sync += self.commit.eq(self.commit_to)
        return m
