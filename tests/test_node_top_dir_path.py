"""The node top's directory-op path (``hdl/node/top.py``, :func:`~mcf.hdl.node.top.dir_op_path`,
docs/depth.md): the sequencer's DIR ops (behind a ready slice, ``dir_slice``) and the local
sink's DRAINs (behind ``drain_slice``) meet in the op arbiter, whose output reaches
``Directory.op`` through a full slice (``dirop_slice``); the directory alternates ops with land
events (and land events with the reads of a port whose ``kv_id`` changed; ops never wait for
those). amaranth.sim of that path built by the top's own function: every sequencer op is
accepted by the directory at most ``DIR_OP_DELAY`` cycles after its transfer, the bound the
sequencers' ``dir_settle`` (``DIR_SETTLE``) is derived from, and the bound is reached."""

from __future__ import annotations

import random

import pytest
from amaranth import Module
from amaranth.lib import stream
from amaranth.sim import Simulator

from mcf.abi.directory import DIR_OP, LAND_EVENT, DirOp
from mcf.hdl.node.arbiter import PacketArbiter
from mcf.hdl.node.directory import Directory
from mcf.hdl.node.top import (
    DIR_OP_DELAY,
    DIR_SETTLE,
    _drain,
    _feed,
    _one_beat,
    dir_op_path,
)

KV_COUNT = 16


def _dir_path():
    """The top's wiring of ``Directory.land`` / ``Directory.op`` (``NodeTop.elaborate``)."""
    m = Module()
    seq = stream.Signature(DIR_OP).create()          # the COMPUTE sequencer's ``dir``
    drain = stream.Signature(DIR_OP).create()        # ``LocalSink.dir_op``
    land = stream.Signature(LAND_EVENT).create()     # ``LandingEngine.landed``
    m.submodules.dirx = dirx = Directory(KV_COUNT, n_read=2)
    m.submodules.arb_land = arb_land = PacketArbiter(2, _one_beat(LAND_EVENT))
    m.d.comb += arb_land.i1.valid.eq(0)
    _feed(m, land, arb_land.i0)
    _drain(m, arb_land.o, dirx.land)
    dir_op_path(m, seq, drain, dirx.op)
    return m, seq, drain, land, dirx


@pytest.mark.parametrize("p_land,p_read", [(1.0, 1.0), (0.6, 0.3), (1.0, 0.0)])
def test_sequencer_ops_reach_the_directory_within_dir_op_delay(p_land, p_read):
    m, seq, drain, land, dirx = _dir_path()
    rng = random.Random(35)
    delays: list[int] = []

    async def bench(ctx):
        while not ctx.get(dirx.ready):
            await ctx.tick()
        sent: list[int] = []                          # transfer cycles of FREEs in flight
        for cycle in range(1600):
            for src, p, op in ((seq, 0.3, DirOp.FREE), (drain, 0.3, DirOp.DRAIN)):
                if not ctx.get(src.valid) and rng.random() < p:
                    ctx.set(src.valid, 1)
                    ctx.set(src.payload, {"kv_id": rng.randrange(KV_COUNT), "op": op,
                                          "count": 0})
            if not ctx.get(land.valid) and rng.random() < p_land:
                ctx.set(land.valid, 1)
                ctx.set(land.payload, {"kv_id": rng.randrange(KV_COUNT), "owner": 0})
            if rng.random() < p_read:                   # the read ports' kv_id changes
                ctx.set(dirx.read0.kv_id, (cycle % 2) + 2 * (cycle % 3 == 0))
                ctx.set(dirx.read1.kv_id, cycle % KV_COUNT)
            if ctx.get(seq.valid) and ctx.get(seq.ready):
                sent.append(cycle)
            if (ctx.get(dirx.op.valid) and ctx.get(dirx.op.ready)
                    and ctx.get(dirx.op.payload.op) == DirOp.FREE):
                delays.append(cycle - sent.pop(0))
            taken = [(src, ctx.get(src.valid) and ctx.get(src.ready))
                     for src in (seq, drain, land)]
            await ctx.tick()
            for src, t in taken:
                if t:
                    ctx.set(src.valid, 0)

    sim = Simulator(m)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert len(delays) > 100
    assert max(delays) <= DIR_OP_DELAY
    print("directory op path: the longest delay", max(delays), "of", DIR_OP_DELAY)
    if p_land == 1.0:                                # a land event every cycle: the worst case
        assert max(delays) == DIR_OP_DELAY
    assert DIR_SETTLE >= 1 + DIR_OP_DELAY
