"""amaranth.sim tests of S = Q·Kᵀ on the GEMM's arrays (issue #33,
mcf.hdl.compute.array_score): :class:`ArrayScore` takes TileScore's streams and must emit its
beats — every ``acc`` of :func:`mcf.golden.attention_tiled.qk_acc`, the keys' ``sk``, ``sv``,
the causal mask, the folded query scale, the row's tags — in the same order, under random
valid/ready (the stimulus and checks of ``tests/test_tile_score.py``); quads of 1..4 rows,
sub-tiles skipped past a block's keys; the rate in cycles."""

from __future__ import annotations

import pytest
from test_tile_score import compare, run, run_full_rate, setup

from mcf.hdl.compute.array_score import ArrayScore


@pytest.mark.parametrize("per_channel,arrays,array_rows", [(False, 4, 8), (True, 4, 8),
                                                           (False, 3, 16), (True, 2, 16)])
def test_chunk_bit_exact(per_channel, arrays, array_rows):
    """TileScore's causal 36-token chunk (GQA 2:1, 72 rows, query tiles of 16; per-token K:
    blocks of 32, 34, 30 keys; per-channel: 32-key groups, the query folded per tile) on
    2, 3 or 4 arrays of 8 or 16 keys — quads that end short at a block's rows, a sub-tile
    skipped past a block's last key — random valid/ready: every beat TileScore's."""
    keys, d, lanes, q_tile = 4, 16, 4, 16
    lens = [32, 32, 32] if per_channel else [32, 34, 30]
    rows, kb, qb, mb = setup(per_channel, keys, d, lanes, lens, 36, 2, q_tile, 80 + per_channel)
    dut = ArrayScore(keys=keys, head_dim=d, lanes=lanes, max_block=mb, max_rows=q_tile,
                     arrays=arrays, array_rows=array_rows)
    got, _ = run(dut, kb, qb, sum(len(b) for _, b in rows), idle=0.3, stall=0.4,
                 seed=per_channel + arrays)
    compare(got, rows, keys, d, q_tile)


@pytest.mark.parametrize("keys,d,lanes,array_rows", [(2, 16, 8, 2), (4, 8, 8, 4),
                                                     (1, 32, 4, 4)])
def test_shapes(keys, d, lanes, array_rows):
    """TileScore's other shapes (key tiles of 4, 4 and 8 keys; one chunk per tile; one key
    per beat), GQA 3:1, blocks of 20 and 13 keys, random valid/ready."""
    q_tile = 8
    rows, kb, qb, mb = setup(False, keys, d, lanes, [20, 13], 5, 3, q_tile, 7 + keys)
    dut = ArrayScore(keys=keys, head_dim=d, lanes=lanes, max_block=mb, max_rows=q_tile,
                     array_rows=array_rows)
    got, _ = run(dut, kb, qb, sum(len(b) for _, b in rows), idle=0.2, stall=0.3, seed=keys)
    compare(got, rows, keys, d, q_tile)


@pytest.mark.parametrize("keys,d,lanes,nk,array_rows", [
    (4, 16, 4, 64, 8),
    pytest.param(4, 128, 16, 64, 16, marks=pytest.mark.slow)])      # kr260: ~30 s
def test_rate(keys, d, lanes, nk, array_rows):
    """Inputs always valid, output always ready, whole key tiles: after the first quad the
    score beats leave one per cycle across quads and blocks — the arrays (twice TileScore's
    MACs per step at 4 arrays) keep up with the output."""
    dut = ArrayScore(keys=keys, head_dim=d, lanes=lanes, max_block=nk, max_rows=8,
                     array_rows=array_rows)
    n_out, tr = run_full_rate(dut, keys, d, lanes, nk)
    out = tr["out"]
    first_quad = 4 * nk // keys
    span = out[-1] - out[first_quad] + 1
    print(f"{n_out} score beats; after the first quad {n_out - first_quad} in {span} cycles")
    assert span == n_out - first_quad
