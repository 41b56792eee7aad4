"""FSM steps the node's units share (called from ``elaborate`` inside a ``with m.State(...)``):
offer one transfer on a stream, present one DMA read descriptor."""

from __future__ import annotations

from amaranth import Module
from amaranth.lib import stream

__all__ = ["dma_read", "offer"]


def offer(m: Module, s: stream.Interface, nxt: str) -> None:
    """In the current FSM state: ``s.valid`` (the payload is the caller's), then go to state
    ``nxt`` the cycle ``s`` takes it (``ready``)."""
    m.d.comb += s.valid.eq(1)
    with m.If(s.ready):
        m.next = nxt


def dma_read(m: Module, desc: stream.Interface, addr, length, nxt: str, *, count=1,
             stride=0) -> None:
    """In the current FSM state: present one descriptor on ``desc`` (a
    :class:`~mcf.hdl.mem.dma.DmaReader`'s: ``count`` rows of ``length`` bytes from ``addr``,
    ``stride`` apart), then go to state ``nxt`` the cycle it is taken. (The constant fields are
    set here, in the state that presents it: a constant-only ``always @*`` never runs in
    Verilator.)"""
    d = desc.payload
    m.d.comb += [desc.valid.eq(1), d.count.eq(count), d.stride.eq(stride),
                 d.addr.eq(addr), d.length.eq(length)]
    with m.If(desc.ready):
        m.next = nxt
