"""amaranth.sim unit tests of the INT4 GEMM array: INT4 extremes (−8, 7) against INT8 extremes
(−128, 127), group boundaries, the DSP packing split, and backpressure."""

from __future__ import annotations

import numpy as np
import pytest
from amaranth.sim import Simulator

from mcf.abi.fixed import pack_int4
from mcf.golden.gemm import (
    accumulate,
    dsp_pack,
    dsp_unpack,
    group_sums,
    packed_group_sums,
)
from mcf.hdl.compute.gemm_array import GemmArray


def steps_for(xq, wq, w_m, lanes, group):
    """The k-step payloads of one dot product: ``xq[K]`` against ``wq[R, K]``."""
    r, k = wq.shape
    out = []
    spg = group // lanes
    for s in range(k // lanes):
        blk = wq[:, s * lanes:(s + 1) * lanes]
        w = int.from_bytes(pack_int4(blk.ravel()).tobytes(), "little")
        a = int.from_bytes((xq[s * lanes:(s + 1) * lanes] & 0xFF).astype(np.uint8).tobytes(),
                           "little")
        g = s // spg
        sc = int.from_bytes(w_m[:, g].astype("<u2").tobytes(), "little")
        out.append({"w": w, "a": a, "scale": sc, "glast": int(s % spg == spg - 1),
                    "last": int(s == k // lanes - 1)})
    return out


def run_array(xq, wq, w_m, rows, lanes, group, stall_seed=None, gaps=False, chain=1,
              dsp="fabric"):
    dut = GemmArray(rows=rows, lanes=lanes, group=group, chain=chain, dsp=dsp)
    dots = [steps_for(xq[t], wq, w_m, lanes, group) for t in range(xq.shape[0])]
    rng = np.random.default_rng(stall_seed if stall_seed is not None else 0)
    return run_steps(dut, dots, rng, stall=0.5 if stall_seed is not None else 0.0,
                     gap=0.3 if gaps else 0.0)


def run_steps(dut, dots, rng, stall=0.0, gap=0.0, idle=0):
    """Every dot product's ``rows`` accumulators from the array ``dut``: the steps of ``dots``
    (lists of step payloads) with an idle cycle after a step with probability ``gap`` and
    ``idle`` cycles in which the pipeline moves before each dot product's last step; ``o.ready``
    low with probability ``stall``."""
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    results = []

    async def producer(ctx):
        for steps in dots:
            for st in steps:
                if st["last"]:
                    for _ in range(idle):         # cycles the pipeline moves without a step
                        await ctx.tick().until(dut.i.ready)
                ctx.set(dut.i.payload, st)
                ctx.set(dut.i.valid, 1)
                await ctx.tick().until(dut.i.ready)
                ctx.set(dut.i.valid, 0)
                if gap and rng.random() < gap:
                    await ctx.tick()

    async def consumer(ctx):
        while len(results) < len(dots):
            ctx.set(dut.o.ready, int(not stall or rng.random() >= stall))
            await ctx.tick()

    async def monitor(ctx):
        while True:
            _, _, valid, ready, payload = await ctx.tick().sample(
                dut.o.valid, dut.o.ready, dut.o.payload)
            if valid and ready:
                results.append([int(payload[r]) for r in range(dut.rows)])

    sim.add_testbench(producer)
    sim.add_testbench(consumer)
    sim.add_testbench(monitor, background=True)
    steps = sum(len(s) for s in dots)
    sim.run_until(1e-8 * (4 * steps + 60 * len(dots) + 500))
    assert len(results) == len(dots)
    return np.array(results, dtype=np.int64)


def _operands(seed, tokens, rows, k, group):
    """Random INT8 activations (``tokens`` x ``k``), INT4 weights (``rows`` x ``k``) and 16-bit
    per-group weight scales, drawn in that order from ``default_rng(seed)``."""
    rng = np.random.default_rng(seed)
    xq = rng.integers(-128, 128, (tokens, k))
    wq = rng.integers(-8, 8, (rows, k))
    return xq, wq, rng.integers(0, 1 << 16, (rows, k // group))


def check(xq, wq, w_m, rows, lanes, group, **kw):
    got = run_array(xq, wq, w_m, rows, lanes, group, **kw)
    want = accumulate(group_sums(xq, wq, group), w_m)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_packing_golden_matches_plain_sums():
    rng = np.random.default_rng(1)
    for group in (8, 32, 128):
        xq = rng.integers(-128, 128, (3, 2 * group))
        wq = rng.integers(-8, 8, (6, 2 * group))
        np.testing.assert_array_equal(packed_group_sums(xq, wq, group),
                                      group_sums(xq, wq, group))
    # all-extreme group: the low field reaches its most negative and positive sums
    for w0, w1, a in [(-8, -8, -128), (-8, 7, -128), (7, -8, 127), (7, 7, -128)]:
        p = dsp_pack(np.full(128, w0), np.full(128, w1)) * a
        lo, hi = dsp_unpack(p.sum())
        assert (lo, hi) == (128 * w0 * a, 128 * w1 * a)


@pytest.mark.parametrize("w,a", [(-8, -128), (-8, 127), (7, -128), (7, 127)])
def test_int4_int8_extremes(w, a):
    rows, lanes, group = 4, 4, 8
    k = 16
    xq = np.full((2, k), a)
    wq = np.full((rows, k), w)
    wq[1] = -wq[0] if w != -8 else 7          # mixed signs within a DSP pair
    wq[3, ::2] = -8
    w_m = np.full((rows, k // group), 0xFFFF)
    check(xq, wq, w_m, rows, lanes, group)


def test_group_boundaries_and_scales():
    rows, lanes, group = 4, 4, 8
    # a different scale per group exposes any group mis-alignment
    xq, wq, w_m = _operands(2, 3, rows, 5 * group, group)
    w_m[:, 0] = 0
    w_m[:, 1] = 0xFFFF
    check(xq, wq, w_m, rows, lanes, group)


def test_backpressure_and_gaps():
    rows, lanes, group = 6, 4, 8
    xq, wq, w_m = _operands(3, 5, rows, 3 * group, group)
    check(xq, wq, w_m, rows, lanes, group, stall_seed=7, gaps=True)


def test_one_step_groups():
    # group == lanes: every step is a group end; the scaler has one cycle per group
    rows, lanes, group = 2, 8, 8
    xq, wq, w_m = _operands(4, 4, rows, 24, group)
    check(xq, wq, w_m, rows, lanes, group, stall_seed=9)


@pytest.mark.parametrize("lanes,chain,dsp", [(4, 2, "fabric"), (4, 4, "fabric"),
                                             (8, 4, "fabric"), (16, 16, "fabric"),
                                             (4, 2, "model"), (4, 4, "model"),
                                             (16, 16, "model")])
def test_post_adder_chains(lanes, chain, dsp):
    """Lane sums through skewed post-adder chains (the DSP48E2 cascade form, in logic or in
    modelled DSP48E2 slices) give the same sums, with INT4/INT8 extremes in the mix, source
    gaps and sink backpressure."""
    rows, group = 4, 2 * lanes
    xq, wq, w_m = _operands(5 + chain, 4, rows, 3 * group, group)
    xq[0, :] = -128
    wq[0, :], wq[1, :] = -8, 7
    check(xq, wq, w_m, rows, lanes, group, stall_seed=11, gaps=True, chain=chain, dsp=dsp)
