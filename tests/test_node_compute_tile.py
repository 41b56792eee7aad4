# amaranth: UnusedElaboratable=no
"""The node's ATTEND records split between AttendUnit and TileUnit (issue #33; docs/node.md §3):
:class:`mcf.hdl.node.attend_split.AttendSplit` alone (dispatch by mode, one record at a time, the
counters summed, the select), the configurations' tiled-path sizes and ``CAPS.tile_chunk_log2``,
and (slow) the sim configuration's whole :class:`~mcf.hdl.node.compute.NodeCompute` in
amaranth.sim on AXI slaves with random latency: PREFILL_TILE, PREFILL and DECODE records and bad
records of each executor in one run, the bytes written, the staged states and the ``att_*``
counters equal to :func:`mcf.golden.attend_unit.attend_model`'s (``max_chunk`` =
``tile_max_chunk``)."""

from __future__ import annotations

import random
from dataclasses import replace

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
)
from mcf.abi.kv_channel import KVFormat
from mcf.abi.node import CMD
from mcf.abi.node_config import KR260, KR260_ENGINE, SIM, NodeConfig, caps_register
from mcf.golden.attend_unit import attend_model
from mcf.golden.attention import random_blocks, random_query
from mcf.hdl.compute.array_engine import ArrayEngine
from mcf.hdl.compute.tile_prefill import TilePrefill
from mcf.hdl.node.attend_split import AttendSplit
from mcf.hdl.node.compute import NodeCompute
from mcf.hdl.node.tile_unit import TileUnit
from mcf.sim.amsim import run_records, send

KV_BASE, Q_BASE, LIST_BASE, OUT_BASE, MEM = 0x1000, 0x6000, 0x9000, 0xA000, 0x10000


def _rec(mode: int, heads: int = 2, softmax: AttendSoftmax = AttendSoftmax.SINGLE) -> int:
    return CMD.const({"arg": AttendArg(0, 1, mode, heads, softmax).pack()}).as_bits()


# --- configuration ----------------------------------------------------------------------------

def test_tile_sizes_and_caps():
    """sim and kr260 have the tiled path (CAPS names its chunk: 32 and 256 tokens), a node
    without it has field 0; the sizes its parts refuse are refused when the configuration is
    made."""
    def field(cfg):
        return caps_register().unpack(cfg.caps())["tile_chunk_log2"]
    assert SIM.tiled and 1 << field(SIM) == SIM.tile_max_chunk == 32
    assert KR260.tiled and 1 << field(KR260) == KR260.tile_max_chunk == 256
    assert not KR260_ENGINE.tiled and field(KR260_ENGINE) == 0
    for bad in ({"tile_max_chunk": 24}, {"tile_max_chunk": 0}, {"tile_lanes": 6},
                {"tile_keys": 3}, {"kv_format": KVFormat.PER_CHANNEL_K}):
        with pytest.raises(ValueError):
            replace(SIM, **bad)
    with pytest.raises(ValueError):
        NodeConfig(name="x", top="x", tile_max_chunk=16)          # a chunk without the path


# --- the split alone --------------------------------------------------------------------------

def test_split_dispatch_one_at_a_time():
    """Records go to the executor of their mode (mode 3 to AttendUnit), the next only after
    ``done``; ``tiled`` follows the record taken; the counters are summed."""
    dut = AttendSplit()
    recs = [AttendMode.PREFILL_TILE.value, AttendMode.DECODE.value, AttendMode.PREFILL.value,
            3, AttendMode.PREFILL_TILE.value, AttendMode.PREFILL_TILE.value]
    seen: list[tuple[str, int, int]] = []
    rng = random.Random(5)

    async def executors(ctx):
        """Each executor ready while idle, busy 1..5 cycles per record, then ``done`` (and
        ready again in that cycle, as the real units are)."""
        ctx.set(dut.attend.ready, 1)
        ctx.set(dut.tile.ready, 1)
        while len(seen) < len(recs):
            *_, av, tv, ap, tp, d = await ctx.tick().sample(
                dut.attend.valid, dut.tile.valid, dut.attend.payload, dut.tile.payload, dut.done)
            ctx.set(dut.attend_done, 0)
            ctx.set(dut.tile_done, 0)
            assert not (av and tv)
            if av or tv:
                name, p = ("tile", tp) if tv else ("attend", ap)
                seen.append((name, int(AttendArg.unpack(int(p.arg)).mode), int(d)))
                ctx.set(dut.attend.ready, 0)
                ctx.set(dut.tile.ready, 0)
                for _ in range(rng.randrange(1, 6)):
                    assert not ctx.get(dut.rec.ready)            # one record at a time
                    assert ctx.get(dut.tiled) == (name == "tile")
                    await ctx.tick()
                ctx.set(dut.attend_done if name == "attend" else dut.tile_done, 1)
                ctx.set(dut.attend.ready, 1)
                ctx.set(dut.tile.ready, 1)

    async def host(ctx):
        ctx.set(dut.attend_status.records, 7)
        ctx.set(dut.tile_status.records, 5)
        ctx.set(dut.tile_status.bad_list, 2)
        await send(ctx, dut.rec, [_rec(md) for md in recs], rng=random.Random(1), idle=0.3)
        await ctx.tick()
        st = ctx.get(dut.status)
        assert {n: int(st[n]) for n, _ in ATTEND_STATUS} == {
            "records": 12, "blocks": 0, "bad_record": 0, "bad_list": 2, "write_errors": 0}

    async def done_watch(ctx):
        async for _, _, ad, td, d in ctx.tick().sample(dut.attend_done, dut.tile_done,
                                                       dut.done):
            assert d == (ad | td)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(executors)
    sim.add_testbench(host)
    sim.add_testbench(done_watch, background=True)
    sim.run_until(1e-8 * 400)
    assert [(n, md) for n, md, _ in seen] == [
        ("tile" if md == AttendMode.PREFILL_TILE.value else "attend", md) for md in recs]
    assert any(d for *_, d in seen[1:])          # a record taken in the previous one's done cycle


