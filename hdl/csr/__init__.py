"""AXI-Lite control/status gateware: the AXI4-Lite signature and the CSR bank elaborated from an
ABI register map (docs/csr.md)."""

from .axil import AxiLiteSignature, AxiResp
from .bank import CsrBank

__all__ = ["AxiLiteSignature", "AxiResp", "CsrBank"]
