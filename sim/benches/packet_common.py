"""Shared cocotb testbench for the packet path (runs on ``mcf.hdl.packet.top.packet_bench_top``).

:class:`PacketTB` owns the clock, the reset and one cocotbext-axi model per AXI-Stream port:
``s_axis_meta`` / ``s_axis_payload`` (packetizer inputs), ``m_axis_packet`` (packetizer output),
``s_axis_packet`` (parser input), ``m_axis_<port>`` for every :class:`~mcf.abi.meta.Port`
(parser outputs, metadata on ``tuser``). Expected traffic comes from the ABI and the golden
model (:mod:`mcf.golden.packet`), never from the DUT's code.

Bench parameters (``mcf.sim.bench_params()``): ``width``, ``max_payload``, ``local_id``,
``num_nodes``, ``meta_widths`` (dict of :class:`~mcf.abi.meta.MetaWidths` fields, optional),
plus test-specific counts.
"""

from __future__ import annotations

import itertools
import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge
from cocotbext.axi import AxiStreamBus, AxiStreamFrame, AxiStreamSink, AxiStreamSource

from mcf.abi.csrmap import PACKETIZER_STATUS, PARSER_STATUS
from mcf.abi.meta import MetaWidths, Port, meta_layout
from mcf.golden.packet import ParsedBeat, WireBeat
from mcf.sim import bench_params
from mcf.sim.amsim import unpack_fields

__all__ = ["PacketTB", "cycle_pause", "beats_to_frame", "frame_to_beats"]


def cycle_pause(seed: int, on_share: float = 0.3):
    """Random pause pattern (True = pause) for idle insertion / backpressure, seeded."""
    rng = random.Random(seed)
    return (rng.random() < on_share for _ in itertools.count())


def beats_to_frame(beats, bpb: int) -> AxiStreamFrame:
    """One AXI-Stream frame carrying exactly these beats (every beat uses all lanes so that
    arbitrary ``keep`` patterns are sent as given; ``last`` only on the final beat)."""
    tdata = bytearray()
    tkeep = []
    for b in beats:
        tdata += b.data.to_bytes(bpb, "little")
        tkeep += [(b.keep >> i) & 1 for i in range(bpb)]
    return AxiStreamFrame(bytes(tdata), tkeep=tkeep)


def frame_to_beats(frame, bpb: int, with_user: bool = False):
    """Beats of a frame received with ``recv(compact=False)``."""
    n = len(frame.tdata) // bpb
    beats = []
    for i in range(n):
        lanes = frame.tdata[i * bpb:(i + 1) * bpb]
        keep = sum(k << j for j, k in enumerate(frame.tkeep[i * bpb:(i + 1) * bpb]))
        data = int.from_bytes(bytes(lanes), "little")
        last = i == n - 1
        if with_user:
            beats.append(ParsedBeat(frame.tuser[i * bpb], data, keep, last))
        else:
            beats.append(WireBeat(data, keep, last))
    return beats


class PacketTB:
    def __init__(self, dut):
        self.dut = dut
        self.params = bench_params()
        self.width = self.params["width"]
        self.bpb = self.width // 8
        self.max_payload = self.params["max_payload"]
        self.local_id = self.params["local_id"]
        self.num_nodes = self.params["num_nodes"]
        self.meta_layout = meta_layout(MetaWidths(**self.params.get("meta_widths", {})))
        self.log = dut._log
        cocotb.start_soon(Clock(dut.clk, 4, unit="ns").start())

        def bus(prefix):
            return AxiStreamBus.from_prefix(dut, prefix)

        self.meta_src = AxiStreamSource(bus("s_axis_meta"), dut.clk, dut.rst)
        self.payload_src = AxiStreamSource(bus("s_axis_payload"), dut.clk, dut.rst)
        self.packet_sink = AxiStreamSink(bus("m_axis_packet"), dut.clk, dut.rst)
        self.packet_src = AxiStreamSource(bus("s_axis_packet"), dut.clk, dut.rst)
        self.sinks = {p: AxiStreamSink(bus(f"m_axis_{p.name.lower()}"), dut.clk, dut.rst)
                      for p in Port}
        for model in [self.meta_src, self.payload_src, self.packet_sink, self.packet_src,
                      *self.sinks.values()]:
            model.log.setLevel("WARNING")

    def sources(self):
        return [self.meta_src, self.payload_src, self.packet_src]

    def all_sinks(self):
        return [self.packet_sink, *self.sinks.values()]

    def set_idle_generator(self, seed: int | None):
        for i, src in enumerate(self.sources()):
            src.set_pause_generator(None if seed is None else cycle_pause(seed + i))

    def set_backpressure_generator(self, seed: int | None):
        for i, snk in enumerate(self.all_sinks()):
            snk.set_pause_generator(None if seed is None else cycle_pause(seed + 100 + i, 0.5))

    async def reset(self, loopback: bool = False):
        dut = self.dut
        dut.local_id.value = self.local_id
        dut.num_nodes.value = self.num_nodes
        dut.loopback.value = int(loopback)
        dut.rst.value = 1
        await ClockCycles(dut.clk, 3)
        dut.rst.value = 0
        await RisingEdge(dut.clk)

    async def start(self, idle_seed: int | None, backpressure_seed: int | None,
                    loopback: bool = False):
        """:meth:`reset` (with ``loopback``), then idle cycles on the sources from ``idle_seed``
        and backpressure on the sinks from ``backpressure_seed`` (``None``: none)."""
        await self.reset(loopback)
        self.set_idle_generator(idle_seed)
        self.set_backpressure_generator(backpressure_seed)

    # --- traffic ---------------------------------------------------------------------------
    async def send_meta(self, raw: int):
        nbytes = len(self.dut.s_axis_meta_tdata) // 8
        await self.meta_src.send(AxiStreamFrame(raw.to_bytes(nbytes, "little")))

    async def send_payload(self, frame_beats):
        await self.payload_src.send(beats_to_frame(frame_beats, self.bpb))

    async def send_packet(self, beats):
        await self.packet_src.send(beats_to_frame(beats, self.bpb))

    async def recv_packet(self):
        return frame_to_beats(await self.packet_sink.recv(compact=False), self.bpb)

    async def recv_parsed(self, port: Port):
        frame = await self.sinks[port].recv(compact=False)
        return frame_to_beats(frame, self.bpb, with_user=True)

    def parsed_waiting(self) -> int:
        return sum(s.count() for s in self.sinks.values())

    def pz_status(self) -> dict[str, int]:
        return unpack_fields(PACKETIZER_STATUS, int(self.dut.pz_status.value))

    def ps_status(self) -> dict[str, int]:
        return unpack_fields(PARSER_STATUS, int(self.dut.ps_status.value))

    async def drain(self, *, idle_cycles: int = 64, timeout: int = 1_000_000):
        """Wait until every source is idle and nothing has moved for ``idle_cycles``."""
        quiet = 0
        for _ in range(timeout):
            await RisingEdge(self.dut.clk)
            busy = any(not s.idle() for s in self.sources()) or any(
                int(getattr(self.dut, f"m_axis_{p.name.lower()}_tvalid").value)
                for p in Port) or int(self.dut.m_axis_packet_tvalid.value)
            quiet = 0 if busy else quiet + 1
            if quiet >= idle_cycles:
                return
        raise AssertionError("packet path did not go idle")
