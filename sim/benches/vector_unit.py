"""cocotb bench of the vector unit behind FlatTop, bit-exact against mcf.golden.vector on
Qwen2.5-1.5B token shapes (hidden 1536, intermediate 8960, head_dim 128) and the tiny model.

Params: ``lanes``; ``jobs``: list of ``{op, n, seed}``; ``idle``/``backpressure``.
"""

from __future__ import annotations

import random

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles
from cocotbext.axi import AxiStreamBus, AxiStreamFrame, AxiStreamSink, AxiStreamSource

from mcf.abi.quant import GAMMA, VectorOp, norm_eps_code, rope_words
from mcf.golden import vector as V
from mcf.sim import bench_params
from mcf.sim.tb import bernoulli


def act_bytes(a):
    return (np.asarray(a, dtype=np.int64) & 0xFFFFFFFF).astype("<u4").tobytes()


def make_job(op, n, seed):
    rng = np.random.default_rng(seed)
    scale = rng.choice([0.05, 1.0, 40.0])
    a = np.round(rng.standard_normal(n) * scale * 65536).astype(np.int64)
    a[rng.integers(0, n)] = rng.choice([2**31 - 1, -2**31])      # one extreme element
    if op == VectorOp.ADD:
        b = rng.integers(-2**31, 2**31, n)
        return a, b, V.residual_add(a, b)
    if op == VectorOp.SILU_MUL:
        b = np.round(rng.standard_normal(n) * 65536).astype(np.int64)
        return a, b, V.silu_mul(a, b)
    if op == VectorOp.ROPE:
        w = rope_words([int(rng.integers(0, 32768))], n, 128)[0]
        return a, w, V.rope_pairs(a, w)[0]
    if op == VectorOp.RMSNORM:
        g = GAMMA.quantize(1 + 0.3 * rng.standard_normal(n))
        return a, g & 0xFFFF, V.rmsnorm(a[None], g)[0]
    q, m, e = V.requantize(a[None])
    return a, None, (q[0], int(m[0]), int(e[0]))


@cocotb.test()
async def vector_bit_exact(dut):
    p = bench_params()
    lanes = p["lanes"]
    cocotb.start_soon(Clock(dut.clk, 4, unit="ns").start())
    sa = AxiStreamSource(AxiStreamBus.from_prefix(dut, "s_axis_a"), dut.clk, dut.rst)
    sb = AxiStreamSource(AxiStreamBus.from_prefix(dut, "s_axis_b"), dut.clk, dut.rst)
    so = AxiStreamSink(AxiStreamBus.from_prefix(dut, "m_axis_o"), dut.clk, dut.rst)
    rng = random.Random(p.get("seed", 1))
    if p.get("idle"):
        sa.set_pause_generator(bernoulli(p["idle"], rng))
        sb.set_pause_generator(bernoulli(p["idle"], rng))
    if p.get("backpressure"):
        so.set_pause_generator(bernoulli(p["backpressure"], rng))
    dut.rst.value = 1
    await ClockCycles(dut.clk, 3)
    dut.rst.value = 0
    for job in p["jobs"]:
        op, n = VectorOp[job["op"]], job["n"]
        a, b, want = make_job(op, n, job["seed"])
        dut.op.value = op.value
        dut.n_beats.value = n // lanes
        dut.eps.value = norm_eps_code(1e-6)
        sends = [cocotb.start_soon(sa.send(AxiStreamFrame(act_bytes(a))))]
        if b is not None:
            sends.append(cocotb.start_soon(sb.send(AxiStreamFrame(act_bytes(b)))))
        fr = await so.recv()
        data = bytes(fr.tdata)
        for s in sends:
            await s
        if op == VectorOp.REQUANT:
            q, m, e = want
            codes = np.frombuffer(data[:n], dtype=np.int8).astype(np.int64)
            np.testing.assert_array_equal(codes, q, err_msg=f"{job}")
            word = int.from_bytes(data[-lanes * 4:][:4], "little")
            assert word == (m | ((e & 0xFF) << 16)), f"{job}: scale word {word:#x}"
        else:
            got = np.frombuffer(data, dtype="<i4").astype(np.int64)
            bad = np.argwhere(got != want)
            assert bad.size == 0, f"{job}: {len(bad)} mismatches, first {bad[0]}"
