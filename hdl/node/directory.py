"""The ``kv_id`` directory: per ``kv_id`` a state and a landed-packet count, in one memory
(URAM on the kr260 node), updated by land events and FREE/DRAIN operations, read by the
sequencer's queues and the KV reader (docs/node.md §5 "Directory"; paper §4, replica states).

Semantics (states, semaphore FREE, saturating counts, refusals) are :mod:`mcf.abi.directory`'s;
:class:`mcf.golden.directory.DirectoryModel` is the golden model.
"""

from __future__ import annotations

from amaranth import Module, Mux, Signal
from amaranth.lib import memory, stream, wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.directory import (
    DIR_ENTRY,
    DIR_OP,
    DIRECTORY_STATUS,
    LAND_EVENT,
    LANDED_MAX,
    DirOp,
    DirState,
)
from mcf.abi.landing import LANDED_BITS
from mcf.abi.meta import META

__all__ = ["Directory", "DirReadSignature", "DirOpArbiter"]

KV_ID_BITS = META["kv_id"].width


class DirReadSignature(wiring.Signature):
    """One directory read port, from the reader's side: ``kv_id`` out; ``landed`` and
    ``state`` in, one cycle later."""

    def __init__(self):
        super().__init__({"kv_id": Out(KV_ID_BITS), "landed": In(LANDED_BITS),
                          "state": In(DirState)})


