"""The cables of a simulated cluster split so that one simulation per node gives the same cycles
as one simulation of all nodes (issue #14 item 3, docs/cluster.md "MPI co-simulation").

A cable direction is ``LinkModel`` (rate, frame faults, the latency less the lookahead) on the
sender's side, then a pure delay of :func:`lookahead` cycles, then :class:`MacRxBuffer` on the
receiver's side. Nothing flows back: as on the board, where a MAC's receive buffer drops a frame
it has no room for (``EthDecap``), the receiver never stalls the wire. So what a receiver sees is
decided by the sender alone, ``lookahead`` cycles ahead.

In one simulation (:class:`mcf.sim.cluster.ClusterTop`) the delay is :class:`WireDelay`. Split
across simulations (:class:`mcf.sim.cluster.RankTop`) it is :class:`WireCapture` on the sender,
which publishes each window of :class:`WindowTimer` whole as one wide port, and
:class:`WireReplay` on the receiver, which loads a window from one wide port and plays it
back; the host exchanges the windows once per window (:mod:`mcf.sim.benches.grid`). A beat
captured in window ``k`` is read in window ``k + 1`` and replayed in window ``k + 2`` at the
same phase: exactly ``2 * window`` cycles, as :class:`WireDelay` (tested in
``tests/test_wire.py``).
"""

from __future__ import annotations

from amaranth import Cat, Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from mcf.abi.eth import MAC_RX_BUFFER_BYTES
from mcf.abi.framing import beat_layout, max_frame_beats

__all__ = ["MAX_WINDOW", "window_for", "lookahead", "wire_entry", "WindowTimer", "WireDelay",
           "WireCapture", "WireReplay", "MacRxBuffer", "LINK_MODEL_MIN_LATENCY"]

LINK_MODEL_MIN_LATENCY = 2
"""``LinkModel``'s shortest latency in cycles."""

MAX_WINDOW = 31
"""Longest window in cycles: a longer lookahead would only make the wires' registers longer."""


