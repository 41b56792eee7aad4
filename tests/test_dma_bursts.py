"""The DMA descriptor walker's burst split (mcf.hdl.mem.dma, issue #35): amaranth.sim runs of
:class:`DmaReader` and :class:`DmaWriter` against bus models with random latency, AR/AW/W stalls,
R idle cycles and stream backpressure, fixed seeds. Every burst's address and length (AR or
AW, in order, none extra) equals the pure-Python split :func:`bursts` (rows cut at 4 KiB
boundaries and at the maximum burst) of random descriptors whose rows start on, just before
and just after 4 KiB boundaries, cross pages, end exactly on them, with any stride and count;
the data read or written equal the memory's bytes; and the receive FIFO's room rule (a burst
issues only when ``beats in flight + FIFO level + n + 1 <= fifo_depth``) at its exact edge.
Widths: 128-bit beats (a page = a maximum burst), a 256-deep FIFO (bursts of at most 255
beats, less than a page) and 32-bit beats (a page = four maximum bursts)."""

from __future__ import annotations

import collections
import random

import pytest
from amaranth.sim import Simulator

from mcf.abi.compute import DMA_READ_STATUS, DMA_WRITE_STATUS, DmaDesc
from mcf.hdl.mem.axi import BOUNDARY_BYTES, MAX_BURST_BEATS
from mcf.hdl.mem.dma import DmaReader, DmaWriter
from mcf.sim.perf.decode import DdrPort, packer

MEM = 1 << 16


def accepted(d: DmaDesc, align: int = 1) -> bool:
    """A descriptor the engine takes: something to move, its rows on ``align`` bytes."""
    return bool(d.length and d.count and d.addr % align == 0 and d.stride % align == 0)