# --- the whole NodeCompute (slow) -------------------------------------------------------------

class Layout:
    """Three KV blocks (32, 32, 12 keys, positions 0..75) and the lists of every record."""

    def __init__(self, cfg: NodeConfig, seed: int):
        self.cfg, self.d, self.g = cfg, cfg.attn_head_dim, cfg.attn_heads
        self.rng = np.random.default_rng(seed)
        self.mem = Mem(MEM)
        self.blocks = random_blocks(self.rng, [32, 32, 12], self.d)
        self.ents, at = [], KV_BASE
        for blk in self.blocks:
            ent, n = place_block(self.mem, at, blk)
            self.ents.append(ent)
            at += -(-n // 64) * 64
        assert at <= Q_BASE
        self.keys = 76
        self.q_at, self.out_at, self.lists = Q_BASE, OUT_BASE, 0

    def record(self, mode, tokens=1, *, pos=None, softmax=AttendSoftmax.SINGLE, nb=3,
               bad_pos=None, big=False):
        """Query slots (``tokens`` of them from ``pos``, default ending at the last key), an
        output region and a list; the record's arg."""
        g, d = self.g, self.d
        q, sq = random_query(self.rng, tokens * g, d, sigma=1.5)
        p0 = self.keys - tokens if pos is None else pos
        q_addr = self.q_at
        for i in range(tokens):
            end = place_slot(self.mem, q_addr, i, g, q[i * g:(i + 1) * g],
                             sq[i * g:(i + 1) * g], p0 + i + (i == bad_pos))
            self.q_at = -(-(end + 16) // 64) * 64
        stride = prefill_out_bytes(g, d) + 16
        out = self.out_at
        self.out_at += -(-(tokens * stride) // 256) * 256
        ents = self.ents[:nb]
        if big:
            ents = ents[:-1] + [AttendBlock(ents[-1].addr, self.cfg.attn_block + 1,
                                            ents[-1].pos0)]
        place_list(self.mem, LIST_BASE + 16 * self.lists,
                   AttendHeader(q_addr, out, tokens, stride), ents)
        arg = AttendArg(self.lists, nb, getattr(mode, "value", mode), g, softmax).pack()
        self.lists += 1 + nb
        assert LIST_BASE + 16 * self.lists <= OUT_BASE and self.q_at <= LIST_BASE
        return arg


def _run_node(cfg, lay, args, *, seed):
    dut = NodeCompute(cfg)
    rng = random.Random(seed)
    wmem: dict[int, int] = {}
    staged: list[bytes] = []
    out: dict = {}
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    for s in memory_slaves(lay.mem, rng, dut.m_axi_att_rd, dut.m_axi_kvr, dut.m_axi_att_wr,
                           wmem, []):
        sim.add_testbench(s, background=True)

    async def sink(ctx):
        cur = b""
        async for _, _, v, r, p in ctx.tick().sample(dut.staged_attn.valid,
                                                      dut.staged_attn.ready,
                                                      dut.staged_attn.payload):
            ctx.set(dut.staged_attn.ready, int(rng.random() < 0.7))
            if v and r:
                cur += int(p.data).to_bytes(8, "little")
                if p.last:
                    staged.append(cur)
                    cur = b""

    async def host(ctx):
        ctx.set(dut.att_list_base, LIST_BASE)
        out["cycles"] = await run_records(ctx, dut.attend, dut.attend_done, args, 30_000)
        assert out["cycles"][-1] < 30_000, f"record {len(out['cycles']) - 1} never done"
        await ctx.tick().repeat(20)
        st = ctx.get(dut.att_status)
        out["status"] = {n: int(st[n]) for n, _ in ATTEND_STATUS}
        out["kvr_rejects"] = int(ctx.get(dut.kvr_status).rejects)

    sim.add_testbench(sink, background=True)
    sim.add_testbench(host)
    sim.run()
    return wmem, staged, out, dut


SHARE = replace(SIM, name="share", attn_head_dim=128, attn_lanes=8, attn_block=128, tile_keys=4,
                tile_lanes=16, tile_on_gemm=True)
"""The sim configuration at head_dim 128 (= the GEMM's group, and the P·V group of 128-key
blocks), its tiled path's S and P·V on
the GEMM's one 16 × 16 array (``tile_on_gemm``): the kr260's kind of key tile (4 keys × 16
channels per cycle, 32-key tiles, 16-key dot products) on the sim's GEMM."""


ARRAYS = replace(SHARE, name="arrays", attn_on_arrays=True)
"""``SHARE`` with DECODE and PREFILL on the GEMM's array too: ArrayEngine on the tiled path's
chain (in today's ``w``; the chunks' rows in P8)."""


def test_tile_on_gemm_config():
    """``tile_on_gemm`` builds TilePrefill on ArrayAttention without arrays of its own, its S
    and P·V ports the matrix engine's share clients 1 and 2; the sizes it cannot share are
    refused when the configuration is made."""
    dut = NodeCompute(SHARE)
    att = dut.prefill.att
    assert att.share is None and att.score.bank is None and att.pv.bank is None
    assert dut.matrix.clients == 2 and dut.matrix.gemm.share.clients == 3
    assert dut.matrix.gemm.engine.shared and not dut.matrix.gemm.engine.arrays
    assert not NodeCompute(SIM).prefill.arrays and not NodeCompute(SIM).matrix.clients
    arr = NodeCompute(ARRAYS)                     # the engine's jobs on the prefill's chain
    assert arr.engine is None and isinstance(arr.prefill.engine, ArrayEngine)
    assert not arr.prefill.engine.inner and arr.prefill.att.pv.limbs == 3
    assert arr.matrix.clients == 2 and arr.matrix.gemm.share.clients == 3
    with pytest.raises(ValueError):
        replace(SIM, attn_on_arrays=True)                       # not without tile_on_gemm
    for bad in ({"attn_head_dim": 64}, {"tile_lanes": 8}, {"gemm_rows": 8, "tile_keys": 16},
                {"attn_block": 64},
                {"tile_keys": 0, "tile_max_chunk": 0}):
        with pytest.raises(ValueError):
            replace(SHARE, **bad)


@pytest.mark.slow
@pytest.mark.parametrize("cfg", [SIM, SHARE, ARRAYS], ids=lambda c: c.name)
def test_node_compute_attend_records(cfg):
    """The sim configuration's NodeCompute (and ``SHARE``'s: its S and P·V on the GEMM's
    array): a 12-token PREFILL_TILE chunk (24 rows over three
    blocks, the last partial), a PREFILL and a DECODE record, bad records of both executors
    (PREFILL_TILE with softmax MAX, a slot with a wrong ``pos``; the undefined mode 3, a DECODE
    block above ``attn_block``), then a 5-token chunk over two blocks: the rows and ``o/l``
    written, the staged states and the ``att_*`` counters are the golden model's."""
    lay = Layout(cfg, 33)
    T = AttendMode.PREFILL_TILE
    args = [lay.record(T, 12), lay.record(AttendMode.PREFILL, pos=70),
            lay.record(AttendMode.DECODE, pos=76), lay.record(T, 4, softmax=AttendSoftmax.MAX),
            lay.record(T, 6, bad_pos=2), lay.record(3), lay.record(AttendMode.DECODE, big=True),
            lay.record(T, 5, pos=59, nb=2)]
    wmem, staged, out, dut = _run_node(cfg, lay, args, seed=4)
    assert isinstance(dut.tiler, TileUnit) and isinstance(dut.prefill, TilePrefill)
    assert dut.tiler.max_chunk == cfg.tile_max_chunk and dut.prefill.keys == cfg.tile_keys

    want = {n: 0 for n, _ in ATTEND_STATUS}
    golden, payloads = {}, []
    for a in args:
        res = attend_model(a, LIST_BASE, lay.mem.read, cfg.attn_head_dim, cfg.attn_heads,
                           cfg.attn_block, cfg.attn_max_list, max_chunk=cfg.tile_max_chunk,
                           kv_format=cfg.kv_format)
        if res.bad:
            want[res.bad] += 1
            continue
        want["records"] += 1
        want["blocks"] += res.blocks
        payloads += res.payloads
        for addr, raw in res.writes:
            golden.update({addr + i: v for i, v in enumerate(raw)})
    assert want["records"] == 4 and want["bad_record"] == 2 and want["bad_list"] == 2
    assert sorted(wmem) == sorted(golden), "bytes written outside the golden rows (or missing)"
    assert all(wmem[a] == v for a, v in golden.items()), "a row differs from the golden model"
    assert staged == payloads and len(payloads) == cfg.attn_heads
    assert out["status"] == want and out["kvr_rejects"] == 0
    print(f"\ncycles per record: {out['cycles']}")
