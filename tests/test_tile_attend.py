"""amaranth.sim tests of the tiled prefill chained from the arrays' ``S`` accumulators to the
merged row states (issue #33, mcf.hdl.compute.tile_attend: TileSoftmax → TilePV → TileMerge):
whole causal query chunks against several KV blocks, per-token and per-channel K, the output
states equal to :func:`mcf.golden.attention_tiled.attend_tiled_rows` (SINGLE, P8, packed arrays)
bit for bit under random valid/ready; the chain's rate measured in cycles."""

from __future__ import annotations

import numpy as np
import pytest
from amaranth.sim import Simulator

from mcf.abi.attn_tile import (
    P8,
    merge_out_layout,
    qk_pack_shift,
    score_row_beat_layout,
    v_beat_layout,
)
from mcf.abi.kv import fold_query
from mcf.abi.quant import ACT
from mcf.golden.attention import KVChannelBlock, KVChannelCache, random_blocks, random_query
from mcf.golden.attention_tiled import attend_tiled_rows, packed_matmul, tile_schedule
from mcf.hdl.compute.tile_attend import TileAttend


def stimulus(q, sq, blocks, q_pos, q_tile, keys, d):
    """The score rows (with their tags) and the V blocks in :func:`tile_schedule`'s order: S
    through the packed-array model (per-channel K: the query folded per group header), the
    causal mask, blocks padded with masked keys / zero V to whole beats."""
    slay = score_row_beat_layout(keys, d, q_tile)
    vlay = v_beat_layout(keys, d, q_tile)
    sched = list(tile_schedule(q_pos, blocks, q_tile))
    seen = {}
    for n, (_, _, r, _) in enumerate(sched):
        for x in r:
            seen.setdefault(int(x), []).append(n)
    rows, vblocks = [], []
    for n, (tile, b, r, valid) in enumerate(sched):
        blk = blocks[b]
        runs = blk.engine_view() if isinstance(blk, KVChannelBlock) else [(None, blk)]
        acc, sm, se = [], [], []
        for hdr, run_ in runs:
            assert len(run_) % keys == 0 or run_ is runs[-1][1], "a beat shares a query scale"
            qf, sf = (q[r], sq[r]) if hdr is None else fold_query(q[r], sq[r], hdr)
            acc.append(packed_matmul(qf, run_.k, qk_pack_shift(d), d))
            sm.append(np.repeat(sf[:, :1], len(run_), axis=1))
            se.append(np.repeat(sf[:, 1:], len(run_), axis=1))
        acc, sm, se = (np.concatenate(x, axis=1) for x in (acc, sm, se))
        sk, sv = np.asarray(blk.sk), np.asarray(blk.sv)
        nk = len(blk)
        nb = -(-nk // keys)
        for j, x in enumerate(r):
            x = int(x)
            beats = []
            for bt in range(nb):
                ks = range(bt * keys, (bt + 1) * keys)
                beats.append(slay.const({
                    "beat": {"keys": [{"acc": int(acc[j, k]), "sk": int(sk[k]), "sv": int(sv[k]),
                                       "masked": int(not valid[j, k])} if k < nk else
                                      {"acc": 0, "sk": 0, "sv": 0, "masked": 1} for k in ks],
                             "scale_m": int(sm[j, bt * keys]), "scale_e": int(se[j, bt * keys]),
                             "last": int(bt == nb - 1)},
                    "row": x - int(tile[0]), "first": int(seen[x][0] == n),
                    "final": int(seen[x][-1] == n)}).as_bits())
            rows.append((x, beats))
        v = np.zeros((nb * keys, d), dtype=np.int64)
        v[:nk] = np.asarray(blk.v)
        vblocks.append([vlay.const({"v": [[int(c) for c in v[bt * keys + k]] for k in range(keys)],
                                    "rows": len(r), "last": int(bt == nb - 1)}).as_bits()
                        for bt in range(nb)])
    return rows, vblocks


def run(dut, rows, vblocks, idle=0.0, stall=0.0, seed=0):
    """Returns the emitted rows' ``(row in the chunk, m, l, o)`` and the cycles of the score
    beats taken, the count of cycles ``s.ready`` was low under a valid beat, and the outputs."""
    d = dut.head_dim
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    rng = np.random.default_rng(seed)
    olay = merge_out_layout(d, dut.rows)
    finals = []                     # the chunk row of each final tag, in the order sent
    for x, beats in rows:
        tag = score_row_beat_layout(dut.keys, d, dut.rows).from_bits(beats[0])
        if tag.final:
            finals.append(x)
    got, tr = [], {"take": [], "wait": 0, "out": []}

    async def feed_v(ctx):
        for beats in vblocks:
            for bits in beats:
                while idle and rng.random() < idle:
                    ctx.set(dut.v.valid, 0)
                    await ctx.tick()
                ctx.set(dut.v.payload.as_value(), bits)
                ctx.set(dut.v.valid, 1)
                await ctx.tick().until(dut.v.ready)
        ctx.set(dut.v.valid, 0)

    async def feed_s(ctx):
        srng = np.random.default_rng(seed + 7)
        for _, beats in rows:
            for bits in beats:
                while idle and srng.random() < idle:
                    ctx.set(dut.s.valid, 0)
                    await ctx.tick()
                ctx.set(dut.s.payload.as_value(), bits)
                ctx.set(dut.s.valid, 1)
                await ctx.tick().until(dut.s.ready)
        ctx.set(dut.s.valid, 0)

    async def sink(ctx):
        cyc = 0
        orng = np.random.default_rng(seed + 11)
        while len(got) < len(finals):
            ctx.set(dut.o.ready, int(not stall or orng.random() >= stall))
            _, _, sv_, sr, ov, ordy, op = await ctx.tick().sample(
                dut.s.valid, dut.s.ready, dut.o.valid, dut.o.ready, dut.o.payload.as_value())
            if sv_ and sr:
                tr["take"].append(cyc)
            elif sv_:
                tr["wait"] += 1
            if ov and ordy:
                b = olay.from_bits(op)
                x = finals[len(got)]
                assert x % dut.rows == int(b.row)
                got.append((x, int(b.state.m), int(b.state.l),
                            np.array([int(b.state.o[n]) for n in range(d)])))
                tr["out"].append(cyc)
            cyc += 1

    sim.add_testbench(feed_v, background=True)
    sim.add_testbench(feed_s, background=True)
    sim.add_testbench(sink)
    sim.run()
    return got, tr


def check(got, expect, n_rows):
    assert sorted(g[0] for g in got) == list(range(n_rows))
    for x, m, l_sum, o in got:
        assert (m, l_sum) == (expect.m[x], expect.l[x]), f"row {x}: (m, l)"
        np.testing.assert_array_equal(o, expect.o[x], err_msg=f"row {x}: o")


def chunk(rng, lens, n_tok, g, d, per_channel):
    if per_channel:
        cache = KVChannelCache(d)
        n = sum(lens)
        kf = rng.normal(0, 1, (n, d)) + rng.normal(0, 1, d)
        kf[:, :2] *= 6
        cache.append(ACT.quantize(kf), ACT.quantize(rng.normal(0, 1, (n, d))))
        blocks = cache.blocks(max_block=max(lens))
    else:
        blocks = random_blocks(rng, lens, d)
    n = sum(len(b) for b in blocks)
    q, sq = random_query(rng, n_tok * g, d, sigma=2.0)
    return q, sq, blocks, np.repeat(np.arange(n - n_tok, n), g)


@pytest.mark.parametrize("per_channel", [False, True])
def test_chunk_bit_exact(per_channel):
    """A causal 36-token chunk, GQA 2:1 (72 rows, query tiles of 16) at the end of 96 keys in
    blocks of 32 (per-token K: 32, 34, 30 keys, padded to whole beats): the first tile's early
    rows skip the last block, which is the diagonal tile of the others; under random
    valid/ready on all three streams every row's merged state equals ``attend_tiled_rows``."""
    rng = np.random.default_rng(80 + per_channel)
    d, keys, q_tile = 16, 4, 16
    lens = [32, 32, 32] if per_channel else [32, 34, 30]
    q, sq, blocks, q_pos = chunk(rng, lens, 36, 2, d, per_channel)
    sched = list(tile_schedule(q_pos, blocks, q_tile))
    assert any(len(r) < len(t) for t, _, r, _ in sched)           # rows skip a block
    assert any(not v.all() and v.any(axis=1).all() for _, _, _, v in sched)   # diagonal
    rows, vblocks = stimulus(q, sq, blocks, q_pos, q_tile, keys, d)
    expect = attend_tiled_rows(q, sq, blocks, q_pos, "single", p_format=P8, q_tile=q_tile,
                               array=True)
    dut = TileAttend(keys=keys, head_dim=d, max_block=36, rows=q_tile, slots=4, merge_lanes=4)
    got, _ = run(dut, rows, vblocks, idle=0.25, stall=0.4, seed=per_channel)
    check(got, expect, len(q))


def test_rate():
    """Full-rate shape (rows of N = 16 beats, 4 slots: 4·16 ≥ 3·16 + HOLD; the merge's 10
    cycles per row < 16), inputs always valid, output always ready: after the first row the
    score beats go in one per cycle — ``keys × head_dim`` = 64 P·V MACs per cycle — across
    rows, blocks and query tiles, and the outputs equal the golden model's."""
    rng = np.random.default_rng(90)
    d, keys, q_tile = 16, 4, 8
    q, sq, blocks, q_pos = chunk(rng, [64, 64, 64], 8, 2, d, False)
    rows, vblocks = stimulus(q, sq, blocks, q_pos, q_tile, keys, d)
    dut = TileAttend(keys=keys, head_dim=d, max_block=64, rows=q_tile, slots=4, merge_lanes=4)
    got, tr = run(dut, rows, vblocks)
    check(got, attend_tiled_rows(q, sq, blocks, q_pos, "single", p_format=P8, q_tile=q_tile,
                                 array=True), len(q))
    take = tr["take"]
    n_beats = sum(len(b) for _, b in rows)
    assert len(take) == n_beats
    span = take[-1] - take[0] + 1
    pv_macs = n_beats * keys * d
    print(f"score beats {n_beats} in {span} cycles; P·V {pv_macs / span:.2f} MACs/cycle")
    assert span == n_beats and tr["wait"] == 0