class Directory(wiring.Component):
    """``kv_id`` → :data:`mcf.abi.directory.DIR_ENTRY` (state, landed count).

    Parameters
    ----------
    kv_count : int
        Entries (``sim`` 256, ``kr260`` 65,536 = every ``kv_id``). A ``kv_id`` at or above it
        is out of range: events on it are ignored and counted, reads of it return ``ABSENT``, 0.
    n_read : int
        Read ports (the two sequencer queues and the KV reader: 3).

    Members
    -------
    land : In(stream.Signature(:data:`mcf.abi.directory.LAND_EVENT`))
        One event per landed packet (from ``LandingEngine.landed``): ``landed += 1`` (saturating),
        ``owner`` sets ``OWNER``, otherwise ``ABSENT`` → ``VALID``.
    op : In(stream.Signature(:data:`mcf.abi.directory.DIR_OP`))
        FREE ``count`` (the sequencer's DIR record) or DRAIN (from ``LocalSink.dir_op``).
    read{n} : In(:class:`DirReadSignature`)
        ``kv_id`` in; ``landed`` and ``state`` of that entry on the next cycle, including an
        update written in the same cycle the address is presented (transparent).
    clear : In(1)
        Strobe: walk every entry back to zero (after any event in flight).
    ready : Out(1)
        No clear walk running. Low for ``kv_count`` cycles from reset (the memory has no
        reset; the walk writes one zero entry per cycle) and from the cycle after a ``clear``
        strobe; the ``land`` and ``op`` streams are not accepted (nor in the strobe's cycle)
        and reads are meaningless while it is low.
    status : Out(:data:`mcf.abi.directory.DIRECTORY_STATUS`)

    Pipeline: cycle 0 accepts one event (``land`` and ``op`` share the slot, round-robin when
    both are valid) and reads its entry; cycle 1 computes and writes the new entry. The entry an
    event reads misses only the write made in that same cycle (by the event just ahead of it);
    a forwarding register holding that write stands in for the memory when the ``kv_id``
    matches, so back-to-back events on one ``kv_id`` are exact. An update is visible on the read
    ports 2 cycles after its event is accepted (``status`` likewise). Throughput: one event per
    cycle (measured: ``tests/test_node_directory.py::test_rate``, 1.0 land events per cycle,
    0.5 each when ``land`` and ``op`` are both always valid). ``land.ready`` / ``op.ready``
    depend on ``valid`` of the other stream only (arbitration), never on their own ``valid``.

    Resources: one memory of ``kv_count`` × 12 bits with ``n_read + 1`` read ports, which
    synthesis replicates per read port. Measured at 65,536 entries (yosys ``synth_xilinx
    -family xcup -uram``, ``mcf.sim.synth.resources``): ``n_read=0`` 4 URAM, 286 LUT, 368 FF;
    ``n_read=2`` 12 URAM, 414 LUT, 409 FF; ``n_read=3`` 16 URAM, 516 LUT, 415 FF (4 URAM per
    copy).
    """

    def __init__(self, kv_count: int = 256, n_read: int = 3):
        if not 1 <= kv_count <= 1 << KV_ID_BITS:
            raise ValueError(f"kv_count must lie in 1..{1 << KV_ID_BITS}")
        if n_read < 0:
            raise ValueError("n_read must be >= 0")
        self._kv_count, self._n_read = kv_count, n_read
        super().__init__({
            "land": In(stream.Signature(LAND_EVENT)),
            "op": In(stream.Signature(DIR_OP)),
            **{f"read{n}": In(DirReadSignature()) for n in range(n_read)},
            "clear": In(1),
            "ready": Out(1),
            "status": Out(DIRECTORY_STATUS),
        })

    @property
    def kv_count(self) -> int:
        return self._kv_count

    @property
    def n_read(self) -> int:
        return self._n_read

    def elaborate(self, platform):
        m = Module()
        n = self._kv_count
        abits = max(1, (n - 1).bit_length())
        st = self.status

        m.submodules.mem = mem = memory.Memory(shape=DIR_ENTRY, depth=n, init=[])
        wr = mem.write_port()
        rd = mem.read_port()                # the RMW read: forwarding register below
        readers = [mem.read_port(transparent_for=(wr,)) for _ in range(self._n_read)]

        def in_range(kv_id):
            return kv_id < n

        # --- clear walker -------------------------------------------------------------
        walking = Signal(init=1)
        walk_addr = Signal(abits)
        m.d.comb += self.ready.eq(~walking)

        # --- cycle 0: accept one event, read its entry ---------------------------------
        prefer_op = Signal()
        sel_op = Signal()
        m.d.comb += sel_op.eq(self.op.valid & (~self.land.valid | prefer_op))
        accept = ~walking & ~self.clear
        m.d.comb += [self.land.ready.eq(accept & ~sel_op), self.op.ready.eq(accept & sel_op)]
        take = Signal()
        m.d.comb += take.eq((self.land.valid & self.land.ready) | (self.op.valid & self.op.ready))
        ev_kv = Signal(KV_ID_BITS)
        m.d.comb += [ev_kv.eq(Mux(sel_op, self.op.payload.kv_id, self.land.payload.kv_id)),
                     rd.addr.eq(ev_kv[:abits]), rd.en.eq(1)]
        s1_valid = Signal()
        s1_land = Signal()
        s1_owner = Signal()
        s1_op = Signal(DirOp)
        s1_count = Signal(LANDED_BITS)
        s1_kv = Signal(abits)
        m.d.sync += s1_valid.eq(take & in_range(ev_kv))
        with m.If(take):
            m.d.sync += [s1_land.eq(~sel_op), s1_owner.eq(self.land.payload.owner),
                         s1_op.eq(self.op.payload.op), s1_count.eq(self.op.payload.count),
                         s1_kv.eq(ev_kv[:abits]), prefer_op.eq(~sel_op)]
            with m.If(~in_range(ev_kv)):
                m.d.sync += st.out_of_range.eq(st.out_of_range + 1)

        # --- cycle 1: modify, write; forward the write to the next event ---------------
        fwd_valid = Signal()
        fwd_kv = Signal(abits)
        fwd = Signal(DIR_ENTRY)
        old = Signal(DIR_ENTRY)
        new = Signal(DIR_ENTRY)
        m.d.comb += [old.eq(Mux(fwd_valid & (fwd_kv == s1_kv), fwd, rd.data)), new.eq(old)]
        with m.If(s1_valid):
            with m.If(s1_land):
                m.d.sync += st.landed.eq(st.landed + 1)
                with m.If(old.landed == LANDED_MAX):
                    m.d.sync += st.saturated.eq(st.saturated + 1)
                with m.Else():
                    m.d.comb += new.landed.eq(old.landed + 1)
                with m.If(s1_owner):
                    m.d.comb += new.state.eq(DirState.OWNER)
                with m.Elif(old.state == DirState.ABSENT):
                    m.d.comb += new.state.eq(DirState.VALID)
            with m.Elif(s1_op == DirOp.FREE):
                with m.If(old.state == DirState.OWNER):
                    m.d.sync += st.free_refused_owner.eq(st.free_refused_owner + 1)
                with m.Elif(s1_count > old.landed):
                    m.d.sync += st.free_refused_count.eq(st.free_refused_count + 1)
                with m.Else():
                    m.d.sync += st.frees.eq(st.frees + 1)
                    m.d.comb += new.landed.eq(old.landed - s1_count)
                    with m.If(old.landed == s1_count):
                        m.d.comb += new.state.eq(DirState.ABSENT)
            with m.Else():                  # DRAIN
                with m.If(old.state == DirState.OWNER):
                    m.d.sync += st.drain_refused_owner.eq(st.drain_refused_owner + 1)
                with m.Else():
                    m.d.sync += st.drains.eq(st.drains + 1)
                    m.d.comb += new.state.eq(DirState.DRAINING)

        m.d.sync += [fwd_valid.eq(s1_valid), fwd_kv.eq(s1_kv), fwd.eq(new)]
        with m.If(s1_valid):
            m.d.comb += [wr.en.eq(1), wr.addr.eq(s1_kv), wr.data.eq(new)]
        with m.Elif(walking):
            m.d.comb += [wr.en.eq(1), wr.addr.eq(walk_addr), wr.data.eq(0)]
            m.d.sync += walk_addr.eq(walk_addr + 1)
            with m.If(walk_addr == n - 1):
                m.d.sync += [walking.eq(0), walk_addr.eq(0),
                             st.clear_walks.eq(st.clear_walks + 1)]
        with m.If(self.clear):
            m.d.sync += [walking.eq(1), walk_addr.eq(0)]

        # --- read ports -------------------------------------------------------------------
        for k, port in enumerate(readers):
            bus = getattr(self, f"read{k}")
            ok = Signal(name=f"read{k}_ok")
            m.d.sync += ok.eq(in_range(bus.kv_id))
            m.d.comb += [port.addr.eq(bus.kv_id[:abits]), port.en.eq(1),
                         bus.landed.eq(Mux(ok, port.data.landed, 0)),
                         bus.state.eq(Mux(ok, port.data.state, DirState.ABSENT))]
        return m


