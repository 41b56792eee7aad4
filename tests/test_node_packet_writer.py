"""Packet writer of the node's landers (mcf.hdl.node.packet_writer.PacketWriter, docs/node.md §5):
amaranth.sim unit tests with the in-test AXI write slave (:func:`mcf.sim.axi_slave.write_slave`)
— the bytes of every packet at its address, one completion per packet in head order with its
tag and the error flag of its bursts, completions held by a consumer that is not ready, 4 KiB
page and maximum-burst splits, and the latency its docstring states."""

from __future__ import annotations

import random

import pytest
from amaranth import unsigned
from amaranth.sim import Simulator

from mcf.abi.framing import MAX_PAYLOAD
from mcf.hdl.mem.axi import BOUNDARY_BYTES
from mcf.hdl.node.packet_writer import LandingStage, PacketWriter
from mcf.sim.axi_slave import write_slave

TAG = unsigned(8)


async def _taken(ctx, port) -> None:
    """Waits for the edge at which ``port`` (valid held high) is taken."""
    while True:
        _, _, ready = await ctx.tick().sample(port.ready)
        if ready:
            return


def _words(payload: bytes, width: int) -> list[int]:
    """A packet's payload as the writer takes it: ``width``-bit words from lane 0."""
    wb = width // 8
    return [int.from_bytes(payload[k:k + wb].ljust(wb, b"\0"), "little")
            for k in range(0, len(payload), wb)]


