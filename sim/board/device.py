"""A ``pynq`` :class:`~pynq.pl_server.device.Device` that is the node top under Verilator
(issue #12 item 2; docs/board.md "The simulated board").

``SimBoard(dut)`` is created inside a cocotb test on a built ``mcf_node_sim`` (or ``mcf_node``)
and stands where a KR260 stands for PYNQ:

* ``Overlay(<name>.hwh, device=board)`` parses the ``.hwh`` with PYNQ's own metadata front end
  (:mod:`mcf.sim.board.hwh` writes it) and binds :class:`mcf.driver.NodeDriver` from its VLNV;
  ``download`` pulses ``aresetn`` (a freshly configured PL).
* ``read_registers``/``write_registers`` (PYNQ's ``REGISTER_RW`` capability, used by ``MMIO``,
  ``DefaultIP.read/write`` and ``register_map``) are AXI-Lite transfers on ``s_axi_ctrl`` by a
  cocotbext-axi ``AxiLiteMaster``; a response other than OKAY raises :class:`AxiBusError`.
* ``default_memory.allocate`` returns ``PynqBuffer`` s whose bytes *are* the DDR model's: one
  ``mmap`` behind four cocotbext-axi ``AxiRam`` s on ``m_axi_hp0..3``, and a buffer's
  ``device_address`` is its address in that model.
* ``clock`` gives the driver simulated time (:class:`SimClock`), so its timeouts are in
  simulated seconds.

The host program (ordinary blocking PYNQ code) runs in a thread through cocotb's ``bridge``;
every access above re-enters the simulation with ``resume``. PYNQ's PL-clock programming is
skipped (``clock_dict`` is empty): the bench's ``aclk`` is the clock.
"""

from __future__ import annotations

import logging
import math
import mmap
import random
from pathlib import Path

import cocotb
from cocotb.clock import Clock
from cocotb.task import resume
from cocotb.triggers import ClockCycles
from cocotb.utils import get_sim_time
from cocotbext.axi import AxiLiteBus, AxiLiteMaster
from cocotbext.axi.constants import AxiResp
from pynq.buffer import PynqBuffer
from pynq.pl_server.device import Device
from pynq.pl_server.hwh_parser import get_hwh_name

from mcf.sim.ddr import ddr_ram

from .hwh import CTRL_BASE, ctrl_range

__all__ = ["SimBoard", "SimClock", "SimMemory", "AxiBusError", "PROBE_PRIORITY"]

PROBE_PRIORITY = 350
"""Unique among PYNQ's devices (embedded 50, remote 100, XRT 200)."""
PAGE = 4096


class AxiBusError(OSError):
    """An AXI-Lite transfer answered SLVERR or DECERR (on a board: a bus error)."""

    def __init__(self, kind: str, address: int, resp):
        super().__init__(f"AXI-Lite {kind} at {address:#x} answered {AxiResp(resp).name}")
        self.address, self.resp = address, AxiResp(resp)


class SimClock:
    """Simulated seconds for the driver's waits (:class:`mcf.driver.Clock`)."""

    def __init__(self, clk, period_ns: float):
        self._clk, self.period_ns = clk, period_ns

    async def _now(self) -> float:
        return get_sim_time("ns") * 1e-9

    async def _sleep(self, cycles: int) -> None:
        await ClockCycles(self._clk, cycles)

    def now(self) -> float:
        return resume(self._now)()

    def sleep(self, seconds: float) -> None:
        resume(self._sleep)(max(1, math.ceil(seconds * 1e9 / self.period_ns)))


