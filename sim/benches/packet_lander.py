"""What the cocotb benches of the two packet landers share (the landing engine's
``node_landing`` and the decode lander's ``node_decode_land``; both write packets through
``hdl/node/packet_writer.py``): the clock, reset, the DDR model on the write bus, the packet
source, the frame of a packet, the status counters and the wait for them."""

from __future__ import annotations

import logging

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge
from cocotbext.axi import AxiStreamBus, AxiStreamFrame, AxiStreamSource

from mcf.abi.meta import Meta
from mcf.sim.benches.pauses import pattern
from mcf.sim.ddr import WRITE, ddr_ram

__all__ = ["LanderTB", "status_of"]


def status_of(dut, fields) -> dict[str, int]:
    """The ``status`` port of ``dut`` split into the counters ``fields`` (an ABI layout)."""
    raw = int(dut.status.value)
    return {name: (raw >> f.offset) & ((1 << f.width) - 1) for name, f in fields}


class LanderTB:
    """A lander on a bench: 250 MHz clock, reset held, ``ram`` (the DDR model on the write
    bus ``bus``: ``size`` bytes of ``fill``, AXI pauses, the addresses in ``bad_write``
    answered SLVERR), ``src`` (packets on ``s_axis`` with their ``Meta`` in ``tuser``, idle
    cycles when ``idle``); ``status`` (the counters of ``fields``)."""

    def __init__(self, dut, rng, *, bus: str, size: int, fill: int, fields, idle=0.0,
                 pause=0.0):
        self.dut, self.fields = dut, fields
        cocotb.start_soon(Clock(dut.clk, 4, unit="ns").start())
        dut.rst.value = 1
        self.bad_write: set[int] = set()
        self.ram = ddr_ram(dut, bus, dut.clk, dut.rst, size=size, fill=fill, pause=pause,
                           rng=rng, channels=WRITE, bad_write=self.bad_write)
        self.src = AxiStreamSource(AxiStreamBus.from_prefix(dut, "s_axis"), dut.clk, dut.rst)
        self.src.log.setLevel(logging.WARNING)
        if idle:
            self.src.set_pause_generator(pattern(idle, rng))
        self.bpb = len(dut.s_axis_tdata) // 8

    async def release(self, cfg) -> None:
        """``cfg`` (a packed configuration) on the ``cfg`` port, three cycles of reset."""
        d = self.dut
        d.cfg.value = cfg.pack()
        d.rst.value = 1
        await ClockCycles(d.clk, 3)
        d.rst.value = 0

    def frame(self, meta: Meta, payload: bytes) -> AxiStreamFrame:
        """A packet as the parser hands it over (a header-only packet: one empty beat)."""
        if not payload:
            return AxiStreamFrame(bytes(self.bpb), tkeep=[0] * self.bpb, tuser=meta.pack())
        return AxiStreamFrame(payload, tuser=meta.pack())

    def status(self) -> dict[str, int]:
        return status_of(self.dut, self.fields)

    async def drain(self, expected: dict, timeout_cycles: int) -> int:
        """Wait until the status equals ``expected`` (or time out); the cycle it happened."""
        for cycle in range(timeout_cycles):
            await RisingEdge(self.dut.clk)
            if self.status() == expected:
                return cycle
        raise AssertionError(f"status {self.status()} never reached {expected}")
