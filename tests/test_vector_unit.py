"""amaranth.sim tests of the vector unit, bit-exact against mcf.golden.vector: every op, with
saturation, rounding ties, sigmoid-table clipping, an all-zero token, and backpressure."""

from __future__ import annotations

import numpy as np
import pytest
from amaranth.sim import Simulator
from engine_sim import data_last, sink

from mcf.abi.compute import VECTOR_STATUS
from mcf.abi.quant import ACT, GAMMA, VectorOp, norm_eps_code, rope_words
from mcf.golden import vector as V
from mcf.hdl.compute.vector import VectorUnit

LANES = 4


def _words(rows, lanes):
    rows = np.asarray(rows, dtype=np.int64) & 0xFFFFFFFF
    out = []
    for row in rows:
        for j in range(0, row.size, lanes):
            out.append(sum(int(v) << (32 * i) for i, v in enumerate(row[j:j + lanes])))
    return out


def run_vector(jobs, lanes=LANES, n_max=64, stall=False, seed=0):
    """``jobs``: list of (op, a[N], b[N] or None); returns list of (beats, lasts) per job."""
    dut = VectorUnit(lanes=lanes, n_max=n_max)
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    rng = np.random.default_rng(seed)
    out = []
    def n_out(op, a):
        nb = len(a) // lanes
        return -(-nb // 4) + 1 if op == VectorOp.REQUANT else nb
    expect = sum(n_out(op, a) for op, a, _ in jobs)

    async def ctrl(ctx):
        for op, a, b in jobs:
            ctx.set(dut.op, op)
            ctx.set(dut.n_beats, len(a) // lanes)
            ctx.set(dut.eps, norm_eps_code(1e-6))
            aw = _words([a], lanes)
            bw = _words([b], lanes) if b is not None else None
            # a and b are offered together; each advances on its own handshake
            ai, bi = 0, 0
            while ai < len(aw) or (bw is not None and bi < len(bw)):
                ctx.set(dut.a.valid, ai < len(aw))
                if ai < len(aw):
                    ctx.set(dut.a.payload, aw[ai])
                ctx.set(dut.b.valid, bw is not None and bi < len(bw))
                if bw is not None and bi < len(bw):
                    ctx.set(dut.b.payload, bw[bi])
                _, _, ar, av, br_, bv = await ctx.tick().sample(
                    dut.a.ready, dut.a.valid, dut.b.ready, dut.b.valid)
                ai += int(ar and av)
                bi += int(br_ and bv)
            ctx.set(dut.a.valid, 0)
            ctx.set(dut.b.valid, 0)
            # wait until this token's output has been produced before changing op
            target = len(out) + n_out(op, a)
            while len(out) < target:
                await ctx.tick()

    status = {}
    sim.add_testbench(ctrl)
    sim.add_testbench(sink(dut, out, expect, rng, stall, status, VECTOR_STATUS, tail=2,
                           beat=data_last))
    sim.run_until(1e-8 * (expect * 20 + len(jobs) * 400 + 200))
    assert len(out) == expect
    beats_in = sum((len(a) + (len(b) if b is not None else 0)) // lanes for _, a, b in jobs)
    assert status == {"tokens": len(jobs), "beats_in": beats_in, "beats_out": expect}
    res, k = [], 0
    for op, a, _ in jobs:
        n = n_out(op, a)
        res.append(out[k:k + n])
        k += n
    return res


def lanes_from(beats, lanes, width=32):
    vals = []
    for d, _ in beats:
        for i in range(lanes):
            v = (d >> (width * i)) & ((1 << width) - 1)
            vals.append(v - (1 << width) if v >> (width - 1) else v)
    return np.array(vals, dtype=np.int64)


def test_streaming_ops():
    rng = np.random.default_rng(1)
    n = 16
    a = rng.integers(-(1 << 31), 1 << 31, n)
    b = rng.integers(-(1 << 31), 1 << 31, n)
    a[:2] = [ACT.max_int, ACT.min_int]
    b[:2] = [5, -5]                                      # saturating sums
    g = rng.integers(-(25 << 16), 25 << 16, n)           # beyond the ±16 sigmoid table
    g[:3] = [ACT.max_int, ACT.min_int, 0]
    u = rng.integers(-(1 << 20), 1 << 20, n)
    x = rng.integers(-(1 << 26), 1 << 26, n)
    pos = 9
    rw = rope_words([pos], n, 8)[0]
    jobs = [(VectorOp.ADD, a, b), (VectorOp.SILU_MUL, g, u), (VectorOp.ROPE, x, rw)]
    for stall in (False, True):
        add, silu, rope = run_vector(jobs, stall=stall, seed=3)
        np.testing.assert_array_equal(lanes_from(add, LANES), V.residual_add(a, b))
        np.testing.assert_array_equal(lanes_from(silu, LANES), V.silu_mul(g, u))
        np.testing.assert_array_equal(lanes_from(rope, LANES), V.rope_pairs(x, rw)[0])
        assert [last for _, last in add] == [0, 0, 0, 1]


@pytest.mark.parametrize("scale", [1e-3, 1.0, 300.0])
def test_rmsnorm(scale):
    rng = np.random.default_rng(2)
    n = 32
    x = np.round(rng.standard_normal(n) * scale * 65536).astype(np.int64)
    gamma = GAMMA.quantize(1 + 0.3 * rng.standard_normal(n))
    gamma[0] = GAMMA.min_int
    (got,) = run_vector([(VectorOp.RMSNORM, x, gamma & 0xFFFF)])
    np.testing.assert_array_equal(lanes_from(got, LANES), V.rmsnorm(x[None], gamma)[0])


def test_requant_and_zero_token():
    rng = np.random.default_rng(3)
    n = 24                                              # 6 beats: one full, one partial pack
    x = rng.integers(-(1 << 24), 1 << 24, n)
    x[3] = -(1 << 24) - 77                              # −absmax → −128
    ties = np.zeros(n, dtype=np.int64)
    ties[:4] = [1 << 20, 3 << 12, 5 << 12, -(3 << 12)]  # exact .5 ties after scaling
    zero = np.zeros(n, dtype=np.int64)
    res = run_vector([(VectorOp.REQUANT, x, None), (VectorOp.REQUANT, ties, None),
                      (VectorOp.REQUANT, zero, None)], stall=True, seed=5)
    for got, src in zip(res, (x, ties, zero)):
        q, m_, e_ = V.requantize(src[None])
        codes = lanes_from(got[:-1], 4 * LANES, 8)[:len(src)]
        np.testing.assert_array_equal(codes, q[0])
        word, last = got[-1]
        assert last == 1
        assert word & 0xFFFF == m_[0] and ((word >> 16) & 0xFF) == (int(e_[0]) & 0xFF)


def run_requant_stream(tokens, *, stall, idle, seed, lanes=LANES):
    """REQUANT of ``tokens`` (rows of one length) with their ``a`` beats offered back to back,
    as the walker's one read of a VEC entry delivers them (with ``idle``, a gap after a beat
    with probability 0.3). Returns the output beats per token and, per output beat, the ``a``
    beats taken by the cycle it left."""
    n = tokens.shape[1]
    dut = VectorUnit(lanes=lanes, n_max=n)
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    rng = np.random.default_rng(seed)
    per = -(-(n // lanes) // 4) + 1
    expect = per * len(tokens)
    aw = _words(tokens, lanes)
    taken, out = [0], []

    async def feed(ctx):
        ctx.set(dut.op, VectorOp.REQUANT)
        ctx.set(dut.n_beats, n // lanes)
        for w in aw:
            ctx.set(dut.a.payload, w)
            ctx.set(dut.a.valid, 1)
            await ctx.tick().until(dut.a.ready)
            taken[0] += 1
            ctx.set(dut.a.valid, 0)
            if idle and rng.random() < 0.3:
                await ctx.tick()

    # each output beat with the a beats taken by the cycle it left
    status = {}
    sim.add_testbench(feed)
    sim.add_testbench(sink(dut, out, expect, rng, stall, status, VECTOR_STATUS, tail=2,
                           beat=lambda p: (data_last(p), taken[0])))
    sim.run_until(1e-8 * (expect * 20 + len(aw) * 8 + len(tokens) * 200))
    assert len(out) == expect
    assert status == {"tokens": len(tokens), "beats_in": len(aw), "beats_out": expect}
    beats, seen = [b for b, _ in out], [t for _, t in out]
    return [beats[k:k + per] for k in range(0, expect, per)], seen, per


@pytest.mark.parametrize("stall,idle", [(False, False), (True, True)])
def test_requant_tokens_back_to_back(stall, idle):
    """Tokens of one REQUANT entry: the next token's pass 1 rides along this one's pass 2 and
    every token's codes and scale stay bit-exact (a token written into the buffer while the one
    before is still read from it)."""
    rng = np.random.default_rng(11)
    rows = rng.integers(-(1 << 26), 1 << 26, (5, 64))
    rows[1] = 0                                          # an all-zero token in the stream
    rows[2, 7] = -(1 << 26) - 5                          # −absmax → −128
    rows[3] = rows[3] >> 9                               # a much smaller scale after a larger
    got, seen, per = run_requant_stream(rows, stall=stall, idle=idle, seed=4)
    q, m_, e_ = V.requantize(rows)
    for t, beats in enumerate(got):
        codes = lanes_from(beats[:-1], 4 * LANES, 8)[:rows.shape[1]]
        np.testing.assert_array_equal(codes, q[t])
        word, last = beats[-1]
        assert last == 1 and [b[1] for b in beats[:-1]] == [0] * (per - 1)
        assert word & 0xFFFF == m_[t] and ((word >> 16) & 0xFF) == (int(e_[t]) & 0xFF)
    if not stall and not idle:
        # by the time token 0's scale beat leaves, all of token 1's beats are in: it was read
        # during token 0's second pass (without the overlap: a few beats of its first pass)
        nb = rows.shape[1] // LANES
        assert seen[per - 1] >= 2 * nb
