"""AXI protocol codes seen by both sides of the bus (ARM IHI 0022): the response a driver gets
back (``SLVERR`` for an unmapped CSR address, DMA error status) and the burst types the DMA
issues. The CSR bank, the DMA loader and the host models import them from here."""

from __future__ import annotations

from amaranth.lib import enum

__all__ = ["AxiResp", "AxiBurst", "RESP_BITS"]

RESP_BITS = 2


class AxiResp(enum.Enum, shape=RESP_BITS):
    """``BRESP`` / ``RRESP`` encodings."""
    OKAY = 0
    EXOKAY = 1
    SLVERR = 2
    DECERR = 3


class AxiBurst(enum.Enum, shape=2):
    """``AWBURST`` / ``ARBURST`` encodings."""
    FIXED = 0
    INCR = 1
    WRAP = 2
