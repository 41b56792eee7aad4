"""The CSR bank as a Verilog top: :class:`mcf.hdl.flat.FlatTop` names (``s_axi_ctrl_*``,
``regs_<REG>_<field>…``), registered in :mod:`mcf.hdl.tops` as ``mcf_csr``."""

from __future__ import annotations

from amaranth import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import Out

from mcf.abi.regs import RegisterMap

from ..flat import FlatTop
from .bank import CsrBank

__all__ = ["CsrTop", "csr_flat_top"]


class CsrTop(wiring.Component):
    """Pass-through around :class:`CsrBank` with the bus declared as
    ``Out(AxiLiteSignature(...).flip())`` — the same ports as the bank's
    ``In(AxiLiteSignature(...))``. ``FlatTop`` in this tree reverses the flows of the members
    of an ``In`` non-stream interface (it flips a signature ``Member.signature`` has already
    flipped); this spelling flattens correctly with and without that fix (docs/csr.md).

    Members: ``s_axi_ctrl`` and ``regs`` exactly as the wrapped bank's. Latency: none added.
    """

    def __init__(self, bank: CsrBank):
        self._bank = bank
        members = {"s_axi_ctrl": Out(bank.s_axi_ctrl.signature)}
        if "regs" in bank.signature.members:
            members["regs"] = bank.signature.members["regs"]
        super().__init__(members)

    @property
    def bank(self) -> CsrBank:
        return self._bank

    def elaborate(self, platform):
        m = Module()
        m.submodules.bank = bank = self._bank
        wiring.connect(m, wiring.flipped(self.s_axi_ctrl), bank.s_axi_ctrl)
        if "regs" in bank.signature.members:
            wiring.connect(m, bank.regs, wiring.flipped(self.regs))
        return m


def csr_flat_top(regmap: RegisterMap, *, addr_width: int | None = None) -> FlatTop:
    return FlatTop(CsrTop(CsrBank(regmap, addr_width=addr_width)))
