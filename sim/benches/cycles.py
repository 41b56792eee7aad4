"""A free-running cycle count for the cocotb benches."""

from __future__ import annotations

import cocotb
from cocotb.triggers import RisingEdge

__all__ = ["cycle_counter"]


def cycle_counter(clock) -> list[int]:
    """A one-element list counting rising edges of ``clock`` from now on (a coroutine started
    here increments it); read ``counter[0]``."""
    cycle = [0]

    async def count():
        while True:
            await RisingEdge(clock)
            cycle[0] += 1

    cocotb.start_soon(count())
    return cycle
