"""KV-address block (mcf.hdl.node.kv_address.KvAddress, docs/node.md §5): amaranth.sim unit
tests against the golden rule :func:`mcf.abi.landing.kv_address` — the ``LAND_OFF`` table, the
address ``KV_BASE + kv_id · KV_SLOT + LAND_OFF[seq].offset`` cut to 40 bits, the ``fits``
check, latency 1 and the hold between lookups."""

from __future__ import annotations

import random

import pytest
from amaranth.sim import Simulator
from landing_sim import write_land_off

from mcf.abi.landing import (
    KV_ALIGN,
    KV_BASE_BITS,
    KV_SLOT_BITS,
    LAND_OFF_BITS,
    LAND_OFF_ENTRIES,
    LandingConfig,
    kv_address,
)
from mcf.abi.meta import META
from mcf.hdl.node.kv_address import KvAddress


def _expect(cfg: LandingConfig, land_off, kv_id: int, seq: int, length: int) -> dict:
    """What ``entry``, ``addr`` and ``fits`` should show for one lookup (the golden rule; the
    hardware computes the address whatever ``KV_COUNT`` says)."""
    off = land_off[seq]
    full = LandingConfig(cfg.kv_base, cfg.kv_slot, kv_id + 1)
    addr = kv_address(full, kv_id, seq, [0 if o is None else o for o in land_off])
    return {"valid": off is not None, "offset": off or 0, "addr": addr,
            "fits": off is not None and off + length <= cfg.kv_slot}


def run(cfg: LandingConfig, land_off, lookups, *, seed: int, gap: float):
    """Write ``land_off``, then look up each ``(kv_id, seq, length)`` of ``lookups`` with
    ``take`` high for one cycle and low for a random number of cycles (probability ``gap``
    each); returns, per lookup, what the outputs showed on every cycle from the one after its
    ``take`` up to (including) the cycle of the next ``take``."""
    dut = KvAddress()
    rng = random.Random(seed)
    seen: list[list[dict]] = []

    def outputs(ctx) -> dict:
        return {"valid": ctx.get(dut.entry.valid), "offset": ctx.get(dut.entry.offset),
                "addr": ctx.get(dut.addr), "fits": ctx.get(dut.fits)}

    async def bench(ctx):
        ctx.set(dut.cfg.as_value(), cfg.pack())
        await write_land_off(ctx, dut, land_off)
        for k, (kv_id, seq, length) in enumerate(lookups):
            ctx.set(dut.take, 1)
            ctx.set(dut.kv_id, kv_id)
            ctx.set(dut.seq, seq)
            if k:
                seen[-1].append(outputs(ctx))       # the cycle of the next take
            await ctx.tick()
            ctx.set(dut.take, 0)
            # the inputs are free once taken; length belongs to the lookup from now on
            ctx.set(dut.kv_id, rng.randrange(1 << META["kv_id"].width))
            ctx.set(dut.seq, rng.randrange(LAND_OFF_ENTRIES))
            ctx.set(dut.length, length)
            seen.append([outputs(ctx)])
            while rng.random() < gap:
                await ctx.tick()
                seen[-1].append(outputs(ctx))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return seen


def _table(rng: random.Random, slot: int) -> list[int | None]:
    """A random ``LAND_OFF`` table: a quarter of the entries invalid, offsets (on
    ``KV_ALIGN``) in and beyond the slot."""
    return [None if rng.random() < 0.25 else
            rng.randrange(0, min(2 * slot, 1 << LAND_OFF_BITS), KV_ALIGN)
            for _ in range(LAND_OFF_ENTRIES)]


@pytest.mark.parametrize("seed,gap", [(1, 0.0), (2, 0.5)])
def test_lookups_follow_the_golden_rule(seed, gap):
    """Random lookups — back to back, or with held cycles between them — show the golden
    address, entry and fits check from the cycle after ``take`` until the next ``take``; the
    base near the top of 40 bits makes some sums wrap."""
    rng = random.Random(seed)
    cfg = LandingConfig(kv_base=(1 << KV_BASE_BITS) - 0x12_3458, kv_slot=0x1_0A08,
                        kv_count=1 << META["kv_id"].width)
    land_off = _table(rng, cfg.kv_slot)
    land_off[7] = cfg.kv_slot - 100
    lookups = [(rng.randrange(1 << META["kv_id"].width), rng.randrange(LAND_OFF_ENTRIES),
                rng.randrange(1, 2049)) for _ in range(150)]
    # edges: the last kv_id, a packet that ends exactly at the slot's end and one byte past
    lookups += [(0xFFFF, 7, 1), (3, 7, 100), (3, 7, 101)]
    seen = run(cfg, land_off, lookups, seed=seed, gap=gap)
    assert len(seen) == len(lookups)
    wrapped = 0
    for (kv_id, seq, length), cycles in zip(lookups, seen, strict=True):
        want = _expect(cfg, land_off, kv_id, seq, length)
        wrapped += cfg.kv_base + kv_id * cfg.kv_slot + want["offset"] >= 1 << KV_BASE_BITS
        assert cycles == [want] * len(cycles), (kv_id, seq, length)
    assert wrapped
    assert [c[0]["fits"] for c in seen[-2:]] == [1, 0]
    assert sum(c[0]["fits"] for c in seen) not in (0, len(seen))


def test_table_rewrite_and_config_follow():
    """A rewritten entry is read by the next lookup; ``addr`` and ``fits`` follow ``cfg``
    combinationally (the product ``kv_id · kv_slot`` is the one registered at ``take``)."""
    dut = KvAddress()
    out = {}

    async def bench(ctx):
        cfg = LandingConfig(kv_base=0x8_0000_0000, kv_slot=0x1000, kv_count=16)
        ctx.set(dut.cfg.as_value(), cfg.pack())
        await write_land_off(ctx, dut, [0x10] * 4)
        ctx.set(dut.take, 1)
        ctx.set(dut.kv_id, 5)
        ctx.set(dut.seq, 2)
        await ctx.tick()
        ctx.set(dut.take, 0)
        ctx.set(dut.length, 0x1000 - 0x10)
        out["first"] = (ctx.get(dut.addr), ctx.get(dut.fits))
        ctx.set(dut.cfg.kv_base, 0x9_0000_0000)
        out["base"] = (ctx.get(dut.addr), ctx.get(dut.fits))
        ctx.set(dut.cfg.kv_slot, (1 << KV_SLOT_BITS) - 1)
        out["slot"] = (ctx.get(dut.addr), ctx.get(dut.fits))
        ctx.set(dut.cfg.kv_slot, 0xFFF)
        out["small"] = ctx.get(dut.fits)
        await write_land_off(ctx, dut, [None, None, 0x20])
        ctx.set(dut.take, 1)
        await ctx.tick()
        ctx.set(dut.take, 0)
        out["rewritten"] = (ctx.get(dut.entry.offset), ctx.get(dut.entry.valid),
                            ctx.get(dut.addr))
        ctx.set(dut.seq, 0)
        ctx.set(dut.take, 1)
        await ctx.tick()
        out["invalid"] = (ctx.get(dut.entry.valid), ctx.get(dut.fits))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert out["first"] == (0x8_0000_5010, 1)
    assert out["base"] == (0x9_0000_5010, 1)
    # the product was registered with the old slot: the address does not move
    assert out["slot"] == (0x9_0000_5010, 1)
    assert out["small"] == 0
    # a slot register off KV_ALIGN is taken with its low bits as 0
    assert out["rewritten"] == (0x20, 1, 0x9_0000_0000 + 5 * 0xFFC + 0x20)
    assert out["invalid"] == (0, 0)
