"""Metadata ingress: the command-ring reader of one sequencer queue (docs/node.md §2, issue #11;
paper §4: MARS's per-node records enter the datapath with no PS on the per-record path).

The record layout, its checks and the register/counter set are :mod:`mcf.abi.node`'s.
"""

from __future__ import annotations

from amaranth import Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.framing import MAX_PAYLOAD
from mcf.abi.meta import META, Op
from mcf.abi.node import (
    CLASS_QUEUES,
    CMD,
    CMD_ADDR_BITS,
    CMD_BYTES,
    CMD_INDEX_BITS,
    CMD_RING_MAX_LOG2,
    INGRESS_STATUS,
    PayloadSource,
    Queue,
    RecordClass,
)

from ..mem.axi import BOUNDARY_BYTES, AXI4Signature, AxiBurst, AxiResp

__all__ = ["CmdRingReader", "cmd_check"]

AXCACHE = 0b0011     # normal non-cacheable bufferable (what Xilinx HP ports expect)

STAGE = data.StructLayout({"valid": unsigned(1), "err": unsigned(1), "rec": CMD})
"""One received ring entry between the R channel and the record check."""


def cmd_check(m: Module, rec: data.View, queue: Queue,
              exclude: tuple[RecordClass, ...] = ()) -> Signal:
    """A 1-bit signal: ``rec`` (a :data:`CMD` view) is malformed for ring ``queue`` (classes in
    ``exclude`` included). The checks of :func:`mcf.abi.node.cmd_malformed`, combinational."""
    cls_ok = Signal(name="cls_ok")
    src_ok = Signal(name="src_ok")
    op_ok = Signal(name="op_ok")
    with m.Switch(rec.cls), m.Case(*(c for c in RecordClass
                                            if queue in CLASS_QUEUES[c] and c not in exclude)):
        m.d.comb += cls_ok.eq(1)
    with m.Switch(rec.src), m.Case(*PayloadSource):
        m.d.comb += src_ok.eq(1)
    meta = data.View(META, rec.meta[:META.size])
    with m.Switch(meta.op), m.Case(*Op):
        m.d.comb += op_ok.eq(1)
    send_bad = Signal(name="send_bad")
    m.d.comb += send_bad.eq(~src_ok | ~op_ok | (meta.length > MAX_PAYLOAD) |
                            ((rec.src == PayloadSource.HDR) & (meta.length != 0)))
    bad = Signal(name="malformed")
    m.d.comb += bad.eq(~cls_ok | (rec.queue != queue) | (rec.flags.reserved != 0) |
                       ((rec.cls == RecordClass.SEND) & send_bad))
    return bad


