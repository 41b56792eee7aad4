"""AXI4 (full) master signature and burst limits of the DMA loader (paper §5, Fig. 2: the
ping-pong DMA loader reads DDR through AXI-Full); the descriptor is :mod:`mcf.abi.compute`'s.

Member names are the AXI names, so ``FlatTop`` of a port called ``m_axi`` yields ``m_axi_araddr``
… and cocotbext-axi's ``AxiBus.from_prefix(dut, "m_axi")`` binds without glue.
"""

from __future__ import annotations

from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from mcf.abi import compute as dma_abi
from mcf.abi.axi import AxiBurst, AxiResp

__all__ = ["AXI4Signature", "AxiResp", "AxiBurst", "MAX_BURST_BEATS", "BOUNDARY_BYTES",
           "descriptor_layout", "ADDR_BITS", "LENGTH_BITS", "STRIDE_BITS", "COUNT_BITS"]

MAX_BURST_BEATS = 256          # AXI4 INCR bursts: arlen ≤ 255
BOUNDARY_BYTES = 4096          # a burst never crosses a 4 KiB boundary
ADDR_BITS = dma_abi.DMA_ADDR_BITS
LENGTH_BITS = dma_abi.DMA_LENGTH_BITS
STRIDE_BITS = dma_abi.DMA_STRIDE_BITS
COUNT_BITS = dma_abi.DMA_COUNT_BITS
descriptor_layout = dma_abi.dma_desc_layout     # the ABI's descriptor (mcf.abi.compute)


class AXI4Signature(wiring.Signature):
    """AXI4 master (read and write channels), ``Out`` = driven by the master."""

    def __init__(self, addr_width: int = ADDR_BITS, data_width: int = 128, id_width: int = 1):
        self.addr_width, self.data_width, self.id_width = addr_width, data_width, id_width
        strb = data_width // 8
        super().__init__({
            "araddr": Out(addr_width), "arlen": Out(8), "arsize": Out(3), "arburst": Out(2),
            "arid": Out(id_width), "arcache": Out(4), "arprot": Out(3),
            "arvalid": Out(1), "arready": In(1),
            "rdata": In(data_width), "rresp": In(2), "rlast": In(1), "rid": In(id_width),
            "rvalid": In(1), "rready": Out(1),
            "awaddr": Out(addr_width), "awlen": Out(8), "awsize": Out(3), "awburst": Out(2),
            "awid": Out(id_width), "awcache": Out(4), "awprot": Out(3),
            "awvalid": Out(1), "awready": In(1),
            "wdata": Out(data_width), "wstrb": Out(strb), "wlast": Out(1),
            "wvalid": Out(1), "wready": In(1),
            "bresp": In(2), "bid": In(id_width), "bvalid": In(1), "bready": Out(1),
        })
