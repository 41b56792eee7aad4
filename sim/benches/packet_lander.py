"""What the cocotb benches of the two packet landers share (the landing engine's
``node_landing`` and the decode lander's ``node_decode_land``; both write packets through
``hdl/node/packet_writer.py``): the clock, reset, the DDR model on the write bus, the packet
source, the frame of a packet, the status counters, the wait for them and a timed run at full
input rate; and the ``LAND_OFF`` table writes (:func:`write_land_off`, also of the emit and send
benches, whose designs hold the same table)."""

from __future__ import annotations

import logging

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge, with_timeout
from cocotbext.axi import AxiStreamBus, AxiStreamFrame, AxiStreamSource

from mcf.abi.framing import payload_beats
from mcf.abi.landing import land_off_entry
from mcf.abi.meta import Meta
from mcf.sim.ddr import WRITE, ddr_ram
from mcf.sim.tb import pattern

from .cycles import cycle_counter

__all__ = ["LanderTB", "status_of", "write_land_off"]


def status_of(dut, fields) -> dict[str, int]:
    """The ``status`` port of ``dut`` split into the counters ``fields`` (an ABI layout)."""
    raw = int(dut.status.value)
    return {name: (raw >> f.offset) & ((1 << f.width) - 1) for name, f in fields}


async def write_land_off(dut, land_off) -> None:
    """``land_off`` (the offset of each sequence number, ``None``: no entry) into the
    ``LAND_OFF`` write port of ``dut`` (``land_off_we``/``_seq``/``_data``), one entry per
    cycle; ``land_off_we`` low when it returns (on the cycle after the last entry)."""
    for seq, off in enumerate(land_off):
        dut.land_off_we.value = 1
        dut.land_off_seq.value = seq
        dut.land_off_data.value = land_off_entry(off)
        await RisingEdge(dut.clk)
    dut.land_off_we.value = 0


class LanderTB:
    """A lander on a bench: 250 MHz clock, reset held, ``ram`` (the DDR model on the write
    bus ``bus``: ``size`` bytes of ``fill``, AXI pauses, the addresses in ``bad_write``
    answered SLVERR), ``src`` (packets on ``s_axis`` with their ``Meta`` in ``tuser``, idle
    cycles when ``idle``); ``status`` (the counters of ``fields``)."""

    def __init__(self, dut, rng, *, bus: str, size: int, fill: int, fields, idle=0.0,
                 pause=0.0):
        self.dut, self.fields, self.size, self.fill = dut, fields, size, fill
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
        self._cycle = None

    async def release(self, cfg) -> None:
        """The DDR model all ``fill`` again, ``cfg`` (a packed configuration) on the ``cfg``
        port, three cycles of reset."""
        d = self.dut
        self.ram.write(0, bytes([self.fill]) * self.size)
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

    async def timed_run(self, packets, expected: dict) -> tuple[int, int]:
        """Send ``packets`` (``(meta, payload)`` pairs) back to back and :meth:`drain` to
        ``expected`` (10 ms at most): (payload beats, cycles from the first input beat taken
        until the status equalled ``expected``)."""
        d = self.dut
        if self._cycle is None:
            self._cycle = cycle_counter(d.clk)
        cycle = self._cycle
        start = None
        for meta, payload in packets:
            await self.src.send(self.frame(meta, payload))
            if start is None:
                while not (d.s_axis_tvalid.value and d.s_axis_tready.value):
                    await RisingEdge(d.clk)
                start = cycle[0]
        beats = sum(payload_beats(len(pl), 8 * self.bpb) for _, pl in packets)
        await with_timeout(self.drain(expected, 10 * beats + 10_000), 10, "ms")
        return beats, cycle[0] - start

    @staticmethod
    def rate_record(packets, beats_key: str, beats: int, cycles: int) -> dict:
        """A :meth:`timed_run`'s figures: packets, their distinct sizes, ``beats`` (named
        ``beats_key``), cycles and beats per cycle."""
        return {"packets": len(packets), "packet_bytes": sorted({len(pl) for _, pl in packets}),
                beats_key: beats, "cycles": cycles, "beats_per_cycle": round(beats / cycles, 4)}
