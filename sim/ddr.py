"""One DDR model for the cocotb benches and the simulated board (:mod:`mcf.sim.board.device`): a
cocotbext-axi ``AxiRam`` with quiet logs, an optional fill pattern, optional shared memory
(several ports on one byte array, as the HP ports share the DDR), pauses on chosen channels and
injected write errors.

The benches used to build this by hand, each slightly differently; this is the one place.
"""

from __future__ import annotations

import logging
import random

from cocotbext.axi import AxiBus, AxiRam

from mcf.sim.tb import pattern

__all__ = ["ddr_ram", "READ", "WRITE", "ALL"]

READ = ("ar", "r")
WRITE = ("aw", "w", "b")
ALL = READ + WRITE


def ddr_ram(dut, prefix: str, clock, reset, *, size: int, reset_active_level: bool = True,
            mem=None, fill: int | None = None, pause: float = 0.0,
            rng: random.Random | None = None, channels: tuple[str, ...] = ALL,
            bad_write: set[int] | None = None, beat_bytes: int = 16) -> AxiRam:
    """An ``AxiRam`` on the AXI4 master ``prefix`` of ``dut``.

    ``mem``: a shared byte buffer (e.g. an ``mmap``); ``fill``: a byte written over the whole
    memory first; ``pause``: pause probability on ``channels`` (names of :data:`ALL`), patterns
    from ``rng``; ``bad_write``: a set of beat addresses (``beat_bytes``-aligned) — any write
    touching one raises inside the model, so the burst answers SLVERR (the set may change while
    the bench runs)."""
    ram = AxiRam(AxiBus.from_prefix(dut, prefix), clock, reset,
                 reset_active_level=reset_active_level, size=size, mem=mem)
    for side in (ram.read_if, ram.write_if):
        side.log.setLevel(logging.WARNING)
    if fill is not None:
        ram.write(0, bytes([fill]) * size)
    if pause:
        rng = rng or random.Random(0)
        named = {"ar": ram.read_if.ar_channel, "r": ram.read_if.r_channel,
                 "aw": ram.write_if.aw_channel, "w": ram.write_if.w_channel,
                 "b": ram.write_if.b_channel}
        for ch in channels:
            named[ch].set_pause_generator(pattern(pause, rng))
    if bad_write is not None:
        wi = ram.write_if
        orig_write = wi._write

        async def write(address, data):     # any strobed byte of a bad beat raises
            if any(address < b + beat_bytes and b < address + len(data) for b in bad_write):
                raise OSError("injected write error")
            await orig_write(address, data)
        wi._write = write
    return ram
