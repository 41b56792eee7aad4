"""amaranth.sim tests of the tiled prefill's output stage and whole compute chain (issue #33):
TileNormalize (mcf.hdl.compute.tile_normalize: merged ``(m, l, o)`` → ``o / l`` equal to
:func:`mcf.abi.softmax.normalize`) and TilePrefill (mcf.hdl.compute.tile_prefill: a chunk's
query rows, the blocks' descriptors and the KV reader's K/V beats in → every row's ``o / l``
equal to :func:`mcf.golden.attention_tiled.attend_prefill_tiled` with ``p_format=P8``,
``array=True``), per-token and per-channel K, GQA, partial diagonal blocks, blocks a whole
query tile skips, gaps on the inputs and backpressure on the output; cycles measured."""

from __future__ import annotations

import numpy as np
import pytest
from amaranth import Elaboratable, Module
from amaranth.sim import Simulator
from test_tile_attend import chunk
from tile_sim import feeder, taking_sink

from mcf.abi.attn_tile import (
    P8,
    block_desc_layout,
    chunk_layout,
    fold_header_layout,
    merge_beat_layout,
    norm_beat_layout,
    query_row_layout,
)
from mcf.abi.kv import pack_kv_block
from mcf.abi.kv_channel import KV_GROUP, KVFormat
from mcf.abi.kv_reader import block_beats
from mcf.abi.softmax import LANE_BITS, STATE_L, STATE_O, normalize
from mcf.golden.attention import KVChannelBlock
from mcf.golden.attention_tiled import attend_prefill_tiled, tile_schedule
from mcf.hdl.compute.tile_normalize import TileNormalize
from mcf.hdl.compute.tile_prefill import TilePrefill

# ---- TileNormalize ---------------------------------------------------------------------------


def norm_states(rng, n, d):
    """``n`` merged states: random, and the edges (``l`` = 0, 1, 2^32 − 1, a power of two,
    ``o`` at both saturation ends)."""
    lo_, hi_ = -(1 << (STATE_O.width - 1)), (1 << (STATE_O.width - 1)) - 1
    ls = [0, 1, STATE_L.max_int, 1 << 20, 3, 65535]
    ls += [int(x) for x in rng.integers(1, 1 << rng.integers(1, 32, n - len(ls)), dtype=np.int64)]
    out = []
    for j, l_sum in enumerate(ls):
        if j % 3 == 0:
            o = rng.choice([lo_, hi_, 0, -1, 1], d)
        else:
            o = rng.integers(lo_, hi_, d, endpoint=True)
        out.append((l_sum, np.asarray(o, dtype=np.int64)))
    return out


def normalized_rows(bits, olay, d: int, lanes: int) -> list:
    """``(row, o)`` of each normalized row in the beats ``bits`` (layout ``olay``, ``lanes``
    channels a beat): ``d / lanes`` beats a row, in order, its row on each, ``last`` on the
    final one."""
    beats = list(map(olay.from_bits, bits))
    nb = d // lanes
    assert len(beats) % nb == 0
    rows = []
    for r in range(0, len(beats), nb):
        part = beats[r:r + nb]
        assert [int(b.last) for b in part] == [0] * (nb - 1) + [1]
        assert len({int(b.row) for b in part}) == 1
        rows.append((int(part[0].row),
                     np.array([int(b.o[n]) for b in part for n in range(lanes)])))
    return rows


def run_norm(dut, states, rows, seed, idle, stall):
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    d = dut.head_dim
    L = dut.lanes
    ilay, olay = merge_beat_layout(L, dut.rows), norm_beat_layout(L, dut.rows)
    nb = d // L
    beats = [ilay.const({"state": {"m": 0, "l": l_sum, "o": [int(x) for x in o[j * L:][:L]]},
                         "row": r, "last": int(j == nb - 1)}).as_bits()
             for (l_sum, o), r in zip(states, rows) for j in range(nb)]
    sink, seen = taking_sink(dut.o, dut.i, len(beats), np.random.default_rng(seed + 1), stall)
    sim.add_testbench(feeder(dut.i, beats, seed, idle), background=True)
    sim.add_testbench(sink)
    sim.run()
    return (normalized_rows(seen.bits, olay, d, L),
            {"in": seen.take[::nb], "out": seen.out[nb - 1::nb], "first": seen.out[::nb]})


