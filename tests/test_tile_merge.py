"""amaranth.sim tests of the tiled prefill's online merge (issue #33, mcf.hdl.compute.tile_merge):
the block states of whole query chunks against several KV blocks, in the golden model's order
(:func:`mcf.golden.attention_tiled.tile_schedule`), merged into the same bits as
:func:`~mcf.golden.attention_tiled.attend_tiled_rows` (SINGLE, P8), under random valid/ready;
the merge's cycles per row measured."""

from __future__ import annotations

import numpy as np
import pytest
from amaranth.sim import Simulator
from tile_sim import beat_rows, beats_per_row, taking_sink

from mcf.abi.attn_tile import (
    P8,
    PV_W,
    merge_in_layout,
    pv_acc_bits,
    pv_p8_out,
    pv_sum_bits,
)
from mcf.abi.fixed import saturate
from mcf.abi.kv import AttnMode
from mcf.abi.quant import ACT
from mcf.abi.softmax import M_EMPTY, STATE_L, STATE_O
from mcf.golden.attention import KVChannelCache, random_blocks, random_query
from mcf.golden.attention_tiled import (
    attend_tiled_rows,
    p8_rows,
    pv_p8_acc,
    tile_block_state,
    tile_schedule,
    tile_scores,
    tile_weights,
)
from mcf.hdl.compute.tile_merge import TileMerge
from mcf.sim.amsim import send


def scheduled(q_pos, blocks, q_tile):
    """:func:`tile_schedule`'s steps as ``(tile, block, rows, valid, tags)``: ``tags[j]`` is
    row ``rows[j]``'s ``(first, final)`` — 1 where this step is its first / its last visit."""
    sched = list(tile_schedule(q_pos, blocks, q_tile))
    seen: dict[int, list[int]] = {}          # query row → the steps that visit it
    for n, (_, _, r, _) in enumerate(sched):
        for x in r:
            seen.setdefault(int(x), []).append(n)
    for n, (tile, b, r, valid) in enumerate(sched):
        yield tile, blocks[b], r, valid, [(int(seen[int(x)][0] == n), int(seen[int(x)][-1] == n))
                                          for x in r]


def schedule(q, sq, blocks, q_pos, q_tile):
    """The merge's input, in order: ``(row in tile, first, final, m, l, (s, acc))`` per (row,
    block) of :func:`tile_schedule`, the block states from the golden stages (P8, packed
    arrays; their ``o_b`` checked against ``tile_block_state``), and the tile's start."""
    items = []
    for tile, blk, r, valid, tags in scheduled(q_pos, blocks, q_tile):
        t = tile_scores(q[r], sq[r], blk, array=True)
        m, _, w, l_sum = tile_weights(t, valid, blk.sv)
        sh, w8 = p8_rows(w)
        acc = pv_p8_acc(w8, blk.v, array=True)
        st = tile_block_state(t, valid, blk, p_format=P8, array=True)
        assert np.array_equal(st.o, saturate(pv_p8_out(acc, sh[:, None]), STATE_O.width, True))
        for j, x in enumerate(r):
            items.append((int(x) - int(tile[0]), *tags[j],
                          int(m[j]), int(l_sum[j]), (int(sh[j]), acc[j]), int(tile[0])))
    return items