def window_for(latency_cycles: int) -> int:
    """The window of a ring whose links take ``latency_cycles``: the longest (at most
    :data:`MAX_WINDOW`) whose lookahead, two windows, leaves ``LinkModel`` its shortest latency."""
    w = min(MAX_WINDOW, (latency_cycles - LINK_MODEL_MIN_LATENCY) // 2)
    if w < 1:
        raise ValueError(f"a link latency of {latency_cycles} cycles leaves no lookahead "
                         f"(at least {LINK_MODEL_MIN_LATENCY + 2})")
    return w


def lookahead(window: int) -> int:
    """Cycles from a beat leaving ``LinkModel`` to its arrival at the receiver's buffer."""
    return 2 * window


def wire_entry(data_width: int = 64) -> data.StructLayout:
    """What the wire carries in one cycle: ``valid`` and the beat."""
    return data.StructLayout({"valid": 1, "beat": beat_layout(data_width)})


class WindowTimer(wiring.Component):
    """The window grid, from reset.

    Members: ``tick`` — ``Out(1)``, high in the last cycle of each window; ``win`` —
    ``Out(1)``, toggles at the end of each window (what the host waits for); ``cycles`` —
    ``Out(64)``, cycles since reset (the host's clock, read without a coroutine per cycle)."""

    def __init__(self, window: int):
        self.window = window
        super().__init__({"tick": Out(1), "win": Out(1), "cycles": Out(64)})

    def elaborate(self, platform):
        m = Module()
        phase = Signal(range(self.window))
        m.d.comb += self.tick.eq(phase == self.window - 1)
        m.d.sync += [phase.eq(phase + 1), self.cycles.eq(self.cycles + 1),
                     self.win.eq(self.win ^ self.tick)]
        with m.If(self.tick):
            m.d.sync += phase.eq(0)
        return m


class WireDelay(wiring.Component):
    """A wire of ``delay`` cycles (registers): a beat accepted in cycle ``c`` is offered in
    cycle ``c + delay``. ``i.ready`` is always 1 and ``o.ready`` is not looked at (a wire
    cannot wait: the receiver is a :class:`MacRxBuffer`)."""

    def __init__(self, delay: int, data_width: int = 64):
        self.delay = delay
        self._entry = wire_entry(data_width)
        blay = beat_layout(data_width)
        super().__init__({"i": In(stream.Signature(blay)), "o": Out(stream.Signature(blay))})

    def elaborate(self, platform):
        m = Module()
        stages = [Signal(self._entry, name=f"stage{k}") for k in range(self.delay)]
        m.d.comb += self.i.ready.eq(1)
        m.d.sync += stages[0].eq(Cat(self.i.valid, self.i.payload))
        for a, b in zip(stages, stages[1:]):
            m.d.sync += b.eq(a)
        m.d.comb += [self.o.valid.eq(stages[-1].valid), self.o.payload.eq(stages[-1].beat)]
        return m


class WireCapture(wiring.Component):
    """The sender's end of a split wire: records ``window`` cycles of the wire and publishes
    them whole.

    Members: ``i`` — ``In`` stream, always ready; ``tick`` — ``In(1)`` from
    :class:`WindowTimer`; ``window`` — ``Out(window * wire_entry().size)``: the window that
    ended at the last ``tick``, entry ``p`` (bits ``p * size`` up) the wire in phase ``p``.
    Stable for the whole next window."""

    def __init__(self, window: int, data_width: int = 64):
        self.cycles = window
        self._entry = wire_entry(data_width)
        super().__init__({"i": In(stream.Signature(beat_layout(data_width))), "tick": In(1),
                          "window": Out(window * self._entry.size)})

    def elaborate(self, platform):
        m = Module()
        now = Signal(self._entry)
        m.d.comb += [self.i.ready.eq(1), now.eq(Cat(self.i.valid, self.i.payload))]
        older = [Signal(self._entry, name=f"held{k}") for k in range(self.cycles - 1)]
        if older:
            m.d.sync += older[0].eq(now)
            for a, b in zip(older, older[1:]):
                m.d.sync += b.eq(a)
        with m.If(self.tick):             # phase 0 is the oldest
            m.d.sync += self.window.eq(Cat(*reversed(older), now))
        return m


class WireReplay(wiring.Component):
    """The receiver's end of a split wire: loads a window at ``tick`` and plays it back, one
    entry per cycle, in the next window.

    Members: ``window`` — ``In(window * wire_entry().size)`` (written by the host during the
    window before); ``tick`` — ``In(1)``; ``o`` — ``Out`` stream, ``o.ready`` not looked at."""

    def __init__(self, window: int, data_width: int = 64):
        self.cycles = window
        self._entry = wire_entry(data_width)
        super().__init__({"window": In(window * self._entry.size), "tick": In(1),
                          "o": Out(stream.Signature(beat_layout(data_width)))})

    def elaborate(self, platform):
        m = Module()
        size = self._entry.size
        shift = Signal(self.cycles * size)
        head = self._entry(shift[:size])
        m.d.comb += [self.o.valid.eq(head.valid), self.o.payload.eq(head.beat)]
        with m.If(self.tick):
            m.d.sync += shift.eq(self.window)
        with m.Else():
            m.d.sync += shift.eq(shift >> size)
        return m


class MacRxBuffer(wiring.Component):
    """The receiver's MAC buffer (:data:`~mcf.abi.eth.MAC_RX_BUFFER_BYTES`): never stalls the
    wire; a frame whose first beat finds less room than the longest frame is dropped whole and
    counted. Members: ``i`` — ``In`` stream, always ready; ``o`` — ``Out`` stream to the node's
    link receiver; ``dropped`` — ``Out(32)`` frames dropped. Latency: 2 cycles (FIFO)."""

    def __init__(self, data_width: int = 64, depth_bytes: int = MAC_RX_BUFFER_BYTES):
        self._blay = beat_layout(data_width)
        self.depth = depth_bytes // (data_width // 8)
        self.max_frame = max_frame_beats(data_width)
        if self.depth < self.max_frame:
            raise ValueError("the buffer must hold a longest frame")
        super().__init__({"i": In(stream.Signature(self._blay)),
                          "o": Out(stream.Signature(self._blay)), "dropped": Out(32)})

    def elaborate(self, platform):
        m = Module()
        i, o = self.i, self.o
        m.submodules.fifo = fifo = SyncFIFOBuffered(width=self._blay.size, depth=self.depth)
        first = Signal(init=1)
        skip = Signal()
        skip_now = Signal()
        m.d.comb += [i.ready.eq(1),
                     skip_now.eq(first & (fifo.level > self.depth - self.max_frame)
                                 | ~first & skip),
                     fifo.w_data.eq(i.payload), fifo.w_en.eq(i.valid & ~skip_now)]
        with m.If(i.valid):
            m.d.sync += [first.eq(i.payload.last), skip.eq(skip_now)]
            with m.If(first & skip_now):
                m.d.sync += self.dropped.eq(self.dropped + 1)
        m.d.comb += [o.valid.eq(fifo.r_rdy), o.payload.eq(fifo.r_data),
                     fifo.r_en.eq(o.ready)]
        return m