@pytest.mark.parametrize("d,lanes", [(16, 4), (8, 8), (12, 1)])
def test_normalize_bit_exact(d, lanes):
    """Every output row equals ``normalize(l, o)`` (and its row), random and edge states, random
    valid/ready."""
    rng = np.random.default_rng(500 + d + lanes)
    states = norm_states(rng, 24, d)
    rows = [int(x) for x in rng.integers(0, 16, len(states))]
    dut = TileNormalize(head_dim=d, rows=16, lanes=lanes)
    got, _ = run_norm(dut, states, rows, lanes, 0.3, 0.4)
    assert [g[0] for g in got] == rows
    for n, ((l_sum, o), (_, y)) in enumerate(zip(states, got)):
        np.testing.assert_array_equal(y, normalize(l_sum, o), err_msg=f"row {n}")
    assert any((normalize(s[0], s[1]) == (1 << (LANE_BITS - 1)) - 1).any() for s in states)


def test_normalize_rate():
    """Always valid, always ready: a row per :meth:`row_cycles` = ``head_dim/lanes + 4``
    cycles (the kr260 shape, 128 channels and 4 lanes: 36), a beat out 2 cycles after it is
    taken, a beat a cycle."""
    rng = np.random.default_rng(510)
    d, lanes = 128, 4
    states = norm_states(rng, 8, d)
    dut = TileNormalize(head_dim=d, rows=64, lanes=lanes)
    got, cyc = run_norm(dut, states, [0] * len(states), 0, 0.0, 0.0)
    for (l_sum, o), (_, y) in zip(states, got):
        np.testing.assert_array_equal(y, normalize(l_sum, o))
    print(f"rows taken at {cyc['in']}, out at {cyc['out']}")
    nb = d // lanes
    assert dut.row_cycles() == 36
    assert set(np.diff(cyc["in"])) == {dut.row_cycles()}
    assert [b - a for a, b in zip(cyc["in"], cyc["first"])] == [2] * len(states)
    assert [b - a for a, b in zip(cyc["in"], cyc["out"])] == [nb + 1] * len(states)


# ---- TilePrefill -----------------------------------------------------------------------------

MAX_ROWS, MAX_HEADS = 96, 4


