"""amaranth.sim tests of the P·V arrays of the tiled prefill (issue #33, mcf.hdl.compute.tile_pv):
every row's ``(m_b, l_b, o_b)`` against the golden model (:func:`mcf.golden.attention_tiled.
tile_block_state` / :func:`~mcf.golden.attention_tiled.pv_p8_block`) bit for bit, under random
valid/ready, and the array's rate and latency measured in cycles."""

from __future__ import annotations

import numpy as np
import pytest
from amaranth.sim import Simulator
from tile_sim import taking_sink

from mcf.abi.attn_tile import (
    P8,
    P8_SHIFT_MAX,
    p8_beat_layout,
    pv_acc_bits,
    pv_p8_out,
    v_beat_layout,
)
from mcf.abi.fixed import saturate
from mcf.abi.kv import KV_ELEM
from mcf.abi.softmax import STATE_L, STATE_O
from mcf.golden.attention import random_blocks, random_query
from mcf.golden.attention_tiled import (
    p8_rows,
    pv_p8_acc,
    pv_p8_block,
    tile_block_state,
    tile_scores,
    tile_weights,
)
from mcf.hdl.compute.tile_pv import TilePV
from mcf.sim.amsim import send


def v_beats(v, keys, d, rows, max_rows):
    """A block's V (``v[T, d]``) as beats of ``keys`` keys (padding keys 0)."""
    lay = v_beat_layout(keys, d, max_rows)
    nb = -(-len(v) // keys)
    vp = np.zeros((nb * keys, d), dtype=np.int64)
    vp[:len(v)] = v
    return [lay.const({"v": [[int(x) for x in vp[b * keys + j]] for j in range(keys)],
                       "rows": rows, "last": int(b == nb - 1)}).as_bits() for b in range(nb)]


def p_beats(m, l_sum, s, w8, keys):
    """One row's P8 beats (``w8[T]`` padded with 0 to whole beats)."""
    lay = p8_beat_layout(keys)
    nb = -(-len(w8) // keys)
    wp = np.zeros(nb * keys, dtype=np.int64)
    wp[:len(w8)] = w8
    return [lay.const({"w8": [int(x) for x in wp[b * keys:(b + 1) * keys]], "m": int(m),
                       "l": int(l_sum), "s": int(s), "last": int(b == nb - 1)}).as_bits()
            for b in range(nb)]


def run(dut, blocks, idle=0.0, stall=0.0, seed=0, v_first=False, v_stream=None):
    """``blocks``: ``[(v[T, d], [(m, l, s, w8[T]) per row])]``. Returns the output rows
    ``[(m, l, s, acc[d])]`` and a trace (cycles of P beats taken, of outputs, P-ready-low count).
    ``v_stream(v, rows)``: a block's ``v`` stream (default :func:`v_beats`, TilePV's)."""
    keys, d = dut.keys, dut.head_dim
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    rng = np.random.default_rng(seed)
    olay = dut.o.payload.shape()                  # pv_out_layout of the stage's channels
    nb = d // olay["acc"].shape.length            # beats of a row
    n_rows = sum(len(r) for _, r in blocks)

    v_stream = v_stream or (lambda v, rows: v_beats(v, keys, d, rows, dut.max_rows))

    async def v_feed(ctx):
        await send(ctx, dut.v, (bits for v, rows in blocks for bits in v_stream(v, len(rows))),
                   rng, idle)

    async def p_feed(ctx):
        if v_first:
            await ctx.tick().until(dut.p.ready)
        await send(ctx, dut.p, (bits for _, rows in blocks for row in rows
                                for bits in p_beats(*row, keys)), rng, idle)

    sink, seen = taking_sink(dut.o, dut.p, n_rows * nb, np.random.default_rng(seed + 100),
                             stall)
    sim.add_testbench(v_feed, background=True)
    sim.add_testbench(p_feed, background=True)
    sim.add_testbench(sink)
    sim.run()
    beats = [olay.from_bits(raw) for raw in seen.bits]
    got = []
    for n in range(0, len(beats), nb):              # a row's beats: in order, last on the final
        part = beats[n:n + nb]
        assert [int(b.last) for b in part] == [0] * (nb - 1) + [1], f"row {n // nb}: last"
        head = (int(part[0].m), int(part[0].l), int(part[0].s))
        assert {(int(b.m), int(b.l), int(b.s)) for b in part} == {head}
        got.append((*head, np.array([int(b.acc[x]) for b in part
                                     for x in range(len(b.acc))])))
    return got, {"take": seen.take, "out": seen.out[nb - 1::nb], "p_wait": seen.wait}


def check(blocks, got, expect_o):
    """The row's record passed on, its exact sums equal to the golden's (``pv_p8_acc`` through
    the packed-array model) and, shifted and saturated as the merge does, its ``o_b``."""
    rows = [(v, r) for v, rs in blocks for r in rs]
    assert len(got) == len(rows)
    for i, ((v, (m, l_sum, s, w8)), (gm, gl, gs, ga), eo) in enumerate(zip(rows, got, expect_o)):
        assert (gm, gl, gs) == (m, l_sum, s), f"row {i}: (m, l, s)"
        np.testing.assert_array_equal(ga, pv_p8_acc(w8[None], v, array=True)[0],
                                      err_msg=f"row {i}: acc")
        np.testing.assert_array_equal(saturate(pv_p8_out(ga, s), STATE_O.width, True), eo,
                                      err_msg=f"row {i}: o_b")


def random_p_blocks(rng, n_blocks, n_rows, block, d, keys, full=False):
    """Blocks of random V with rows of random ``w8`` / ``s`` (``full``: w8 = 255, V channels
    −8 and 7 and the largest shift, which saturate ``o_b`` both ways beyond 256 keys); expected
    ``o_b`` from the golden P·V."""
    blocks, exp = [], []
    for _ in range(n_blocks):
        n = block - int(rng.integers(0, keys)) if block > keys else block
        v = (np.tile(np.where(np.arange(d) % 2, KV_ELEM.max_int, KV_ELEM.min_int), (n, 1)) if full
             else rng.integers(KV_ELEM.min_int, KV_ELEM.max_int + 1, (n, d)))
        rows = []
        for _ in range(n_rows):
            w8 = (np.full(n, P8.max_int) if full
                  else rng.integers(0, P8.max_int + 1, n) * (rng.random(n) < 0.8))
            s = P8_SHIFT_MAX if full else int(rng.integers(0, P8_SHIFT_MAX + 1))
            rows.append((int(rng.integers(-(1 << 31), 1 << 31)),
                         int(rng.integers(0, 1 << STATE_L.width)), s, w8))
        blocks.append((v, rows))
        exp += list(pv_p8_block(np.stack([r[3] for r in rows]), [r[2] for r in rows], v,
                                array=True))
    return blocks, exp


@pytest.mark.parametrize("keys,d,block,group", [(1, 4, 6, 2), (2, 8, 16, 4), (4, 8, 32, 8),
                                                (4, 6, 24, 128)])
def test_random_rows_backpressure(keys, d, block, group):
    """Random ``w8``, shifts and V (several groups per row where ``group < block``), three
    blocks through the two banks, random valid on both inputs and random ready on ``o``."""
    rng = np.random.default_rng(keys * 10 + d)
    blocks, exp = random_p_blocks(rng, 3, 5, block, d, keys)
    dut = TilePV(keys=keys, head_dim=d, max_block=block, max_rows=8, group=min(group, block))
    got, _ = run(dut, blocks, idle=0.3, stall=0.4, seed=keys)
    check(blocks, got, exp)


def test_largest_sums():
    """Blocks of 313..320 keys (three packed groups), ``w8 = 255`` against V of −8 and 7: the
    sums reach ``pv_acc_bits(320)`` = 21 bits, and every ``o_b`` saturates both ways."""
    rng = np.random.default_rng(3)
    blocks, exp = random_p_blocks(rng, 2, 2, 320, 4, 8, full=True)
    lim = 1 << (STATE_O.width - 1)
    assert np.all(np.concatenate(exp) == np.tile([-lim, lim - 1], 2 * 2 * 2))
    dut = TilePV(keys=8, head_dim=4, max_block=320, max_rows=4)
    got, _ = run(dut, blocks, stall=0.3, seed=3)
    check(blocks, got, exp)
    assert pv_acc_bits(320) == 21 and min(int(g[3].min()) for g in got) < -(1 << 19)


def real_block_rows(block, d):
    """Rows of a causal chunk against two real KV blocks of ``block`` keys (masked keys,
    all-masked rows): ``[(v, [(m, l, s, w8) per row])]`` from the golden model's stages and
    the expected ``o_b`` of ``tile_block_state(…, p_format=P8, array=True)``."""
    rng = np.random.default_rng(block)
    kv = random_blocks(rng, [block, block], d)
    q, sq = random_query(rng, 6, d, sigma=2.0)
    q_pos = np.array([block - 1, block + 3, block + 10, 2 * block - 1, block - 1, block + 1])
    blocks, exp = [], []
    for blk in kv:
        t = tile_scores(q, sq, blk, array=True)
        valid = np.asarray(blk.pos)[None, :] <= q_pos[:, None]
        m, _, w, l_sum = tile_weights(t, valid, blk.sv)
        s, w8 = p8_rows(w)
        st = tile_block_state(t, valid, blk, p_format=P8, array=True)
        assert np.array_equal(st.m, m) and np.array_equal(st.l, l_sum)
        blocks.append((np.asarray(blk.v), [(m[r], l_sum[r], s[r], w8[r]) for r in range(len(q))]))
        exp += list(st.o)
    return blocks, exp


@pytest.mark.parametrize("block", [32, 160])
def test_real_block_states(block):
    """Rows of a causal chunk against real KV blocks (the diagonal block has masked keys and
    all-masked rows): scores, ``w8``, ``s`` from the golden model's stages, the array's output
    equal to ``tile_block_state(…, p_format=P8, array=True)``. 160 keys: two packed groups of
    ``PV_SPLIT_KEYS`` = 128 keys and a partial one."""
    d = 16
    blocks, exp = real_block_rows(block, d)
    dut = TilePV(keys=4, head_dim=d, max_block=block, max_rows=8)
    got, _ = run(dut, blocks, idle=0.2, stall=0.3, seed=7)
    check(blocks, got, exp)


@pytest.mark.parametrize("keys,d,block", [(2, 4, 8), (4, 8, 32), (4, 128, 256)])
def test_rate_and_latency(keys, d, block):
    """With ``o.ready`` high and both banks loaded ahead: one P beat per cycle across rows and
    blocks (``keys × d`` MACs per cycle), one row out per ``block / keys`` cycles, each
    ``keys + 4`` cycles after its last beat. 4 × 128 × 256: the kr260 shape (256 DSP48E2)."""
    rng = np.random.default_rng(block)
    n_blocks, n_rows = (2, 3) if d == 128 else (3, 4)
    blocks, exp = random_p_blocks(rng, n_blocks, n_rows, block, d, keys)
    blocks = [(np.concatenate([v, rng.integers(-8, 8, (block - len(v), d))]),
               [(m, l_sum, s, np.concatenate([w8, np.zeros(block - len(w8), np.int64)]))
                for m, l_sum, s, w8 in rows]) for v, rows in blocks]
    exp = [o for v, rows in blocks for o in
           pv_p8_block(np.stack([r[3] for r in rows]), [r[2] for r in rows], v, array=True)]
    dut = TilePV(keys=keys, head_dim=d, max_block=block, max_rows=8)
    got, tr = run(dut, blocks, v_first=True)
    check(blocks, got, exp)
    nb = block // keys
    take, out = tr["take"], tr["out"]
    assert tr["p_wait"] == 0 and take == list(range(take[0], take[0] + len(take)))
    lat = [o - take[(r + 1) * nb - 1] for r, o in enumerate(out)]
    assert lat == [dut.latency] * len(out) == [keys + 4] * len(out)
    assert np.all(np.diff(out) == nb)
    macs = len(take) * keys * d
    assert macs / len(take) == keys * d == 2 * dut.dsps
