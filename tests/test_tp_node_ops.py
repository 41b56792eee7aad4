"""Tensor-parallel decode's node datapath steps (issue #34 item 3; docs/cluster.md
"Tensor-parallel decode: the golden model"), amaranth.sim bit-exact against the golden models,
which are checked against :mod:`mcf.golden.tp_decode`:

* the vector unit's ABSMAX (a shard's ``absmax_lanes``) and REQUANT_EXT (requantisation with the
  MAX-reduced lanes: the whole row's codes);
* the GEMM's ``acc_out`` jobs (each element's exact accumulator as two SUM lanes) and
  ``acc_in`` jobs (the epilogue of the summed lanes: the single-node GEMM of the whole K)."""

from __future__ import annotations

import numpy as np
import pytest
from amaranth.sim import Simulator
from engine_sim import beats, data_last, run_gemm_engine, sink

from mcf.abi.compute import (
    VECTOR_STATUS,
    GemmJob,
    gemm_bias_stream,
    gemm_lanes_x_stream,
    gemm_w_stream,
    gemm_x_stream,
)
from mcf.abi.meta import ReduceOp
from mcf.abi.quant import ACT, VectorOp, requantize
from mcf.abi.tp import absmax_lanes, acc_lanes, lanes_absmax, requantize_with_absmax
from mcf.golden import gemm as G
from mcf.golden import vector as V
from mcf.golden.tp_decode import nic_all_reduce, partial_acc
from mcf.hdl.compute.gemm import GemmEngine
from mcf.hdl.compute.vector import VectorUnit
from mcf.quant import QuantWeight, gemm_tile_blob, gemm_x_blob, token_scale_words

LANES = 4                      # vector unit lanes (a 128-bit beat)


# ---- golden models against the TP golden functions ----------------------------------------------


def test_golden_vector_ops_match_tp():
    """ABSMAX's lanes, MAX-reduced over the shards through the golden NIC, give REQUANT_EXT
    the whole row's ``requantize`` codes on every shard (= ``requantize_with_absmax``)."""
    rng = np.random.default_rng(101)
    for n_nodes in (2, 4):
        row = rng.integers(-(1 << 28), 1 << 28, 64)
        row[rng.integers(64)] = -(1 << 31)                     # |−2^31| only via the ~x lane
        shards = np.split(row, n_nodes)
        mx = nic_all_reduce(ReduceOp.MAX, [V.absmax(s) for s in shards]).reshape(2)
        q, m_, e_ = requantize(row)
        for i, s in enumerate(shards):
            np.testing.assert_array_equal(V.absmax(s), absmax_lanes(s))
            qs, ms, es = V.requantize_ext(s, mx)
            np.testing.assert_array_equal(qs, np.split(q, n_nodes)[i])
            assert (ms, es) == (m_, e_)
            np.testing.assert_array_equal(qs, requantize_with_absmax(s, lanes_absmax(mx))[0])
    zero = np.zeros(8, dtype=np.int64)
    np.testing.assert_array_equal(V.requantize_ext(zero, [-5, -7])[0], zero)   # absmax 0


