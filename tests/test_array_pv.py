"""amaranth.sim tests of P·V on the GEMM's arrays (issue #33, mcf.hdl.compute.array_pv):
:class:`ArrayPV` takes TilePV's P rows and V as array words (``pv_word_layout``) and must emit
TilePV's rows — every ``(m_b, l_b, s)`` passed on and every exact ``Σ w8·v`` of the golden
model (``pv_p8_acc``; shifted and saturated, ``o_b``) — in the same order, under random
valid/ready (the stimulus and checks of ``tests/test_tile_pv.py``); quads of 1..4 rows,
partial steps and groups padded with ``w8`` = 0 (stale P lanes masked); the rate in cycles."""

from __future__ import annotations

import numpy as np
import pytest
from test_tile_pv import check, random_p_blocks, real_block_rows
from test_tile_pv import run as run_pv

from mcf.abi.attn_tile import pv_word_layout
from mcf.golden.attention_tiled import pv_p8_block
from mcf.hdl.compute.array_pv import ArrayPV


def v_words(v, rows, dut):
    """A block's V (``v[T, d]``) as array words: per step of ``lanes`` keys (padding keys 0),
    per channel group, ``[channel][key]``; ``n`` and ``rows`` on the last."""
    L, AR, d = dut.lanes, dut.array_rows, dut.head_dim
    lay = pv_word_layout(AR, L, dut.max_block, dut.max_rows)
    ns = -(-len(v) // L)
    vp = np.zeros((ns * L, d), dtype=np.int64)
    vp[:len(v)] = v
    out = []
    for s in range(ns):
        for c in range(d // AR):
            blk = vp[s * L:(s + 1) * L, c * AR:(c + 1) * AR].T
            last = s == ns - 1 and c == d // AR - 1
            out.append(lay.const({"v": [[int(x) for x in r] for r in blk], "n": len(v),
                                  "rows": rows if last else 0, "last": int(last)}).as_bits())
    return out


def run(dut, blocks, idle=0.0, stall=0.0, seed=0):
    """``test_tile_pv.run`` with V as array words."""
    return run_pv(dut, blocks, idle, stall, seed, v_stream=lambda v, rows: v_words(v, rows, dut))


@pytest.mark.parametrize("keys,d,block,rows,arrays,array_rows,lanes,group",
                         [(2, 8, 16, 5, 4, 4, 4, 8), (4, 8, 32, 6, 4, 2, 8, 16),
                          (1, 4, 12, 3, 2, 4, 2, 4), (4, 16, 64, 7, 3, 8, 4, 16)])
def test_random_rows_backpressure(keys, d, block, rows, arrays, array_rows, lanes, group):
    """Random ``w8``, shifts and V, blocks of up to ``keys − 1`` keys short of ``block`` (partial
    steps and groups), rows not a multiple of the quad, three blocks through the two banks,
    random valid on both inputs and random ready on ``o``."""
    rng = np.random.default_rng(keys * 10 + d)
    blocks, exp = random_p_blocks(rng, 3, rows, block, d, keys)
    dut = ArrayPV(keys=keys, head_dim=d, max_block=block, max_rows=8, arrays=arrays,
                  array_rows=array_rows, lanes=lanes, group=group)
    got, _ = run(dut, blocks, idle=0.3, stall=0.4, seed=keys)
    check(blocks, got, exp)


def test_largest_sums():
    """TilePV's largest sums: 313..320-key blocks of ``w8 = 255`` against V of −8 and 7 (three
    packed groups of 128 keys at the kr260's group): 21-bit sums, ``o_b`` saturating."""
    rng = np.random.default_rng(3)
    blocks, exp = random_p_blocks(rng, 2, 2, 320, 4, 8, full=True)
    dut = ArrayPV(keys=8, head_dim=4, max_block=384, max_rows=4, array_rows=4)
    got, _ = run(dut, blocks, stall=0.3, seed=3)
    check(blocks, got, exp)


@pytest.mark.parametrize("block", [32, 160])
def test_real_block_states(block):
    """TilePV's causal chunk rows against real KV blocks (masked keys, all-masked rows), at
    the kr260 array (16 channels × 16 keys, group 128; 160 keys: a whole and a partial
    group): equal to ``tile_block_state(…, p_format=P8, array=True)``."""
    d = 16
    blocks, exp = real_block_rows(block, d)
    dut = ArrayPV(keys=4, head_dim=d, max_block=256, max_rows=8)
    got, _ = run(dut, blocks, idle=0.2, stall=0.3, seed=7)
    check(blocks, got, exp)


@pytest.mark.parametrize("keys,d,block,lanes,group", [
    (4, 8, 32, 4, 8),
    pytest.param(4, 128, 256, 16, 128, marks=pytest.mark.slow)])    # kr260: ~45 s
def test_rate(keys, d, block, lanes, group):
    """Output always ready, whole blocks, 8 rows (two quads) per block, three blocks: the P
    rows are taken one beat per cycle — the arrays (``head_dim / 16 · block / lanes`` cycles a
    quad at the kr260 shape, 128 against the P rows' 4 · 64) keep up."""
    rng = np.random.default_rng(block)
    blocks, _ = random_p_blocks(rng, 3, 8, block, d, keys)
    blocks = [(np.concatenate([v, rng.integers(-8, 8, (block - len(v), d))]),
               [(m, l_sum, s, np.concatenate([w8, np.zeros(block - len(w8), np.int64)]))
                for m, l_sum, s, w8 in rows]) for v, rows in blocks]
    exp = [o for v, rows in blocks for o in
           pv_p8_block(np.stack([r[3] for r in rows]), [r[2] for r in rows], v, array=True)]
    dut = ArrayPV(keys=keys, head_dim=d, max_block=block, max_rows=8,
                  array_rows=min(16, d), lanes=lanes, group=group)
    got, tr = run(dut, blocks)
    check(blocks, got, exp)
    take = tr["take"]
    first = 4 * block // keys                      # the first quad's beats
    span = take[-1] - take[first] + 1
    print(f"{len(take)} P beats; after the first quad {len(take) - first} in {span} cycles")
    assert span == len(take) - first


def test_short_block_after_long():
    """A block of 5 keys after one of 30 in the same banks (and 17 after 5): the short rows'
    steps and groups past their keys read the long rows' P lanes and V words, which must count
    as 0 (the P lanes past a row's beats are masked)."""
    rng = np.random.default_rng(12)
    blocks, exp = [], []
    for n in (30, 5, 17, 3):
        v = rng.integers(-8, 8, (n, 8))
        rows = [(int(rng.integers(-1000, 1000)), int(rng.integers(0, 1 << 20)),
                 int(rng.integers(0, 4)), rng.integers(1, 256, n)) for _ in range(5)]
        blocks.append((v, rows))
        exp += list(pv_p8_block(np.stack([r[3] for r in rows]), [r[2] for r in rows], v,
                                array=True))
    dut = ArrayPV(keys=2, head_dim=8, max_block=32, max_rows=8, array_rows=4, lanes=4,
                  group=8)
    got, _ = run(dut, blocks, idle=0.2, stall=0.3, seed=12)
    check(blocks, got, exp)