def _packets(rng: random.Random, n: int, width: int):
    """``n`` packets ``(addr, payload)`` in disjoint regions above 4 GiB (a gap of at least
    one bus word between two), byte-aligned anywhere, a third of them placed across a 4 KiB
    page boundary."""
    wb = width // 8
    out = []
    at = 0x1_0000_0000 + rng.randrange(BOUNDARY_BYTES)
    for _ in range(n):
        length = rng.choice([1, 7, 16, 17, MAX_PAYLOAD, rng.randrange(1, MAX_PAYLOAD + 1)])
        if rng.random() < 1 / 3:        # straddle the next page boundary
            page = (at // BOUNDARY_BYTES + 1) * BOUNDARY_BYTES
            at = max(at, page - rng.randrange(1, length + 1)) if length > 1 else at
        out.append((at, bytes(rng.randrange(256) for _ in range(length))))
        at += length + wb + rng.randrange(3 * wb)
        at += -at % wb + rng.randrange(wb)
    return out


def simulate(packets, *, width=128, seed=1, idle=0.0, wpause=0.0, done_stall=0.0,
             bad=frozenset(), b_latency=(1, 6)):
    """Write ``packets`` through a :class:`PacketWriter` (heads and words from two testbenches
    with idle cycles, probability ``idle``); the packets of the indices ``bad`` answer
    SLVERR on their first burst. Returns the memory, the AW list and the completions
    ``(tag, err, b)`` taken (``done.ready`` low with probability ``done_stall``; ``b``: the B
    handshakes up to and including the completion's cycle)."""
    dut = PacketWriter(TAG, axi_width=width)
    rng = random.Random(seed)
    mem: dict[int, int] = {}
    aws: list[tuple[int, int]] = []
    done: list[tuple[int, int, int]] = []
    wb = width // 8
    bad_beats = {packets[k][0] - packets[k][0] % wb for k in bad}

    async def heads(ctx):
        hrng = random.Random(seed + 1)
        for k, (addr, payload) in enumerate(packets):
            while hrng.random() < idle:
                await ctx.tick()
            ctx.set(dut.head.valid, 1)
            ctx.set(dut.head.payload.addr, addr)
            ctx.set(dut.head.payload.length, len(payload))
            ctx.set(dut.head.payload.tag, k)
            await _taken(ctx, dut.head)
            ctx.set(dut.head.valid, 0)

    async def words(ctx):
        wrng = random.Random(seed + 2)
        for _, payload in packets:
            for w in _words(payload, width):
                while wrng.random() < idle:
                    await ctx.tick()
                ctx.set(dut.i.valid, 1)
                ctx.set(dut.i.payload, w)
                await _taken(ctx, dut.i)
                ctx.set(dut.i.valid, 0)

    async def sink(ctx):
        drng = random.Random(seed + 3)
        cycles = bs = 0
        while len(done) < len(packets):
            ctx.set(dut.done.ready, int(drng.random() >= done_stall))
            _, _, valid, ready, tag, err, bv, br = await ctx.tick().sample(
                dut.done.valid, dut.done.ready, dut.done.payload.tag, dut.done.payload.err,
                dut.bus.bvalid, dut.bus.bready)
            bs += bv and br
            if valid and ready:
                done.append((tag, err, bs))
            cycles += 1
            assert cycles < 100_000, "hang"
        for _ in range(50):             # nothing more comes
            _, _, valid, awv, wv, bv = await ctx.tick().sample(
                dut.done.valid, dut.bus.awvalid, dut.bus.wvalid, dut.bus.bvalid)
            assert not (valid or awv or wv or bv)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(heads, background=True)
    sim.add_testbench(words, background=True)
    sim.add_testbench(write_slave(dut.bus, rng, mem, aws, bad_beats, wpause, b_latency,
                                  beat_bytes=wb), background=True)
    sim.add_testbench(sink)
    sim.run()
    return mem, aws, done


def _check(packets, mem, aws, done, width, bad=frozenset()):
    """Every packet's bytes landed at its address (a bad packet's first burst did not land),
    nothing outside the packets was written, completions in order with the right flags, each
    on the B response of the packet's last burst, and every burst within a 4 KiB page."""
    wb = width // 8
    b_last = 0
    want = []
    for k, (addr, payload) in enumerate(packets):
        b_last += sum(addr - addr % wb <= a < addr + len(payload) for a, _ in aws)
        want.append((k, int(k in bad), b_last))
    assert done == want
    allowed = set()
    for k, (addr, payload) in enumerate(packets):
        span = range(addr, addr + len(payload))
        allowed.update(span)
        if k not in bad:
            assert bytes(mem.get(a, -1) for a in span) == payload, k
    assert set(mem) <= allowed
    for a, beats in aws:
        assert a % wb == 0
        assert a // BOUNDARY_BYTES == (a + beats * wb - 1) // BOUNDARY_BYTES


@pytest.mark.parametrize("seed,idle,wpause,done_stall", [(1, 0.0, 0.0, 0.0),
                                                         (2, 0.3, 0.3, 0.5)])
def test_packets_land_and_complete_in_order(seed, idle, wpause, done_stall):
    """Random packets (1..MAX_PAYLOAD bytes, unaligned, some across a page) land bit-exact,
    one completion each in head order; a consumer that is not ready holds them all; two
    packets' first bursts answer SLVERR and only theirs carry ``err``."""
    rng = random.Random(seed)
    packets = _packets(rng, 24, 128)
    bad = frozenset({3, 17})
    mem, aws, done = simulate(packets, seed=seed, idle=idle, wpause=wpause,
                              done_stall=done_stall, bad=bad)
    _check(packets, mem, aws, done, 128, bad)
    assert len(aws) > len(packets)      # some packets were two bursts (a page crossed)


def test_narrow_writer_splits_at_the_maximum_burst():
    """A 64-bit writer: a ``MAX_PAYLOAD`` packet not aligned to the word is 257 beats, two
    bursts without a page boundary; its completion still comes once, after both."""
    width = 64
    packets = [(0x2000 + 3, bytes(range(256)) * (MAX_PAYLOAD // 256)),
               (0x2000 + MAX_PAYLOAD + 64, bytes([0x5A]) * 9)]
    mem, aws, done = simulate(packets, width=width, seed=5)
    _check(packets, mem, aws, done, width)
    assert aws == [(0x2000, 256), (0x2000 + 256 * 8, 1), (0x2000 + MAX_PAYLOAD + 64, 2)]


def test_latency():
    """As documented: the first AW valid 5 cycles after the head handshake (words already
    waiting), its first W beat 2 cycles after that, ``done.valid`` in the cycle of the last
    B response (slave always ready, B one cycle after ``wlast``)."""
    dut = PacketWriter(TAG)
    t: dict[str, int] = {}

    async def bench(ctx):
        ctx.set(dut.done.ready, 1)
        for w in _words(bytes(range(40)), 128):     # 3 words into the FIFO first
            ctx.set(dut.i.valid, 1)
            ctx.set(dut.i.payload, w)
            await ctx.tick()
        ctx.set(dut.i.valid, 0)
        ctx.set(dut.head.valid, 1)
        ctx.set(dut.head.payload.addr, 0x1000)
        ctx.set(dut.head.payload.length, 40)
        ctx.set(dut.head.payload.tag, 0xA5)
        ctx.set(dut.bus.awready, 1)
        ctx.set(dut.bus.wready, 1)
        cycle = 0
        bdue = None
        while "done" not in t:
            if cycle == bdue:
                ctx.set(dut.bus.bvalid, 1)
                t["b"] = cycle
            got = {n: ctx.get(s) for n, s in (("head", dut.head.ready), ("aw", dut.bus.awvalid),
                                              ("w", dut.bus.wvalid), ("done", dut.done.valid))}
            for n, v in got.items():
                if v and n not in t:
                    t[n] = cycle
            if got["done"]:
                assert ctx.get(dut.done.payload.tag) == 0xA5
                assert ctx.get(dut.done.payload.err) == 0
            if ctx.get(dut.bus.wvalid) and ctx.get(dut.bus.wlast):
                bdue = cycle + 1
            await ctx.tick()
            ctx.set(dut.head.valid, 0)
            ctx.set(dut.bus.bvalid, 0)
            cycle += 1
            assert cycle < 100

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert t["head"] == 0
    assert t["aw"] - t["head"] == 5
    assert t["w"] - t["aw"] == 2
    assert t["done"] == t["b"]


def _stage_expect(packets):
    """What :class:`LandingStage` sends on for ``packets`` (``(keep, length, info, beats)``):
    a kept packet's first ``ceil(length / 8)`` beats, zero beats where its input ended early,
    each with its ``length``; and how many kept packets' framing disagreed with it."""
    out, errors = [], 0
    for keep, length, info, beats in packets:
        if not keep:
            continue
        n = (length + 7) // 8
        errors += len(beats) != n
        data = (beats + [0] * n)[:n]
        out += [(d, int(k == 0), int(k == n - 1), length, info) for k, d in enumerate(data)]
    return out, errors


@pytest.mark.parametrize("seed,idle,stall", [(1, 0.0, 0.0), (2, 0.3, 0.4)])
def test_landing_stage(seed, idle, stall):
    """Random packets, kept or dropped, framed right, short (zero-padded) or long (cut): the
    kept ones' beats leave bit-exact with ``first``, ``final`` and the first beat's ``info``
    (a later beat's ``keep`` and ``info`` are ignored), framing errors counted once a packet;
    at full rate in and out no cycle is lost."""
    rng = random.Random(seed)
    packets = []
    for _ in range(60):
        length = rng.randrange(1, 200)
        n = (length + 7) // 8
        beats = [rng.getrandbits(64) for _ in range(max(1, n + rng.choice([0, 0, 0, -2, 1])))]
        packets.append((int(rng.random() < 0.7), length, rng.getrandbits(8), beats))
    dut = LandingStage(TAG)
    got: list[tuple[int, int, int, int, int]] = []
    errors = [0]
    want, want_err = _stage_expect(packets)
    cycles = [0]

    async def source(ctx):
        srng = random.Random(seed + 1)
        for keep, length, info, beats in packets:
            for k, d in enumerate(beats):
                while srng.random() < idle:
                    ctx.set(dut.i.valid, 0)
                    await ctx.tick()
                ctx.set(dut.i.valid, 1)
                ctx.set(dut.i.payload.data, d)
                ctx.set(dut.i.payload.first, int(k == 0))
                ctx.set(dut.i.payload.last, int(k == len(beats) - 1))
                ctx.set(dut.i.payload.length, length)
                ctx.set(dut.i.payload.keep, keep if k == 0 else srng.randrange(2))
                ctx.set(dut.i.payload.info, info if k == 0 else srng.getrandbits(8))
                await _taken(ctx, dut.i)
        ctx.set(dut.i.valid, 0)

    async def sink(ctx):
        krng = random.Random(seed + 2)
        while len(got) < len(want):
            ctx.set(dut.o.ready, int(krng.random() >= stall))
            _, _, v, r, d, f, fin, n, info, err = await ctx.tick().sample(
                dut.o.valid, dut.o.ready, dut.o.payload.data, dut.o.payload.first,
                dut.o.payload.final, dut.o.payload.length, dut.o.payload.info,
                dut.framing_error)
            cycles[0] += 1
            errors[0] += err
            if v and r:
                got.append((d, f, fin, n, info))
            assert cycles[0] < 20_000, "hang"
        for _ in range(20):
            _, _, v, err = await ctx.tick().sample(dut.o.valid, dut.framing_error)
            errors[0] += err
            assert not v

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(source, background=True)
    sim.add_testbench(sink)
    sim.run()
    assert got == want
    assert errors[0] == want_err > 0
    if idle == stall == 0:
        # one cycle per input beat and per padding beat, one of latency
        pads = sum(max(0, (length + 7) // 8 - len(b)) for keep, length, _, b in packets if keep)
        assert cycles[0] <= sum(len(b) for *_, b in packets) + pads + 1