class SimMemory:
    """PYNQ's ``default_memory``: page-aligned buffers carved from the DDR model."""

    def __init__(self, device: SimBoard, start: int = PAGE):
        self.device, self._next = device, start

    def allocate(self, shape, dtype="u4", **kwargs) -> PynqBuffer:
        import numpy as np
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        at = self._next
        if at + nbytes > len(self.device.mem):
            raise MemoryError(f"DDR model of {len(self.device.mem)} B has no room for "
                              f"{nbytes} B")
        self._next = -(-(at + max(nbytes, 1)) // PAGE) * PAGE
        return PynqBuffer(shape, dtype, buffer=self.device.mem, offset=at, device=self.device,
                          device_address=at, bo=at, coherent=True)


class SimBoard(Device):
    """The node top ``dut`` (flat ports, ``aclk``/``aresetn``) as a PYNQ device.

    ``ctrl_base``: the control window's address (the ``.hwh``'s); ``mem_bytes``: DDR model
    size; ``pause``: random pause probability on the DDR model's channels (``seed``);
    ``prefix``: of the node's ports on ``dut`` (``"n0_"`` on
    :class:`mcf.sim.cluster.RankTop`, whose links are the co-simulation's); ``start_clock``:
    drive ``aclk`` every ``period_ns`` (else the bench does, at that period). ``aclk_hz``: the
    clock the driver's cycle figures assume."""

    _probe_priority_ = PROBE_PRIORITY

    @classmethod
    def _probe_(cls):
        return []            # made by a bench around a running simulation, never probed

    def __init__(self, dut, *, ctrl_base: int = CTRL_BASE, mem_bytes: int = 8 << 20,
                 period_ns: float = 10.0, pause: float = 0.0, seed: int = 1, prefix: str = "",
                 start_clock: bool = True):
        super().__init__("mcf_sim_kr260")
        self.name = "mcf_sim_kr260"
        self.capabilities = {"REGISTER_RW": True}
        self.dut = dut
        self.ctrl_base, self.ctrl_range = ctrl_base, ctrl_range()
        self.period_ns, self.aclk_hz = period_ns, 1e9 / period_ns
        if start_clock:
            cocotb.start_soon(Clock(dut.aclk, period_ns, "ns").start())
        dut.aresetn.value = 0
        self.axil = AxiLiteMaster(AxiLiteBus.from_prefix(dut, f"{prefix}s_axi_ctrl"), dut.aclk,
                                  dut.aresetn, reset_active_level=False)
        for side in (self.axil.read_if, self.axil.write_if):
            side.log.setLevel(logging.WARNING)
        self.mem = mmap.mmap(-1, mem_bytes)
        rng = random.Random(seed)
        self.rams = [ddr_ram(dut, f"{prefix}m_axi_hp{p}", dut.aclk, dut.aresetn,
                             reset_active_level=False, size=mem_bytes, mem=self.mem,
                             pause=pause, rng=random.Random(rng.random())) for p in range(4)]
        self.default_memory = SimMemory(self)
        self.clock = SimClock(dut.aclk, period_ns)
        self.downloads = 0

    # --- the PL ----------------------------------------------------------------------------------

    async def reset_pl(self, cycles: int = 8) -> None:
        """Hold ``aresetn`` low for ``cycles`` clock cycles (a new configuration)."""
        self.dut.aresetn.value = 0
        await ClockCycles(self.dut.aclk, cycles)
        self.dut.aresetn.value = 1
        await ClockCycles(self.dut.aclk, 4)

    def download(self, bitstream, parser=None):
        resume(self.reset_pl)()
        self.downloads += 1
        self.post_download(bitstream, parser)

    def get_bitfile_metadata(self, bitfile_name: str, partial: bool = False):
        from pynqmetadata.frontends import Metadata
        from pynqmetadata.views.runtime import RuntimeMetadataParser
        hwh = Path(get_hwh_name(bitfile_name))
        if not hwh.is_file():
            raise RuntimeError(f"no hardware handoff file {hwh}")
        parser = RuntimeMetadataParser(Metadata(input=hwh))
        parser.clock_dict = {}       # aclk is the bench's clock: no PS clock to program
        return parser

    # --- registers (REGISTER_RW) -----------------------------------------------------------------

    def _offset(self, address: int, length: int) -> int:
        off = address - self.ctrl_base
        if off < 0 or off + length > self.ctrl_range:
            raise ValueError(f"address {address:#x} (+{length}) is outside the node's control "
                             f"window {self.ctrl_base:#x}..{self.ctrl_base + self.ctrl_range:#x}")
        return off

    def read_registers(self, address: int, length: int) -> bytes:
        off = self._offset(address, length)
        resp = resume(self.axil.read)(off, length)
        if resp.resp != AxiResp.OKAY:
            raise AxiBusError("read", address, resp.resp)
        return bytes(resp.data)

    def write_registers(self, address: int, data) -> None:
        off = self._offset(address, len(data))
        resp = resume(self.axil.write)(off, bytes(data))
        if resp.resp != AxiResp.OKAY:
            raise AxiBusError("write", address, resp.resp)
