"""A free-running cycle count for the cocotb benches."""

from __future__ import annotations

import cocotb
from cocotb.triggers import RisingEdge

__all__ = ["cycle_counter"]


class _PortCycles:
    """``counter[0]``: the cycles a top's ``cycles`` port counted since this object was made
    (:class:`mcf.sim.wire.WindowTimer`): no coroutine per cycle."""

    def __init__(self, port):
        self._port = port
        self._start = int(port.value)

    def __getitem__(self, index: int) -> int:
        if index != 0:
            raise IndexError(index)
        return int(self._port.value) - self._start


def cycle_counter(clock, dut=None):
    """A one-element counter of rising edges of ``clock`` from now on: read ``counter[0]``.
    If ``dut`` has a ``cycles`` port it is read (no Python per cycle); else a coroutine started
    here counts."""
    if dut is not None and hasattr(dut, "cycles"):
        return _PortCycles(dut.cycles)
    cycle = [0]

    async def count():
        while True:
            await RisingEdge(clock)
            cycle[0] += 1

    cocotb.start_soon(count())
    return cycle
