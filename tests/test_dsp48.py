"""The DSP48E2 multiply-add slice (mcf.hdl.compute.dsp48): the model's arithmetic and pipeline
against UG579's ``P = (D + A)·B + PCIN`` with its 27/45/48-bit wraps, a cascade under clock
enables, and the instantiated form through yosys (ports/parameters checked against its DSP48E2
cell, every lane sum inside DSP slices)."""

from __future__ import annotations

import numpy as np
from amaranth import Module
from amaranth.sim import Simulator

from mcf.hdl.compute.dsp48 import MULT_B_BITS, P_BITS, PREADD_BITS, Dsp48MulAdd
from mcf.hdl.compute.gemm_array import GemmArray
from mcf.sim.synth import resources


def wrap(v: int, bits: int) -> int:
    v &= (1 << bits) - 1
    return v - (1 << bits) if v >> (bits - 1) else v


def ug579(a: int, d: int, b: int, pcin: int) -> int:
    """The slice's sum as UG579 defines it for this configuration."""
    return wrap(wrap(d + a, PREADD_BITS) * b + pcin, P_BITS)


def test_model_matches_ug579_with_wraps_and_cascade():
    """Three cascaded model slices, inputs skewed one cycle per slice, random clock-enable
    gaps; values at the pre-adder's and the P register's limits wrap as the silicon does."""
    n = 3
    top = Module()
    sl = [Dsp48MulAdd(cascade=j > 0, primitive=False) for j in range(n)]
    for j, s in enumerate(sl):
        top.submodules[f"s{j}"] = s
        if j:
            top.d.comb += s.pcin.eq(sl[j - 1].pcout)
    rng = np.random.default_rng(3)
    lim_a = 1 << (PREADD_BITS - 1)
    lim_b = 1 << (MULT_B_BITS - 1)
    steps = [[(int(rng.integers(-lim_a, lim_a)), int(rng.integers(-lim_a, lim_a)),
               int(rng.integers(-lim_b, lim_b))) for _ in range(n)] for _ in range(40)]
    steps[0] = [(lim_a - 1, lim_a - 1, lim_b - 1)] * n        # pre-adder overflow
    steps[1] = [(-lim_a, -lim_a, -lim_b)] * n
    want = []
    for st in steps:
        acc = 0
        for a, d, b in st:
            acc = ug579(a, d, b, acc)
        want.append(acc)
    got = []

    async def bench(ctx):
        # slice j sees step t's inputs at (enabled) cycle t + j; the chain's sum of step t
        # leaves slice n−1 at enabled cycle t + n − 1 + 3
        cyc = 0
        while len(got) < len(steps):
            ce = int(rng.random() < 0.7)
            for s in sl:
                ctx.set(s.ce, ce)
            for j, s in enumerate(sl):
                t = cyc - j
                a, d, b = steps[t][j] if 0 <= t < len(steps) else (0, 0, 0)
                ctx.set(s.a, a)
                ctx.set(s.d, d)
                ctx.set(s.b, b)
            await ctx.tick()
            if ce:
                cyc += 1
                t = cyc - (n - 1) - 3
                if 0 <= t < len(steps):
                    got.append(ctx.get(sl[-1].pcout))

    sim = Simulator(top)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert got == want


def test_primitive_array_puts_lane_sums_into_dsp_slices():
    """The instantiated form passes yosys's DSP48E2 port and parameter check, and an array's
    lane sums cost no carry chain: only the group accumulators and scaler add (fabric form for
    comparison: every lane adder in carry chains)."""
    kw = dict(rows=2, lanes=8, group=16)
    prim = resources(GemmArray(chain=8, dsp="primitive", **kw), "test_gemm_dsp_prim", abc9=False)
    fab = resources(GemmArray(chain=8, **kw), "test_gemm_dsp_fabric", abc9=False)
    assert prim["DSP"] == fab["DSP"] == 8 + 1     # 8 lanes × 1 row pair, 1 scaler
    assert prim["CARRY"] < fab["CARRY"] - 8 * 8   # ≥ 8 × 32-bit chain adders gone
    assert prim["LUT"] < fab["LUT"]


def test_accumulating_slice_holds_and_adds_its_own_p():
    """An accumulating slice (W multiplexer on P): ``P ← M + PCIN + (acc ? P : 0)`` when ``ce_p``,
    held otherwise; the input and product registers follow ``ce`` alone. Checked cycle by cycle
    against a register-level reference with random enables, ``acc`` and operands."""
    prev = Dsp48MulAdd(cascade=False, primitive=False)
    dut = Dsp48MulAdd(cascade=True, primitive=False, accumulate=True)
    top = Module()
    top.submodules.prev, top.submodules.dut = prev, dut
    top.d.comb += dut.pcin.eq(prev.pcout)
    rng = np.random.default_rng(8)
    lim = 1 << 20

    async def bench(ctx):
        ref = {"a2": 0, "d2": 0, "b2": 0, "m": 0, "p": 0}
        for _ in range(300):
            ce, ce_p, acc = (int(rng.random() < q) for q in (0.8, 0.7, 0.6))
            a, d, b = (int(v) for v in rng.integers(-lim, lim, 3))
            b = wrap(b, MULT_B_BITS)
            pc = int(rng.integers(-lim, lim))
            for port, v in ((prev.ce, 1), (prev.a, pc), (prev.d, 0), (prev.b, 1),
                            (dut.ce, ce), (dut.ce_p, ce_p), (dut.acc, acc),
                            (dut.a, a), (dut.d, d), (dut.b, b)):
                ctx.set(port, v)
            pcin = ctx.get(prev.pcout)
            new = dict(ref)
            if ce:
                new.update(a2=a, d2=d, b2=b,
                           m=wrap(ref["d2"] + ref["a2"], PREADD_BITS) * ref["b2"])
            if ce_p:
                new["p"] = wrap(ref["m"] + pcin + (ref["p"] if acc else 0), P_BITS)
            ref = new
            await ctx.tick()
            assert ctx.get(dut.pcout) == ref["p"]

    sim = Simulator(top)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
