"""The node sequencer's contract: what each record field means per class, the counters a WAIT
tests, the status/halt layouts and registers (docs/node.md §3 "The sequencer", §6 "Records";
issue #11; paper §4: the datapath, not the PS, sequences MARS's per-node records). The
cycle-exact golden model is :class:`mcf.golden.sequencer.SequencerModel`.

One :class:`~mcf.abi.node.CMD` record, field by field, per class (``wait`` is the 20-bit
``CMD.wait``; "landed wait" means: the record issues only once the directory says
``landed(meta.kv_id) ≥ wait``, and ``wait = 0`` never waits — the relay rule / data-driven
start; ``meta.kv_id`` is always the bits of ``mcf.abi.META["kv_id"]`` in ``CMD.meta``):

======  ==========================  ==========================================  ====================
class   wait operand                ``arg``                                     issued on / retires
======  ==========================  ==========================================  ====================
NOP     landed wait (0: none)       —                                           — / when it leaves
SEND    landed wait on the packet   — (``meta`` is the packet's ``Meta``,       ``send`` / at the
        ``meta.kv_id``              ``src`` the payload source)                 transfer
DIR     landed wait; also the count ``mcf.abi.directory.DirOp`` code           ``dir`` (a
        a FREE releases             (FREE, DRAIN)                               ``DIR_OP``) / at
                                                                                the transfer
JOB     —                           opaque (template index, tokens): engine's   ``job`` / on
                                                                                ``job_done``
EMIT    landed wait                 opaque: the emitter's                       ``emit`` / on
                                                                                ``emit_done``
ATTEND  landed wait (first block)   opaque: the attention engine's              ``attend`` / on
                                                                                ``attend_done``
WAIT    counter threshold           :class:`SeqCounter` index                   — / when
                                                                                ``counter ≥ wait``
MARK    —                           counter-clear mask: bit ``i`` re-bases      — / when it leaves
                                    counter ``i``; ``seq_marks`` += 1
======  ==========================  ==========================================  ====================

**Counters and MARK (the clear semantics).** The sequencer does not own the counters it tests
(``results_landed``, ``queries_landed``, ``maxes_landed`` are the decode lander's,
``control`` the local sink's, ``OTHER_RETIRED``
is the other queue's ``retired``); each queue keeps a 32-bit *base* per counter, reset to 0.
A WAIT on counter ``c`` is satisfied when ``(counters[c] − base[c]) mod 2^32 ≥ wait`` — the
full 32-bit difference against the zero-extended 20-bit ``wait``. A MARK with bit ``c`` of
``arg`` set loads ``base[c] = counters[c]`` in the cycle it retires, so "clearing" a counter is
local to the queue and nothing outside is written (bits ≥ ``len(SeqCounter)`` are ignored).

**Order.** Records issue and retire in queue order. A JOB/EMIT/ATTEND leaves the issue slot at
its stream transfer and retires on its engine's ``*_done`` strobe (one strobe per record, in
order); up to ``max_outstanding`` records *of the same engine class* may be outstanding, every
other record (and a record of another engine) waits until none are — the record carries no data
dependency between engines, so this fence is what keeps a SEND of an ATTEND's state behind the
ATTEND. Everything else retires when it leaves the issue slot.

**Bad at run time** (``bad_runtime`` += 1, retired unexecuted, no interrupt, the queue runs on):
a class the queue does not run or an unassigned class, a WAIT on a counter index ≥
``len(SeqCounter)``, a landed wait ≥ 2^``LANDED_BITS`` (the directory's count saturates below
it), a DIR with an unassigned ``DirOp``; also (+1 per cycle) an engine ``*_done`` strobe with
no record of that engine outstanding.

**Watchdog, skip, abort.** A record blocked on its wait for ``timeout`` cycles (0: never) halts
the queue: ``halted`` = 1, ``timeouts`` += 1 and :data:`SEQ_HALT` / ``halt_index`` are
latched. A halted queue does nothing (even if the wait becomes true) until ``skip`` (the record
retires unexecuted, ``skipped`` += 1, no interrupt; it takes effect once no engine record is
outstanding) or ``abort``. ``abort`` starts a *flush* (from the next cycle): the record in the
issue slot and every record arriving at the queue's input are taken and dropped (``aborted`` +=
1 each) until ``enable`` is low — the PS writes ``SEQ_CTRL`` = {run, abort}, waits until the
ring is drained (``CMDq_CONS`` = ``CMDq_HEAD``), then clears ``run``, which ends the flush.
Records already offered to a stream (``valid`` high) complete their transfer first (stream rule:
a raised ``valid`` stays until the transfer) and outstanding engine records still retire on
their ``*_done``. Nothing in the flush waits on anything but the clock.
"""

from __future__ import annotations

from amaranth.hdl import unsigned
from amaranth.lib import data, enum

from .meta import META
from .node import N_QUEUES, Queue, RecordClass
from .regs import COUNTER_BITS, Access, Field, Register, counters, status_registers

__all__ = [
    "SeqCounter", "HaltCause", "SEQ_COUNTERS", "SEQ_HALT", "SEQ_STATUS",
    "SEQ_CTRL", "KV_ID_BITS", "ENGINE_CLASSES", "STREAM_OF", "LANDED_WAIT_CLASSES",
    "sequencer_registers", "DEFAULT_DIR_SETTLE",
    "DEFAULT_MAX_OUTSTANDING", "HALT_INDEX_DESC",
]

KV_ID_BITS = META["kv_id"].width


