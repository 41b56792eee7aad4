"""amaranth.sim tests of prefill attention on one shared set of GEMM arrays (issue #33,
mcf.hdl.compute.array_attend, array_share): :class:`ArrayAttention` from Q, K and V — S and
P·V taking turns on the same arrays — must give every row's merged state of
:func:`mcf.golden.attention_tiled.attend_tiled_rows` (SINGLE, P8, packed arrays) bit for bit
under random valid/ready (TileAttention's chunks and checks, ``tests/test_tile_attend.py``),
and its rate in cycles."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from amaranth import Elaboratable, Module, Value
from amaranth.lib import wiring
from amaranth.sim import Simulator
from test_array_pv import v_words
from test_gemm_engine import SHAPES4, golden, job_results, job_streams, random_case
from test_tile_attend import check, chunk, run, run_at_full_rate, score_inputs, stimulus
from test_tile_merge import scheduled
from tile_sim import beats_per_row, feeder, merged_rows

from mcf.abi.attn_tile import P8, PV_W, score_row_beat_layout
from mcf.abi.kv import KV_SCALE, AttnMode
from mcf.golden.attention import State
from mcf.golden.attention_tiled import attend_tiled_rows
from mcf.hdl.compute.array_attend import ArrayAttention
from mcf.hdl.compute.gemm_shared import SharedGemm


def v_blocks(dut, q_pos, blocks, q_tile):
    """Each scheduled block's V as the arrays' words (ArrayPV's ``v``)."""
    return [v_words(np.asarray(blk.v), len(r), dut.pv)
            for _, blk, r, _, _ in scheduled(q_pos, blocks, q_tile)]


@pytest.mark.parametrize("per_channel,g", [(False, 2), (True, 2), (True, 6)])
def test_qkv_chunk_bit_exact(per_channel, g):
    """TileAttention's causal chunks (36 tokens at GQA 2:1, 12 at 6:1; query tiles of 16 rows;
    per-token K: blocks of 32, 34, 30 keys; per-channel K: 32-key groups, the query folded per
    key tile; rows skipping the last block; the diagonal tile) on 4 arrays of 8 keys/channels ×
    4 lanes shared by S and P·V; random valid/ready on Q, K, V and the output."""
    rng = np.random.default_rng(100 + 10 * per_channel + g)
    d, keys, lanes, q_tile = 16, 4, 4, 16
    lens = [32, 32, 32] if per_channel else [32, 34, 30]
    q, sq, blocks, q_pos = chunk(rng, lens, 72 // g, g, d, per_channel)
    mb = 48
    rows, _ = stimulus(q, sq, blocks, q_pos, q_tile, keys, d)
    qk = score_inputs(q, sq, blocks, q_pos, q_tile, keys, d, lanes, mb)
    expect = attend_tiled_rows(q, sq, blocks, q_pos, "single", p_format=P8, q_tile=q_tile,
                               array=True)
    dut = ArrayAttention(keys=keys, head_dim=d, lanes=lanes, max_block=mb, rows=q_tile,
                         array_rows=8)
    got, _ = run(dut, rows, v_blocks(dut, q_pos, blocks, q_tile), idle=0.25, stall=0.4,
                 seed=g + per_channel, qk=qk)
    check(got, expect, len(q))


@pytest.mark.parametrize("per_channel,g", [(False, 2), (True, 6)])
def test_qkv_chunk_today_w(per_channel, g):
    """The same chunks, V scales raised so ``w`` fills its three bytes, with P·V in today's
    ``w`` (``p_format = PV_W``: each byte a dot product on the arrays): every merged row is
    today's — ``attend_tiled_rows(..., p_format=None)``, which the golden tests equal to
    ``attend_causal_rows`` — and the P8 path gives different rows on these chunks (the test
    can tell the formats apart; a wrong shift of byte 1 or byte 2 fails it)."""
    rng = np.random.default_rng(100 + 10 * per_channel + g)
    d, keys, lanes, q_tile = 16, 4, 4, 16
    lens = [32, 32, 32] if per_channel else [32, 34, 30]
    q, sq, blocks, q_pos = chunk(rng, lens, 72 // g, g, d, per_channel)
    # V scales up to KV_SCALE's largest: w = p·sv / 2^12 reaches its third byte
    blocks = [replace(b, sv=rng.integers(1 << 12, KV_SCALE.max_int + 1, len(b.sv)))
              for b in blocks]
    blocks[0].sv[0] = KV_SCALE.max_int
    mb = 48
    rows, _ = stimulus(q, sq, blocks, q_pos, q_tile, keys, d)
    qk = score_inputs(q, sq, blocks, q_pos, q_tile, keys, d, lanes, mb)
    expect = attend_tiled_rows(q, sq, blocks, q_pos, "single", q_tile=q_tile, array=True)
    assert expect == attend_tiled_rows(q, sq, blocks, q_pos, "single", q_tile=q_tile)
    p8 = attend_tiled_rows(q, sq, blocks, q_pos, "single", p_format=P8, q_tile=q_tile)
    assert not np.array_equal(p8.o, expect.o)
    dut = ArrayAttention(keys=keys, head_dim=d, lanes=lanes, max_block=mb, rows=q_tile,
                         array_rows=8, p_format=PV_W)
    got, _ = run(dut, rows, v_blocks(dut, q_pos, blocks, q_tile), idle=0.25, stall=0.4,
                 seed=7 + g + per_channel, qk=qk)
    check(got, expect, len(q))


@pytest.mark.parametrize("per_channel,g", [(False, 2), (True, 6)])
def test_p8_rows_on_the_today_w_chain(per_channel, g):
    """One chain for both formats: rows with ``p8`` on ArrayAttention built for today's ``w``
    (``PV_W``) give the P8 rows (``attend_tiled_rows(..., p_format=P8, array=True)``), the
    others today's — query tiles of either kind in one stream, and the two kinds' rows differ
    on this chunk (the test tells them apart)."""
    rng, q, sq, blocks, q_pos, rows = today_w_chunk(per_channel, g)
    d, keys, lanes, q_tile, mb = 16, 4, 4, 16, 48
    p8_gold = attend_tiled_rows(q, sq, blocks, q_pos, "single", p_format=P8, q_tile=q_tile,
                                array=True)
    w_gold = attend_tiled_rows(q, sq, blocks, q_pos, "single", q_tile=q_tile, array=True)
    assert not np.array_equal(p8_gold.o, w_gold.o)
    p8 = (np.arange(len(q)) // q_tile) % 2 == 0            # every other query tile in P8
    expect = State(np.where(p8, p8_gold.m, w_gold.m), np.where(p8, p8_gold.l, w_gold.l),
                   np.where(p8[:, None], p8_gold.o, w_gold.o))
    qk = score_inputs(q, sq, blocks, q_pos, q_tile, keys, d, lanes, mb, p8=p8)
    dut = ArrayAttention(keys=keys, head_dim=d, lanes=lanes, max_block=mb, rows=q_tile,
                         array_rows=8, p_format=PV_W)
    got, _ = run(dut, rows, v_blocks(dut, q_pos, blocks, q_tile), idle=0.2, stall=0.3,
                 seed=11 + g, qk=qk)
    check(got, expect, len(q))


def today_w_chunk(per_channel, g):
    """:func:`test_qkv_chunk_today_w`'s chunk and its inputs (V scales filling ``w``'s three
    bytes)."""
    rng = np.random.default_rng(100 + 10 * per_channel + g)
    d, keys, q_tile = 16, 4, 16
    lens = [32, 32, 32] if per_channel else [32, 34, 30]
    q, sq, blocks, q_pos = chunk(rng, lens, 72 // g, g, d, per_channel)
    blocks = [replace(b, sv=rng.integers(1 << 12, KV_SCALE.max_int + 1, len(b.sv)))
              for b in blocks]
    rows, _ = stimulus(q, sq, blocks, q_pos, q_tile, keys, d)
    return rng, q, sq, blocks, q_pos, rows


@pytest.mark.parametrize("per_channel,g", [(False, 2), (True, 6)])
def test_qkv_chunk_two_phase(per_channel, g):
    """The two-phase modes on the arrays in today's ``w``, rows of both modes in one stream:
    MAX rows give :func:`attend_tiled_rows`' ``"max"`` maxima (``l``, ``o`` 0); FIXED rows
    against given maxima give its ``"fixed"`` states — the wrapped exact sums of
    :func:`mcf.golden.attention.attend_fixed` — with the maxima of a quarter of the rows
    lowered (keys above it: ``p = 1``, counted in ``err_fixed`` as the golden counts them);
    the FIXED rows differ from SINGLE's (the test tells the modes apart)."""
    rng, q, sq, blocks, q_pos, rows = today_w_chunk(per_channel, g)
    d, keys, lanes, q_tile, mb = 16, 4, 4, 16, 48
    m_max = attend_tiled_rows(q, sq, blocks, q_pos, "max", q_tile=q_tile, array=True)
    m_fix = m_max + rng.integers(0, 3 << 8, len(q))
    low = rng.permutation(len(q))[:len(q) // 4]
    m_fix[low] -= 3 << 8
    fixed, bad = attend_tiled_rows(q, sq, blocks, q_pos, "fixed", m_fix=m_fix, q_tile=q_tile,
                                   array=True)
    assert bad > 0
    single = attend_tiled_rows(q, sq, blocks, q_pos, "single", q_tile=q_tile)
    assert not np.array_equal(fixed.l, single.l)
    for mode, expect, n_bad in ((AttnMode.MAX, State(m_max, np.zeros_like(m_max),
                                                     np.zeros_like(fixed.o)), 0),
                                (AttnMode.FIXED, fixed, bad)):
        qk = score_inputs(q, sq, blocks, q_pos, q_tile, keys, d, lanes, mb, mode=mode,
                          m_fix=m_fix)
        dut = ArrayAttention(keys=keys, head_dim=d, lanes=lanes, max_block=mb, rows=q_tile,
                             array_rows=8, p_format=PV_W)
        got, tr = run(dut, rows, v_blocks(dut, q_pos, blocks, q_tile), idle=0.25, stall=0.4,
                      seed=3 + g + per_channel, qk=qk, probes=[dut.softmax.err_fixed])
        check(got, expect, len(q))
        assert tr["probes"] == [n_bad]


@pytest.mark.parametrize("d,lanes,nk,n_blocks,n_tok,array_rows", [
    (16, 4, 64, 3, 8, 8),
    pytest.param(128, 16, 256, 2, 4, 16, marks=pytest.mark.slow)])   # kr260: ~1 min
def test_qkv_rate(d, lanes, nk, n_blocks, n_tok, array_rows):
    """Inputs always valid, output always ready, whole blocks: the score beats pass from
    ArrayScore to the softmax one per cycle after the first quad — ``keys`` (row, key) pairs,
    ``2·keys·head_dim`` QKᵀ + P·V MACs per cycle — while S and P·V share the arrays. The
    second shape is the kr260's (4 keys per beat, head_dim 128, 4 arrays of 16 × 16,
    256-key blocks): 1,024 MACs per cycle on 512 DSP48E2 — TileAttention's rate on as many
    array DSPs, which here S and P·V share."""
    rng = np.random.default_rng(91)
    keys, q_tile = 4, 8
    q, sq, blocks, q_pos = chunk(rng, [nk] * n_blocks, n_tok, 2, d, False)
    rows, _ = stimulus(q, sq, blocks, q_pos, q_tile, keys, d)
    qk = score_inputs(q, sq, blocks, q_pos, q_tile, keys, d, lanes, nk)
    dut = ArrayAttention(keys=keys, head_dim=d, lanes=lanes, max_block=nk, rows=q_tile,
                         array_rows=array_rows)
    got, tr, n_beats, span = run_at_full_rate(dut, q, sq, blocks, q_pos, rows,
                                              v_blocks(dut, q_pos, blocks, q_tile), qk)
    take = tr["take"]
    first = 4 * nk // keys
    steady = take[-1] - take[first] + 1
    macs = 2 * n_beats * keys * d
    print(f"score beats {n_beats} in {span} cycles ({macs / span:.1f} MACs/cycle); after the "
          f"first quad {n_beats - first} in {steady}; all {len(got)} rows out "
          f"{tr['out'][-1] + 1} cycles from the start "
          f"({macs / (tr['out'][-1] + 1):.1f} MACs/cycle with fill and drain)")
    assert steady == n_beats - first


@pytest.mark.slow
def test_qkv_rate_today_w():
    """The kr260 shape of :func:`test_qkv_rate` with P·V in today's ``w`` (three dot products
    per channel group): bit-exact with today's rows; the cycles printed (P·V's steps three
    times P8's, so the arrays, not the output, set the rate)."""
    rng = np.random.default_rng(91)
    d, lanes, nk, keys, q_tile = 128, 16, 256, 4, 8
    q, sq, blocks, q_pos = chunk(rng, [nk] * 2, 4, 2, d, False)
    rows, _ = stimulus(q, sq, blocks, q_pos, q_tile, keys, d)
    qk = score_inputs(q, sq, blocks, q_pos, q_tile, keys, d, lanes, nk)
    dut = ArrayAttention(keys=keys, head_dim=d, lanes=lanes, max_block=nk, rows=q_tile,
                         array_rows=16, p_format=PV_W)
    got, tr, n_beats, span = run_at_full_rate(dut, q, sq, blocks, q_pos, rows,
                                              v_blocks(dut, q_pos, blocks, q_tile), qk,
                                              p_format=None)
    macs = 2 * n_beats * keys * d
    print(f"today's w: score beats {n_beats} in {span} cycles ({macs / span:.1f} MACs/cycle); "
          f"all {len(got)} rows out {tr['out'][-1] + 1} cycles from the start "
          f"({macs / (tr['out'][-1] + 1):.1f} MACs/cycle with fill and drain)")


class GemmAndAttention(Elaboratable):
    """A GEMM engine and an ArrayAttention on one set of arrays: the engine is client 0 of a
    three-client ArrayShare (:class:`~mcf.hdl.compute.gemm_shared.SharedGemm`), ArrayScore and
    ArrayPV clients 1 and 2."""

    def __init__(self, gemm_kw, att_kw):
        self.g = SharedGemm(clients=3, **gemm_kw)
        self.a = ArrayAttention(own_arrays=False, **att_kw)

    def elaborate(self, platform):
        m = Module()
        m.submodules.g, m.submodules.a = g, a = self.g, self.a
        wiring.connect(m, a.score_st, g.c1_st)
        wiring.connect(m, g.c1_res, a.score_res)
        wiring.connect(m, a.pv_st, g.c2_st)
        wiring.connect(m, g.c2_res, a.pv_res)
        return m


def test_gemm_and_attention_share_the_arrays():
    """GEMM jobs (token-parallel, M not a multiple of the 4 arrays) and a causal attention chunk
    (per-channel K, GQA 2:1) run at the same time on one set of 4 arrays of 4 × 4 (group 8 =
    head_dim): the share switches between their dot products (the clients' steps interleave
    in time), and every GEMM output and every merged attention row is bit-exact, under random
    valid/ready on all seven streams."""
    rng = np.random.default_rng(77)
    cases = [random_case(rng, *s) for s in SHAPES4]
    d, keys, lanes, q_tile = 8, 4, 4, 8
    q, sq, blocks, q_pos = chunk(rng, [32, 32], 12, 2, d, True)
    rows, _ = stimulus(q, sq, blocks, q_pos, q_tile, keys, d)
    kb, qb = score_inputs(q, sq, blocks, q_pos, q_tile, keys, d, lanes, 32)
    top = GemmAndAttention(dict(rows=4, lanes=4, group=8, k_max=32, m_max=8, arrays=4),
                           dict(keys=keys, head_dim=d, lanes=lanes, max_block=32, rows=q_tile,
                                array_rows=4))
    g, a = top.g, top.a
    jobs, xb, wb, n_out = job_streams(g, cases)
    finals = [x for x, beats in rows
              if score_row_beat_layout(keys, d, q_tile).from_bits(beats[0]).final]
    sim = Simulator(top)
    sim.add_clock(1e-8)
    feeds = [(g.job, jobs), (g.x_in, xb), (g.w_in, wb), (a.q, qb),
             (a.k, [w for blk in kb for w in blk]), (a.v, [w for blk in v_blocks(
                 a, q_pos, blocks, q_tile) for w in blk])]
    for n, (port, beats) in enumerate(feeds):
        sim.add_testbench(feeder(port, beats, 5 + n, 0.2), background=True)
    g_out, a_out, steps = [], [], {0: [], 1: [], 2: []}

    def sink(port, out, count, seed):
        async def tb(ctx):
            r = np.random.default_rng(seed)
            while len(out) < count:
                ctx.set(port.ready, int(r.random() < 0.7))
                _, _, v, rd, p = await ctx.tick().sample(port.valid, port.ready,
                                                         Value.cast(port.payload))
                if v and rd:
                    out.append(int(p))
        return tb

    async def watch(ctx):
        cyc = 0
        sh = g.share
        async for vals in ctx.tick().sample(*[x for c in range(3) for x in (
                getattr(sh, f"c{c}_st").valid, getattr(sh, f"c{c}_st").ready)]):
            for c in range(3):
                if vals[2 + 2 * c] and vals[3 + 2 * c]:
                    steps[c].append(cyc)
            cyc += 1

    sim.add_testbench(sink(g.o, g_out, sum(n_out), 1))
    olay = a.o.payload.shape()
    sim.add_testbench(sink(a.o, a_out, len(finals) * beats_per_row(olay, d), 2))
    sim.add_testbench(watch, background=True)
    sim.run()
    bb = g.beat // 8
    vals = np.frombuffer(b"".join(v.to_bytes(bb, "little") for v in g_out),
                         dtype="<i4").astype(np.int64)
    for case, y in zip(cases, job_results(g, cases, vals, n_out)):
        np.testing.assert_array_equal(y, golden(case))
    got = merged_rows(a_out, finals, olay, d, q_tile)
    check(got, attend_tiled_rows(q, sq, blocks, q_pos, "single", p_format=P8, q_tile=q_tile,
                                 array=True), len(q))
    # the clients' steps interleave: attention steps between the GEMM's first and last
    g0, g1 = steps[0][0], steps[0][-1]
    inside = [c for c in steps[1] + steps[2] if g0 < c < g1]
    print(f"GEMM steps {len(steps[0])} in cycles {g0}..{g1}; attention steps {len(steps[1])} "
          f"S + {len(steps[2])} P·V, {len(inside)} of them in that span")
    assert len(inside) > 10
