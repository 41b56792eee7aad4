"""amaranth.sim tests of the query fold of the tiled prefill (issue #33,
mcf.hdl.compute.tile_fold): query rows → TileScore's query beats, one per key tile, equal bit for
bit to those TileAttention's tests feed (``tests/test_tile_attend.py``'s ``score_inputs``: per
channel K folded by :func:`mcf.abi.kv.fold_query`), per-token and per-channel K, random
valid/ready; the fold's rate and latency in cycles; and the chain from the records:
KV reader beats → TileKV, query rows → TileFold → TileAttention → merged states equal to
``attend_tiled_rows(..., "single", p_format=P8, array=True)``."""

from __future__ import annotations

import numpy as np
import pytest
from amaranth import Module
from amaranth.lib import wiring
from amaranth.sim import Simulator
from test_tile_attend import check, chunk, score_inputs
from test_tile_kv import kv_inputs
from test_tile_merge import scheduled
from tile_sim import beats_per_row, feeder, merged_rows, taking_sink

from mcf.abi.attn_tile import P8, fold_header_layout, fold_row_layout
from mcf.abi.kv_channel import KV_GROUP, KVFormat
from mcf.golden.attention import KVChannelBlock
from mcf.golden.attention_tiled import attend_tiled_rows, tile_schedule
from mcf.hdl.compute.tile_attend import TileAttention
from mcf.hdl.compute.tile_fold import TileFold
from mcf.hdl.compute.tile_kv import TileKV


