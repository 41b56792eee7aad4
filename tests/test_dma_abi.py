"""Host views of the compute ABI (mcf.abi.compute): DMA descriptors and GEMM job descriptors
pack with the very layouts the HDL decodes, reject out-of-range fields, and the activation
stream order matches the two DMA reads of a requantised chunk."""

import numpy as np
import pytest

from mcf.abi.compute import (
    DMA_DESC,
    DMA_STATUS,
    GEMM_JOB,
    GEMM_STATUS,
    DmaDesc,
    GemmJob,
    gemm_x_stream,
    status_values,
)
from mcf.abi.csrmap import COUNTER_BITS
from mcf.quant import gemm_x_blob


def test_dma_desc_pack_layout():
    d = DmaDesc(addr=0x12_3456_789A, length=0xABCDE, stride=0x1000, count=7)
    raw = d.pack()
    assert raw & ((1 << 40) - 1) == 0x12_3456_789A                   # addr first, LSB
    assert (raw >> DMA_DESC["count"].offset) == 7
    assert DmaDesc.unpack(raw) == d
    assert DMA_DESC.size == 40 + 24 + 32 + 16
    with pytest.raises(ValueError):
        DmaDesc(addr=0, length=1 << 24).pack()
    with pytest.raises(ValueError):
        DmaDesc(addr=-1, length=4).pack()


def test_gemm_job_pack_and_shapes():
    j = GemmJob.for_shape(m=64, n=1536, k=8960, w_exp=-21)
    assert (j.m_count, j.k_steps, j.n_tiles) == (64, 560, 96)
    assert GemmJob.unpack(j.pack()) == j                              # signed exponent
    assert (j.pack() >> GEMM_JOB["w_exp"].offset) == (-21) & 0xFF
    with pytest.raises(ValueError):
        GemmJob.for_shape(m=1, n=20, k=128, w_exp=0)                  # N not whole tiles
    with pytest.raises(ValueError):
        GemmJob(1, 1, 1, 200).pack()                                  # exponent out of range


def test_x_descriptors_match_stream_order():
    rng = np.random.default_rng(3)
    m, k = 3, 32
    xq = rng.integers(-128, 128, (m, k))
    x_m = rng.integers(1 << 15, 1 << 16, m)
    x_e = rng.integers(-24, -18, m)
    blob = gemm_x_blob(xq, x_m, x_e, 16)
    mem = bytes(100) + blob
    scales, codes = GemmJob(m, k // 16, 1, 0).x_descriptors(100)
    read = mem[scales.addr:scales.addr + scales.nbytes]
    stream = gemm_x_stream(blob, m, k, 16)
    assert stream[:16] == read + bytes(16 - len(read))                # one beat, zero-padded
    assert stream[16:] == mem[codes.addr:codes.addr + codes.nbytes]


def test_status_layouts_are_counters():
    for layout in (DMA_STATUS, GEMM_STATUS):
        assert all(f.width == COUNTER_BITS for _, f in layout)
    raw = (5 << GEMM_STATUS["steps"].offset) | 2
    assert status_values(GEMM_STATUS, raw)["steps"] == 5
    assert status_values(GEMM_STATUS, raw)["jobs"] == 2