class CmdRingReader(wiring.Component):
    """Reads one command ring ``CMDq`` from DDR into its queue's record FIFO.

    One component per ring (instantiate it once per :class:`mcf.abi.node.Queue`): the rings are
    independent by design (docs/node.md §2 rejects coupling the queues), so each reader has its
    own FIFO, indices and AXI master (the HP0 burst mux of §4 joins them, one AXI ID each); a
    shared reader would need per-queue state anyway and adds an arbiter inside.

    ``exclude`` lists record classes this node build does not execute: they are malformed here
    (counted and skipped like any other malformed record).

    Members
    -------
    base : In(40)
        ``CMDq_BASE``: the ring's physical address, 16-byte aligned.
    size : In(5)
        ``CMDq_SIZE``: log2 of the entry count (values above 16 act as 16). ``base`` and
        ``size`` are changed only while the ring is idle (``PROD = CONS``, FIFO drained).
    doorbell : In(stream.Signature(16))
        A PS write of ``CMDq_PROD`` (always ready). Accepted when ``PROD' − CONS ≤ 2^SIZE``
        (free-running 16-bit indices); otherwise ignored and counted in ``overruns``.
    prod, cons : Out(16)
        ``CMDq_PROD`` (the last accepted doorbell) and ``CMDq_CONS``: entries read from DDR so
        far (each either queued, or skipped as malformed or errored); a slot below ``CONS`` may
        be rewritten by the PS.
    o : Out(stream.Signature(CMD))
        Well-formed records in ring order, from a ``fifo_depth``-entry FIFO. Stream rules:
        ``valid`` never waits for ``ready``; the payload is stable until taken.
    bus : Out(AXI4Signature(40, 128)) — AR/R only (AW/W/B tied off), ``rready`` always 1.
    status : Out(:data:`mcf.abi.node.INGRESS_STATUS`)

    Behaviour: while ``PROD ≠`` the fetch index it issues INCR bursts of
    ``min(max_burst, PROD − fetch, free FIFO entries, entries to the ring's end, entries to the
    4 KiB boundary)`` beats, at most ``outstanding`` in flight; FIFO room is reserved at issue,
    so the FIFO never overruns and R beats are never refused. Each R beat is checked
    (:func:`cmd_check`): well-formed → FIFO, ``records`` += 1; malformed → skipped,
    ``bad_records`` += 1, ``last_bad`` = its index; non-OKAY ``RRESP`` → skipped,
    ``read_errors`` += 1. ``CONS`` advances by one per beat either way, so nothing hangs.

    Latency: doorbell → ``arvalid`` 2 cycles; R beat → ``o.valid`` 3 cycles (check stage,
    FIFO). Throughput: at most ``min(outstanding·max_burst, fifo_depth)`` entries are in flight,
    so with an AR→R latency ``L`` the sustained rate is about ``min(1, 32 / (L + 16))`` records
    per cycle at the defaults; measured (sim/benches/node_ingress.py, no backpressure) 1.0 with
    AxiRam's own latency and 0.49 with ``L`` = 40 — the design's target is 0.25.
    """

    def __init__(self, queue: Queue, fifo_depth: int = 32, max_burst: int = 16,
                 outstanding: int = 2, data_width: int = 128, addr_width: int = CMD_ADDR_BITS,
                 exclude: tuple[RecordClass, ...] = ()):
        if data_width != CMD.size:
            raise ValueError(f"one ring entry is one {CMD.size}-bit beat")
        if not 1 <= max_burst <= fifo_depth:
            raise ValueError("a burst must fit in the FIFO")
        self._queue, self._fifo_depth = Queue(queue), fifo_depth
        self._exclude = tuple(RecordClass(c) for c in exclude)
        self._max_burst, self._outstanding = max_burst, outstanding
        self._addr_width = addr_width
        super().__init__({
            "base": In(addr_width),
            "size": In(range(32)),
            "doorbell": In(stream.Signature(unsigned(CMD_INDEX_BITS))),
            "prod": Out(CMD_INDEX_BITS),
            "cons": Out(CMD_INDEX_BITS),
            "o": Out(stream.Signature(CMD)),
            "bus": Out(AXI4Signature(addr_width, data_width)),
            "status": Out(INGRESS_STATUS),
        })

    @property
    def queue(self) -> Queue:
        return self._queue

    @property
    def fifo_depth(self) -> int:
        return self._fifo_depth

    def elaborate(self, platform):
        m = Module()
        bus, st = self.bus, self.status
        lb = (CMD_BYTES - 1).bit_length()
        depth = self._fifo_depth

        # ring geometry
        size = Signal(range(CMD_RING_MAX_LOG2 + 1))
        m.d.comb += size.eq(Mux(self.size > CMD_RING_MAX_LOG2, CMD_RING_MAX_LOG2, self.size))
        entries = Signal(CMD_RING_MAX_LOG2 + 1)
        m.d.comb += entries.eq(Const(1, CMD_RING_MAX_LOG2 + 1) << size)

        # doorbell: accept unless it overruns the ring
        m.d.comb += self.doorbell.ready.eq(1)
        fill_new = Signal(CMD_INDEX_BITS)
        m.d.comb += fill_new.eq(self.doorbell.payload - self.cons)
        with m.If(self.doorbell.valid):
            with m.If(fill_new > entries):
                m.d.sync += st.overruns.eq(st.overruns + 1)
            with m.Else():
                m.d.sync += self.prod.eq(self.doorbell.payload)

        # fetch: burst sizing
        m.submodules.fifo = q = fifo.SyncFIFOBuffered(width=CMD.size, depth=depth)
        fetch = Signal(CMD_INDEX_BITS)
        pending = Signal(CMD_INDEX_BITS)     # requested, not yet through the check stage
        avail = Signal(CMD_INDEX_BITS)
        m.d.comb += [pending.eq(fetch - self.cons), avail.eq(self.prod - fetch)]
        room = Signal(range(depth + 1))
        m.d.comb += room.eq(depth - q.level - pending)   # ≥ 0: reserved at issue
        slot = Signal(CMD_RING_MAX_LOG2)
        m.d.comb += slot.eq(fetch & (entries - 1))
        to_end = Signal(CMD_RING_MAX_LOG2 + 1)
        m.d.comb += to_end.eq(entries - slot)
        addr = Signal(self._addr_width)
        m.d.comb += addr.eq(self.base + (slot << lb))
        to_4k = Signal(range(BOUNDARY_BYTES // CMD_BYTES + 1))
        m.d.comb += to_4k.eq((BOUNDARY_BYTES - addr[:12]) >> lb)
        n = Signal(range(self._max_burst + 1))
        lims = [avail, room, to_end, to_4k]
        n_chain = Const(self._max_burst, n.shape())
        for lim in lims:
            n_chain = Mux(lim < n_chain, lim, n_chain)
        m.d.comb += n.eq(n_chain)

        # AR channel
        bursts = Signal(range(self._outstanding + 1))
        m.d.comb += [bus.arsize.eq(lb), bus.arburst.eq(AxiBurst.INCR), bus.arcache.eq(AXCACHE),
                     bus.arid.eq(0), bus.arprot.eq(0)]
        ar_done = Signal()
        m.d.comb += ar_done.eq(bus.arvalid & bus.arready)
        with m.If(ar_done):
            m.d.sync += bus.arvalid.eq(0)
        with m.If(~bus.arvalid & (n != 0) & (bursts < self._outstanding)):
            m.d.sync += [bus.arvalid.eq(1), bus.araddr.eq(addr), bus.arlen.eq(n - 1),
                         fetch.eq(fetch + n), st.bursts.eq(st.bursts + 1)]
        recv = Signal()
        m.d.comb += [bus.rready.eq(1), recv.eq(bus.rvalid)]
        # a burst counts from its AR issue (arvalid rising) to its last R beat
        issue = Signal()
        m.d.comb += issue.eq(~bus.arvalid & (n != 0) & (bursts < self._outstanding))
        m.d.sync += bursts.eq(bursts + issue - (recv & bus.rlast))

        # check stage: one registered beat, then the FIFO or a counter
        stage = Signal(STAGE)
        m.d.sync += [stage.valid.eq(recv), stage.err.eq(bus.rresp != AxiResp.OKAY),
                     stage.rec.eq(bus.rdata)]
        bad = cmd_check(m, stage.rec, self._queue, self._exclude)
        m.d.comb += [q.w_data.eq(stage.rec), q.w_en.eq(stage.valid & ~stage.err & ~bad)]
        with m.If(stage.valid):
            m.d.sync += self.cons.eq(self.cons + 1)
            with m.If(stage.err):
                m.d.sync += st.read_errors.eq(st.read_errors + 1)
            with m.Elif(bad):
                m.d.sync += [st.bad_records.eq(st.bad_records + 1), st.last_bad.eq(self.cons)]
            with m.Else():
                m.d.sync += st.records.eq(st.records + 1)

        m.d.comb += [self.o.payload.eq(q.r_data), self.o.valid.eq(q.r_rdy),
                     q.r_en.eq(self.o.ready)]
        return m

