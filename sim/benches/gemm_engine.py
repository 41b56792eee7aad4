"""cocotb bench of the INT4 GEMM engine behind FlatTop: activations and tile blobs from
cocotbext-axi stream sources, results into a sink, bit-exact against mcf.golden.gemm.

Params: ``rows``, ``lanes``, ``group``; ``cases``: list of ``{m, n, k, seed}``; ``idle`` and
``backpressure`` (probabilities of pausing a source / the sink); ``out`` (optional): path of a
JSON file receiving per case: ``steps`` and ``cycles`` (the engine's counters: k-steps, and
cycles from the first step to the last result) and ``job_cycles`` (from ``start`` to the last
result beat received, i.e. including the activation and first-tile loads).
"""

from __future__ import annotations

import json
import random

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import RisingEdge
from cocotb.utils import get_sim_time
from cocotbext.axi import AxiStreamBus, AxiStreamFrame, AxiStreamSink, AxiStreamSource

from mcf.golden.gemm import gemm
from mcf.quant import QuantWeight, gemm_tile_blob, gemm_x_blob
from mcf.sim import bench_params

CLOCK_NS = 4


def _pauses(p, rng):
    while True:
        yield rng.random() < p


def make_case(m, n, k, group, seed):
    rng = np.random.default_rng(seed)
    xq = rng.integers(-128, 128, (m, k))
    x_m = rng.integers(1 << 15, 1 << 16, m)
    x_e = rng.integers(-26, -20, m)
    q = rng.integers(-8, 8, (n, k)).astype(np.int8)
    # a few all-extreme rows keep the INT4 corners in every shape
    q[0, :] = -8
    if n > 1:
        q[1, :] = 7
    wm = rng.integers(0, 1 << 16, (n, k // group))
    qw = QuantWeight(q, wm, -20, group)
    bias = rng.integers(-(1 << 24), 1 << 24, n)
    return xq, x_m, x_e, qw, bias


@cocotb.test()
async def gemm_bit_exact(dut):
    p = bench_params()
    rows, lanes, group = p["rows"], p["lanes"], p["group"]
    beat = lanes
    cocotb.start_soon(Clock(dut.clk, CLOCK_NS, unit="ns").start())
    xs = AxiStreamSource(AxiStreamBus.from_prefix(dut, "s_axis_x"), dut.clk, dut.rst)
    ws = AxiStreamSource(AxiStreamBus.from_prefix(dut, "s_axis_w"), dut.clk, dut.rst)
    ys = AxiStreamSink(AxiStreamBus.from_prefix(dut, "m_axis_y"), dut.clk, dut.rst)
    rng = random.Random(p.get("seed", 1))
    if p.get("idle", 0):
        xs.set_pause_generator(_pauses(p["idle"], rng))
        ws.set_pause_generator(_pauses(p["idle"], rng))
    if p.get("backpressure", 0):
        ys.set_pause_generator(_pauses(p["backpressure"], rng))
    dut.start.value = 0
    dut.rst.value = 1
    for _ in range(3):
        await RisingEdge(dut.clk)
    dut.rst.value = 0
    measured = []
    for case in p["cases"]:
        m, n, k = case["m"], case["n"], case["k"]
        xq, x_m, x_e, qw, bias = make_case(m, n, k, group, case["seed"])
        dut.m_count.value = m
        dut.k_steps.value = k // lanes
        dut.n_tiles.value = n // rows
        dut.w_exp.value = qw.e
        dut.start.value = 1
        await RisingEdge(dut.clk)
        dut.start.value = 0
        t0 = get_sim_time("ns")
        await xs.send(AxiStreamFrame(gemm_x_blob(xq, x_m, x_e, beat)))
        await ws.send(AxiStreamFrame(gemm_tile_blob(qw, rows, lanes, bias)))
        want = gemm(xq, x_m, x_e, qw.q, qw.m, qw.e, bias, group)
        n_bytes = m * n * 4
        got = bytearray()
        while len(got) < n_bytes:
            fr = await ys.recv(compact=False)
            got += bytes(fr.tdata)
        job_cycles = int(round((get_sim_time("ns") - t0) / CLOCK_NS))
        vals = np.frombuffer(bytes(got[:n_bytes]), dtype="<i4").astype(np.int64)
        y = vals.reshape(n // rows, m, rows).transpose(1, 0, 2).reshape(m, n)
        bad = np.argwhere(y != want)
        assert bad.size == 0, (f"case {case}: {len(bad)} mismatches, first at {bad[0]}: "
                               f"{y[tuple(bad[0])]} != {want[tuple(bad[0])]}")
        for _ in range(4):
            await RisingEdge(dut.clk)
        assert int(dut.tiles_done.value) == n // rows
        assert int(dut.x_dropped.value) == 0 and int(dut.w_dropped.value) == 0
        steps, cycles = int(dut.steps.value), int(dut.cycles.value)
        assert steps == m * (k // lanes) * (n // rows)
        measured.append({**case, "steps": steps, "cycles": cycles, "job_cycles": job_cycles,
                         "x_bytes": len(gemm_x_blob(xq, x_m, x_e, beat)),
                         "w_bytes": len(gemm_tile_blob(qw, rows, lanes, bias))})
    if p.get("out"):
        with open(p["out"], "w") as f:
            json.dump(measured, f)
