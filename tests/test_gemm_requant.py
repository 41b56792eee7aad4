"""amaranth.sim tests of the GEMM engine's output requantiser (hdl/compute/gemm_requant.py):
every element against :func:`mcf.abi.fixed.round_shift` / :func:`mcf.abi.fixed.saturate` and
:func:`mcf.abi.quant.epilogue_shift`'s clamp (the golden epilogue's arithmetic), packing order,
backpressure, and the latency its docstring states."""

from __future__ import annotations

import numpy as np
import pytest
from amaranth import Module, Signal, signed
from amaranth.hdl import Value
from amaranth.sim import Simulator

from mcf.abi.fixed import round_shift, saturate
from mcf.abi.quant import ACT, SHIFT_MAX
from mcf.hdl.compute.gemm_requant import GEMM_ELEMENT, GemmRequant, gemm_round_shift


def expected(e) -> int:
    if e["raw"]:
        return e["lane"]
    sh = min(max(e["shift"], 0), SHIFT_MAX)
    y = saturate(np.int64(round_shift(e["acc"] * e["x_m"], sh, "half_even")), ACT.width)
    return int(saturate(np.int64(int(y) + e["bias"]), ACT.width))


def elements(rng, n):
    out = []
    for _ in range(n):
        big = rng.random() < 0.2                      # saturating products
        out.append({
            "acc": int(rng.integers(-(1 << 46), 1 << 46) if big else
                       rng.integers(-(1 << 30), 1 << 30)),
            "x_m": int(rng.integers(0, 1 << 16)),
            "shift": int(rng.choice([-3, 0, 1, 2, 20, 30, 40, 63, 70])
                         if rng.random() < 0.5 else rng.integers(0, 48)),
            "bias": int(rng.choice([-(1 << 31), (1 << 31) - 1, 0]) if rng.random() < 0.2 else
                        rng.integers(-(1 << 20), 1 << 20)),
            "raw": int(rng.random() < 0.2),
            "lane": int(rng.integers(-(1 << 31), 1 << 31)),
        })
    return out


def run(elems, beat, seed, p_valid, p_ready):
    dut = GemmRequant(beat)
    rng = np.random.default_rng(seed)
    per = beat // 32
    want = len(elems) // per
    got, first = [], []

    async def src(ctx):
        for e in elems:
            while rng.random() >= p_valid:
                ctx.set(dut.i.valid, 0)
                await ctx.tick()
            ctx.set(dut.i.valid, 1)
            ctx.set(Value.cast(dut.i.payload), GEMM_ELEMENT.const(e).as_value().value)
            await ctx.tick().until(dut.i.ready)
        ctx.set(dut.i.valid, 0)

    async def sink(ctx):
        cyc = 0
        while len(got) < want:
            ctx.set(dut.o.ready, int(rng.random() < p_ready))
            _, _, v, r, p = await ctx.tick().sample(dut.o.valid, dut.o.ready, dut.o.payload)
            if v and not first:
                first.append(cyc)
            if v and r:
                got.append(int(p))
            cyc += 1

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(src)
    sim.add_testbench(sink)
    sim.run_until(1e-8 * (len(elems) * 20 + 100))
    assert len(got) == want
    words = [(w >> (32 * i)) & 0xFFFFFFFF for w in got for i in range(per)]
    return [w - (1 << 32) if w >> 31 else w for w in words], first[0]


@pytest.mark.parametrize("width", [53, 62])
def test_round_shift_every_shift(width):
    """``gemm_round_shift`` against ``round_shift(·, ·, "half_even")`` for every 6-bit shift
    (past the value's width too) on extremes, ties and random values of the widths the
    vector unit uses."""
    m = Module()
    v, sh = Signal(signed(width)), Signal(6)
    out = gemm_round_shift(m, v, sh, width)
    lo, hi = -(1 << (width - 1)), (1 << (width - 1)) - 1
    rng = np.random.default_rng(width)
    values = [lo, hi, 0, 1, -1, 3, -3, 5 << 20, -(5 << 20), (1 << 40) + (1 << 39),
              -(1 << 40) - (1 << 39)] + [int(x) for x in rng.integers(lo, hi, 24)]
    cases = [(x, s) for x in values for s in range(64)]
    got = []

    async def bench(ctx):
        for x, s in cases:
            ctx.set(v, x)
            ctx.set(sh, s)
            got.append(ctx.get(out))

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()
    assert got == [int(round_shift(x, s, "half_even")) for x, s in cases]


def test_requant_values_under_backpressure():
    rng = np.random.default_rng(5)
    elems = elements(rng, 400)
    got, _ = run(elems, 128, seed=1, p_valid=0.7, p_ready=0.5)
    assert got == [expected(e) for e in elems]


def test_requant_latency_and_one_element_per_cycle():
    rng = np.random.default_rng(6)
    elems = elements(rng, 8)
    got, first = run(elems, 64, seed=2, p_valid=1.0, p_ready=1.0)
    assert got == [expected(e) for e in elems]
    # elements taken in cycles 0, 1: the first beat is valid at 1 + 3
    assert first == 4
