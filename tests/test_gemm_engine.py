"""amaranth.sim tests of the GEMM engine (loaders, ping-pong tiles, epilogue): bit-exact against
:func:`mcf.golden.gemm.gemm`, including rounding ties and saturation of the epilogue."""

from __future__ import annotations

import numpy as np
import pytest
from amaranth.sim import Simulator

from mcf.abi.quant import ACT, ACT_FRAC
from mcf.golden.gemm import gemm
from mcf.hdl.compute.gemm import GemmEngine
from mcf.quant import QuantWeight, gemm_tile_blob, gemm_x_blob


def beats(blob: bytes, nbytes: int):
    assert len(blob) % nbytes == 0
    return [int.from_bytes(blob[i:i + nbytes], "little") for i in range(0, len(blob), nbytes)]


def run_engine(xq, x_m, x_e, qw, bias, rows, lanes, group, k_max, m_max, seed=0,
               stall=False, extra_x=0):
    dut = GemmEngine(rows=rows, lanes=lanes, group=group, k_max=k_max, m_max=m_max)
    bb = dut.beat // 8
    xb = beats(gemm_x_blob(xq, x_m, x_e, bb), bb) + [0xDEAD] * extra_x
    wb = beats(gemm_tile_blob(qw, rows, lanes, bias), bb)
    m_tok, k = xq.shape
    n = qw.q.shape[0]
    n_out = m_tok * n * 4 // bb
    out = []
    rng = np.random.default_rng(seed)
    sim = Simulator(dut)
    sim.add_clock(1e-8)

    async def control(ctx):
        ctx.set(dut.m_count, m_tok)
        ctx.set(dut.k_steps, k // lanes)
        ctx.set(dut.n_tiles, n // rows)
        ctx.set(dut.w_exp, qw.e)
        ctx.set(dut.start, 1)
        await ctx.tick()
        ctx.set(dut.start, 0)

    def feeder(port, items):
        async def tb(ctx):
            await ctx.tick().repeat(2)
            for it in items:
                ctx.set(port.payload, it)
                ctx.set(port.valid, 1)
                await ctx.tick().until(port.ready)
                ctx.set(port.valid, 0)
                if stall and rng.random() < 0.2:
                    await ctx.tick()
        return tb

    async def sink(ctx):
        while len(out) < n_out:
            ctx.set(dut.o.ready, 1 if not stall else int(rng.random() < 0.6))
            _, _, v, r, p = await ctx.tick().sample(dut.o.valid, dut.o.ready, dut.o.payload)
            if v and r:
                out.append(int(p))

    sim.add_testbench(control)
    sim.add_testbench(feeder(dut.x_in, xb))
    sim.add_testbench(feeder(dut.w_in, wb))
    sim.add_testbench(sink)
    cycles = (len(xb) + len(wb)) * 3 + m_tok * (k // lanes + 30) * (n // rows) * 3 + 400
    sim.run_until(1e-8 * cycles)
    assert len(out) == n_out, f"got {len(out)} of {n_out} beats"
    raw = b"".join(v.to_bytes(bb, "little") for v in out)
    vals = np.frombuffer(raw, dtype="<i4").astype(np.int64)
    # tile-major, token-major inside a tile
    y = vals.reshape(n // rows, m_tok, rows).transpose(1, 0, 2).reshape(m_tok, n)
    return y, dut


def random_case(rng, m_tok, n, k, group):
    xq = rng.integers(-128, 128, (m_tok, k))
    x_m = rng.integers(1 << 15, 1 << 16, m_tok)
    x_e = rng.integers(-24, -18, m_tok)
    q = rng.integers(-8, 8, (n, k)).astype(np.int8)
    wm = rng.integers(0, 1 << 16, (n, k // group))
    qw = QuantWeight(q, wm, -22, group)
    bias = rng.integers(-(1 << 20), 1 << 20, n)
    return xq, x_m, x_e, qw, bias


@pytest.mark.parametrize("stall", [False, True])
def test_engine_random(stall):
    rng = np.random.default_rng(11)
    rows, lanes, group = 4, 4, 8
    xq, x_m, x_e, qw, bias = random_case(rng, 3, 12, 24, group)
    y, _ = run_engine(xq, x_m, x_e, qw, bias, rows, lanes, group, k_max=32, m_max=4,
                      seed=5, stall=stall)
    np.testing.assert_array_equal(y, gemm(xq, x_m, x_e, qw.q, qw.m, qw.e, bias, group))


def test_epilogue_ties_and_saturation():
    """Rounding ties at the epilogue shift (half to even) and ±2^31 saturation, with bias."""
    rows, lanes, group = 4, 4, 8
    k = 8
    # x_e chosen so the shift is 1: acc·x_m / 2 — odd products give exact ties
    w_e = -ACT_FRAC
    x_e = np.array([-1, -1, -1 + 0, 20])
    xq = np.zeros((4, k), dtype=np.int64)
    xq[0, 0], xq[1, 0], xq[2, 0], xq[3, :] = 1, 3, -1, 127
    x_m = np.array([1, 1, 3, 0xFFFF])
    q = np.zeros((4, k), dtype=np.int8)
    q[:, 0] = [1, -1, 7, -8]
    q[:, 1:] = 7
    wm = np.array([[1], [1], [1], [0xFFFF]])
    qw = QuantWeight(q, wm, w_e, group)
    bias = np.array([0, 1, ACT.max_int, ACT.min_int])
    y, _ = run_engine(xq, x_m, x_e, qw, bias, rows, lanes, group, k_max=16, m_max=4)
    want = gemm(xq, x_m, x_e, qw.q, qw.m, qw.e, bias, group)
    np.testing.assert_array_equal(y, want)
    assert ACT.max_int in want and ACT.min_int in want  # saturation exercised both ways


def test_extra_beats_dropped():
    rng = np.random.default_rng(12)
    rows, lanes, group = 4, 4, 8
    xq, x_m, x_e, qw, bias = random_case(rng, 2, 4, 16, group)
    y, _ = run_engine(xq, x_m, x_e, qw, bias, rows, lanes, group, k_max=16, m_max=2,
                      extra_x=3)
    np.testing.assert_array_equal(y, gemm(xq, x_m, x_e, qw.q, qw.m, qw.e, bias, group))
