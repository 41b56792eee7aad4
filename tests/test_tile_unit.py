"""The PREFILL_TILE ATTEND executor (mcf.hdl.node.tile_unit, issue #33; docs/node.md §3):
``TileUnit`` + a real ``KvReader`` + ``TilePrefill`` on amaranth.sim AXI slaves
(:mod:`mcf.sim.axi_slave`: random latencies, R and W pauses) — the bytes written equal
:func:`mcf.golden.attend_unit.attend_model`'s writes (``max_chunk`` > 0, per-token K, small
query tiles so that tiles skip blocks), the status counters its results, and bad records
(a softmax PREFILL_TILE does not run, a slot with a non-consecutive ``pos``, a chunk longer
than ``max_chunk``, a block longer than ``max_block``) retire with nothing written. Two inputs
on which the unit departs from the golden model, asserted as such: a slot read error (the
model has none) and a chunk whose first token precedes the first block (a bad list here)."""

from __future__ import annotations

import random

import numpy as np
import pytest
from amaranth.sim import Simulator
from attend_mem import Mem, memory_slaves, place_block, place_list, place_slot

from mcf.abi.attend import (
    ATTEND_STATUS,
    AttendArg,
    AttendBlock,
    AttendHeader,
    AttendMode,
    AttendSoftmax,
    prefill_out_bytes,
    prefill_query_address,
)
from mcf.abi.kv_reader import KV_READER_STATUS
from mcf.golden.attend_unit import attend_model
from mcf.golden.attention import random_blocks, random_query
from mcf.golden.attention_tiled import tile_schedule
from mcf.sim.amsim import run_records
from mcf.sim.tile_top import tile_top

BB = 16
MAX_HEADS, MAX_LIST = 3, 8
KV_BASE, Q_BASE, LIST_BASE, OUT_BASE = 0x1000, 0x8000, 0x18000, 0x20000
MEM = 0x40000