def run(dut, items, idle=0.0, stall=0.0, seed=0, modes=None):
    """Drive the items; returns ``{tile start + row: (m, l, o)}`` of the emitted rows in
    order, and the cycles of the inputs taken and of the outputs. ``modes``: each row's
    :class:`~mcf.abi.kv.AttnMode` (SINGLE when not given)."""
    d = dut.head_dim
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    rng = np.random.default_rng(seed)
    C = dut.in_channels
    ilay = merge_in_layout(C, dut.rows, dut.max_block, dut.p_format)
    olay = dut.o.payload.shape()
    nb = beats_per_row(olay, d)
    n_final = sum(it[2] for it in items)
    bases = [it[6] for it in items if it[2]]
    modes = modes or {}

    async def feed(ctx):                      # a row's block state as d / C beats
        await send(ctx, dut.i, (ilay.const({
            "state": {"m": m, "l": l_sum, "s": sh, "last": int(j == d // C - 1),
                      "acc": [int(x) for x in acc[j * C:(j + 1) * C]]},
            "row": row, "first": first, "final": final,
            "mode": modes.get(row, AttnMode.SINGLE)}).as_bits()
            for row, first, final, m, l_sum, (sh, acc), _ in items
            for j in range(d // C)), rng, idle)

    sink, seen = taking_sink(dut.o, dut.i, n_final * nb, np.random.default_rng(seed + 1),
                             stall)
    sim.add_testbench(feed, background=True)
    sim.add_testbench(sink)
    sim.run()
    got = [(base + r, m_, l_, o)
           for base, (r, m_, l_, o) in zip(bases, beat_rows(seen.bits, olay, d), strict=True)]
    return got, {"take": seen.take, "out": seen.out[nb - 1::nb]}


def check(got, expect, n_rows):
    assert sorted(g[0] for g in got) == list(range(n_rows))
    for row, m, l_sum, o in got:
        assert (m, l_sum) == (expect.m[row], expect.l[row]), f"row {row}: (m, l)"
        np.testing.assert_array_equal(o, expect.o[row], err_msg=f"row {row}: o")


def chunk(rng, lens, n_tok, g, d, per_channel=False, outliers=0):
    """A causal prefill chunk: the last ``n_tok`` tokens of the keys (``g`` query heads each),
    KV blocks of ``lens`` tokens (per-channel K: its first ``outliers`` channels six times
    wider)."""
    if per_channel:
        cache = KVChannelCache(d)
        n = sum(lens)
        kf = rng.normal(0, 1, (n, d)) + rng.normal(0, 1, d)
        kf[:, :outliers] *= 6
        cache.append(ACT.quantize(kf), ACT.quantize(rng.normal(0, 1, (n, d))))
        blocks = cache.blocks(max_block=max(lens))
    else:
        blocks = random_blocks(rng, lens, d)
    n = sum(len(b) for b in blocks)
    q, sq = random_query(rng, n_tok * g, d, sigma=2.0)
    return q, sq, blocks, np.repeat(np.arange(n - n_tok, n), g)


@pytest.mark.parametrize("per_channel,lanes,in_channels", [(False, 4, 16), (True, 8, 16),
                                                            (False, 4, 8), (True, 8, 8)])
def test_chunk_against_blocks(per_channel, lanes, in_channels):
    """A 12-token chunk, GQA 2:1 (24 rows), query tiles of 8 rows, against four KV blocks of 16
    keys (the chunk spans the last blocks: diagonal tiles, rows skipped for blocks after
    them), under random valid/ready; the merged states equal ``attend_tiled_rows``; block
    states as one beat per row or as beats of ``in_channels`` (ArrayPV's channel groups)."""
    rng = np.random.default_rng(60 + per_channel)
    d, q_tile = 16, 8
    q, sq, blocks, q_pos = chunk(rng, [16, 16, 16, 16], 12, 2, d, per_channel)
    items = schedule(q, sq, blocks, q_pos, q_tile)
    assert {it[:3] for it in items} >= {(0, 1, 0), (0, 0, 1)}
    assert len({(it[6], it[0]) for it in items}) == len(q)
    expect = attend_tiled_rows(q, sq, blocks, q_pos, "single", p_format=P8, q_tile=q_tile,
                               array=True)
    got, _ = run(TileMerge(head_dim=d, rows=q_tile, lanes=lanes, in_channels=in_channels),
                 items, idle=0.3, stall=0.4, seed=per_channel)
    check(got, expect, len(q))


def test_edge_states():
    """Hand-made block states: empty blocks (``M_EMPTY``) first and later, equal maxima, ``o_b``
    saturating both ways (``acc`` at the ends of a 320-key block's 21 bits, ``s`` = 12) and
    not, ``l`` saturating, a block maximum far below the running one; against ``merge_state``
    of ``sat(acc·2^s)``."""
    from mcf.abi.softmax import merge_state
    d = 8
    amax = (1 << (pv_acc_bits(320) - 1)) - 1
    big = np.array([amax, -amax - 1, amax, -amax - 1, 5, -5, 0, 1])
    zero = np.zeros(d, dtype=np.int64)
    seq = {0: [(M_EMPTY, 0, 0, zero), (100, 1 << 16, 12, big),
               (100, (1 << STATE_L.width) - 1, 12, big)],
           1: [(-(1 << 31) + 5, 3, 3, big), (1 << 30, 7, 11, -big - 1), (-(1 << 30), 9, 0, big)],
           2: [(7, 1 << 16, 7, big), (M_EMPTY, 0, 0, zero)],
           3: [(M_EMPTY, 0, 0, zero)]}
    items, expect = [], {}
    for row, states in seq.items():
        run_ = (M_EMPTY, 0, np.zeros(d, dtype=np.int64))
        for j, (m, l_sum, sh, acc) in enumerate(states):
            o = saturate(pv_p8_out(acc, sh), STATE_O.width, True)
            run_ = merge_state(run_, (m, l_sum, o))
            items.append((row, int(j == 0), int(j == len(states) - 1), m, l_sum, (sh, acc), 0))
        expect[row] = run_
    assert saturate(pv_p8_out(big, 12), STATE_O.width, True)[0] == (1 << 31) - 1
    # interleave the rows' blocks as the tiles do: block by block
    items = sorted(items, key=lambda it: (sum(1 for x in items[:items.index(it)]
                                              if x[0] == it[0]), it[0]))
    got, _ = run(TileMerge(head_dim=d, rows=4, lanes=4, max_block=320), items, stall=0.3,
                 seed=2)
    assert [g[0] for g in got] == [3, 2, 0, 1]
    for row, m, l_sum, o in got:
        em, el, eo = expect[row]
        assert (m, l_sum) == (int(em), int(el))
        np.testing.assert_array_equal(o, eo)


def test_two_phase_states():
    """``p_format = PV_W``, hand-made block states of rows in the three modes interleaved:
    FIXED rows (every block's ``m`` the row's ``m_fix``, ``acc`` at the ends of 256 keys' 32
    bits, ``l_b`` up to 2^31) sum ``l`` and ``o`` with 32-bit wrap-around — the two-phase
    combine :func:`mcf.abi.softmax.sum_states`, not the online merge, whose saturation gives
    other bits here; MAX rows keep the largest ``m`` (``M_EMPTY`` blocks too) with ``l``, ``o``
    0; a SINGLE row beside them is the online merge (``merge_state``)."""
    from mcf.abi.softmax import merge_state, sum_states
    d, rng = 8, np.random.default_rng(12)
    amax = (1 << (pv_sum_bits(256, PV_W) - 1)) - 1
    big = np.array([amax, -amax - 1, amax, -amax - 1, 5, -5, 0, 1])
    zero = np.zeros(d, dtype=np.int64)
    fix = [(-300, int(rng.integers(0, 1 << 31)), big) for _ in range(4)]
    modes = {0: AttnMode.FIXED, 1: AttnMode.MAX, 2: AttnMode.SINGLE, 3: AttnMode.FIXED}
    seq = {0: fix, 1: [(M_EMPTY, 0, zero), (40, 9, big), (-(1 << 30), 3, -big - 1)],
           2: [(40, 1 << 16, big[:] // (1 << 12)), (100, 5 << 16, -big // (1 << 12))],
           3: [(1 << 20, 7, big), (1 << 20, 1 << 24, -big - 1)]}
    items, expect = [], {}
    for row, states in seq.items():
        run_ = None
        for j, (m, l_sum, acc) in enumerate(states):
            o = saturate(acc, STATE_O.width, True)
            b = (m, l_sum, np.asarray(acc, dtype=np.int64))
            if modes[row] == AttnMode.FIXED:
                run_ = b if run_ is None else sum_states(run_, b)
            elif modes[row] == AttnMode.MAX:
                run_ = (max(m, M_EMPTY if run_ is None else run_[0]), 0, zero)
            else:
                run_ = merge_state((M_EMPTY, 0, zero) if run_ is None else run_, (m, l_sum, o))
            items.append((row, int(j == 0), int(j == len(states) - 1), m, l_sum, (0, acc), 0))
        expect[row] = run_
    assert expect[0][1] != min(sum(f[1] for f in fix), (1 << 32) - 1)   # l wrapped
    items = sorted(items, key=lambda it: (sum(1 for x in items[:items.index(it)]
                                              if x[0] == it[0]), it[0]))
    got, _ = run(TileMerge(head_dim=d, rows=4, lanes=4, max_block=256, p_format=PV_W,
                           in_channels=4), items, stall=0.3, seed=4, modes=modes)
    assert sorted(g[0] for g in got) == [0, 1, 2, 3]
    for row, m, l_sum, o in got:
        em, el, eo = expect[row]
        assert (m, l_sum) == (int(em), int(el)), f"row {row}"
        np.testing.assert_array_equal(o, eo, err_msg=f"row {row}")


@pytest.mark.parametrize("d,lanes,in_channels", [(16, 4, 16), (128, 4, 128), (128, 16, 128),
                                                  (128, 4, 16)])
def test_cycles_per_row(d, lanes, in_channels):
    """Back to back with ``o.ready`` high: one block state every ``cycles_per_row`` cycles
    (38 at head_dim 128, 4 lanes; 14 with 16) and each final state out that many cycles after
    it — also from beats of 16 channels (the kr260's ArrayPV), each taken as its words come."""
    rng = np.random.default_rng(70)
    q, sq, blocks, q_pos = chunk(rng, [8, 8], 4, 2, d)
    items = schedule(q, sq, blocks, q_pos, 8)
    dut = TileMerge(head_dim=d, rows=8, lanes=lanes, in_channels=in_channels)
    got, tr = run(dut, items)
    check(got, attend_tiled_rows(q, sq, blocks, q_pos, "single", p_format=P8, q_tile=8,
                                 array=True), len(q))
    take = tr["take"][::d // in_channels]               # each row's first beat
    assert np.all(np.diff(take) == dut.cycles_per_row)
    finals = [t for t, it in zip(take, items) if it[2]]
    assert [o - t for o, t in zip(tr["out"], finals)] == [dut.cycles_per_row] * len(finals)
    assert (TileMerge.row_cycles(128, 4), TileMerge.row_cycles(128, 16)) == (38, 14)
