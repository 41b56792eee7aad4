# amaranth: UnusedElaboratable=no
"""amaranth.sim tests of the query sequencer of the tiled prefill (issue #33,
mcf.hdl.compute.tile_query): a chunk's query rows and, per query tile, every KV block's
descriptor in → TileFold's row beats equal bit for bit to those of
:func:`mcf.golden.attention_tiled.tile_schedule` (``tests/test_tile_fold.py``'s
``fold_inputs``: rows skipped before a block, the causal ``visible``, ``first``/``final``, the
block's ``n`` and ``last``), per block the rows issued (TileKV's ``blk``), per tile the rows
that see a key; GQA 1..3, contiguous and non-contiguous blocks, blocks after a whole tile,
two chunks back to back, random valid/ready; the rate and latency in cycles."""

from __future__ import annotations

import numpy as np
import pytest
from amaranth.sim import Simulator
from test_tile_fold import fold_inputs
from tile_sim import feeder

from mcf.abi.attn_tile import (
    block_desc_layout,
    chunk_layout,
    kv_rows_layout,
    query_row_layout,
    tile_rows_layout,
)
from mcf.golden.attention import random_blocks, random_query
from mcf.golden.attention_tiled import tile_schedule
from mcf.hdl.compute.tile_query import TileQuery

MAX_ROWS, MAX_HEADS = 48, 4


