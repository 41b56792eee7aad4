"""The node sequencer: one in-order executor per command queue (docs/node.md §3, §6 "Records";
issue #11; paper §4: MARS's records run with no PS on the per-record path).

Field meanings, counters, the clear (MARK) semantics, the status layout and the cycle-exact
golden model are :mod:`mcf.abi.sequencer`'s.
"""

from __future__ import annotations

from amaranth import Array, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.csrmap import COUNTER_BITS
from mcf.abi.directory import DIR_OP, DirOp
from mcf.abi.landing import LANDED_BITS
from mcf.abi.meta import META
from mcf.abi.node import CLASS_QUEUES, CMD, Queue, RecordClass
from mcf.abi.sequencer import (
    DEFAULT_DIR_SETTLE,
    DEFAULT_MAX_OUTSTANDING,
    ENGINE_CLASSES,
    KV_ID_BITS,
    LANDED_WAIT_CLASSES,
    SEQ_STATUS,
    STREAM_OF,
    HaltCause,
    SeqCounter,
)

__all__ = ["QueueSequencer"]


class QueueSequencer(wiring.Component):
    """Executes one queue's records in order (one instance per :class:`mcf.abi.node.Queue`).

    Members
    -------
    rec : In(stream.Signature(CMD))
        Well-formed records from the queue's ring reader (``CmdRingReader.o``).
    enable : In(1)
        ``DIR_READY & SEQ<q>_CTRL.run``: records issue only while high (a raised ``valid``
        completes its transfer regardless); low also ends an abort flush.
    dir_kv_id : Out(16), dir_landed : In(LANDED_BITS), dir_fresh : In(1, init=1)
        Directory read port (:class:`~mcf.hdl.node.directory.DirReadSignature`): while
        ``dir_fresh`` is high, ``dir_landed`` is the ``landed`` count of the ``dir_kv_id``
        presented in the previous cycle; a landed wait passes only while it is high. The
        sequencer presents the ``meta.kv_id`` of the record in its slot while that record is a
        landed wait, else that of the record at its input (decided from flip-flops, not from
        the slot's handshake); the node's directory reads a changed ``kv_id`` a cycle later
        and the landed condition is a register, so a landed wait on a new ``kv_id`` passes 3
        cycles after its record is taken at the earliest, 4 when it follows another landed
        wait on a different ``kv_id``.
    counters : In(ArrayLayout(32, n_counters))
        The counters WAIT tests, indexed by :class:`mcf.abi.sequencer.SeqCounter`.
    send : Out(stream.Signature(CMD)) — both queues; the whole record.
    dir : Out(stream.Signature(DIR_OP)), job / emit / attend : Out(stream.Signature(CMD))
        COMPUTE only. ``job_done``, ``emit_done``, ``attend_done`` : In(1): one strobe per
        issued record of that engine, in order; the record retires on it.
    timeout : In(32)
        ``SEQ_TIMEOUT``: cycles a record may wait before the queue halts (0: never).
    skip, abort : In(1)
        ``SEQ<q>_CTRL`` strobes (semantics in :mod:`mcf.abi.sequencer`).
    irq_mark : Out(1)
        One-cycle pulse, the cycle after a record with ``flags.irq`` retires (executed).
    halted : Out(1)
        The watchdog halted the queue (until ``skip`` or ``abort``).
    retired : Out(32)
        Records retired (wire it to the other queue's ``counters[OTHER_RETIRED]``).
    status : Out(:data:`mcf.abi.sequencer.SEQ_STATUS`)

    Every stream obeys the stdlib rules: ``valid`` never waits for ``ready`` and, once high,
    stays high with a stable payload until the transfer.

    Latency: a record at the input in cycle ``t`` is offered (or retires, for NOP/MARK/WAIT)
    in cycle ``t + 1`` if its wait holds — a WAIT's on the counters of cycle ``t`` (it sees
    ``counters`` one cycle late: a WAIT a counter releases leaves the cycle after the counter
    reached its threshold, not in it); a landed wait passes on the directory's answer of the
    previous cycle for the record then in the slot (so in ``t + 2`` at the earliest);
    ``irq_mark``, ``retired`` and ``status`` follow one cycle after the retire. Both
    conditions are registers (issue #35, docs/depth.md). Throughput: one record per cycle
    while no wait blocks and the issue streams are ready (measured, ``tests/
    test_node_sequencer.py::test_header_only_send_rate``: 1.00 records/cycle for header-only
    SENDs with ``wait = 0``, ``N`` records in ``N + 1`` cycles; 0.33 with satisfied landed
    waits on changing ``kv_id`` s; equal to the golden model's count). Engine records of one
    class may be ``max_outstanding`` deep in their engine.

    ``dir_settle``: after a DIR transfer, landed waits use only directory reads presented
    ``dir_settle`` or more cycles later, so a wait behind a FREE never passes on the count the
    FREE is about to lower. ``mcf.hdl.node.directory.Directory`` shows an op on its read
    ports 2 cycles after accepting it, so 1 suffices when ``dir`` reaches ``Directory.op``
    through combinational logic only (``PacketArbiter``); add one per register stage in
    between (default 4).

    The record is decoded as it is taken (``bad``, engine, stream, WAIT / landed wait, DIR,
    MARK: :meth:`_decode` of ``rec.payload``) and the flags are registered with it, so the
    issue logic starts from flip-flops; the cycles are those of decoding the slot itself.

    Resources (yosys ``synth_xilinx -family xcup``, ``mcf.sim.synth.resources``, an
    estimate): NET 317 LUT, 109 CARRY, 673 FF; COMPUTE 354 LUT, 111 CARRY, 690 FF; no RAM
    (decoding the slot instead: 311 / 385 LUT, 667 / 679 FF).
    """

    def __init__(self, queue: Queue, n_counters: int = len(SeqCounter),
                 max_outstanding: int = DEFAULT_MAX_OUTSTANDING,
                 dir_settle: int = DEFAULT_DIR_SETTLE):
        if n_counters < 1 or max_outstanding < 1 or dir_settle < 0:
            raise ValueError("n_counters, max_outstanding ≥ 1, dir_settle ≥ 0")
        self._queue, self._n = Queue(queue), n_counters
        self._max_out, self._dir_settle = max_outstanding, dir_settle
        self._streams = [s for c, s in STREAM_OF.items() if self._queue in CLASS_QUEUES[c]]
        ports = {
            "rec": In(stream.Signature(CMD)),
            "enable": In(1),
            "dir_kv_id": Out(KV_ID_BITS),
            "dir_landed": In(LANDED_BITS),
            "dir_fresh": In(1, init=1),
            "counters": In(data.ArrayLayout(COUNTER_BITS, n_counters)),
            "timeout": In(COUNTER_BITS),
            "skip": In(1),
            "abort": In(1),
            "irq_mark": Out(1),
            "halted": Out(1),
            "retired": Out(COUNTER_BITS),
            "status": Out(SEQ_STATUS),
        }
        for name in self._streams:
            ports[name] = Out(stream.Signature(DIR_OP if name == "dir" else CMD))
        for c in ENGINE_CLASSES:
            if self._queue in CLASS_QUEUES[c]:
                ports[f"{STREAM_OF[c]}_done"] = In(1)
        super().__init__(ports)

    @property
    def queue(self) -> Queue:
        return self._queue

    @property
    def streams(self) -> list[str]:
        """Names of this queue's issue streams."""
        return list(self._streams)

    def _decode(self, m: Module, rec, out, classes, engines) -> None:
        """``out`` (comb) = the flags of record ``rec``: ``bad`` (a class this queue does not
        run, a landed wait over ``LANDED_BITS``, a WAIT on a counter it does not have, an
        unknown DIR op), ``eng`` (an engine record, not bad), ``is_wait``, ``dir_wait`` (a
        landed wait: its class waits on the directory and ``wait`` ≠ 0), ``is_dir``,
        ``is_mark`` and ``mine`` (bit ``k``: the record goes out on stream ``k``, not bad)."""
        known = Signal()
        with m.Switch(rec.cls), m.Case(*classes):
            m.d.comb += known.eq(1)
        with m.Switch(rec.cls), m.Case(*LANDED_WAIT_CLASSES):
            m.d.comb += out.dir_wait.eq(rec.wait != 0)
        op_ok = Signal()
        with m.Switch(rec.arg), m.Case(*DirOp):
            m.d.comb += op_ok.eq(1)
        m.d.comb += [
            out.is_wait.eq(rec.cls == RecordClass.WAIT),
            out.is_dir.eq(rec.cls == RecordClass.DIR),
            out.is_mark.eq(rec.cls == RecordClass.MARK),
            out.bad.eq(~known | (out.dir_wait & (rec.wait >= (1 << LANDED_BITS))) |
                       (out.is_wait & (rec.arg >= self._n)) | (out.is_dir & ~op_ok)),
        ]
        with m.Switch(rec.cls), m.Case(*engines):
            m.d.comb += out.eng.eq(~out.bad)
        for k, name in enumerate(self._streams):
            cls = next(c for c, n in STREAM_OF.items() if n == name)
            m.d.comb += out.mine[k].eq((rec.cls == cls) & ~out.bad)

    def elaborate(self, platform):
        m = Module()
        st = self.status
        q = self._queue
        classes = [c for c in RecordClass if q in CLASS_QUEUES[c]]
        engines = [c for c in ENGINE_CLASSES if c in classes]

        # the issue slot
        s_valid = Signal()
        s = Signal(CMD)
        committed = Signal()        # offered (valid high), not yet transferred
        kv = data.View(META, s.meta[:META.size]).kv_id

        wd = Signal(COUNTER_BITS)
        halted = Signal()
        skip_req = Signal()
        flushing = Signal()
        pend = Signal(range(self._max_out + 1))
        pend_cls = Signal(RecordClass)
        irq_q = Signal(self._max_out)
        base = Array(Signal(COUNTER_BITS, name=f"base{i}") for i in range(self._n))
        settle = Signal(range(self._dir_settle + 1))
        taken = Signal(COUNTER_BITS)

        # decode: of the record being taken (rec.payload), registered with it into the slot, so
        # the issue logic starts from flip-flops (same cycles as decoding the slot itself)
        dec_l = data.StructLayout({"bad": 1, "eng": 1, "is_wait": 1, "dir_wait": 1, "is_dir": 1,
                                   "is_mark": 1, "mine": len(self._streams)})
        dec = Signal(dec_l)             # the slot's record, decoded
        nxt = Signal(dec_l)             # rec.payload, decoded
        self._decode(m, self.rec.payload, nxt, classes, engines)
        bad, eng, is_wait, dir_wait = dec.bad, dec.eng, dec.is_wait, dec.dir_wait

        # conditions: a WAIT tests the counters as they were in the previous cycle — ``wcond``
        # is registered, computed for the record the slot holds next (issue #35: the two
        # 32-bit carry chains, the subtraction and the compare, end at a flip-flop instead of
        # running on into the handshakes; a WAIT a counter releases leaves a cycle later)
        cidx_bits = max(1, (self._n - 1).bit_length())
        wcond = Signal()
        # a landed wait likewise passes on the directory's answer of the previous cycle, for
        # the record in the slot then (``lcond``, registered: the directory's read and the
        # compare end at a flip-flop, not in the DIR/SEND handshakes; +1 cycle per landed wait)
        lcond = Signal()
        # ``asked``: the directory's answer this cycle is for the slot's kv_id (the lookup
        # presented in the previous cycle was the slot's record's, see ``dir_kv_id``)
        asked = Signal()
        landed_ok = Signal()
        m.d.comb += landed_ok.eq(asked & (settle == 0) & self.dir_fresh &
                                 (self.dir_landed >= s.wait))
        cond = Signal()
        m.d.comb += cond.eq(Mux(is_wait, wcond, ~dir_wait | lcond))
        order_ok = Signal()
        m.d.comb += order_ok.eq((pend == 0) | (eng & (s.cls == pend_cls) &
                                               (pend < self._max_out)))
        active = Signal()
        m.d.comb += active.eq(s_valid & self.enable & ~halted & ~flushing & order_ok)

        # issue
        has_stream = Signal()
        offer = Signal()
        xfer = Signal()
        for k, name in enumerate(self._streams):
            port = getattr(self, name)
            mine = Signal(name=f"is_{name}")
            m.d.comb += mine.eq(dec.mine[k])
            m.d.comb += port.valid.eq(offer & mine)
            with m.If(mine):
                m.d.comb += [has_stream.eq(1), xfer.eq(offer & port.ready)]
            if name == "dir":
                m.d.comb += [port.payload.op.eq(s.arg[:DIR_OP["op"].width]),
                             port.payload.kv_id.eq(kv), port.payload.count.eq(s.wait)]
            else:
                m.d.comb += port.payload.eq(s)
        m.d.comb += offer.eq(has_stream & s_valid & (committed | (active & cond)))
        go_ns = Signal()
        skip_act = Signal()
        leave = Signal()
        waiting = Signal()
        drop_s = Signal()
        m.d.comb += [
            go_ns.eq(active & (bad | (~has_stream & cond))),
            skip_act.eq(s_valid & halted & (self.skip | skip_req) & (pend == 0)),
            leave.eq(xfer | go_ns | skip_act),
            waiting.eq(active & ~committed & ~bad & ~cond),
            drop_s.eq(flushing & s_valid & ~committed),
        ]

        # retire
        imm = Signal()
        done_ret = Signal()
        stray = Signal()
        m.d.comb += imm.eq((xfer & ~eng) | go_ns | skip_act)
        for c in engines:
            done = getattr(self, f"{STREAM_OF[c]}_done")
            mine = (pend != 0) & (pend_cls == c)
            with m.If(done & mine):
                m.d.comb += done_ret.eq(1)
            with m.If(done & ~mine):
                m.d.comb += stray.eq(1)
        m.d.sync += [
            self.irq_mark.eq((imm & ~skip_act & ~bad & s.flags.irq) | (done_ret & irq_q[0])),
            st.retired.eq(st.retired + (imm | done_ret)),
            st.wait_cycles.eq(st.wait_cycles + waiting),
            st.aborted.eq(st.aborted + drop_s + (self.rec.valid & self.rec.ready & flushing)),
            st.bad_runtime.eq(st.bad_runtime + (go_ns & bad) + stray),
        ]
        m.d.comb += [self.retired.eq(st.retired), self.halted.eq(halted)]
        mark_now = Signal()
        m.d.comb += mark_now.eq(go_ns & ~bad & dec.is_mark)
        with m.If(mark_now):
            m.d.sync += st.marks.eq(st.marks + 1)
            for i in range(self._n):
                with m.If(s.arg[i]):
                    m.d.sync += base[i].eq(self.counters[i])

        # engine records outstanding: count, class, irq flags (head at bit 0)
        push = Signal()
        m.d.comb += push.eq(xfer & eng)
        with m.If(push):
            m.d.sync += pend_cls.eq(s.cls)
        slot = Signal(range(self._max_out + 1))
        m.d.comb += slot.eq(pend - done_ret)
        m.d.sync += [
            pend.eq(slot + push),
            irq_q.eq((irq_q >> done_ret) | ((push & s.flags.irq) << slot)),
        ]
        with m.If(xfer & dec.is_dir):
            m.d.sync += settle.eq(self._dir_settle)
        with m.Elif(settle != 0):
            m.d.sync += settle.eq(settle - 1)

        # input, and the directory lookup: the slot's landed wait, else the record at the input
        m.d.comb += [
            self.rec.ready.eq(Mux(flushing, ~(s_valid & committed), ~s_valid | leave)),
            # the slot's kv_id while its record waits on the directory, else the input's: from
            # flip-flops (issue #35: not behind the slot's handshake, ``leave``)
            self.dir_kv_id.eq(Mux(s_valid & dir_wait, kv,
                                  data.View(META, self.rec.payload.meta[:META.size]).kv_id)),
        ]
        take = self.rec.valid & self.rec.ready
        with m.If(take):
            m.d.sync += taken.eq(taken + 1)
        # the WAIT condition of the next cycle's slot: the record staying (``s``) or the one
        # taken (its counter's base zeroed by a MARK retiring now), selected at the end
        nrec = self.rec.payload
        c_s, c_n = s.arg[:cidx_bits], nrec.arg[:cidx_bits]
        cnt_s, cnt_n = Signal(COUNTER_BITS), Signal(COUNTER_BITS)
        m.d.comb += [cnt_s.eq(self.counters[c_s] - base[c_s]),
                     cnt_n.eq(Mux(mark_now & s.arg.bit_select(c_n, 1), 0,
                                  self.counters[c_n] - base[c_n]))]
        m.d.sync += wcond.eq(Mux(take, cnt_n >= nrec.wait, cnt_s >= s.wait))
        with m.If(take & ~flushing):
            # the record taken was looked up now unless the slot presented its own kv_id
            m.d.sync += [s.eq(self.rec.payload), dec.eq(nxt), s_valid.eq(1), committed.eq(0),
                         wd.eq(0), lcond.eq(0), asked.eq(~(s_valid & dir_wait))]
        with m.Elif(leave | drop_s):
            m.d.sync += [s_valid.eq(0), committed.eq(0), lcond.eq(0), asked.eq(0)]
        with m.Else():
            m.d.sync += [committed.eq(offer & ~xfer), wd.eq(wd + waiting),
                         lcond.eq(s_valid & landed_ok), asked.eq(s_valid & dir_wait)]

        # watchdog, skip, abort
        with m.If(waiting & (self.timeout != 0) & (wd >= self.timeout - 1)):
            m.d.sync += [halted.eq(1), st.timeouts.eq(st.timeouts + 1),
                         st.halt_index.eq(taken - 1), st.halt.halted.eq(1),
                         st.halt.queue.eq(q),
                         st.halt.cause.eq(Mux(is_wait, HaltCause.COUNTER, HaltCause.LANDED)),
                         st.halt.kv_id.eq(Mux(is_wait, s.arg[:KV_ID_BITS], kv))]
        with m.If(skip_act):
            m.d.sync += [halted.eq(0), skip_req.eq(0), st.halt.halted.eq(0),
                         st.skipped.eq(st.skipped + 1)]
        with m.Elif(halted & self.skip):
            m.d.sync += skip_req.eq(1)
        with m.If(self.abort):
            m.d.sync += [flushing.eq(1), halted.eq(0), skip_req.eq(0), st.halt.halted.eq(0)]
        with m.Elif(flushing & ~self.enable):
            m.d.sync += flushing.eq(0)
        return m
