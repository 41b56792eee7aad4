"""The ``kv_id`` directory: per ``kv_id`` a state and a landed-packet count, in one memory
(URAM on the kr260 node), updated by land events and FREE/DRAIN operations, read by the
sequencer's queues and the KV reader (docs/node.md §5 "Directory"; paper §4, replica states).

Semantics (states, semaphore FREE, saturating counts, refusals) are :mod:`mcf.abi.directory`'s;
:class:`mcf.golden.directory.DirectoryModel` is the golden model.
"""

from __future__ import annotations

from amaranth import Array, Module, Mux, Signal
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
    ``state`` in, of the ``kv_id`` presented the cycle before when ``fresh`` is high
    (:class:`Directory` says when)."""

    def __init__(self):
        super().__init__({"kv_id": Out(KV_ID_BITS), "landed": In(LANDED_BITS),
                          "state": In(DirState), "fresh": In(1)})


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
        ``kv_id`` in; ``landed`` and ``state`` out: when ``fresh`` is high, the entry of the
        ``kv_id`` presented the cycle before, every update written up to then included (what a
        transparent read presented a cycle earlier returns; ``fresh`` comes from flip-flops).
        A port whose ``kv_id`` changed (``fresh`` low) wants the memory's read of the
        ``kv_id`` presented the cycle before: it gets it in the first cycle that takes no
        event, or the cycle after one that took an event when no op waits (ports wanting it
        are served round-robin, one a cycle), and ``fresh`` rises the cycle after, if the
        ``kv_id`` stayed: 2 cycles after a new ``kv_id`` is presented at the earliest.
    clear : In(1)
        Strobe: walk every entry back to zero (after any event in flight).
    ready : Out(1)
        No clear walk running. Low for ``kv_count`` cycles from reset (the memory has no
        reset; the walk writes one zero entry per cycle) and from the cycle after a ``clear``
        strobe; the ``land`` and ``op`` streams are not accepted (nor in the strobe's cycle)
        and reads are meaningless while it is low.
    status : Out(:data:`mcf.abi.directory.DIRECTORY_STATUS`)

    Pipeline: cycle 0 accepts one event (``land`` and ``op`` share the slot, round-robin when
    both are valid) and reads its entry; cycle 1 computes and writes the new entry. The
    memory has one read port, transparent for the write, so back-to-back events on one
    ``kv_id`` are exact. The read ports share it with the events: a port is read only when its
    ``kv_id`` changed (its entry is then held in registers, and every write to that
    ``kv_id`` is written into them too, so a held entry never goes stale). A read port takes
    the memory's read in a cycle that takes no event, or, when the cycle before took one and
    no op waits, ahead of the events (so land events and changed ports alternate while both
    wait; ops are never held back by a port, so the op path's bound is the events' own). An
    update is
    visible on the read ports 2 cycles after its event is accepted (``status`` likewise).
    Throughput: one event per cycle while no port's ``kv_id`` changes (measured:
    ``tests/test_node_directory.py::test_rate``, 1.0 land events per cycle, 0.5 each when
    ``land`` and ``op`` are both always valid, 0.5 when a port's ``kv_id`` changes every
    cycle). ``land.ready`` / ``op.ready`` depend on ``valid`` of the other stream and on the
    read ports' registers (arbitration); ``op.ready`` also on ``op.valid`` (a waiting op goes
    ahead of a port's read), ``land.ready`` never on ``land.valid``.

    Resources: one memory of ``kv_count`` × 12 bits with one read and one write port, and per
    read port a held entry with its ``kv_id``. Measured at 65,536 entries, ``n_read=3``
    (yosys ``synth_xilinx -family xcup -uram``, ``mcf.sim.synth.resources``): 4 URAM, 585 LUT,
    480 FF (a memory copy per read port before: 16 URAM, 516 LUT, 415 FF).
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
        rd = mem.read_port(transparent_for=(wr,))   # events and read ports, one a cycle
        buses = [getattr(self, f"read{k}") for k in range(self._n_read)]

        def in_range(kv_id):
            return kv_id < n

        # --- clear walker -------------------------------------------------------------
        walking = Signal(init=1)
        walk_addr = Signal(abits)
        m.d.comb += self.ready.eq(~walking)

        # --- read ports: held entries; which port (if any) takes the read this cycle ---
        held = [Signal(DIR_ENTRY, name=f"held{k}") for k in range(self._n_read)]
        at = [Signal(KV_ID_BITS, name=f"at{k}") for k in range(self._n_read)]
        have = [Signal(name=f"have{k}") for k in range(self._n_read)]
        want = Signal(max(1, self._n_read))
        prev = [Signal(KV_ID_BITS, name=f"prev{k}") for k in range(self._n_read)]
        for k, bus in enumerate(buses):
            # from flip-flops only: a port's kv_id reaches nothing but its register (a reader
            # may compute kv_id from what it reads; no path into the events' arbitration)
            m.d.sync += prev[k].eq(bus.kv_id)
            m.d.comb += [bus.fresh.eq(have[k] & (at[k] == prev[k])),
                         want[k].eq(~bus.fresh)]
        last_ev = Signal()                          # the cycle before took an event
        port_turn = Signal()
        m.d.comb += port_turn.eq(last_ev & want.any() & ~self.op.valid)
        grant = Signal(range(max(1, self._n_read)))
        last = Signal(range(max(1, self._n_read)), init=max(0, self._n_read - 1))
        for rot in range(self._n_read):             # the first wanting port after the last
            with m.If(last == rot):
                for step in reversed(range(1, self._n_read + 1)):
                    k = (rot + step) % self._n_read
                    with m.If(want[k]):
                        m.d.comb += grant.eq(k)

        # --- cycle 0: accept one event, read its entry ---------------------------------
        prefer_op = Signal()
        sel_op = Signal()
        m.d.comb += sel_op.eq(self.op.valid & (~self.land.valid | prefer_op))
        accept = ~walking & ~self.clear & ~port_turn
        m.d.comb += [self.land.ready.eq(accept & ~sel_op), self.op.ready.eq(accept & sel_op)]
        take = Signal()
        m.d.comb += take.eq((self.land.valid & self.land.ready) | (self.op.valid & self.op.ready))
        m.d.sync += last_ev.eq(take)
        ev_kv = Signal(KV_ID_BITS)
        m.d.comb += ev_kv.eq(Mux(sel_op, self.op.payload.kv_id, self.land.payload.kv_id))
        serve = Signal()                            # a read port takes the read
        m.d.comb += [serve.eq(~take & want.any()), rd.en.eq(1)]
        if buses:
            m.d.comb += rd.addr.eq(Mux(serve, Array(prev)[grant], ev_kv))
        else:
            m.d.comb += rd.addr.eq(ev_kv)
        served = Signal(max(1, self._n_read))       # one-hot: the port read last cycle
        with m.If(serve):
            m.d.sync += last.eq(grant)
        for k in range(self._n_read):
            m.d.sync += served[k].eq(serve & (grant == k))
            with m.If(serve & (grant == k)):
                m.d.sync += [at[k].eq(prev[k]), have[k].eq(1)]
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

        # --- cycle 1: modify, write -----------------------------------------------------
        old = Signal(DIR_ENTRY)
        new = Signal(DIR_ENTRY)
        m.d.comb += [old.eq(rd.data), new.eq(old)]
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

        # --- read ports' entries: the read the cycle after it, then held; writes to a held
        #     kv_id written into it (an out-of-range kv_id holds ABSENT, 0) ----------------
        for k, bus in enumerate(buses):
            ok = in_range(at[k])
            now = Signal(DIR_ENTRY, name=f"now{k}")
            m.d.comb += now.eq(Mux(served[k], Mux(ok, rd.data, 0), held[k]))
            m.d.comb += [bus.landed.eq(now.landed), bus.state.eq(now.state)]
            with m.If(wr.en & ok & (wr.addr == at[k][:abits])):
                m.d.sync += held[k].eq(wr.data)
            with m.Else():
                m.d.sync += held[k].eq(now)
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
