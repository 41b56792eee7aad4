"""amaranth.sim tests of the tiled prefill chained to the merged row states (issue #33,
mcf.hdl.compute.tile_attend): TileAttend from the arrays' ``S`` accumulators (TileSoftmax →
TilePV → TileMerge) and TileAttention from Q, K and V (TileScore first): whole causal query
chunks against several KV blocks, per-token and per-channel K, GQA, the output states equal to
:func:`mcf.golden.attention_tiled.attend_tiled_rows` (SINGLE, P8, packed arrays) bit for bit
under random valid/ready; the chains' rates measured in cycles."""

from __future__ import annotations

import numpy as np
import pytest
from amaranth.sim import Simulator
from test_tile_merge import check, scheduled
from test_tile_merge import chunk as merge_chunk
from tile_sim import beats_per_row, feeder, merged_rows, taking_sink

from mcf.abi.attn_tile import (
    P8,
    k_word_layout,
    qk_pack_shift,
    qk_tile_keys,
    score_q_layout,
    score_row_beat_layout,
    v_beat_layout,
)
from mcf.abi.kv_channel import fold_query
from mcf.golden.attention import KVChannelBlock
from mcf.golden.attention_tiled import attend_tiled_rows, packed_matmul, tile_schedule
from mcf.hdl.compute.tile_attend import TileAttend, TileAttention


def stimulus(q, sq, blocks, q_pos, q_tile, keys, d):
    """The score rows (with their tags) and the V blocks in :func:`tile_schedule`'s order: S
    through the packed-array model (per-channel K: the query folded per group header), the
    causal mask, blocks padded with masked keys / zero V to whole beats."""
    slay = score_row_beat_layout(keys, d, q_tile)
    vlay = v_beat_layout(keys, d, q_tile)
    rows, vblocks = [], []
    for tile, blk, r, valid, tags in scheduled(q_pos, blocks, q_tile):
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
                    "row": x - int(tile[0]), "first": tags[j][0],
                    "final": tags[j][1]}).as_bits())
            rows.append((x, beats))
        v = np.zeros((nb * keys, d), dtype=np.int64)
        v[:nk] = np.asarray(blk.v)
        vblocks.append([vlay.const({"v": [[int(c) for c in v[bt * keys + k]] for k in range(keys)],
                                    "rows": len(r), "last": int(bt == nb - 1)}).as_bits()
                        for bt in range(nb)])
    return rows, vblocks