def query_inputs(q, sq, blocks, pos, g, q_tile, max_block):
    """The sequencer's inputs for a chunk of ``len(q)`` rows at first position ``pos``: the
    chunk beat, the query rows, per query tile every block's descriptor; and the expected
    ``kv`` and ``tile`` beats."""
    n = len(q)
    clay, qlay = chunk_layout(MAX_ROWS, MAX_HEADS), query_row_layout(q.shape[1])
    dlay = block_desc_layout(max_block)
    chunk = [clay.const({"pos": pos, "rows": n, "heads": g}).as_bits()]
    rows = [qlay.const({"q": [int(v) for v in q[x]], "scale_m": int(sq[x, 0]),
                        "scale_e": int(sq[x, 1])}).as_bits() for x in range(n)]
    n_tiles = -(-n // q_tile)
    desc = [dlay.const({"pos0": int(b.pos[0]), "n": len(b), "last": int(j == len(blocks) - 1)})
            .as_bits() for _ in range(n_tiles) for j, b in enumerate(blocks)]
    q_pos = pos + np.arange(n) // g
    met = {(int(t[0]), b): len(r) for t, b, r, _ in tile_schedule(q_pos, blocks, q_tile)}
    klay, tlay = kv_rows_layout(q_tile), tile_rows_layout(q_tile)
    kv = [klay.const({"rows": met.get((lo, b), 0)}).as_bits()
          for lo in range(0, n, q_tile) for b in range(len(blocks))]
    tile = [tlay.const({"rows": met.get((lo, 0), 0), "last": int(lo + q_tile >= n)}).as_bits()
            for lo in range(0, n, q_tile)]
    return chunk, rows, desc, kv, tile, q_pos


def run(dut, inputs, want, idle=0.0, stall=0.0, seed=0):
    """Feeds ``inputs`` (port name → beats); collects ``o``, ``kv``, ``tile`` until each has
    as many beats as ``want``; returns them and the cycles of the ``o`` beats and the
    descriptors taken."""
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    outs = {k: [] for k in want}
    cyc = {"o": [], "desc": []}

    async def sink(ctx):
        rng = np.random.default_rng(seed + 5)
        c = 0
        while any(len(outs[k]) < len(want[k]) for k in want):
            for k in want:
                ctx.set(getattr(dut, k).ready, int(not stall or rng.random() >= stall))
            sig = [getattr(dut, k) for k in want]
            vals = await ctx.tick().sample(
                dut.desc.valid, dut.desc.ready,
                *[x for p in sig for x in (p.valid, p.ready, p.payload.as_value())])
            if vals[2] and vals[3]:
                cyc["desc"].append(c)
            for j, k in enumerate(want):
                v, r, p = vals[4 + 3 * j: 7 + 3 * j]
                if v and r:
                    outs[k].append(int(p))
                    if k == "o":
                        cyc["o"].append(c)
            c += 1
        for _ in range(4):
            await ctx.tick()
            assert not ctx.get(dut.o.valid)

    for n, (name, beats) in enumerate(inputs.items()):
        sim.add_testbench(feeder(getattr(dut, name), beats, seed + 3 * n, idle), background=True)
    sim.add_testbench(sink)
    sim.run()
    return outs, cyc


def case(rng, g, n_tok, lens, keep, d=8):
    """A causal chunk of ``n_tok`` tokens (``g`` heads) at the end of blocks of ``lens`` keys,
    of which the blocks ``keep`` are this node's (the others left out: non-contiguous)."""
    blocks = random_blocks(rng, lens, d)
    n = sum(lens)
    blocks = [blocks[j] for j in keep]
    q, sq = random_query(rng, n_tok * g, d, sigma=2.0)
    return q, sq, blocks, n - n_tok


@pytest.mark.parametrize("g,n_tok,q_tile,lens,keep,row_words", [
    (2, 18, 8, [16, 16, 12, 8], [0, 1, 2, 3], 1),     # diagonal blocks, tiles skipping blocks
    (3, 11, 16, [20, 9, 7], [0, 1, 2], 1),            # a partial tile, GQA 3
    (1, 24, 4, [8, 8, 8, 8, 8], [0, 2, 3, 4], 1),     # a block left out, blocks after tiles
    (2, 6, 16, [30, 10, 6], [1, 2], 1),               # the chunk inside the last block
    (2, 18, 8, [16, 16, 12, 8], [0, 1, 2, 3], 4),     # rows as four words
    (3, 11, 16, [20, 9, 7], [0, 1, 2], 3),            # three words (the last one short)
])
def test_schedule(g, n_tok, q_tile, lens, keep, row_words):
    """Every row beat, ``kv`` beat and ``tile`` beat equals the schedule's, under random
    valid/ready on all inputs and outputs; a row kept as one word or as ``row_words``."""
    rng = np.random.default_rng(400 + g + n_tok + q_tile)
    d, mb = 8, 32
    q, sq, blocks, pos = case(rng, g, n_tok, lens, keep, d)
    chunk, rows, desc, kv, tile, q_pos = query_inputs(q, sq, blocks, pos, g, q_tile, mb)
    want_o, _ = fold_inputs(q, sq, blocks, q_pos, q_tile, d, mb, d)
    dut = TileQuery(head_dim=d, max_block=mb, rows=q_tile, max_rows=MAX_ROWS,
                    max_heads=MAX_HEADS, row_words=row_words)
    outs, _ = run(dut, {"chunk": chunk, "q": rows, "desc": desc},
                  {"o": want_o, "kv": kv, "tile": tile}, idle=0.3, stall=0.4, seed=g)
    assert outs["kv"] == kv and outs["tile"] == tile
    assert len(outs["o"]) == len(want_o)
    for n, (a, b) in enumerate(zip(outs["o"], want_o)):
        assert a == b, f"row beat {n}"


@pytest.mark.parametrize("style", TileQuery.RAM_STYLES)
def test_ram_style(style):
    """``ram_style`` reaches the row memory's netlist attribute (yosys maps ``"ultra"`` to
    URAM288 with ``-uram``) and changes no bit of the schedule; other styles are refused."""
    from amaranth.back import rtlil
    dut = TileQuery(head_dim=8, max_block=32, rows=8, max_rows=MAX_ROWS, max_heads=MAX_HEADS,
                    ram_style=style)
    text = rtlil.convert(dut, name="tq", emit_src=False)
    assert f'attribute \\ram_style "{style}"' in text
    rng = np.random.default_rng(410)
    q, sq, blocks, pos = case(rng, 2, 18, [16, 16, 12, 8], [0, 1, 2, 3])
    chunk, rows, desc, kv, tile, q_pos = query_inputs(q, sq, blocks, pos, 2, 8, 32)
    want_o, _ = fold_inputs(q, sq, blocks, q_pos, 8, 8, 32, 8)
    dut = TileQuery(head_dim=8, max_block=32, rows=8, max_rows=MAX_ROWS, max_heads=MAX_HEADS,
                    ram_style=style)
    outs, _ = run(dut, {"chunk": chunk, "q": rows, "desc": desc},
                  {"o": want_o, "kv": kv, "tile": tile}, idle=0.3, stall=0.4, seed=1)
    assert outs["kv"] == kv and outs["tile"] == tile and outs["o"] == want_o
    with pytest.raises(ValueError):
        TileQuery(ram_style="distributed")


def test_two_chunks():
    """Two chunks back to back (the second taken after the first's last row): both schedules
    in order."""
    rng = np.random.default_rng(410)
    d, mb, q_tile = 8, 32, 8
    ins = {"chunk": [], "q": [], "desc": []}
    want = {"o": [], "kv": [], "tile": []}
    for g, n_tok, lens in [(2, 10, [16, 14]), (3, 5, [16, 16, 5])]:
        q, sq, blocks, pos = case(rng, g, n_tok, lens, range(len(lens)), d)
        chunk, rows, desc, kv, tile, q_pos = query_inputs(q, sq, blocks, pos, g, q_tile, mb)
        for k, v in (("chunk", chunk), ("q", rows), ("desc", desc)):
            ins[k] += v
        want["o"] += fold_inputs(q, sq, blocks, q_pos, q_tile, d, mb, d)[0]
        want["kv"] += kv
        want["tile"] += tile
    dut = TileQuery(head_dim=d, max_block=mb, rows=q_tile, max_rows=MAX_ROWS,
                    max_heads=MAX_HEADS)
    outs, _ = run(dut, ins, want, idle=0.2, stall=0.3, seed=7)
    assert outs == want


@pytest.mark.parametrize("row_words", [1, 4])
def test_rate_and_latency(row_words):
    """Inputs always valid, outputs always ready: a row beat per ``P = row_words`` cycles
    within a block, one cycle more between blocks (the descriptor taken), a block's first row
    ``P + 1`` cycles after its descriptor is taken."""
    P = row_words
    rng = np.random.default_rng(420)
    d, mb, q_tile, g = 8, 32, 16, 2
    q, sq, blocks, pos = case(rng, g, 24, [32, 40], [0, 1], d)
    chunk, rows, desc, kv, tile, q_pos = query_inputs(q, sq, blocks, pos, g, q_tile, mb)
    want_o, _ = fold_inputs(q, sq, blocks, q_pos, q_tile, d, mb, d)
    dut = TileQuery(head_dim=d, max_block=mb, rows=q_tile, max_rows=MAX_ROWS,
                    max_heads=MAX_HEADS, row_words=P)
    outs, cyc = run(dut, {"chunk": chunk, "q": rows, "desc": desc},
                    {"o": want_o, "kv": kv, "tile": tile})
    assert outs["o"] == want_o
    sched = list(tile_schedule(q_pos, blocks, q_tile))
    o, dc = np.array(cyc["o"]), np.array(cyc["desc"])
    print(f"{len(o)} row beats from cycle {o[0]} to {o[-1]}; descriptors at {dc.tolist()}")
    assert len(dc) == len(sched) and o[0] == dc[0] + P + 1
    # within a block P cycles apart; between blocks one more, the descriptor's
    starts = np.cumsum([0] + [len(r) for _, _, r, _ in sched])[:-1]
    gaps = np.diff(o)
    assert set(gaps[np.setdiff1d(np.arange(len(gaps)), starts - 1)]) == {P}
    assert set(gaps[starts[1:] - 1]) == {P + 1}
    assert (o[starts] == dc + P + 1).all()