def fold_inputs(q, sq, blocks, q_pos, q_tile, d, max_block, fold_lanes):
    """Per (query tile, block) of :func:`tile_schedule`: a row beat per row (the query not
    folded, ``n``, ``last`` on the block's last row) and, per-channel K, the block's group
    headers (one per 32 keys from its first key), ``last`` on the final beat."""
    rlay = fold_row_layout(d, max_block, q_tile)
    hlay = fold_header_layout(fold_lanes)
    rows, hdrs = [], []
    for tile, blk, r, valid, tags in scheduled(q_pos, blocks, q_tile):
        nk = len(blk)
        for j, x in enumerate(r):
            x = int(x)
            rows.append(rlay.const({
                "q": [int(v) for v in q[x]], "scale_m": int(sq[x, 0]), "scale_e": int(sq[x, 1]),
                "visible": int(valid[j].sum()), "n": nk, "row": x - int(tile[0]),
                "first": tags[j][0], "final": tags[j][1],
                "last": int(j == len(r) - 1)}).as_bits())
        if isinstance(blk, KVChannelBlock):
            ng = -(-nk // KV_GROUP)
            for g in range(ng):
                h = np.asarray(blk.ks)[g * KV_GROUP]
                for c in range(d // fold_lanes):
                    word = sum(int(h[c * fold_lanes + i]) << (16 * i) for i in range(fold_lanes))
                    hdrs.append(hlay.const({"data": word, "last": int(
                        g == ng - 1 and c == d // fold_lanes - 1)}).as_bits())
    return rows, hdrs


def run_fold(dut, rows, hdrs, n_out, idle=0.0, stall=0.0, seed=0):
    """Returns the query beats emitted (bits) and the cycles they were taken."""
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sink, seen = taking_sink(dut.o, dut.i, n_out, np.random.default_rng(seed + 5), stall,
                             quiet=4)
    sim.add_testbench(feeder(dut.i, rows, seed, idle), background=True)
    if hdrs:
        sim.add_testbench(feeder(dut.kh, hdrs, seed + 1, idle), background=True)
    sim.add_testbench(sink)
    sim.run()
    return seen.bits, seen.out, seen.take


@pytest.mark.parametrize("per_channel,lanes,folds", [(False, 4, 3), (True, 4, 3),
                                                     (True, 4, 1), (True, 2, 2)])
def test_bit_exact(per_channel, lanes, folds):
    """A causal 36-token chunk, GQA 2:1, query tiles of 16, at the end of 96 keys (per-token:
    blocks of 32, 34, 30; per-channel: 32-key groups, keys with outlier channels), key tiles of
    16 and 32 keys, 1..3 folds: every query beat (folded query, ``(m', e')``, ``visible``, tags)
    equals TileAttention's test input, under random valid/ready."""
    rng = np.random.default_rng(300 + per_channel + lanes + folds)
    d, keys, q_tile, fl = 16, 4, 16, 4
    lens = [32, 32, 32] if per_channel else [32, 34, 30]
    q, sq, blocks, q_pos = chunk(rng, lens, 36, 2, d, per_channel)
    mb = 48 if lanes == 4 else 64
    _, want = score_inputs(q, sq, blocks, q_pos, q_tile, keys, d, lanes, mb)
    rows, hdrs = fold_inputs(q, sq, blocks, q_pos, q_tile, d, mb, fl)
    fmt = KVFormat.PER_CHANNEL_K if per_channel else KVFormat.PER_TOKEN
    dut = TileFold(keys=keys, head_dim=d, lanes=lanes, max_block=mb, rows=q_tile,
                   kv_format=fmt, fold_lanes=fl, folds=folds)
    got, _, _ = run_fold(dut, rows, hdrs, len(want), idle=0.3, stall=0.4, seed=folds)
    assert len(got) == len(want)
    for x, (g, w) in enumerate(zip(got, want)):
        assert g == w, f"query beat {x}"


def test_rate():
    """The kr260 shape, per-channel K (head_dim 128, 16 fold lanes, 3 folds, key tiles of 32
    keys = one group): inputs always valid, output always ready — after the first group one
    folded query beat per ``head_dim/fold_lanes`` = 8 cycles (a 32-key group is 8 score beats
    on the arrays), the first ``2·8 + 6`` = 22 cycles after its row was taken; the beats equal
    the golden ones."""
    rng = np.random.default_rng(310)
    d, keys, lanes, fl, q_tile, nk = 128, 4, 16, 16, 8, 256
    q, sq, blocks, q_pos = chunk(rng, [nk, nk], 4, 2, d, True)
    _, want = score_inputs(q, sq, blocks, q_pos, q_tile, keys, d, lanes, nk)
    rows, hdrs = fold_inputs(q, sq, blocks, q_pos, q_tile, d, nk, fl)
    dut = TileFold(keys=keys, head_dim=d, lanes=lanes, max_block=nk, rows=q_tile,
                   kv_format=KVFormat.PER_CHANNEL_K, fold_lanes=fl, folds=3)
    got, out, inp = run_fold(dut, rows, hdrs, len(want))
    assert got == want
    gaps = np.diff(out)
    print(f"{len(out)} folded beats in {out[-1] - out[0] + 1} cycles; gaps {sorted(set(gaps))};"
          f" first {out[0] - inp[0]} cycles after its row")
    assert (gaps == d // fl).all()
    assert out[0] - inp[0] == 2 * d // fl + 6


class Chain(wiring.Component):
    """Records → TileKV, rows → TileFold, both → TileAttention (the test's wiring; the ports
    of the three parts are driven directly)."""

    def __init__(self, keys, d, lanes, in_lanes, mb, q_tile, fmt, fl):
        self.kv = TileKV(keys=keys, head_dim=d, lanes=lanes, in_lanes=in_lanes, max_block=mb,
                         max_rows=q_tile)
        self.fold = TileFold(keys=keys, head_dim=d, lanes=lanes, max_block=mb, rows=q_tile,
                             kv_format=fmt, fold_lanes=fl)
        self.att = TileAttention(keys=keys, head_dim=d, lanes=lanes, max_block=mb, rows=q_tile)
        super().__init__({})

    def elaborate(self, platform):
        m = Module()
        m.submodules.kv, m.submodules.fold, m.submodules.att = self.kv, self.fold, self.att
        wiring.connect(m, self.kv.kw, self.att.k)
        wiring.connect(m, self.kv.vb, self.att.v)
        wiring.connect(m, self.fold.o, self.att.q)
        return m


def run_chain(dut, feeds, finals, q_tile, d, seed, idle, stall):
    """Feeds ``(port, beats)``; returns the merged states ``(row, m, l, o)`` and the cycles
    score beats passed from TileScore to TileAttend, and the count of cycles one waited."""
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    olay = dut.att.o.payload.shape()
    sink, seen = taking_sink(dut.att.o, dut.att.score.o, len(finals) * beats_per_row(olay, d),
                             np.random.default_rng(seed + 11), stall)
    for n, (port, beats) in enumerate(feeds):
        sim.add_testbench(feeder(port, beats, seed + 7 * n, idle), background=True)
    sim.add_testbench(sink)
    sim.run()
    return merged_rows(seen.bits, finals, olay, d, q_tile), {"take": seen.take, "wait": seen.wait}


def chain_inputs(dut, q, sq, blocks, q_pos, q_tile, d, in_lanes, mb, fl):
    kb, vb, rb = kv_inputs(blocks, q_pos, q_tile, d, in_lanes, q_tile)
    rows, hdrs = fold_inputs(q, sq, blocks, q_pos, q_tile, d, mb, fl)
    feeds = [(dut.kv.k, kb), (dut.kv.v, vb), (dut.kv.blk, rb), (dut.fold.i, rows)]
    if hdrs:
        feeds.append((dut.fold.kh, hdrs))
    finals = [int(x) for _, _, r, _ in tile_schedule(q_pos, blocks, q_tile) for x in r]
    last_of = {x: n for n, x in enumerate(finals)}
    return feeds, [x for n, x in enumerate(finals) if last_of[x] == n]


@pytest.mark.parametrize("per_channel,g", [(False, 2), (True, 3)])
def test_records_to_states(per_channel, g):
    """The chain from the records: a causal chunk (36 tokens at GQA 2:1, 24 at 3:1; query tiles
    of 16) at the end of 96 keys in three blocks (per-token: 32, 34, 30 keys; per-channel:
    32-key groups with outlier channels), each (query tile, block) read again as the
    sequencer would, the KV reader's beats of 8 channels into TileKV, the query rows (and
    per-channel, the blocks' group headers) into TileFold, TileAttention after them; random
    valid/ready on every input and the output: every row's merged state equals
    ``attend_tiled_rows(..., "single", p_format=P8, array=True)``."""
    rng = np.random.default_rng(320 + 10 * per_channel + g)
    d, keys, lanes, q_tile, in_lanes, fl, mb = 16, 4, 4, 16, 8, 4, 48
    lens = [32, 32, 32] if per_channel else [32, 34, 30]
    q, sq, blocks, q_pos = chunk(rng, lens, 72 // g, g, d, per_channel)
    fmt = KVFormat.PER_CHANNEL_K if per_channel else KVFormat.PER_TOKEN
    dut = Chain(keys, d, lanes, in_lanes, mb, q_tile, fmt, fl)
    feeds, finals = chain_inputs(dut, q, sq, blocks, q_pos, q_tile, d, in_lanes, mb, fl)
    got, _ = run_chain(dut, feeds, finals, q_tile, d, g + per_channel, 0.25, 0.4)
    check(got, attend_tiled_rows(q, sq, blocks, q_pos, "single", p_format=P8, q_tile=q_tile,
                                 array=True), len(q))


def test_records_rate():
    """The chain at full rate, per-channel K (d 16, 4 keys per beat, 4 lanes, the reader's 8
    lanes; blocks of 64 keys against 8-row query tiles: the transposer takes ``64·16/8`` = 128
    cycles per block, the arrays ``8·64/4`` = 128), inputs always valid, output always ready:
    after the first row the score beats pass from TileScore to TileAttend one per cycle — the
    records and the fold keep the arrays busy — and every merged state equals the golden
    model's."""
    per_channel = True
    rng = np.random.default_rng(331)
    d, keys, lanes, q_tile, in_lanes, fl, nk = 16, 4, 4, 8, 8, 4, 64
    q, sq, blocks, q_pos = chunk(rng, [nk] * 3, 8, 2, d, per_channel)
    fmt = KVFormat.PER_CHANNEL_K if per_channel else KVFormat.PER_TOKEN
    dut = Chain(keys, d, lanes, in_lanes, nk, q_tile, fmt, fl)
    feeds, finals = chain_inputs(dut, q, sq, blocks, q_pos, q_tile, d, in_lanes, nk, fl)
    got, tr = run_chain(dut, feeds, finals, q_tile, d, 0, 0.0, 0.0)
    check(got, attend_tiled_rows(q, sq, blocks, q_pos, "single", p_format=P8, q_tile=q_tile,
                                 array=True), len(q))
    take = tr["take"]
    n_beats = sum(len(r) for _, _, r, _ in tile_schedule(q_pos, blocks, q_tile)) * nk // keys
    span = take[-1] - take[0] + 1
    print(f"score beats {len(take)} in {span} cycles (first at cycle {take[0]})")
    assert len(take) == n_beats
    assert span == n_beats and tr["wait"] == 0