def score_inputs(q, sq, blocks, q_pos, q_tile, keys, d, lanes, max_block, mode=None,
                 m_fix=None, p8=None):
    """TileScore's inputs in :func:`tile_schedule`'s order: per (query tile, block) the block's K
    words (key tile by key tile, ``lanes`` channels each, padding keys 0, word ``n`` carrying
    the scales of keys ``n·keys ..``) and per row one query beat per key tile (per-channel K:
    the query folded by the tile's group header; ``visible`` from the causal mask; with
    ``mode`` (:class:`mcf.abi.kv.AttnMode`) every row's ``mode`` and ``m_fix[row]``; ``p8``:
    ``p8[row]``, the row's P·V in P8 on a PV_W chain)."""
    R = qk_tile_keys(keys, d, lanes)
    steps = d // lanes
    klay = k_word_layout(keys, d, lanes, max_block, q_tile)
    qlay = score_q_layout(d, max_block, q_tile)
    kblocks, qbeats = [], []
    for tile, blk, r, valid, tags in scheduled(q_pos, blocks, q_tile):
        nk = len(blk)
        nt = -(-nk // R)
        kp = np.zeros((nt * R, d), dtype=np.int64)
        kp[:nk] = np.asarray(blk.k)
        sk = np.zeros(nt * R, dtype=np.int64)
        sv = np.zeros(nt * R, dtype=np.int64)
        sk[:nk], sv[:nk] = np.asarray(blk.sk), np.asarray(blk.sv)
        words = []
        for kt in range(nt):
            for c in range(steps):
                w = kt * steps + c
                words.append(klay.const({
                    "k": [[int(kp[kt * R + i, c * lanes + j]) for j in range(lanes)]
                          for i in range(R)],
                    "sk": [int(x) for x in sk[w * keys:(w + 1) * keys]],
                    "sv": [int(x) for x in sv[w * keys:(w + 1) * keys]],
                    "n": nk, "rows": len(r), "last": int(w == nt * steps - 1)}).as_bits())
        kblocks.append(words)
        hdrs = []
        for kt in range(nt):
            if isinstance(blk, KVChannelBlock):
                ks = np.asarray(blk.ks)[kt * R:min(nk, (kt + 1) * R)]
                assert (ks == ks[0]).all(), "a key tile lies in one group"
                hdrs.append(ks[0])
            else:
                hdrs.append(None)
        for j, x in enumerate(r):
            x = int(x)
            vis = int(valid[j].sum())
            assert valid[j, :vis].all(), "a row sees a prefix of the block"
            for hdr in hdrs:
                qf, sf = (q[x], sq[x]) if hdr is None else fold_query(q[x], sq[x], hdr)
                qbeats.append(qlay.const({
                    "q": [int(v) for v in qf], "scale_m": int(sf[0]), "scale_e": int(sf[1]),
                    "visible": vis, "row": x - int(tile[0]), "first": tags[j][0],
                    "final": tags[j][1],
                    **({} if mode is None else
                       {"mode": mode, "m_fix": 0 if m_fix is None else int(m_fix[x])}),
                    **({} if p8 is None else {"p8": int(p8[x])}),
                    }).as_bits())
    return kblocks, qbeats


def run(dut, rows, vblocks, idle=0.0, stall=0.0, seed=0, qk=None, probes=()):
    """Returns the emitted rows' ``(row in the chunk, m, l, o)`` and the cycles of the score
    beats taken, the count of cycles the score stream's ``ready`` was low under a valid beat,
    and the outputs. ``qk = (kblocks, qbeats)`` (a :class:`TileAttention`): K and the query
    beats go in instead of the score rows, which are then watched inside, between TileScore
    and TileAttend. ``probes``: signals read at the end (``"probes"``, their values)."""
    d = dut.head_dim
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    olay = dut.o.payload.shape()
    finals = []                     # the chunk row of each final tag, in the order sent
    for x, beats in rows:
        tag = score_row_beat_layout(dut.keys, d, dut.rows).from_bits(beats[0])
        if tag.final:
            finals.append(x)
    if qk is None:
        feeds = [(dut.v, [b for bl in vblocks for b in bl]),
                 (dut.s, [b for _, bl in rows for b in bl])]
        s_port = dut.s
    else:
        feeds = [(dut.v, [b for bl in vblocks for b in bl]),
                 (dut.k, [b for bl in qk[0] for b in bl]), (dut.q, qk[1])]
        s_port = dut.score.o
    nb = beats_per_row(olay, d)
    sink, seen = taking_sink(dut.o, s_port, len(finals) * nb, np.random.default_rng(seed + 11),
                             stall, probes=probes)
    for n, (port, beats) in enumerate(feeds):
        sim.add_testbench(feeder(port, beats, seed + 7 * n, idle), background=True)
    sim.add_testbench(sink)
    sim.run()
    return merged_rows(seen.bits, finals, olay, d, dut.rows), {
        "take": seen.take, "wait": seen.wait, "out": seen.out[nb - 1::nb],
        "probes": seen.probes}


def chunk(rng, lens, n_tok, g, d, per_channel):
    """:func:`test_tile_merge.chunk` with two outlier channels in per-channel K."""
    return merge_chunk(rng, lens, n_tok, g, d, per_channel, outliers=2)


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


def run_at_full_rate(dut, q, sq, blocks, q_pos, rows, vblocks, qk=None, p_format=P8):
    """:func:`run` with inputs always valid and the output always ready; the rows checked
    against ``attend_tiled_rows(..., "single", p_format, array=True)`` (``p_format`` the
    golden's: ``None`` for today's ``w``) and every score beat seen once. Returns the rows, the
    trace, the score beats and the cycles from the first to the last."""
    got, tr = run(dut, rows, vblocks, qk=qk)
    check(got, attend_tiled_rows(q, sq, blocks, q_pos, "single", p_format=p_format,
                                 q_tile=dut.rows, array=True), len(q))
    take = tr["take"]
    n_beats = sum(len(b) for _, b in rows)
    assert len(take) == n_beats
    return got, tr, n_beats, take[-1] - take[0] + 1


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
    got, tr, n_beats, span = run_at_full_rate(dut, q, sq, blocks, q_pos, rows, vblocks)
    pv_macs = n_beats * keys * d
    print(f"score beats {n_beats} in {span} cycles; P·V {pv_macs / span:.2f} MACs/cycle")
    assert span == n_beats and tr["wait"] == 0


@pytest.mark.parametrize("per_channel,g", [(False, 2), (True, 2), (True, 6)])
def test_qkv_chunk_bit_exact(per_channel, g):
    """TileAttention from Q, K, V: a causal chunk (36 tokens at GQA 2:1, 12 at 6:1; query
    tiles of 16 rows) at the end of 96 keys (per-token K: blocks of 32, 34, 30 keys — a partial
    key tile, padded beats; per-channel K: 32-key groups, the query folded per key tile), rows
    skipping the last block, the diagonal tile; random valid/ready on Q, K, V and the output:
    every row's merged state equals ``attend_tiled_rows(..., "single", p_format=P8,
    array=True)``."""
    rng = np.random.default_rng(100 + 10 * per_channel + g)
    d, keys, lanes, q_tile = 16, 4, 4, 16
    lens = [32, 32, 32] if per_channel else [32, 34, 30]
    q, sq, blocks, q_pos = chunk(rng, lens, 72 // g, g, d, per_channel)
    mb = 48                                      # whole key tiles of 16 keys
    rows, vblocks = stimulus(q, sq, blocks, q_pos, q_tile, keys, d)
    qk = score_inputs(q, sq, blocks, q_pos, q_tile, keys, d, lanes, mb)
    expect = attend_tiled_rows(q, sq, blocks, q_pos, "single", p_format=P8, q_tile=q_tile,
                               array=True)
    dut = TileAttention(keys=keys, head_dim=d, lanes=lanes, max_block=mb, rows=q_tile)
    got, _ = run(dut, rows, vblocks, idle=0.25, stall=0.4, seed=g + per_channel, qk=qk)
    check(got, expect, len(q))


@pytest.mark.parametrize("d,lanes,nk,n_blocks,n_tok", [
    (16, 4, 64, 3, 8),
    pytest.param(128, 16, 256, 2, 4, marks=pytest.mark.slow)])      # kr260: ~1 min
def test_qkv_rate(d, lanes, nk, n_blocks, n_tok):
    """TileAttention at full rate (whole key tiles, rows of N = nk/4 beats, 4 softmax slots:
    4·N ≥ 3N + 9, the merge's cycles per row ≤ N), inputs always valid, output always ready:
    after the first row the score beats pass from TileScore to the softmax one per cycle —
    ``keys × head_dim`` QKᵀ and as many P·V MACs per cycle — across rows, blocks and query
    tiles; the outputs equal the golden model's. The second shape is the kr260's (4 keys,
    head_dim 128, 16 lanes, 256-key blocks): 1,024 MACs per cycle."""
    rng = np.random.default_rng(91)
    keys, q_tile = 4, 8
    q, sq, blocks, q_pos = chunk(rng, [nk] * n_blocks, n_tok, 2, d, False)
    rows, vblocks = stimulus(q, sq, blocks, q_pos, q_tile, keys, d)
    qk = score_inputs(q, sq, blocks, q_pos, q_tile, keys, d, lanes, nk)
    dut = TileAttention(keys=keys, head_dim=d, lanes=lanes, max_block=nk, rows=q_tile)
    got, tr, n_beats, span = run_at_full_rate(dut, q, sq, blocks, q_pos, rows, vblocks, qk)
    macs = 2 * n_beats * keys * d
    print(f"score beats {n_beats} in {span} cycles; QKᵀ + P·V {macs / span:.2f} MACs/cycle; "
          f"all {len(got)} rows out {tr['out'][-1] + 1} cycles from the start "
          f"({macs / (tr['out'][-1] + 1):.1f} MACs/cycle with fill and drain)")
    assert span == n_beats and tr["wait"] == 0