def bursts(d: DmaDesc, bb: int, max_beats: int, align: int = 1) -> list[tuple[int, int]]:
    """The ``(address, beats)`` bursts of descriptor ``d`` on a bus of ``bb``-byte beats: each
    row's beats from its beat-aligned start, cut at every 4 KiB boundary and after
    ``max_beats``; none for a rejected descriptor."""
    out = []
    if not accepted(d, align):
        return out
    for r in range(d.count):
        a = d.addr + r * d.stride
        addr = a - a % bb
        left = (a % bb + d.length + bb - 1) // bb
        while left:
            n = min(left, (BOUNDARY_BYTES - addr % BOUNDARY_BYTES) // bb, max_beats)
            out.append((addr, n))
            addr += n * bb
            left -= n
    return out


def row_beats(rows: list[bytes], bb: int) -> list[tuple[int, int, int]]:
    """``(data, keep, last)`` of the read stream of one descriptor's ``rows`` (each from lane
    0, its final beat partial; ``last`` on the descriptor's final beat), data masked by
    ``keep``."""
    out = []
    for i, row in enumerate(rows):
        for k in range(0, len(row), bb):
            chunk = row[k:k + bb]
            out.append((int.from_bytes(chunk, "little"), (1 << len(chunk)) - 1,
                        int(i == len(rows) - 1 and k + bb >= len(row))))
    return out


def random_descs(rng: random.Random, n: int, bb: int, size: int = MEM,
                 align: int = 1) -> list[DmaDesc]:
    """Rows starting on a 4 KiB boundary, a beat or a byte either side of one, a maximum burst
    before one, or anywhere; lengths of a byte, a beat, up to the boundary exactly, across
    one to three pages, or anywhere; strides to the next boundary, of a beat or of any bytes;
    every seventh descriptor rejected (zero length or count); one page-aligned row of two
    pages and a bit (maximum bursts), in random order. With ``align`` > 1 half the
    descriptors have their start and stride moved onto ``align`` bytes, a quarter only their
    start, a quarter only their stride (an engine of that ``align`` rejects those)."""
    descs = [DmaDesc(BOUNDARY_BYTES, 2 * BOUNDARY_BYTES + bb + 3)]   # maximum bursts
    for i in range(1, n):
        off = rng.choice((0, bb, 1, BOUNDARY_BYTES - bb, BOUNDARY_BYTES - 1,
                          BOUNDARY_BYTES - MAX_BURST_BEATS * bb % BOUNDARY_BYTES,
                          BOUNDARY_BYTES - 3 * bb + 5, rng.randrange(BOUNDARY_BYTES)))
        off %= BOUNDARY_BYTES
        count = rng.choice((1, 1, 1, 2, 3))
        room = (3 if count == 1 else 1) * BOUNDARY_BYTES
        length = rng.choice((1, bb, BOUNDARY_BYTES - off, 2 * BOUNDARY_BYTES - off,
                             BOUNDARY_BYTES - off + bb, rng.randrange(1, room),
                             rng.randrange(1, room)))
        stride = length + rng.choice((0, bb, BOUNDARY_BYTES - (off + length) % BOUNDARY_BYTES,
                                      rng.randrange(0, 600)))
        if align > 1 and i % 4 != 3:
            off -= off % align
        if align > 1 and i % 4 != 2:
            stride += -stride % align
        span = off + stride * (count - 1) + length
        addr = BOUNDARY_BYTES * rng.randrange(0, (size - span) // BOUNDARY_BYTES) + off
        if i % 7 == 6:
            descs.append(DmaDesc(addr, 0, stride, count) if i % 2 else
                         DmaDesc(addr, length, stride, 0))
        else:
            descs.append(DmaDesc(addr, length, stride, count))
    rng.shuffle(descs)
    return descs


def run_reader(dut: DmaReader, descs, mem: bytes, *, seed: int, latency: int = 10,
               jitter: int = 0, ar_idle: float = 0.0, r_idle: float = 0.0, bp: float = 0.0,
               desc_idle: float = 0.0, ready_after: int | None = None,
               cycles: int | None = None) -> dict:
    """``descs`` into ``dut`` against a :class:`~mcf.sim.perf.decode.DdrPort` over ``mem``,
    ``o`` taken with backpressure ``bp`` (from cycle ``ready_after`` on when given: never
    before it). Runs until every expected beat came and a few cycles more (or ``cycles``).
    Returns the AR log ``[(addr, beats)]``, the beats ``[(data & keep, keep, last, err)]``,
    the status and the cycles run."""
    rng = random.Random(seed)
    bb = dut.data_width // 8
    port = DdrPort(dut.bus, mem, random.Random(seed + 1), latency=latency, jitter=jitter,
                   ar_idle=ar_idle, r_idle=r_idle)
    want = sum(len(row_beats([b"x" * d.length] * d.count, bb))
               for d in descs if accepted(d, dut.align))
    out = {"beats": [], "cycles": 0}
    queue = collections.deque(d.pack(dut.desc.payload.shape()) for d in descs)

    async def bench(ctx):
        cat, pack = packer([dut.desc.valid, dut.desc.payload, dut.o.ready, *port.inputs])
        valid = 0
        cycle = 0
        tail = 20
        while tail if cycles is None else cycle < cycles:
            if len(out["beats"]) >= want:
                tail -= 1
            valid = int(bool(queue) and (valid or rng.random() >= desc_idle))
            ready = int(rng.random() >= bp and (ready_after is None or cycle >= ready_after))
            ctx.set(cat, pack([valid, queue[0] if valid else 0, ready,
                               *port.values(cycle)]))
            if valid and ctx.get(dut.desc.ready):
                queue.popleft()
                valid = 0
            if ready and ctx.get(dut.o.valid):
                p = ctx.get(dut.o.payload)
                keep = int(p.keep)
                mask = int.from_bytes(bytes(0xFF if keep >> i & 1 else 0 for i in range(bb)),
                                      "little")
                out["beats"].append((int(p.data) & mask, keep, int(p.last), int(p.err)))
            port.observe(ctx, cycle)
            await ctx.tick()
            cycle += 1
            assert cycle < 200_000, "the reader hung"
        out["cycles"] = cycle
        st = ctx.get(dut.status)
        out["status"] = {name: int(st[name]) for name, _ in DMA_READ_STATUS}

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    out["ar"] = [(a, n) for _, a, n in port.ar_log]
    return out


def expected_read(descs, mem: bytes, bb: int, align: int = 1) -> list[tuple[int, int, int, int]]:
    beats = []
    for d in descs:
        if accepted(d, align):
            rows = [mem[d.addr + r * d.stride:d.addr + r * d.stride + d.length]
                    for r in range(d.count)]
            beats += [(data, keep, last, 0) for data, keep, last in row_beats(rows, bb)]
    return beats


@pytest.mark.parametrize("width,fifo_depth,outstanding,seed,latency,jitter,idle,bp,align", [
    (128, 512, 8, 1, 4, 0, 0.0, 0.0, 1),
    (128, 512, 8, 2, 40, 40, 0.3, 0.3, 1),
    (128, 512, 2, 3, 100, 10, 0.1, 0.7, 1),
    (128, 256, 8, 4, 8, 8, 0.2, 0.2, 1),
    (128, 256, 4, 5, 60, 0, 0.0, 0.5, 1),
    (32, 512, 8, 6, 12, 12, 0.2, 0.3, 1),
    (128, 64, 8, 7, 40, 20, 0.2, 0.3, 1),       # LUTRAM_FIFO_DEPTH
    (128, 16, 2, 8, 30, 10, 0.1, 0.2, 1),
    (128, 512, 8, 9, 20, 10, 0.2, 0.3, 16),     # beat-aligned rows: no realigner
    (128, 64, 8, 13, 30, 10, 0.2, 0.3, 4),      # 4-byte rows: one 4:1 stage
    (32, 512, 8, 11, 12, 12, 0.2, 0.3, 2),
])
def test_reader_bursts(width, fifo_depth, outstanding, seed, latency, jitter, idle, bp, align):
    """Every AR (address, beats) in order equals the pure-Python split, no burst crosses 4 KiB
    (the port model asserts it) or exceeds ``min(256, fifo_depth − 1)`` beats, ``rready``
    never drops, every beat's bytes, keep and last are the memory's, descriptors counted;
    with ``align`` the descriptors off ``align`` bytes are rejected, nothing read for them."""
    rng = random.Random(seed)
    mem = bytes(rng.getrandbits(8) for _ in range(MEM))
    bb = width // 8
    descs = random_descs(rng, 14, bb, align=align)
    dut = DmaReader(width, outstanding=outstanding, fifo_depth=fifo_depth, align=align)
    res = run_reader(dut, descs, mem, seed=seed, latency=latency, jitter=jitter,
                     ar_idle=idle, r_idle=idle, bp=bp, desc_idle=idle)
    max_beats = min(MAX_BURST_BEATS, fifo_depth - 1)
    want = [b for d in descs for b in bursts(d, bb, max_beats, align)]
    assert res["ar"] == want
    assert max(n for _, n in res["ar"]) == max_beats       # the limit was reached
    assert res["beats"] == expected_read(descs, mem, bb, align)
    good = sum(1 for d in descs if accepted(d, align))
    if align > 1:                       # every kind was there
        assert any(d.addr % align and d.stride % align == 0 for d in descs if d.count)
        assert any(d.addr % align == 0 and d.stride % align for d in descs if d.count)
        assert any(d.addr % bb for d in descs if accepted(d, align)) == (align < bb)
    assert res["status"]["descs"] == good
    assert res["status"]["rejects"] == len(descs) - good
    assert res["status"]["beats"] == sum(n for _, n in want)


def test_bursts_reference():
    """The reference split itself, by hand: a row ending exactly on a boundary, one starting
    a byte before it, a page-aligned 8 KiB row of 16-byte beats (two maximum bursts), the
    same row at 255 beats a burst and at 32-bit beats, a stride landing on a boundary."""
    assert bursts(DmaDesc(0x1F00, 0x100), 16, 256) == [(0x1F00, 16)]
    assert bursts(DmaDesc(0x1FFF, 2), 16, 256) == [(0x1FF0, 1), (0x2000, 1)]
    assert bursts(DmaDesc(0x2000, 0x2000), 16, 256) == [(0x2000, 256), (0x3000, 256)]
    assert bursts(DmaDesc(0x2000, 0x2000), 16, 255) == [
        (0x2000, 255), (0x2FF0, 1), (0x3000, 255), (0x3FF0, 1)]
    assert bursts(DmaDesc(0x2004, 0x1000), 4, 256) == [
        (0x2004, 256), (0x2404, 256), (0x2804, 256), (0x2C04, 255), (0x3000, 1)]
    assert bursts(DmaDesc(0xFF0, 0x20, 0x1010, 2), 16, 256) == [
        (0xFF0, 1), (0x1000, 1), (0x2000, 2)]
    assert bursts(DmaDesc(0x1000, 0, 0, 3), 16, 256) == []


@pytest.mark.parametrize("second,issued", [(2, 2), (3, 1)])
def test_reader_room_edge(second, issued):
    """With ``o`` never ready the realigner takes two beats of the first row and stops: a
    256-deep FIFO holding the other 253 of a 255-beat burst has room for a second burst of 2
    beats (253 + 2 + 1 = 256) and not of 3; once ``o`` is taken every beat arrives."""
    rng = random.Random(7)
    mem = bytes(rng.getrandbits(8) for _ in range(MEM))
    descs = [DmaDesc(0x3000, 255 * 16), DmaDesc(0x5000, second * 16)]
    stuck = run_reader(DmaReader(128, fifo_depth=256), descs, mem, seed=1, latency=20,
                       ready_after=10**9, cycles=1200)
    assert stuck["ar"] == [(0x3000, 255), (0x5000, second)][:issued]
    assert stuck["beats"] == []
    res = run_reader(DmaReader(128, fifo_depth=256), descs, mem, seed=1, latency=20,
                     ready_after=1200)
    assert res["ar"] == [(0x3000, 255), (0x5000, second)]
    assert res["beats"] == expected_read(descs, mem, 16)


class WriteSlave:
    """AXI4 write slave for ``amaranth.sim``: ``awready``/``wready`` low at random (``idle``),
    W beats buffered and matched to the AWs in order, one B per burst (OKAY) no earlier than
    ``latency`` + random(0..``latency``) cycles after both its AW and its last W beat. Logs
    the AWs; :meth:`apply` writes the beats into a memory by their strobes and checks
    ``wlast`` and the 4 KiB rule."""

    def __init__(self, bus, rng: random.Random, *, latency: int, idle: float):
        self.bus, self.rng, self.latency, self.idle = bus, rng, latency, idle
        self.bb = len(bus.wdata) // 8
        self.aw: list[tuple[int, int]] = []
        self.w: list[tuple[int, int, int]] = []
        self.wlasts = 0
        self.b_due: collections.deque = collections.deque()
        self.b_sent = 0

    @property
    def inputs(self) -> list:
        b = self.bus
        return [b.awready, b.wready, b.bvalid, b.bresp, b.bid]

    def values(self, cycle: int) -> list[int]:
        self.ready = [int(self.rng.random() >= self.idle) for _ in range(2)]
        self.bvalid = int(bool(self.b_due) and self.b_due[0] <= cycle)
        return [*self.ready, self.bvalid, 0, 0]

    def observe(self, ctx, cycle: int) -> None:
        b = self.bus
        if ctx.get(b.awvalid) and self.ready[0]:
            assert ctx.get(b.awsize) == self.bb.bit_length() - 1 and ctx.get(b.awburst) == 1
            self.aw.append((ctx.get(b.awaddr), ctx.get(b.awlen) + 1))
        if ctx.get(b.wvalid) and self.ready[1]:
            self.w.append((ctx.get(b.wdata), ctx.get(b.wstrb), ctx.get(b.wlast)))
            self.wlasts += ctx.get(b.wlast)
        if self.bvalid:
            assert ctx.get(b.bready)
            self.b_due.popleft()
            self.b_sent += 1
        while self.b_sent + len(self.b_due) < min(len(self.aw), self.wlasts):
            self.b_due.append(cycle + self.latency + self.rng.randint(0, self.latency))

    def apply(self, mem: bytearray) -> None:
        k = 0
        for addr, n in self.aw:
            assert addr % self.bb == 0 and addr // 4096 == (addr + n * self.bb - 1) // 4096
            for i in range(n):
                data, strb, last = self.w[k]
                k += 1
                assert last == (i == n - 1)
                for j in range(self.bb):
                    if strb >> j & 1:
                        mem[addr + i * self.bb + j] = data >> (8 * j) & 0xFF
        assert k == len(self.w)


@pytest.mark.parametrize("width,seed,latency,idle,align", [
    (128, 11, 4, 0.0, 1), (128, 12, 30, 0.4, 1), (32, 13, 10, 0.3, 1),
    (128, 14, 20, 0.3, 16), (128, 15, 20, 0.3, 4)])
def test_writer_bursts(width, seed, latency, idle, align):
    """Every AW (address, beats) in order equals the pure-Python split; the written memory
    equals the rows placed by byte (strobes), nothing else touched; one ``desc_done`` per
    good descriptor; rejects counted (with ``align``: the descriptors off ``align`` bytes
    too, nothing written for them)."""
    rng = random.Random(seed)
    bb = width // 8
    descs = random_descs(rng, 12, bb, align=align)
    dut = DmaWriter(width, align=align)
    slave = WriteSlave(dut.bus, random.Random(seed + 1), latency=latency, idle=idle)
    before = bytes(rng.getrandbits(8) for _ in range(MEM))
    want_mem = bytearray(before)
    words = []
    for d in descs:
        if accepted(d, align):
            for r in range(d.count):
                row = bytes(rng.getrandbits(8) for _ in range(d.length))
                a = d.addr + r * d.stride
                want_mem[a:a + d.length] = row
                words += [int.from_bytes(row[k:k + bb], "little")
                          for k in range(0, d.length, bb)]
    queue = collections.deque(d.pack(dut.desc.payload.shape()) for d in descs)
    good = sum(1 for d in descs if accepted(d, align))
    res = {"done": 0}

    async def bench(ctx):
        cat, pack = packer([dut.desc.valid, dut.desc.payload, dut.i.valid, dut.i.payload,
                            *slave.inputs])
        valid = ivalid = 0
        pos = cycle = 0
        tail = 40
        while tail:
            if res["done"] == good and pos == len(words):
                tail -= 1
            valid = int(bool(queue) and (valid or rng.random() >= idle))
            ivalid = int(pos < len(words) and (ivalid or rng.random() >= idle))
            ctx.set(cat, pack([valid, queue[0] if valid else 0, ivalid,
                               words[pos] if ivalid else 0, *slave.values(cycle)]))
            if valid and ctx.get(dut.desc.ready):
                queue.popleft()
                valid = 0
            if ivalid and ctx.get(dut.i.ready):
                pos += 1
                ivalid = 0
            res["done"] += ctx.get(dut.desc_done)
            slave.observe(ctx, cycle)
            await ctx.tick()
            cycle += 1
            assert cycle < 200_000, "the writer hung"
        st = ctx.get(dut.status)
        res["status"] = {name: int(st[name]) for name, _ in DMA_WRITE_STATUS}
        res["busy"] = ctx.get(dut.busy)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    want = [b for d in descs for b in bursts(d, bb, MAX_BURST_BEATS, align)]
    assert slave.aw == want
    if align > 1:                       # every kind was there
        assert any(d.addr % align and d.stride % align == 0 for d in descs if d.count)
        assert any(d.addr % align == 0 and d.stride % align for d in descs if d.count)
    mem = bytearray(before)
    slave.apply(mem)
    assert mem == want_mem
    assert res["done"] == good and res["busy"] == 0
    assert res["status"]["descs"] == good
    assert res["status"]["rejects"] == len(descs) - good
    assert res["status"]["bursts"] == len(want)
