"""amaranth.sim pieces of the landing units' tests (tests/test_node_landing.py,
tests/test_node_decode_land.py, tests/test_node_send.py, tests/test_node_directory.py): the
LAND_OFF table written, parsed packets' beats fed to an input, a run of a unit that lands them
through an AXI write bus (:func:`mcf.sim.axi_slave.write_slave`), ended once the input and the
bus have been quiet for a while after the last beat, the status counters read, and the KV
directory's entries read back."""

from __future__ import annotations

from amaranth.sim import Simulator

from mcf.abi.directory import DirEntry, DirState
from mcf.abi.landing import land_off_entry
from mcf.sim.amsim import parsed_beats
from mcf.sim.axi_slave import write_slave


async def write_land_off(ctx, dut, land_off) -> None:
    """The LAND_OFF table through ``dut``'s ``land_off_we``/``_seq``/``_data`` port: entry
    ``seq`` = ``land_off[seq]`` (an offset or None), one a cycle."""
    for seq, off in enumerate(land_off):
        ctx.set(dut.land_off_we, 1)
        ctx.set(dut.land_off_seq, seq)
        ctx.set(dut.land_off_data.as_value(), land_off_entry(off))
        await ctx.tick()
    ctx.set(dut.land_off_we, 0)


def dir_entry(ctx, port) -> DirEntry:
    """The entry a :class:`~mcf.hdl.node.directory.Directory` read port shows now."""
    return DirEntry(DirState(ctx.get(port.state)), ctx.get(port.landed))


async def read_directory(ctx, port, n: int) -> dict[int, DirEntry]:
    """Entries ``0 .. n-1`` through a Directory read port (``kv_id`` set, the entry read after
    the next edge at which the port is ``fresh``: one a cycle while no event arrives)."""
    entries = {}
    for kv in range(n):
        ctx.set(port.kv_id, kv)
        for _ in range(64):
            await ctx.tick()
            if ctx.get(port.fresh):
                break
        assert ctx.get(port.fresh), f"directory read of kv_id {kv} never fresh"
        entries[kv] = dir_entry(ctx, port)
    return entries


async def feed_packets(ctx, port, packets, rng, idle: float) -> int:
    """The ``(meta, payload)`` ``packets``' parsed beats onto ``port``, each held until taken,
    an idle cycle before a beat with probability ``idle`` (again and again); returns the cycles
    a beat waited for ``ready``."""
    stalls = 0
    for meta, payload in packets:
        for beat in parsed_beats(meta, payload):
            while rng.random() < idle:
                await ctx.tick()
            ctx.set(port.valid, 1)
            ctx.set(port.payload.as_value(), beat)
            while True:
                _, _, ready = await ctx.tick().sample(port.ready)
                if ready:
                    break
                stalls += 1
            ctx.set(port.valid, 0)
    return stalls


def run_drained(dut, bus, producer, finished: list, out: dict, layout, *, rng, mem: dict,
                aws: list, bad_beats, wpause, b_latency, quiet: int, limit: int, also=(),
                background=()) -> None:
    """Simulate ``dut`` with the testbench ``producer`` (it sets ``finished[0]`` after its last
    beat), a ``write_slave`` on ``bus`` (``mem``, ``aws``, ``bad_beats``, ``wpause``,
    ``b_latency``, ``rng``) and the ``background`` testbenches, until, once ``finished[0]``,
    none of ``dut.i.valid``, the bus's AW/W/B ``valid`` and the signals ``also`` has been high
    for ``quiet`` cycles in a row (asserting fewer than ``limit`` cycles in all). Then
    ``out["status"]`` = ``dut.status`` by the fields of ``layout``, ``out["cycles"]`` = the
    cycles run and ``out["quiet"]`` = the quiet tail among them."""
    async def checker(ctx):
        cycles = 0
        idle_for = 0
        watch = (dut.i.valid, bus.awvalid, bus.wvalid, bus.bvalid, *also)
        while idle_for < quiet:
            await ctx.tick()
            cycles += 1
            busy = any(ctx.get(s) for s in watch)
            idle_for = idle_for + 1 if finished[0] and not busy else 0
            assert cycles < limit, "hang"
        raw = ctx.get(dut.status.as_value())
        out["status"] = {n: (raw >> f.offset) & ((1 << f.width) - 1) for n, f in layout}
        out["cycles"], out["quiet"] = cycles, idle_for

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(producer, background=True)
    sim.add_testbench(write_slave(bus, rng, mem, aws, bad_beats, wpause, b_latency),
                      background=True)
    for tb in background:
        sim.add_testbench(tb, background=True)
    sim.add_testbench(checker)
    sim.run()
