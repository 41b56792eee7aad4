"""A registered stream slice (skid buffer): cuts the combinational paths through a stream
boundary at full throughput (docs/depth.md)."""

from __future__ import annotations

from amaranth import Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["RegisterSlice"]


class RegisterSlice(wiring.Component):
    """One stream in, the same stream out, through a skid buffer.

    Parameters
    ----------
    shape: the payload shape (any ``amaranth`` shape or ``data`` layout).
    forward: ``True`` (default) — a full slice: ``o.valid``, ``o.payload`` and ``i.ready`` are
        all flip-flops. ``False`` — a ready slice: only ``i.ready`` is a flip-flop; ``o`` is
        ``i`` passed through (one 2:1 multiplexer) while the skid register is empty.

    Members
    -------
    ``i``: ``In(stream.Signature(shape))``; ``o``: ``Out(stream.Signature(shape))``.

    Paths cut: ``i.ready`` is the skid register's "empty" flag, so ``o.ready`` never reaches
    ``i.ready`` in the same cycle (both modes); with ``forward`` neither does ``i.valid`` or
    ``i.payload`` reach ``o``. ``o.valid`` never depends on ``o.ready`` and ``o.payload``
    holds while ``o.valid`` and not ``o.ready`` (stream rules), provided ``i`` keeps the same
    rules.

    Latency: ``forward``: 1 cycle (a beat taken at edge ``t`` can transfer on ``o`` at edge
    ``t + 1``); ready slice: 0 (a beat on ``i`` is on ``o`` in the same cycle). Throughput: one
    beat per cycle, no bubble; with ``o.ready`` held high ``i.ready`` stays high. When ``o``
    stalls, the beat taken in that cycle goes into the skid register and ``i.ready`` falls one
    cycle later. Beats leave in order, each exactly once. Cost: ``forward`` 2 × (payload width
    + 1) flip-flops, ready slice payload width + 1.
    """

    def __init__(self, shape, *, forward: bool = True):
        self._shape = shape
        self._forward = forward
        super().__init__({"i": In(stream.Signature(shape)), "o": Out(stream.Signature(shape))})

    @property
    def shape(self):
        return self._shape

    @property
    def forward(self) -> bool:
        return self._forward

    def elaborate(self, platform):
        m = Module()
        i, o = self.i, self.o
        skid_empty = Signal(init=1)             # drives i.ready directly: a flip-flop
        skid = Signal(self._shape, name="skid")
        m.d.comb += i.ready.eq(skid_empty)
        take = i.valid & skid_empty
        if not self._forward:
            m.d.comb += [o.valid.eq(i.valid | ~skid_empty),
                         o.payload.eq(Mux(skid_empty, i.payload, skid))]
            with m.If(o.ready):
                m.d.sync += skid_empty.eq(1)
            with m.Elif(take):                   # stalled: park the beat taken now
                m.d.sync += [skid.eq(i.payload), skid_empty.eq(0)]
            return m
        with m.If(~o.valid | o.ready):          # the main register is free this edge
            with m.If(~skid_empty):
                m.d.sync += [o.payload.eq(skid), o.valid.eq(1), skid_empty.eq(1)]
            with m.Else():
                m.d.sync += o.valid.eq(take)
                with m.If(take):
                    m.d.sync += o.payload.eq(i.payload)
        with m.Elif(take):                       # stalled: park the beat taken now
            m.d.sync += [skid.eq(i.payload), skid_empty.eq(0)]
        return m
