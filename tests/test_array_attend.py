"""amaranth.sim tests of prefill attention on one shared set of GEMM arrays (issue #33,
mcf.hdl.compute.array_attend, array_share): :class:`ArrayAttention` from Q, K and V — S and
P·V taking turns on the same arrays — must give every row's merged state of
:func:`mcf.golden.attention_tiled.attend_tiled_rows` (SINGLE, P8, packed arrays) bit for bit
under random valid/ready (TileAttention's chunks and checks, ``tests/test_tile_attend.py``),
and its rate in cycles."""

from __future__ import annotations

import numpy as np
import pytest
from test_array_pv import v_words
from test_tile_attend import check, chunk, run, run_at_full_rate, score_inputs, stimulus
from test_tile_merge import scheduled

from mcf.abi.attn_tile import P8
from mcf.golden.attention_tiled import attend_tiled_rows
from mcf.hdl.compute.array_attend import ArrayAttention


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


@pytest.mark.parametrize("d,lanes,nk,n_blocks,n_tok,array_rows", [(16, 4, 64, 3, 8, 8),
                                                                  (128, 16, 256, 2, 4, 16)])
def test_qkv_rate(d, lanes, nk, n_blocks, n_tok, array_rows):
    """Inputs always valid, output always ready, whole blocks: the score beats pass from
    ArrayScore to the softmax one per cycle after the first quad — ``keys`` (row, key) pairs,
    ``2·keys·head_dim`` QKᵀ + P·V MACs per cycle — while S and P·V share the arrays. The
    second shape is the kr260's (4 keys per beat, head_dim 128, 4 arrays of 16 × 16,
    256-key blocks): 1,024 MACs per cycle on 512 DSP48E2, TileAttention's rate on half its
    DSPs."""
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
