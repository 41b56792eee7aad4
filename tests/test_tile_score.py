"""amaranth.sim tests of the S = Q·Kᵀ arrays of the tiled prefill (issue #33,
mcf.hdl.compute.tile_score): every score beat — the exact ``acc`` of
:func:`mcf.golden.attention_tiled.qk_acc` through the packed-array model, the keys' ``sk``,
``sv``, the causal mask, the folded query scale, the row's tags — equal to the score rows
TileSoftmax takes (``tests/test_tile_attend.py``'s ``stimulus``) bit for bit, under random
valid/ready; the array's rate and latency measured in cycles."""

from __future__ import annotations

import numpy as np
import pytest
from amaranth.sim import Simulator
from test_tile_attend import chunk, score_inputs, stimulus
from tile_sim import taking_sink

from mcf.abi.attn_tile import qk_acc_bits, qk_pack_shift, qk_tile_keys, score_row_beat_layout
from mcf.abi.kv import KV_ELEM, Q_ELEM
from mcf.golden.attention import KVBlock
from mcf.golden.attention_tiled import packed_matmul, qk_acc, tile_schedule
from mcf.hdl.compute.tile_score import TileScore
from mcf.sim.amsim import send


def run(dut, kblocks, qbeats, n_out, idle=0.0, stall=0.0, seed=0):
    """Feeds the K words and query beats; returns the ``n_out`` output beats (bits) and a
    trace: the cycles of output beats taken and of query beats taken, and the count of cycles
    ``q.ready`` was low under a valid beat."""
    sim = Simulator(dut)
    sim.add_clock(1e-8)

    async def feed_k(ctx):
        await send(ctx, dut.k, (b for words in kblocks for b in words),
                   np.random.default_rng(seed), idle)

    async def feed_q(ctx):
        await send(ctx, dut.q, qbeats, np.random.default_rng(seed + 3), idle)

    sink, seen = taking_sink(dut.o, dut.q, n_out, np.random.default_rng(seed + 5), stall,
                             quiet=8)          # nothing more comes out
    sim.add_testbench(feed_k, background=True)
    sim.add_testbench(feed_q, background=True)
    sim.add_testbench(sink)
    sim.run()
    return seen.bits, {"out": seen.out, "qtake": seen.take, "qwait": seen.wait}


def compare(got, rows, keys, d, q_tile):
    """Beat for beat against the expected score rows, with a readable first difference."""
    want = [bits for _, beats in rows for bits in beats]
    assert len(got) == len(want)
    lay = score_row_beat_layout(keys, d, q_tile)
    for n, (g, w) in enumerate(zip(got, want)):
        if g != int(w):
            gv, wv = lay.from_bits(g), lay.from_bits(w)
            accs = [(int(gv.beat.keys[j].acc), int(wv.beat.keys[j].acc)) for j in range(keys)]
            raise AssertionError(f"beat {n}: got {gv} want {wv}; acc {accs}")


