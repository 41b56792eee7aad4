"""The node's three link ports on the simulated board: every ``m_axis_link<l>`` frame is taken
by a cocotbext-axi ``AxiStreamSink`` and kept; a *loopback* cable sends link ``l``'s frames back
into ``s_axis_link<l>`` (``AxiStreamSource``) when the bench releases them.

Held frames live here, not in the source's queue, so a PL reset (``SimBoard.download``) between
capture and release loses none: the bench can let one configuration of the node send and the
next one receive — one board playing both ends of a cable.
"""

from __future__ import annotations

import logging

import cocotb
from cocotbext.axi import AxiStreamBus, AxiStreamFrame, AxiStreamSink, AxiStreamSource

__all__ = ["LinkPorts", "frame_beats"]


def frame_beats(frame: AxiStreamFrame, beat_bytes: int = 8) -> list[tuple[bytes, int]]:
    """A captured frame as ``(beat bytes, keep)`` pairs, bytes outside ``keep`` zeroed (the
    form :func:`mcf.golden.nic.link_frame` writes and ``LinkRxModel.receive`` reads)."""
    data, keep = bytes(frame.tdata), list(frame.tkeep or [1] * len(frame.tdata))
    out = []
    for at in range(0, len(data), beat_bytes):
        k = sum(1 << i for i, b in enumerate(keep[at: at + beat_bytes]) if b)
        out.append((bytes(d if keep[at + i] else 0 for i, d in enumerate(
            data[at: at + beat_bytes])).ljust(beat_bytes, b"\0"), k))
    return out


class LinkPorts:
    """Sinks on every ``m_axis_link<l>``, sources on every ``s_axis_link<l>`` of ``dut``.

    ``sent[l]``: every frame link ``l`` transmitted, in order. ``hold(l)`` keeps a copy of each
    later frame of link ``l`` for its own RX; :meth:`release` delivers the kept frames into
    ``s_axis_link<l>`` and ends the loop (frames sent after that are only captured: a looped
    cable would carry a routed packet round and round)."""

    def __init__(self, dut, clock, resetn, links: int = 3):
        self.links = links
        self.sinks, self.sources = [], []
        for ln in range(links):
            sink = AxiStreamSink(AxiStreamBus.from_prefix(dut, f"m_axis_link{ln}"), clock,
                                 resetn, reset_active_level=False)
            src = AxiStreamSource(AxiStreamBus.from_prefix(dut, f"s_axis_link{ln}"), clock,
                                  resetn, reset_active_level=False)
            for x in (sink, src):
                x.log.setLevel(logging.WARNING)
            self.sinks.append(sink)
            self.sources.append(src)
        self.sent: list[list[AxiStreamFrame]] = [[] for _ in range(links)]
        self._held: dict[int, list[AxiStreamFrame]] = {}
        self.delivered = [0] * links
        for ln in range(links):
            cocotb.start_soon(self._take(ln))

    async def _take(self, ln: int) -> None:
        while True:
            frame = await self.sinks[ln].recv(compact=False)
            self.sent[ln].append(frame)
            if ln in self._held:
                self._held[ln].append(frame)

    def hold(self, ln: int) -> None:
        """From now on keep link ``ln``'s frames for its own RX."""
        self._held.setdefault(ln, [])

    def held(self, ln: int) -> int:
        return len(self._held.get(ln, []))

    async def release(self, ln: int) -> int:
        """Send the kept frames of link ``ln`` into its RX, in order; end the loop. Returns
        how many were delivered."""
        frames = self._held.pop(ln, [])
        for frame in frames:
            await self.sources[ln].send(AxiStreamFrame(frame.tdata, frame.tkeep))
            self.delivered[ln] += 1
        return len(frames)
