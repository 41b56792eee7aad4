"""amaranth.sim tests of the K/V transposer of the tiled prefill (issue #33,
mcf.hdl.compute.tile_kv): token-major KV records, as the KV reader's golden model delivers them
(:func:`mcf.abi.kv_reader.block_beats` of :func:`mcf.abi.kv.pack_kv_block`), → TileScore's K
words and TilePV's V beats equal, field by field, to those TileAttention's tests feed
(``tests/test_tile_attend.py``'s ``score_inputs`` and ``stimulus``), per-token and per-channel
K, partial key tiles and beats, random valid/ready; the rate measured in cycles."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from amaranth.sim import Simulator
from test_array_pv import v_words
from test_tile_attend import chunk, score_inputs, stimulus
from tile_sim import feeder

from mcf.abi.attn_tile import k_word_layout, kv_rows_layout, pv_word_layout, v_beat_layout
from mcf.abi.kv import pack_kv_block
from mcf.abi.kv_reader import block_beats
from mcf.golden.attention_tiled import tile_schedule
from mcf.hdl.compute.tile_kv import TileKV


def kv_inputs(blocks, q_pos, q_tile, d, in_lanes, max_rows):
    """Per (query tile, block) of :func:`tile_schedule`: the block's K and V beats as the KV
    reader delivers them, and its ``rows`` beat."""
    kb, vb, rb = [], [], []
    rlay = kv_rows_layout(max_rows)
    for _, b, r, _ in tile_schedule(q_pos, blocks, q_tile):
        blk = blocks[b]
        rec = pack_kv_block(blk.k, blk.sk, blk.v, blk.sv)
        k, v = block_beats(rec, d, in_lanes, pos0=int(blk.pos[0]))
        kb += k
        vb += v
        rb.append(rlay.const({"rows": len(r)}).as_bits())
    return kb, vb, rb


def run(dut, kb, vb, rb, n_kw, n_vb, idle=0.0, stall=0.0, seed=0):
    """Returns the K words and V beats (or the arrays' V words, ``pv_words``) emitted (bits)
    and a trace: the cycles ``k`` beats were taken, the cycles ``k.ready`` was low under a valid
    beat, the cycles of the outputs."""
    vout = dut.vw if dut.pv_words else dut.vb
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    got = {"kw": [], "vb": []}
    tr = {"ktake": [], "kwait": 0, "vwait": 0, "kw": [], "vb": []}

    async def sink(ctx):
        rng = np.random.default_rng(seed + 5)
        cyc = 0
        while len(got["kw"]) < n_kw or len(got["vb"]) < n_vb:
            ctx.set(dut.kw.ready, int(not stall or rng.random() >= stall))
            ctx.set(vout.ready, int(not stall or rng.random() >= stall))
            s = await ctx.tick().sample(dut.k.valid, dut.k.ready, dut.v.valid, dut.v.ready,
                                        dut.kw.valid, dut.kw.ready, dut.kw.payload.as_value(),
                                        vout.valid, vout.ready, vout.payload.as_value())
            kv_, kr, vv, vr, wv, wr, wp, bv, br, bp = s[2:]
            if kv_ and kr:
                tr["ktake"].append(cyc)
            tr["kwait"] += bool(kv_ and not kr)
            tr["vwait"] += bool(vv and not vr)
            if wv and wr:
                got["kw"].append(int(wp))
                tr["kw"].append(cyc)
            if bv and br:
                got["vb"].append(int(bp))
                tr["vb"].append(cyc)
            cyc += 1
        for _ in range(4):                       # nothing more comes out
            await ctx.tick()
            assert not ctx.get(dut.kw.valid) and not ctx.get(vout.valid)

    sim.add_testbench(feeder(dut.k, kb, seed, idle), background=True)
    sim.add_testbench(feeder(dut.v, vb, seed + 1, idle), background=True)
    sim.add_testbench(feeder(dut.blk, rb, seed + 2, idle), background=True)
    sim.add_testbench(sink)
    sim.run()
    return got, tr


def _val(x):
    return x.as_value().value if hasattr(x, "as_value") else int(x)


def compare(got, want, lay, always, on_last):
    """Every output's ``always`` fields, and ``on_last`` on a block's last one (where the
    arrays read them)."""
    assert len(got) == len(want)
    for x, (g, w) in enumerate(zip(got, want)):
        g, w = lay.from_bits(g), lay.from_bits(w)
        for f in always + (on_last if int(w.last) else ()):
            assert _val(getattr(g, f)) == _val(getattr(w, f)), f"beat {x}: {f}"


def _blocks(words, lay):
    """Each word's index in its block and the block's ``n`` (from its last word)."""
    out, idx, start = [], 0, 0
    for x, raw in enumerate(words):
        w = lay.from_bits(raw)
        out.append(idx)
        idx += 1
        if int(w.last):
            for y in range(start, x + 1):
                out[y] = (out[y], int(w.n))
            idx, start = 0, x + 1
    return out


def compare_k(got, want, lay, keys, words_per_tile):
    """K words: every field but the keys at or past the block's ``n`` (any value, masked by
    every consumer: ``k_word_layout``) — their codes and scales."""
    compare(got, want, lay, ("last",), ("n", "rows"))
    tile = len(lay.from_bits(want[0]).k)
    for x, ((wi, n), g, w) in enumerate(zip(_blocks(want, lay), got, want)):
        g, w = lay.from_bits(g), lay.from_bits(w)
        t = wi // words_per_tile
        for i in range(min(tile, n - t * tile)):
            assert _val(g.k[i]) == _val(w.k[i]), f"word {x}: key {t * tile + i}"
        for j in range(min(keys, n - wi * keys)):
            assert (_val(g.sk[j]), _val(g.sv[j])) == (_val(w.sk[j]), _val(w.sv[j])), \
                f"word {x}: scales of key {wi * keys + j}"


def compare_v(got, want, lay):
    compare(got, want, lay, ("v", "last"), ("rows",))


def compare_vw(got, want, lay, groups):
    """The arrays' V words (``groups`` channel groups per key step): keys at or past the
    block's ``n`` any value (their P is 0)."""
    compare(got, want, lay, ("last",), ("n", "rows"))
    for x, ((wi, n), g, w) in enumerate(zip(_blocks(want, lay), got, want)):
        g, w = lay.from_bits(g), lay.from_bits(w)
        lanes = len(w.v[0])
        step = wi // groups
        live = min(lanes, n - step * lanes)
        for c in range(len(w.v)):
            for i in range(live):
                assert _val(g.v[c][i]) == _val(w.v[c][i]), f"word {x}: channel {c} key {i}"