def test_golden_gemm_modes_match_tp():
    """``partial_lanes`` is ``acc_lanes(partial_acc)``; the SUM-reduced lanes through
    ``lanes_epilogue`` are the single-node GEMM of the whole K (with bias)."""
    rng = np.random.default_rng(102)
    k, n, g = 64, 8, 16
    x = rng.integers(-128, 128, (1, k))
    x_m, x_e = rng.integers(1 << 15, 1 << 16, 1), np.array([-20])
    qw = QuantWeight(rng.integers(-8, 8, (n, k)), rng.integers(0, 1 << 16, (n, k // g)), -22, g)
    bias = rng.integers(-(1 << 20), 1 << 20, n)
    ranges = [(0, 16), (16, 40), (40, 64)]                   # one cuts a group
    parts = []
    for lo, hi in ranges:
        j0, j1 = lo // g, -(-hi // g)
        xp = np.zeros((1, (j1 - j0) * g), dtype=np.int64)
        wp = np.zeros((n, (j1 - j0) * g), dtype=np.int64)
        xp[:, lo - j0 * g:hi - j0 * g] = x[:, lo:hi]
        wp[:, lo - j0 * g:hi - j0 * g] = qw.q[:, lo:hi]
        lanes = G.partial_lanes(xp, wp, qw.m[:, j0:j1], g)
        np.testing.assert_array_equal(lanes[0], acc_lanes(partial_acc(x[:, lo:hi], qw,
                                                                      (lo, hi))[0]))
        parts.append(lanes[0])
    summed = nic_all_reduce(ReduceOp.SUM, parts)
    np.testing.assert_array_equal(G.lanes_epilogue(summed[None], x_m, x_e, qw.e, bias),
                                  G.gemm(x, x_m, x_e, qw.q, qw.m, qw.e, bias, g))
    assert G.lanes_in([[0, 1 << 23]]) == -(1 << 47)          # wraps to ACC_BITS as the engine


# ---- vector unit --------------------------------------------------------------------------------


def _beats(vals, lanes, width=32):
    v = np.asarray(vals, dtype=np.int64) & ((1 << width) - 1)
    return [sum(int(x) << (width * i) for i, x in enumerate(v[j:j + lanes]))
            for j in range(0, v.size, lanes)]


def _lanes(words, lanes, width=32):
    out = []
    for w in words:
        for i in range(lanes):
            v = (w >> (width * i)) & ((1 << width) - 1)
            out.append(v - (1 << width) if v >> (width - 1) else v)
    return np.array(out, dtype=np.int64)


def run_vector(jobs, n_max=64, stall=False, seed=0):
    """``jobs``: ``(op, a, b or None)``; returns the output beats ``(data, last)`` per job and
    the status counters."""
    dut = VectorUnit(lanes=LANES, n_max=n_max)
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    rng = np.random.default_rng(seed)

    def n_out(op, a):
        nb = len(a) // LANES
        return {VectorOp.ABSMAX: 1, VectorOp.REQUANT: -(-nb // 4) + 1,
                VectorOp.REQUANT_EXT: -(-nb // 4) + 1}.get(op, nb)

    counts = [n_out(op, a) for op, a, _ in jobs]
    out, status = [], {}

    async def ctrl(ctx):
        for (op, a, b), cnt in zip(jobs, counts):
            ctx.set(dut.op, op)
            ctx.set(dut.n_beats, len(a) // LANES)
            aw = _beats(a, LANES)
            bw = _beats(b, LANES) if b is not None else []
            ai = bi = 0
            while ai < len(aw) or bi < len(bw):
                ctx.set(dut.a.valid, ai < len(aw))
                ctx.set(dut.a.payload, aw[ai] if ai < len(aw) else 0)
                ctx.set(dut.b.valid, bi < len(bw))
                ctx.set(dut.b.payload, bw[bi] if bi < len(bw) else 0)
                _, _, ar, av, br, bv = await ctx.tick().sample(
                    dut.a.ready, dut.a.valid, dut.b.ready, dut.b.valid)
                ai += int(ar and av)
                bi += int(br and bv)
                if stall and rng.random() < 0.3:
                    ctx.set(dut.a.valid, 0)
                    ctx.set(dut.b.valid, 0)
                    await ctx.tick()
            ctx.set(dut.a.valid, 0)
            ctx.set(dut.b.valid, 0)
            target = len(out) + cnt
            while len(out) < target:
                await ctx.tick()

    sim.add_testbench(ctrl)
    sim.add_testbench(sink(dut, out, sum(counts), rng, stall, status, VECTOR_STATUS, tail=2,
                           beat=data_last))
    sim.run_until(1e-8 * (sum(counts) * 20 + len(jobs) * 400 + 200))
    assert len(out) == sum(counts)
    res, k = [], 0
    for cnt in counts:
        res.append(out[k:k + cnt])
        k += cnt
    return res, status


def _check_requant(got, want):
    q, m_, e_ = want
    codes = _lanes([d for d, _ in got[:-1]], 4 * LANES, 8)[:q.size]
    np.testing.assert_array_equal(codes, q)
    word, last = got[-1]
    assert last == 1 and [d for d, lst in got[:-1] if lst] == []
    assert word & 0xFFFF == int(m_) and (word >> 16) & 0xFF == int(e_) & 0xFF
    assert word >> 24 == 0


@pytest.mark.parametrize("stall", [False, True])
def test_vector_absmax_and_requant_ext(stall):
    """ABSMAX of random shards and the extremes (−2^31, 2^31 − 1, all negative, all zero) is
    ``absmax_lanes``; REQUANT_EXT with the MAX-reduced lanes is the whole row's requantisation
    (random rows, a shard without the row's absmax, absmax 0, lanes below the shard's own
    absmax, negative lanes), back to back with REQUANT."""
    rng = np.random.default_rng(103)
    n = 16
    shards = [rng.integers(-(1 << 31), 1 << 31, n), rng.integers(-(1 << 20), 1 << 20, n),
              np.full(n, -(1 << 31)), np.full(n, (1 << 31) - 1), -rng.integers(1, 99, n),
              np.zeros(n, dtype=np.int64)]
    jobs = [(VectorOp.ABSMAX, s, None) for s in shards]
    row = rng.integers(-(1 << 26), 1 << 26, 2 * n)
    row[5] = (1 << 26) + 12345                                    # the absmax in shard 0
    halves = np.split(row, 2)
    mx = np.maximum(absmax_lanes(halves[0]), absmax_lanes(halves[1]))   # the MAX all-reduce
    ext_cases = [(halves[0], mx), (halves[1], mx), (np.zeros(n, dtype=np.int64), [0, -1]),
                 (halves[1], [7, 3]), (halves[1], [-9, -(1 << 31)]),
                 (shards[0], [(1 << 31) - 1, (1 << 31) - 1])]
    lanes4 = [np.concatenate([np.asarray(v, dtype=np.int64), rng.integers(-99, 99, LANES - 2)])
              for _, v in ext_cases]
    jobs += [(VectorOp.REQUANT_EXT, s, b) for (s, _), b in zip(ext_cases, lanes4)]
    jobs += [(VectorOp.REQUANT, halves[1], None)]
    res, st = run_vector(jobs, stall=stall, seed=7)
    for s, got in zip(shards, res):
        (d, last), = got
        assert last == 1
        np.testing.assert_array_equal(_lanes([d], LANES), list(V.absmax(s)) + [0, 0])
    for (s, v), got in zip(ext_cases, res[len(shards):]):
        _check_requant(got, V.requantize_ext(s, v))
    _check_requant(res[-1], requantize(halves[1]))
    q, m_, e_ = requantize(row)                                   # the whole row's codes
    _check_requant(res[len(shards)], (q[:n], m_, e_))
    _check_requant(res[len(shards) + 1], (q[n:], m_, e_))
    assert st["tokens"] == len(jobs)
    assert st["beats_in"] == sum(len(a) // LANES + (b is not None) for _, a, b in jobs)


# ---- GEMM engine --------------------------------------------------------------------------------


def run_gemm(cfg, jobs, k_max=32, m_max=4, arrays=1, stall=False, seed=0):
    """``jobs``: ``(job, x_stream, w_stream, out_words)`` for an engine of ``cfg`` (rows,
    lanes, group, w_in bytes); returns the output words per job (signed 32-bit) and the status
    counters."""
    rows, lanes, group, wbb = cfg
    dut = GemmEngine(rows=rows, lanes=lanes, group=group, k_max=k_max, m_max=m_max,
                     arrays=arrays, w_width=8 * wbb)
    bb = dut.beat // 8
    xb = [b for _, xs, _, _ in jobs for b in beats(xs, bb)]
    wb = [b for _, _, ws, _ in jobs for b in beats(ws, wbb)]
    n_out = [nw * 4 // bb for *_, nw in jobs]
    vals, status = run_gemm_engine(dut, [j.pack() for j, *_ in jobs], xb, wb, n_out, seed=seed,
                            stall=stall, cycles=(len(xb) + len(wb) + sum(n_out)) * 8 + 800)
    res, pos = [], 0
    for *_, nw in jobs:
        res.append(vals[pos:pos + nw])
        pos += nw
    return res, status


def _tile_major(words, m, n, rows, per):
    """Engine output order (tile, token, ``per`` words of a tile row) → ``[m, n · per / rows]``."""
    return np.asarray(words).reshape(n // rows, m, per).transpose(1, 0, 2).reshape(m, -1)


def act_job(cfg, xq, x_m, x_e, qw, bias, acc_out=0):
    rows, lanes, group, wbb = cfg
    bb = lanes
    m, k = xq.shape
    n = qw.q.shape[0]
    job = GemmJob.for_shape(m, n, k, qw.e, rows, lanes, acc_out=acc_out)
    xs = gemm_x_stream(gemm_x_blob(xq, x_m, x_e, bb), m, k, bb)
    ws = gemm_w_stream(gemm_tile_blob(qw, rows, lanes, bias), k // lanes, n // rows, rows,
                       lanes, wbb, group)
    return job, xs, ws, m * n * (2 if acc_out else 1)


def lanes_job(cfg, lanes_, x_m, x_e, qw, bias, acc_out=0):
    rows, lanes, group, wbb = cfg
    m = lanes_.shape[0]
    n = qw.q.shape[0]
    job = GemmJob(m, group // lanes, n // rows, qw.e, acc_in=1, acc_out=acc_out)
    xs = gemm_lanes_x_stream(token_scale_words(x_m, x_e), lanes_, rows, lanes)
    ws = gemm_bias_stream(gemm_tile_blob(qw, rows, lanes, bias), n // rows, rows, wbb)
    return job, xs, ws, m * n * (2 if acc_out else 1)


def extreme_weights(rng, m, n, k, group):
    """Codes and mantissas with the largest accumulators a K = 32 job reaches (rows 0 and 1 of
    token 0: ±32 · 1,024 · 0xFFFF ≈ ±2^31), mixed with random rows: ``hi`` lanes of both
    signs. (Accumulators near ±2^47 need K near 2^21; the ``acc_in`` jobs take them.)"""
    xq = rng.integers(-128, 128, (m, k))
    xq[0] = -128
    q = rng.integers(-8, 8, (n, k))
    q[0], q[1] = -8, 7                                  # acc of token 0: big ±
    wm = rng.integers(0, 1 << 16, (n, k // group))
    wm[:2] = 0xFFFF
    return xq, q, wm


# (rows, lanes, group, w_in bytes): a 32-bit beat (an element's lanes in two beats), a 64-bit
# one (one element per beat) and a 128-bit one (two per beat) with a two-beat w_in
CFGS = [(4, 4, 8, 4), (4, 8, 16, 8), (8, 16, 16, 32)]


@pytest.mark.parametrize("cfg,arrays,stall", [(CFGS[0], 1, False), (CFGS[0], 4, True),
                                              (CFGS[1], 2, True), (CFGS[2], 4, True)])
def test_gemm_acc_out_and_in(cfg, arrays, stall):
    """Back to back on one engine: an ordinary job, ``acc_out`` jobs (each node's shard of a
    row-parallel GEMM over 3 nodes, K cut inside a group), an ``acc_in`` job on their SUM
    all-reduced lanes (= the single-node GEMM of the whole K: bias, rounding, saturation),
    an ``acc_in`` job of hand-made lanes (accumulators at ±2^47, negative ``lo`` and ``hi``,
    sums beyond 48 bits wrapping), an ``acc_in`` + ``acc_out`` job (the lanes renormalised) and
    the ordinary job again: every output bit-exact against the golden models."""
    rows, lanes, group, _ = cfg
    rng = np.random.default_rng(104 + lanes)
    m, n, k = 1, 2 * rows, 32
    xq, q, wm = extreme_weights(rng, m, n, k, group)
    x_m = np.array([0xFFFF])
    x_e = np.array([-14])                                # shift 18: ACT codes up to ~2^29
    qw = QuantWeight(q, wm, -20, group)
    bias = rng.integers(-(1 << 20), 1 << 20, n)
    bias[0] = ACT.max_int
    full_acc = G.accumulate(G.group_sums(xq, q, group), wm)
    assert full_acc.max() > 1 << 30 and full_acc.min() < -(1 << 30)
    # row-parallel over 3 nodes: K ranges run as the whole groups they touch
    ranges = [(0, 12), (12, 24), (24, 32)]
    jobs, shard_in = [act_job(cfg, xq, x_m, x_e, qw, bias)], []
    for lo, hi in ranges:
        j0, j1 = lo // group, -(-hi // group)
        xp = np.zeros((m, (j1 - j0) * group), dtype=np.int64)
        qp = np.zeros((n, (j1 - j0) * group), dtype=np.int64)
        xp[:, lo - j0 * group:hi - j0 * group] = xq[:, lo:hi]
        qp[:, lo - j0 * group:hi - j0 * group] = q[:, lo:hi]
        shard = QuantWeight(qp, wm[:, j0:j1], qw.e, group)
        shard_in.append((xp, shard))
        jobs.append(act_job(cfg, xp, x_m, x_e, shard, None, acc_out=1))
    parts = [G.partial_lanes(xp, s.q, s.m, group) for xp, s in shard_in]
    summed = nic_all_reduce(ReduceOp.SUM, [p[0] for p in parts])[None]
    jobs.append(lanes_job(cfg, summed, x_m, x_e, qw, bias))
    # hand-made summed lanes, 2 tokens
    hand = rng.integers(-(1 << 28), 1 << 28, (2, 2 * n))
    hand[0, :4] = [(1 << 24) - 1, (1 << 23) - 1, 0, -(1 << 23)]     # 2^47 − 1, −2^47
    hand[0, 4:8] = [-5, 3, -(1 << 30), 1 << 30]                     # negative lo
    hand[1, :2] = [(1 << 31) - 1, 1 << 22]                           # lo near 2^31
    hx_m, hx_e = rng.integers(1 << 15, 1 << 16, 2), np.array([-38, -30])
    jobs.append(lanes_job(cfg, hand, hx_m, hx_e, qw, bias))
    jobs.append(lanes_job(cfg, hand, hx_m, hx_e, qw, bias, acc_out=1))
    jobs.append(jobs[0])
    res, st = run_gemm(cfg, jobs, arrays=arrays, stall=stall, seed=5)

    want_full = G.gemm(xq, x_m, x_e, q, wm, qw.e, bias, group)
    assert ACT.max_int in want_full
    np.testing.assert_array_equal(_tile_major(res[0], m, n, rows, rows), want_full)
    for i, p in enumerate(parts):
        np.testing.assert_array_equal(_tile_major(res[1 + i], m, n, rows, 2 * rows), p)
    np.testing.assert_array_equal(_tile_major(res[4], m, n, rows, rows), want_full)
    want_hand = G.lanes_epilogue(hand, hx_m, hx_e, qw.e, bias)
    np.testing.assert_array_equal(_tile_major(res[5], 2, n, rows, rows), want_hand)
    assert np.abs(G.lanes_in(hand)[0, :2]).min() >= (1 << 47) - 1
    np.testing.assert_array_equal(_tile_major(res[6], 2, n, rows, 2 * rows),
                                  acc_lanes(G.lanes_in(hand)))
    np.testing.assert_array_equal(res[7], res[0])
    assert st["jobs_done"] == len(jobs) and st["bad_jobs"] == 0
    assert st["tiles_done"] == len(jobs) * n // rows
    # acc_in jobs issue no array steps
    assert st["steps"] == sum(x.shape[0] * x.shape[1] // lanes * n // rows
                              for x in [xq] + [xp for xp, _ in shard_in] + [xq])
