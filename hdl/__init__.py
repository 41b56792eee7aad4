"""Amaranth gateware of one MCF node (``hdl/`` → ``mcf.hdl``).

Folders: ``packet/`` (packetizer, parser), ``nic/`` (router, all-to-all, reduction, link),
``compute/`` (GEMM, attention, vector unit), ``mem/`` (DMA loader), ``csr/`` (AXI-Lite).
"""
