"""AXI4-Lite interface signature and response codes (AMBA AXI and ACE Protocol Specification,
ARM IHI 0022, part B: AXI4-Lite).

:class:`AxiLiteSignature` carries the nineteen AXI4-Lite signals under their specification names
with the flows seen from the manager (master). A subordinate declares
``s_axi_ctrl: In(AxiLiteSignature(addr_width))``; :class:`mcf.hdl.flat.FlatTop` then yields
``s_axi_ctrl_awaddr`` … ``s_axi_ctrl_rready``, which cocotbext-axi's
``AxiLiteBus.from_prefix(dut, "s_axi_ctrl")`` and Vivado's interface inference bind as they are.
"""

from __future__ import annotations

from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.axi import RESP_BITS, AxiResp

__all__ = ["AxiLiteSignature", "AxiResp", "PROT_BITS", "RESP_BITS"]

PROT_BITS = 3


class AxiLiteSignature(wiring.Signature):
    """AXI4-Lite, manager view: the five channels AW, W, B, AR, R.

    Parameters
    ----------
    addr_width : int
        Width of ``awaddr`` / ``araddr`` in bits (byte addresses).
    data_width : int
        32 or 64 (the only AXI4-Lite data widths); ``wstrb`` has ``data_width // 8`` bits.
    """

    def __init__(self, addr_width: int, data_width: int = 32):
        if not isinstance(addr_width, int) or addr_width < 1:
            raise ValueError(f"addr_width must be a positive integer, not {addr_width!r}")
        if data_width not in (32, 64):
            raise ValueError(f"AXI4-Lite data width is 32 or 64, not {data_width!r}")
        self._addr_width = addr_width
        self._data_width = data_width
        super().__init__({
            "awaddr": Out(addr_width),
            "awprot": Out(PROT_BITS),
            "awvalid": Out(1),
            "awready": In(1),
            "wdata": Out(data_width),
            "wstrb": Out(data_width // 8),
            "wvalid": Out(1),
            "wready": In(1),
            "bresp": In(RESP_BITS),
            "bvalid": In(1),
            "bready": Out(1),
            "araddr": Out(addr_width),
            "arprot": Out(PROT_BITS),
            "arvalid": Out(1),
            "arready": In(1),
            "rdata": In(data_width),
            "rresp": In(RESP_BITS),
            "rvalid": In(1),
            "rready": Out(1),
        })

    @property
    def addr_width(self) -> int:
        return self._addr_width

    @property
    def data_width(self) -> int:
        return self._data_width

    def __eq__(self, other):
        return (isinstance(other, AxiLiteSignature) and self.addr_width == other.addr_width
                and self.data_width == other.data_width)

    def __hash__(self):
        return hash((AxiLiteSignature, self._addr_width, self._data_width))

    def __repr__(self):
        return f"AxiLiteSignature({self._addr_width}, {self._data_width})"
