"""Toolchain smoke bench: frames through a FIFO behind FlatTop's AXI-Stream names.

Used by tests/test_toolchain.py to prove the Verilator/cocotb bootstrap end to end; the frame
checked against ``params["expect_len"]`` lets the test show that a failing bench fails the run,
and a ``tests`` parameter without ``loopback`` that a skipped test is reported as skipped.
"""

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import RisingEdge
from cocotbext.axi import AxiStreamBus, AxiStreamFrame, AxiStreamSink, AxiStreamSource

from mcf.sim.toolchain import bench_params, skip_unless_selected


@cocotb.test()
async def loopback(dut):
    params = bench_params()
    skip_unless_selected("loopback", params)
    cocotb.start_soon(Clock(dut.clk, 4, unit="ns").start())
    src = AxiStreamSource(AxiStreamBus.from_prefix(dut, "s_axis"), dut.clk, dut.rst)
    snk = AxiStreamSink(AxiStreamBus.from_prefix(dut, "m_axis"), dut.clk, dut.rst)
    dut.rst.value = 1
    for _ in range(3):
        await RisingEdge(dut.clk)
    dut.rst.value = 0
    frames = [bytes((i * 7 + j) & 0xFF for j in range(n)) for i, n in enumerate(params["lens"])]
    for frame in frames:
        await src.send(AxiStreamFrame(frame))
    for frame in frames:
        got = await snk.recv()
        assert bytes(got.tdata) == frame
    assert len(frames[-1]) == params["expect_len"]