class DirOpArbiter(wiring.Component):
    """Merges ``n`` :data:`mcf.abi.directory.DIR_OP` streams into ``Directory.op`` (the
    sequencer's FREEs and ``LocalSink.dir_op``'s DRAINs), round-robin: after input ``k`` is
    served, the first valid input after ``k`` wins; no input waits more than ``n − 1``
    transfers. Latency 0 (combinational ``valid``/``payload``/``ready``); one op per cycle.

    Members
    -------
    i{k} : In(stream.Signature(DIR_OP)) for k in range(n)
    o : Out(stream.Signature(DIR_OP))
    """

    def __init__(self, n: int = 2):
        if n < 1:
            raise ValueError("n must be >= 1")
        self._n = n
        super().__init__({**{f"i{k}": In(stream.Signature(DIR_OP)) for k in range(n)},
                          "o": Out(stream.Signature(DIR_OP))})

    @property
    def n(self) -> int:
        return self._n

    def elaborate(self, platform):
        m = Module()
        n = self._n
        ins = [getattr(self, f"i{k}") for k in range(n)]
        last = Signal(range(n), init=n - 1)             # the input served last
        grant = Signal(range(n))
        # the first valid input in the order last+1, last+2, ...: later entries override
        for rot in range(n):
            with m.If(last == rot):
                for step in reversed(range(1, n + 1)):
                    k = (rot + step) % n
                    with m.If(ins[k].valid):
                        m.d.comb += grant.eq(k)
        with m.Switch(grant):
            for k, port in enumerate(ins):
                with m.Case(k):
                    m.d.comb += [self.o.valid.eq(port.valid), self.o.payload.eq(port.payload),
                                 port.ready.eq(self.o.ready)]
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += last.eq(grant)
        return m