def run_and_compare(cut, keys, d, lanes, in_lanes, max_block, q_tile, **run_kw):
    """Run a :class:`TileKV` (``max_rows`` = ``q_tile``) on the reader beats of the chunk ``cut``
    (``chunk``'s (q, sq, blocks, q_pos)) and check every K word and V beat against
    TileAttention's test inputs; returns the unit and :func:`run`'s trace."""
    q, sq, blocks, q_pos = cut
    kblocks, _ = score_inputs(q, sq, blocks, q_pos, q_tile, keys, d, lanes, max_block)
    _, vblocks = stimulus(q, sq, blocks, q_pos, q_tile, keys, d)
    want_k = [w for bl in kblocks for w in bl]
    want_v = [b for bl in vblocks for b in bl]
    kb, vb, rb = kv_inputs(blocks, q_pos, q_tile, d, in_lanes, q_tile)
    dut = TileKV(keys=keys, head_dim=d, lanes=lanes, in_lanes=in_lanes, max_block=max_block,
                 max_rows=q_tile)
    got, tr = run(dut, kb, vb, rb, len(want_k), len(want_v), **run_kw)
    compare_k(got["kw"], want_k, k_word_layout(keys, d, lanes, max_block, q_tile), keys,
              d // lanes)
    compare_v(got["vb"], want_v, v_beat_layout(keys, d, q_tile))
    return dut, tr


@pytest.mark.parametrize("per_channel,in_lanes,lanes", [(False, 4, 4), (False, 2, 4),
                                                        (True, 16, 4), (True, 4, 2)])
def test_bit_exact(per_channel, in_lanes, lanes):
    """A causal 36-token chunk, GQA 2:1, query tiles of 16, at the end of 96 keys (per-token:
    blocks of 32, 34, 30 keys — partial key tiles and V beats; per-channel: 32-key groups),
    every (query tile, block) of the schedule read again as the sequencer would, reader beats
    of 2..16 channels (narrower and wider than the K words' lanes): every K word and V beat
    equals TileAttention's test input, under random valid/ready on every stream."""
    rng = np.random.default_rng(200 + per_channel + in_lanes)
    d, keys, q_tile = 16, 4, 16
    lens = [32, 32, 32] if per_channel else [32, 34, 30]
    cut = chunk(rng, lens, 36, 2, d, per_channel)
    run_and_compare(cut, keys, d, lanes, in_lanes, 48 if lanes == 4 else 64, q_tile,
                    idle=0.3, stall=0.4, seed=in_lanes)


@pytest.mark.parametrize("d,lanes,in_lanes,nk", [(16, 4, 4, 64), (128, 16, 64, 256)])
def test_rate(d, lanes, in_lanes, nk):
    """Inputs always valid, outputs always ready: the K and V beats go in one per cycle with
    ``ready`` never low — a block of ``n`` keys in ``n·head_dim/in_lanes`` cycles — and the
    words equal the golden ones; a tile's first word one cycle after its last K beat. The
    second shape is the kr260's (4 keys, head_dim 128, 16 lanes, the reader's 64 lanes,
    256-key blocks: 512 cycles per block, against 64 per row on the arrays)."""
    rng = np.random.default_rng(210)
    keys, q_tile = 4, 8
    _, _, blocks, _ = cut = chunk(rng, [nk, nk], 4, 2, d, False)
    dut, tr = run_and_compare(cut, keys, d, lanes, in_lanes, nk, q_tile)
    take = tr["ktake"]
    span = take[-1] - take[0] + 1
    print(f"{len(take)} K beats in {span} cycles ({len(blocks)} blocks of {nk} keys); "
          f"first word {tr['kw'][0] - take[dut.tile * d // in_lanes - 1]} cycle(s) after the "
          f"tile's last K beat")
    assert span == len(take) == len(blocks) * nk * d // in_lanes
    assert tr["kwait"] == 0 and tr["vwait"] == 0
    assert tr["kw"][0] - take[dut.tile * d // in_lanes - 1] == 1


@pytest.mark.parametrize("per_channel,in_lanes,pv_words", [(False, 4, (8, 4)), (True, 16, (4, 8)),
                                                            (False, 2, (16, 16))])
def test_pv_words(per_channel, in_lanes, pv_words):
    """``pv_words``: the same chunk's V as the GEMM arrays' words (ArrayPV's ``v``: tiles of
    ``keys`` keys, words of ``channels`` channels, ``[channel][key]``; keys past a block's end
    any value; ``n`` and ``rows`` on the last), every word equal to ``test_array_pv.v_words``
    of the scheduled block (keys below ``n``), the K words unchanged, under random
    valid/ready."""
    rng = np.random.default_rng(300 + per_channel + in_lanes)
    d, keys, lanes, q_tile, mb = 16, 4, 4, 16, 48
    lens = [32, 32, 32] if per_channel else [32, 34, 30]
    q, sq, blocks, q_pos = chunk(rng, lens, 36, 2, d, per_channel)
    kblocks, _ = score_inputs(q, sq, blocks, q_pos, q_tile, keys, d, lanes, mb)
    want_k = [w for bl in kblocks for w in bl]
    va, vl = pv_words
    geom = SimpleNamespace(lanes=vl, array_rows=va, head_dim=d, max_block=mb, max_rows=q_tile)
    want_v = [w for _, b, r, _ in tile_schedule(q_pos, blocks, q_tile)
              for w in v_words(np.asarray(blocks[b].v), len(r), geom)]
    kb, vb, rb = kv_inputs(blocks, q_pos, q_tile, d, in_lanes, q_tile)
    dut = TileKV(keys=keys, head_dim=d, lanes=lanes, in_lanes=in_lanes, max_block=mb,
                 max_rows=q_tile, pv_words=pv_words)
    got, _ = run(dut, kb, vb, rb, len(want_k), len(want_v), idle=0.3, stall=0.4, seed=in_lanes)
    compare_k(got["kw"], want_k, k_word_layout(keys, d, lanes, mb, q_tile), keys, d // lanes)
    compare_vw(got["vb"], want_v, pv_word_layout(va, vl, mb, q_tile), d // va)