def prefill_inputs(q, sq, blocks, pos, g, q_tile, d, in_lanes, mb, fl):
    """The chain's inputs: the chunk beat, its query rows, per query tile every block's
    descriptor, K/V beats (the reader's golden beats) and, per-channel K, group headers."""
    n = len(q)
    clay, qlay, dlay = chunk_layout(MAX_ROWS, MAX_HEADS), query_row_layout(d), block_desc_layout(mb)
    hlay = fold_header_layout(fl)
    ins = {"chunk": [clay.const({"pos": pos, "rows": n, "heads": g}).as_bits()],
           "q": [qlay.const({"q": [int(v) for v in q[x]], "scale_m": int(sq[x, 0]),
                             "scale_e": int(sq[x, 1])}).as_bits() for x in range(n)],
           "desc": [], "k": [], "v": [], "kh": []}
    for _ in range(0, n, q_tile):
        for j, blk in enumerate(blocks):
            ins["desc"].append(dlay.const({"pos0": int(blk.pos[0]), "n": len(blk),
                                           "last": int(j == len(blocks) - 1)}).as_bits())
            k, v = block_beats(pack_kv_block(blk.k, blk.sk, blk.v, blk.sv), d, in_lanes,
                               pos0=int(blk.pos[0]))
            ins["k"] += k
            ins["v"] += v
            if isinstance(blk, KVChannelBlock):
                ng = -(-len(blk) // KV_GROUP)
                for gi in range(ng):
                    h = np.asarray(blk.ks)[gi * KV_GROUP]
                    for c in range(d // fl):
                        word = sum(int(h[c * fl + i]) << (16 * i) for i in range(fl))
                        ins["kh"].append(hlay.const({"data": word, "last": int(
                            gi == ng - 1 and c == d // fl - 1)}).as_bits())
    if not ins["kh"]:
        del ins["kh"]
    return ins


class Selected(Elaboratable):
    """A TilePrefill built with the engine (``engine_width``) on its chunk's path (``sel``)."""

    def __init__(self, dut):
        self.dut = dut

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = self.dut
        m.d.comb += self.dut.sel.eq(1)
        return m


def run_prefill(dut, ins, n_rows, seed, idle, stall):
    """Returns ``{chunk row: o}`` in the order out, the cycles of the output rows, and those
    the score beats passed from TileScore to TileAttend."""
    sim = Simulator(Selected(dut) if dut.engine is not None else dut)
    sim.add_clock(1e-8)
    lanes = dut.norm.lanes
    olay = norm_beat_layout(lanes, dut.max_rows)
    nb = dut.head_dim // lanes
    sink, seen = taking_sink(dut.o, dut.att.score.o, n_rows * nb,
                             np.random.default_rng(seed + 11), stall, quiet=8)
    for n, (name, beats) in enumerate(ins.items()):
        sim.add_testbench(feeder(getattr(dut, name), beats, seed + 7 * n, idle), background=True)
    sim.add_testbench(sink)
    sim.run()
    return (normalized_rows(seen.bits, olay, dut.head_dim, lanes),
            {"out": seen.out[nb - 1::nb], "beats": seen.take})


def check_rows(got, want):
    assert sorted(r for r, _ in got) == list(range(len(want)))
    for r, o in got:
        np.testing.assert_array_equal(o, want[r], err_msg=f"row {r}")


@pytest.mark.parametrize("per_channel,g,n_tok,lens,q_tile,arrays,engine", [
    (False, 2, 14, [16, 16, 12, 8], 8, 0, 0),  # partial diagonal blocks, a tile skips a block
    (True, 2, 20, [32, 32, 16], 8, 0, 0),   # per-channel: the open group diagonal, a block dropped
    (False, 2, 14, [16, 16, 12, 8], 8, 4, 0),  # the same on 4 shared GEMM arrays
    (True, 2, 20, [32, 32, 16], 8, 2, 0),
    (False, 2, 14, [16, 16, 12, 8], 8, 4, 64),  # the chain the engine shares (today's w, P8 rows)
])
def test_chunk_bit_exact(per_channel, g, n_tok, lens, q_tile, arrays, engine):
    """A causal chunk at the end of the keys (its diagonal block partial; a query tile wholly
    before the last block: that block is read and dropped, per-channel K its headers too),
    head_dim 16, gaps on every input and backpressure on the output: every row's ``o / l``
    equals ``attend_prefill_tiled(..., p_format=P8, array=True)`` — with S and P·V on arrays
    of their own (TileAttention) and on ``arrays`` GEMM arrays of 8 × 4 taking turns
    (ArrayAttention, TileKV's V as the arrays' words); ``engine``: on the chain it shares with
    ArrayEngine (built in today's ``w``, the chunk's rows in P8 by their ``p8`` flag)."""
    rng = np.random.default_rng(520 + 10 * per_channel + g)
    d, keys, lanes, in_lanes, fl, mb = 16, 4, 4, 8, 4, 32
    q, sq, blocks, q_pos = chunk(rng, lens, n_tok, g, d, per_channel)
    pos = int(q_pos[0])
    sched = list(tile_schedule(q_pos, blocks, q_tile))
    assert any(not v.all() for _, _, _, v in sched)                     # the diagonal
    assert len(sched) < len(blocks) * -(-len(q) // q_tile)              # a block dropped
    want = attend_prefill_tiled(q.reshape(n_tok, g, d), sq.reshape(n_tok, g, 2), blocks,
                                q_pos[::g], p_format=P8, q_tile=q_tile, array=True)
    fmt = KVFormat.PER_CHANNEL_K if per_channel else KVFormat.PER_TOKEN
    dut = TilePrefill(keys=keys, head_dim=d, lanes=lanes, in_lanes=in_lanes, max_block=mb,
                      rows=q_tile, max_rows=MAX_ROWS, max_heads=MAX_HEADS, kv_format=fmt,
                      fold_lanes=fl, arrays=arrays, array_rows=8, engine_width=engine)
    ins = prefill_inputs(q, sq, blocks, pos, g, q_tile, d, in_lanes, mb, fl)
    got, _ = run_prefill(dut, ins, len(q), g, 0.25, 0.4)
    check_rows(got, want.reshape(len(q), d))


def unmasked_macs(q_pos, blocks, q_tile, d):
    """QKᵀ + P·V multiply-accumulates of the schedule's unmasked (row, key) pairs."""
    return sum(int(v.sum()) for _, _, _, v in tile_schedule(q_pos, blocks, q_tile)) * 2 * d


def measure(per_channel, g, n_tok, lens, q_tile, d, lanes, in_lanes, fl, seed, arrays=0,
            array_rows=16, engine=0, query_words=1):
    """The chain at full rate (inputs always valid, output always ready): the rows against
    the golden model, the score beats' span, and the chunk's cycles from the first input to
    the last row out against its unmasked MACs. ``arrays``: S and P·V on that many shared
    GEMM arrays of ``array_rows × lanes``; ``query_words``: TilePrefill's."""
    rng = np.random.default_rng(seed)
    keys, mb = 4, max(lens)
    q, sq, blocks, q_pos = chunk(rng, lens, n_tok, g, d, per_channel)
    fmt = KVFormat.PER_CHANNEL_K if per_channel else KVFormat.PER_TOKEN
    dut = TilePrefill(keys=keys, head_dim=d, lanes=lanes, in_lanes=in_lanes, max_block=mb,
                      rows=q_tile, max_rows=MAX_ROWS, max_heads=6, kv_format=fmt,
                      fold_lanes=fl, arrays=arrays, array_rows=array_rows,
                      engine_width=engine, query_words=query_words)
    assert len(q) <= dut.max_rows
    ins = prefill_inputs(q, sq, blocks, int(q_pos[0]), g, q_tile, d, in_lanes, mb, fl)
    ins["chunk"] = [chunk_layout(MAX_ROWS, 6).const({"pos": int(q_pos[0]), "rows": len(q),
                                                      "heads": g}).as_bits()]
    got, cyc = run_prefill(dut, ins, len(q), seed, 0.0, 0.0)
    want = attend_prefill_tiled(q.reshape(n_tok, g, d), sq.reshape(n_tok, g, 2), blocks,
                                q_pos[::g], p_format=P8, q_tile=q_tile, array=True)
    check_rows(got, want.reshape(len(q), d))
    n_beats = sum(len(r) * -(-len(blocks[b]) // keys)
                  for _, b, r, _ in tile_schedule(q_pos, blocks, q_tile))
    beats = cyc["beats"]
    cycles = cyc["out"][-1] + 1
    macs = unmasked_macs(q_pos, blocks, q_tile, d)
    print(f"\n{'TileAttention' if not arrays else f'{arrays} shared arrays'}: "
          f"{len(q)} rows (GQA {g}:1, head_dim {d}) against {sum(lens)} keys: score beats "
          f"{len(beats)} in {beats[-1] - beats[0] + 1} cycles; the chunk {cycles} cycles, "
          f"{macs} unmasked QKᵀ + P·V MACs: {macs / cycles:.1f} MACs/cycle "
          f"(peak {2 * keys * d}: {macs / cycles / (2 * keys * d):.3f})")
    return n_beats, beats


@pytest.mark.parametrize("arrays", [0, 4])
def test_chunk_rate(arrays):
    """Full rate at head_dim 16 (4 keys per beat, 4 lanes, the reader's 8 lanes; a 16-row
    query tile against three 64-key blocks, the last the diagonal): after the first row the
    score beats pass TileScore → TileAttend one per cycle through the whole chain — also with
    S and P·V on 4 shared arrays of 16 × 4; the chunk's MACs per cycle are printed (not
    asserted)."""
    n_beats, beats = measure(False, 2, 8, [64, 64, 64], 16, 16, 4, 8, 4, 530, arrays)
    assert len(beats) == n_beats and beats[-1] - beats[0] + 1 == n_beats


def test_chunk_rate_query_words():
    """The same chunk with TileQuery's rows as four words (``query_words``, the kr260's: a row
    per 4 cycles out of TileQuery, each held by TileFold for its key tiles): bit-exact, and the
    score beats still one per cycle after the first row — the sequencer stays ahead."""
    n_beats, beats = measure(False, 2, 8, [64, 64, 64], 16, 16, 4, 8, 4, 530, 4,
                             query_words=4)
    assert len(beats) == n_beats and beats[-1] - beats[0] + 1 == n_beats


@pytest.mark.slow
@pytest.mark.parametrize("arrays,engine", [(0, 0), (4, 0), (4, 64)])
def test_kr260_shape_rate(arrays, engine):
    """Near the kr260 shape (head_dim 128, 16 lanes, the reader's 64 lanes, GQA 6:1, 256-key
    blocks, 64-row query tiles): a 16-token causal chunk (96 rows) at the end of 512 keys, bit
    exact; the score beats one per cycle; the MACs per cycle printed. ``arrays`` 4: S and P·V
    on the kr260's 4 GEMM arrays of 16 × 16 taking turns; ``engine``: on the chain ArrayEngine
    shares (today's ``w``, the chunk in P8)."""
    n_beats, beats = measure(False, 6, 16, [256, 256], 64, 128, 16, 64, 16, 540, arrays,
                             engine=engine)
    assert len(beats) == n_beats and beats[-1] - beats[0] + 1 == n_beats
