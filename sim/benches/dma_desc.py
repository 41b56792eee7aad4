"""Driving the DMA loader's descriptor streams from a cocotb bench (shared by the DMA and the
matrix-engine benches). Flat names: ``<prefix>_t{addr,length,stride,count}``, ``_tvalid``,
``_tready`` (see :func:`mcf.hdl.mem.axi.descriptor_layout`)."""

from cocotb.triggers import RisingEdge


async def send_descriptor(dut, prefix: str, addr: int, length: int, stride: int = 0,
                          count: int = 1) -> None:
    """Present one descriptor on ``prefix`` and hold it until accepted."""
    for name, value in (("addr", addr), ("length", length), ("stride", stride),
                        ("count", count)):
        getattr(dut, f"{prefix}_t{name}").value = value
    getattr(dut, f"{prefix}_tvalid").value = 1
    while True:
        await RisingEdge(dut.clk)
        if getattr(dut, f"{prefix}_tready").value:
            break
    getattr(dut, f"{prefix}_tvalid").value = 0