class Case:
    """A KV head's blocks at positions 0.., chunks of query slots (one region each) and their
    lists (chunk ``j``'s at entry ``(1 + MAX_LIST)·j`` of the list table)."""

    def __init__(self, seed, d, g, lens, out_off):
        self.rng = np.random.default_rng(seed)
        self.d, self.g, self.mem = d, g, Mem(MEM)
        self.blocks = random_blocks(self.rng, lens, d)
        self.ents = []
        at = KV_BASE
        for blk in self.blocks:
            ent, n = place_block(self.mem, at, blk)
            self.ents.append(ent)
            at += -(-n // 64) * 64 + 16 * (len(self.ents) % 2)
        assert at < Q_BASE
        self.keys, self.out_off, self.lists, self.q_at = sum(lens), out_off, 0, Q_BASE
        self.q_addr = {}                                   # list entry → its chunk's q_addr
        self.stride = 2 * prefill_out_bytes(g, d) + 16     # rows interleaved with another head's

    def chunk(self, tokens, *, bad_pos=None, nb=None, first=0, heads=None, big=False,
              skew=None):
        """A chunk of ``tokens`` query tokens ending at the last key (its diagonal block
        partial): its slots and list; returns the list's entry index (``ATTEND_ARG.list``).
        ``skew``: one address of the list off ``ATT_ALIGN`` (``"q"``, ``"out"``, ``"stride"``,
        ``"block"``), a bad list."""
        g = heads or self.g
        q, sq = random_query(self.rng, tokens * g, self.d, sigma=1.5)
        p0 = self.keys - tokens
        q_addr = self.q_at
        for i in range(tokens):
            end = place_slot(self.mem, q_addr, i, g, q[i * g:(i + 1) * g],
                             sq[i * g:(i + 1) * g], p0 + i + (i == bad_pos))
            self.q_at = end + 64
        out = OUT_BASE + self.out_off + self.lists * 0x2000
        ents = self.ents[first:first + (nb or len(self.ents))]
        if big:                               # a block longer than max_block (16)
            ents = ents[:-1] + [AttendBlock(ents[-1].addr, 17, ents[-1].pos0)]
        if skew == "block":
            ents = [AttendBlock(ents[0].addr + 2, ents[0].tokens, ents[0].pos0)] + ents[1:]
        place_list(self.mem, LIST_BASE + 16 * (1 + MAX_LIST) * self.lists,
                   AttendHeader(q_addr + 2 * (skew == "q"), out + (skew == "out"), tokens,
                                self.stride + 2 * (skew == "stride")), ents)
        self.lists += 1
        self.q_addr[(1 + MAX_LIST) * (self.lists - 1)] = q_addr
        return (1 + MAX_LIST) * (self.lists - 1)


def run(case, recs, *, mb, max_chunk, qt, lanes=4, in_lanes=8, seed=0, limit=200_000,
        bad_beats=(), bad_reads=()):
    """The records through TileUnit + KvReader + TilePrefill: the bytes written, the status
    counters, the KV reader's, and each record's cycles to ``done``."""
    ex = tile_top(head_dim=case.d, max_heads=MAX_HEADS, max_block=mb, max_list=MAX_LIST,
                  max_chunk=max_chunk, rows=qt, keys=4, lanes=lanes, in_lanes=in_lanes,
                  fold_lanes=4)
    u, kvr, tp = ex.unit, ex.reader, ex.prefill
    rng = random.Random(seed)
    wmem: dict[int, int] = {}
    sim = Simulator(ex.m)
    sim.add_clock(1e-8)
    for s in memory_slaves(case.mem, rng, u.rd_bus, kvr.bus, u.wr_bus, wmem, [],
                           bad_reads=bad_reads, bad_beats=bad_beats):
        sim.add_testbench(s, background=True)
    out = {}

    async def host(ctx):
        ctx.set(u.list_base, LIST_BASE)
        out["cycles"] = await run_records(ctx, u.rec, u.done, recs, limit)
        assert out["cycles"][-1] < limit, f"record {len(out['cycles']) - 1} never done"
        for _ in range(20):
            await ctx.tick()
            assert not ctx.get(u.done) and not ctx.get(tp.o.valid)
        out["status"] = {n: ctx.get(u.status[n]) for n, _ in ATTEND_STATUS}
        out["kvr"] = {n: ctx.get(kvr.status[n]) for n, _ in KV_READER_STATUS}

    sim.add_testbench(host)
    sim.run()
    return wmem, out


def check(case, recs, wmem, out, *, mb, max_chunk, qt, lost=(), write_errors=0,
          diverge=()):
    """The bytes written are the golden writes (nothing else; ``lost``: bytes of beats the
    slave answered with SLVERR), the counters its results. Records in ``diverge`` are ones the
    golden model runs and this unit counts as bad lists (a slot read error: the golden model
    has no read errors)."""
    want = {n: 0 for n, _ in ATTEND_STATUS}
    golden = {}

    for j, arg in enumerate(recs):
        res = attend_model(arg, LIST_BASE, case.mem.read, case.d, MAX_HEADS, mb, MAX_LIST,
                           max_chunk=max_chunk, tile_rows=qt)
        if j in diverge:
            assert res.bad is None and res.writes
            want["bad_list"] += 1
            continue
        if res.bad:
            want[res.bad] += 1
            continue
        want["records"] += 1
        want["blocks"] += res.blocks
        for addr, raw in res.writes:
            golden.update({addr + i: v for i, v in enumerate(raw) if addr + i not in lost})
    want["write_errors"] = write_errors
    assert sorted(wmem) == sorted(golden), "bytes written outside the golden rows (or missing)"
    assert all(wmem[a] == v for a, v in golden.items()), "a row differs from the golden model"
    assert out["status"] == want
    assert out["kvr"]["blocks"] == want["blocks"] and out["kvr"]["rejects"] == 0
    assert out["kvr"]["jobs"] == want["records"]
    return want


def arg(case, lst, nb=None, softmax=AttendSoftmax.SINGLE, heads=None):
    return AttendArg(lst, nb or len(case.ents), AttendMode.PREFILL_TILE.value,
                     heads or case.g, softmax).pack()


def test_chunks_and_bad_records():
    """GQA 2:1, head_dim 16, blocks of 16, 16, 4 keys, query tiles of 8 rows: an 8-token chunk
    ending at the last key (its first tile lies wholly before the last block, the second
    tile's partial diagonal), rows at an unaligned ``out_addr``; then a record with softmax
    MAX, a chunk whose slot 3 has the wrong ``pos``, a chunk above ``max_chunk``, chunks with
    the query, output, stride or a block off ATT_ALIGN, and a 5-token chunk over the first two
    blocks only — every good row bit-exact, nothing else written."""
    mb, max_chunk, qt = 16, 16, 8
    case = Case(60, 16, 2, [16, 16, 4], out_off=4)
    good = case.chunk(8)
    bad_pos = case.chunk(6, bad_pos=3)
    too_long = case.chunk(17)
    short = case.chunk(5, nb=2)
    skewed = [arg(case, case.chunk(4, skew=k)) for k in ("q", "out", "stride", "block")]
    recs = [arg(case, good), arg(case, good, softmax=AttendSoftmax.MAX), arg(case, bad_pos),
            arg(case, too_long), *skewed, arg(case, short, nb=2)]
    q_pos = np.repeat(np.arange(case.keys - 8, case.keys), 2)
    assert len(list(tile_schedule(q_pos, case.blocks, qt))) == 3 * 2 - 1    # a tile skips one
    wmem, out = run(case, recs, mb=mb, max_chunk=max_chunk, qt=qt, seed=1)
    want = check(case, recs, wmem, out, mb=mb, max_chunk=max_chunk, qt=qt)
    assert want == {"records": 2, "blocks": want["blocks"], "bad_record": 1, "bad_list": 6,
                    "write_errors": 0}
    print(f"\ncycles per record: {out['cycles']}")


def test_gqa3_split_tokens_write_error_and_early_chunk():
    """GQA 3:1, blocks of 8 and 13 keys, a 7-token chunk in query tiles of 8 rows (tokens 2
    and 5 have heads in two tiles: each head's part is written at its offset), one W beat of
    token 1's row answered SLVERR (``write_errors`` 1, the record retires, the other bytes
    land). Then bad lists with nothing written: a chunk whose first token precedes its list's
    first block (rows that see no key; a bad list in the golden model too), a block above
    ``max_block``, a chunk whose slot 2 reads SLVERR (the golden model has no read errors: it
    writes that chunk)."""
    mb, max_chunk, qt = 16, 16, 8
    case = Case(62, 16, 3, [8, 13], out_off=0)
    good = case.chunk(7)
    early = case.chunk(15, first=1)
    big = case.chunk(4, big=True)
    err = case.chunk(4)
    recs = [arg(case, good), arg(case, early, nb=1), arg(case, big), arg(case, err)]
    bad = OUT_BASE + case.stride          # token 1's row: its first beat (16-byte aligned)
    assert bad % BB == 0
    q_err = prefill_query_address(case.q_addr[err], 2, case.g, case.d) // BB * BB
    wmem, out = run(case, recs, mb=mb, max_chunk=max_chunk, qt=qt, seed=3, bad_beats={bad},
                    bad_reads={q_err})
    check(case, recs, wmem, out, mb=mb, max_chunk=max_chunk, qt=qt,
          lost=set(range(bad, bad + BB)), write_errors=1, diverge={3})


@pytest.mark.slow
def test_larger_chunk():
    """GQA 3:1, head_dim 32, blocks of 32 keys (the last 20), a 40-token chunk (120 rows in
    query tiles of 16: a token's heads split over two tiles)."""
    mb, max_chunk, qt = 32, 40, 16
    case = Case(61, 32, 3, [32, 32, 32, 20], out_off=0)
    good = case.chunk(40)
    recs = [arg(case, good)]
    wmem, out = run(case, recs, mb=mb, max_chunk=max_chunk, qt=qt, lanes=8, in_lanes=16,
                    seed=2, limit=2_000_000)
    check(case, recs, wmem, out, mb=mb, max_chunk=max_chunk, qt=qt)
    print(f"\ncycles: {out['cycles']}")