def setup(per_channel, keys, d, lanes, lens, n_tok, g, q_tile, seed):
    rng = np.random.default_rng(seed)
    q, sq, blocks, q_pos = chunk(rng, lens, n_tok, g, d, per_channel)
    R = qk_tile_keys(keys, d, lanes)
    max_block = -(-max(lens) // R) * R
    rows, _ = stimulus(q, sq, blocks, q_pos, q_tile, keys, d)
    kb, qb = score_inputs(q, sq, blocks, q_pos, q_tile, keys, d, lanes, max_block)
    return rows, kb, qb, max_block


@pytest.mark.parametrize("per_channel", [False, True])
def test_chunk_bit_exact(per_channel):
    """A causal 36-token chunk, GQA 2:1 (72 rows, query tiles of 16) at the end of 96 keys
    (per-token K: blocks of 32, 34, 30 keys — a partial key tile and a partial beat; per-channel
    K: 32-key groups, two key tiles each, the query folded per tile); rows that skip the last
    block, the diagonal tile; random valid/ready on all streams: every beat equals the score
    rows TileSoftmax takes."""
    keys, d, lanes, q_tile = 4, 16, 4, 16
    lens = [32, 32, 32] if per_channel else [32, 34, 30]
    rows, kb, qb, mb = setup(per_channel, keys, d, lanes, lens, 36, 2, q_tile, 80 + per_channel)
    dut = TileScore(keys=keys, head_dim=d, lanes=lanes, max_block=mb, max_rows=q_tile)
    got, _ = run(dut, kb, qb, sum(len(b) for _, b in rows), idle=0.3, stall=0.4,
                 seed=per_channel)
    compare(got, rows, keys, d, q_tile)


@pytest.mark.parametrize("keys,d,lanes", [(2, 16, 8), (4, 8, 8), (1, 32, 4)])
def test_shapes(keys, d, lanes):
    """Other array shapes — key tiles of 4, 4 and 8 keys; one chunk per tile (``lanes =
    head_dim``); one key per beat — per-token K, GQA 3:1, blocks of 20 and 13 keys, random
    valid/ready."""
    q_tile = 8
    rows, kb, qb, mb = setup(False, keys, d, lanes, [20, 13], 5, 3, q_tile, 7 + keys)
    dut = TileScore(keys=keys, head_dim=d, lanes=lanes, max_block=mb, max_rows=q_tile)
    got, _ = run(dut, kb, qb, sum(len(b) for _, b in rows), idle=0.2, stall=0.3, seed=keys)
    compare(got, rows, keys, d, q_tile)


def test_extremes_kr260_shape():
    """The kr260 shape (4 keys per beat, head_dim 128, 16 lanes: 32-key tiles, 256 slices):
    queries at 127 / −128 against keys at −8 / 7 — the largest sums both ways (131,072 =
    −128·−8·128 needs all ``qk_acc_bits`` = 19 bits) — and random rows; the split is exact, and
    ``packed_matmul`` agrees with the plain product."""
    keys, d, lanes = 4, 128, 16
    rng = np.random.default_rng(5)
    R = qk_tile_keys(keys, d, lanes)
    nk = 2 * R
    k = rng.integers(KV_ELEM.min_int, KV_ELEM.max_int + 1, (nk, d))
    k[0], k[1], k[2], k[3] = KV_ELEM.min_int, KV_ELEM.max_int, KV_ELEM.min_int, KV_ELEM.max_int
    k[4, ::2], k[4, 1::2] = KV_ELEM.min_int, KV_ELEM.max_int
    k[5] = 0
    q = rng.integers(Q_ELEM.min_int, Q_ELEM.max_int + 1, (4, d))
    q[0], q[1] = Q_ELEM.min_int, Q_ELEM.max_int
    q[2, ::2], q[2, 1::2] = Q_ELEM.min_int, Q_ELEM.max_int
    acc = qk_acc(q, k)
    np.testing.assert_array_equal(qk_acc(q, k, array=True), acc)
    assert acc.max() == Q_ELEM.min_int * KV_ELEM.min_int * d            # 131,072
    assert acc.min() == Q_ELEM.max_int * KV_ELEM.min_int * d            # −130,048
    assert int(acc.max()).bit_length() + 1 == qk_acc_bits(d)
    sq = np.stack([rng.integers(1, 1 << 15, 4), rng.integers(-8, 8, 4)], axis=1)
    blk = KVBlock(k, rng.integers(1, 1 << 16, nk), np.zeros((nk, d), dtype=np.int64),
                  rng.integers(1, 1 << 16, nk), np.arange(nk))
    q_pos = np.array([nk - 1, nk - 1, nk - 1, 40])          # the last row sees 41 keys
    rows, _ = stimulus(q, sq, [blk], q_pos, 4, keys, d)
    kb, qb = score_inputs(q, sq, [blk], q_pos, 4, keys, d, lanes, nk)
    dut = TileScore(keys=keys, head_dim=d, lanes=lanes, max_block=nk, max_rows=4)
    got, _ = run(dut, kb, qb, sum(len(b) for _, b in rows), stall=0.3, seed=2)
    compare(got, rows, keys, d, 4)


def run_full_rate(dut, keys, d, lanes, nk):
    """Three whole blocks of ``nk`` keys, 8 rows each (a 4-token chunk at GQA 2:1, 8-row
    tiles), inputs always valid and the output always ready, every beat checked; returns the
    beats' count and :func:`run`'s trace."""
    q_tile = 8
    rng = np.random.default_rng(11)
    q, sq, blocks, q_pos = chunk(rng, [nk] * 3, 4, 2, d, False)
    assert all(len(r) == 8 for _, _, r, _ in tile_schedule(q_pos, blocks, q_tile))
    rows, _ = stimulus(q, sq, blocks, q_pos, q_tile, keys, d)
    kb, qb = score_inputs(q, sq, blocks, q_pos, q_tile, keys, d, lanes, nk)
    n_out = sum(len(b) for _, b in rows)
    got, tr = run(dut, kb, qb, n_out)
    compare(got, rows, keys, d, q_tile)
    return n_out, tr


@pytest.mark.parametrize("keys,d,lanes,nk", [(4, 16, 4, 64), (4, 128, 16, 64)])
def test_rate_and_latency(keys, d, lanes, nk):
    """Whole key tiles (``R`` divides the block), inputs always valid, output always ready:
    after the first row the score beats leave one per cycle — ``keys × head_dim`` MACs per
    cycle — across rows and blocks (K double-banked, the next block loaded under the current
    one); the first beat leaves ``latency`` cycles after the first query beat is taken."""
    dut = TileScore(keys=keys, head_dim=d, lanes=lanes, max_block=nk, max_rows=8)
    n_out, tr = run_full_rate(dut, keys, d, lanes, nk)
    out = tr["out"]
    span = out[-1] - out[0] + 1
    print(f"{n_out} score beats in {span} cycles: {n_out * keys * d / span:.1f} MACs/cycle on "
          f"{dut.dsps} DSP; first beat {out[0] - tr['qtake'][0]} cycles after the first query")
    assert span == n_out
    assert out[0] - tr["qtake"][0] == dut.latency


def test_packed_model_matches():
    """The stimulus' S (``packed_matmul`` per engine run) is :func:`qk_acc` of the golden model
    (the function TileScore is named against)."""
    rng = np.random.default_rng(3)
    q = rng.integers(-128, 128, (5, 32))
    k = rng.integers(-8, 8, (9, 32))
    np.testing.assert_array_equal(packed_matmul(q, k, qk_pack_shift(32), 32),
                                  qk_acc(q, k, array=True))
    np.testing.assert_array_equal(qk_acc(q, k), q @ k.T)