class SeqCounter(enum.Enum, shape=3):
    """The counters a WAIT tests (``CMD.arg``); the node top wires ``counters[i]``."""
    RESULTS_LANDED = 0   # decode results landed (normalised o/l rows in OBUF)
    QUERIES_LANDED = 1   # decode queries landed in QBUF
    CONTROL = 2          # CONTROL packets (barriers) counted by the control sink
    OTHER_RETIRED = 3    # the other queue's ``retired``
    MAXES_LANDED = 4     # two-phase decode: all-reduced maxima landed in MBUF
    SUMS_LANDED = 5      # tensor-parallel decode: SUM all-reduce lanes landed in SUM slots


class HaltCause(enum.Enum, shape=2):
    """Why the watchdog halted a queue."""
    NONE = 0
    COUNTER = 1     # a WAIT record: ``SEQ_HALT.kv_id`` holds the counter index
    LANDED = 2      # a landed wait: ``SEQ_HALT.kv_id`` holds ``meta.kv_id``


ENGINE_CLASSES = (RecordClass.JOB, RecordClass.EMIT, RecordClass.ATTEND)
LANDED_WAIT_CLASSES = (RecordClass.NOP, RecordClass.SEND, RecordClass.DIR, RecordClass.EMIT,
                       RecordClass.ATTEND)
"""Classes whose ``wait`` is a landed wait on ``meta.kv_id``. A NOP with ``wait ≠ 0`` is a
*block barrier*: the driver puts one per KV block an ATTEND reads before the ATTENDs (the record
itself waits on one block only)."""
STREAM_OF: dict[RecordClass, str] = {
    RecordClass.SEND: "send", RecordClass.DIR: "dir", RecordClass.JOB: "job",
    RecordClass.EMIT: "emit", RecordClass.ATTEND: "attend",
}
"""Issue stream (port name) of each class that has one."""

DEFAULT_DIR_SETTLE = 4
DEFAULT_MAX_OUTSTANDING = 4

SEQ_COUNTERS = counters("retired", "marks", "wait_cycles", "timeouts", "skipped", "aborted",
                        "bad_runtime", "halt_index")
"""Records retired (executed, skipped or bad; not aborted), MARKs retired, cycles spent blocked
on a wait, watchdog halts, records skipped by ``SEQ_CTRL.skip``, records dropped by an abort
flush, records bad at run time (and stray ``*_done`` cycles), and — latched at a halt — the
halted record's position in the queue's input since reset (0-based, aborted ones included).

``halt_index`` is **not** a ring index: it counts the records this queue's sequencer took from
its ring reader (retired, aborted, or still outstanding in an engine), so the malformed records
and read errors the reader skipped (``cmd<q>_bad_records``, ``cmd<q>_read_errors``) are not in
it. Its ring index is ``halt_index`` plus the entries the reader skipped before it (mod 2^16):
equal to it when neither counter moved."""

HALT_INDEX_DESC = ("latched at a watchdog halt: the halted record's 0-based position among the "
                   "records this queue's sequencer took since reset (aborted ones included; "
                   "ring entries skipped as malformed or read errors are not) — its ring "
                   "index (mod 2^16) only while cmd<q>_bad_records and cmd<q>_read_errors are 0")

SEQ_HALT = data.StructLayout({
    "halted": unsigned(1),
    "queue": Queue,
    "cause": HaltCause,
    "kv_id": unsigned(KV_ID_BITS),
})
"""Latched at a watchdog halt (``halted`` clears at skip or abort, the rest stays)."""

SEQ_STATUS = data.StructLayout({**{n: f.shape for n, f in SEQ_COUNTERS}, "halt": SEQ_HALT})
"""One queue's status: :data:`SEQ_COUNTERS` then :data:`SEQ_HALT` (registers ``seq<q>_*``)."""

SEQ_CTRL = data.StructLayout({"run": unsigned(1), "skip": unsigned(1), "abort": unsigned(1)})
"""``SEQ<q>_CTRL``: ``run`` (RW; the queue's ``enable`` = ``DIR_READY & run``), ``skip`` and
``abort`` (W: one-cycle strobes)."""


def sequencer_registers(n_queues: int = N_QUEUES) -> list[Register]:
    """``SEQ_TIMEOUT`` (shared watchdog, cycles, 0 = off), per queue ``SEQ<q>_CTRL`` and the
    status registers ``seq<q>_<field>`` (:data:`SEQ_STATUS`). Not yet in the node map."""
    regs = [Register.single("SEQ_TIMEOUT", COUNTER_BITS, Access.RW,
                            desc="sequencer watchdog: cycles a record may wait (0 disables)")]
    for q in range(n_queues):
        regs.append(Register(f"SEQ{q}_CTRL", (
            Field("run", 1, Access.RW, 0, f"queue {q} runs (gated by DIR_READY)"),
            Field("skip", 1, Access.W, desc="halted: retire the waiting record unexecuted"),
            Field("abort", 1, Access.W, desc="flush the queue's input until run is cleared"),
        ), f"sequencer queue {q} control"))
        regs += [Register.single(r.name, r.fields[0].width, Access.R,
                                 desc=f"sequencer queue {q}: "
                                      f"{HALT_INDEX_DESC.replace('<q>', str(q))}")
                 if r.name == f"seq{q}_halt_index" else r
                 for r in status_registers(f"seq{q}", SEQ_STATUS, f"sequencer queue {q}")]
    return regs


if [f.width for _, f in SEQ_CTRL] != [f.width for f in sequencer_registers(1)[1].fields]:
    raise AssertionError("SEQ_CTRL and SEQ<q>_CTRL disagree")  # pragma: no cover
