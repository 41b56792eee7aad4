"""The CSR bank as a Verilog top: :class:`mcf.hdl.flat.FlatTop` names (``s_axi_ctrl_*``,
``regs_<REG>_<field>…``), registered in :mod:`mcf.hdl.tops` as ``mcf_csr``."""

from __future__ import annotations

from mcf.abi.regs import RegisterMap

from ..flat import FlatTop
from .bank import CsrBank

__all__ = ["csr_flat_top"]


def csr_flat_top(regmap: RegisterMap, *, addr_width: int | None = None) -> FlatTop:
    """``FlatTop(CsrBank(regmap))``: the bank's ports under their flat AXI names."""
    return FlatTop(CsrBank(regmap, addr_width=addr_width))
