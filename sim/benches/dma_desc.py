"""Driving descriptor streams from a cocotb bench (shared by the DMA, GEMM and matrix-engine
benches). A struct-payload stream flattened by ``FlatTop`` has ports ``<prefix>_t<field>``,
``_tvalid``, ``_tready``; the values come from the ABI's host views
(:class:`mcf.abi.compute.DmaDesc`, :class:`mcf.abi.compute.GemmJob`), which check the ranges."""

from __future__ import annotations

import dataclasses

from cocotb.triggers import RisingEdge

from mcf.abi.compute import DmaDesc, GemmJob


async def send_fields(dut, prefix: str, desc) -> None:
    """Present the fields of ``desc`` (a dataclass) on ``prefix`` and hold until accepted."""
    for name, value in dataclasses.asdict(desc).items():
        handle = getattr(dut, f"{prefix}_t{name}")
        handle.value = value & ((1 << len(handle)) - 1)
    getattr(dut, f"{prefix}_tvalid").value = 1
    while True:
        await RisingEdge(dut.clk)
        if getattr(dut, f"{prefix}_tready").value:
            break
    getattr(dut, f"{prefix}_tvalid").value = 0


async def send_descriptor(dut, prefix: str, addr: int, length: int, stride: int = 0,
                          count: int = 1) -> None:
    """One DMA descriptor (:data:`mcf.abi.compute.DMA_DESC`)."""
    desc = DmaDesc(addr, length, stride, count)
    desc.pack()                        # range check against the ABI layout
    await send_fields(dut, prefix, desc)


async def send_job(dut, prefix: str, job: GemmJob) -> None:
    """One GEMM job descriptor (:data:`mcf.abi.compute.GEMM_JOB`)."""
    await send_fields(dut, prefix, job)
