"""Runners of the DMA loader's cocotb + Verilator bench (sim/benches/dma_loader.py) against
cocotbext-axi AxiRam: misaligned and 4 KiB-straddling reads and writes, strided rows, random
read latency, AR/R pauses and stream backpressure, injected SLVERR on reads and writes, and
rejected descriptors; and the reader's and writer's width-checked Verilator builds."""

import pytest

from mcf.hdl.flat import FlatTop
from mcf.hdl.mem.dma import DmaLoader, DmaReader, DmaWriter
from mcf.sim import build, run

BENCH = "mcf.sim.benches.dma_loader"
AXIS = {"rd_desc": "s_axis_rd_desc", "rd": "m_axis_rd", "wr_desc": "s_axis_wr_desc",
        "wr": "s_axis_wr"}


def dma_built(data_width=128):
    return build(FlatTop(DmaLoader(data_width=data_width), AXIS), f"dma_loader_{data_width}")


@pytest.mark.parametrize("latency,pauses", [(4, 0.0), (40, 0.3)])
def test_dma_bench(latency, pauses):
    run(dma_built(), BENCH, params={"seed": 1 + latency, "latency": latency, "n": 12,
                                    "jitter": latency,
                                    "ar_pause": pauses, "r_pause": pauses, "bp": pauses,
                                    "idle": pauses})


@pytest.mark.slow
def test_dma_bench_narrow():
    """A 32-bit port: more beats per row, other alignments."""
    run(dma_built(32), BENCH, params={"seed": 5, "latency": 10, "n": 6,
                                      "tests": ["read", "write", "error"]})


@pytest.mark.slow
def test_dma_bench_long():
    run(dma_built(), BENCH, params={"seed": 9, "latency": 60, "n": 150, "ar_pause": 0.4,
                                    "r_pause": 0.4, "bp": 0.5, "idle": 0.5})


def test_dma_width_clean():
    """DmaReader and DmaWriter build with Verilator's width warnings on (the realigners' byte
    shifts are fixed slices, no 256-bit shift truncated into a beat)."""
    build(FlatTop(DmaReader(), {"o": "m_axis"}), "dma_reader_ww", width_warnings=True)
    build(FlatTop(DmaWriter(), {"i": "s_axis"}), "dma_writer_ww", width_warnings=True)
