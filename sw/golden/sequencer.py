"""Cycle-exact golden model of one node sequencer queue
(``mcf.hdl.node.sequencer.QueueSequencer``). The record fields per class, the counters, MARK,
the order, the watchdog, skip and abort are specified in :mod:`mcf.abi.sequencer`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from amaranth.lib import data

from mcf.abi.csrmap import COUNTER_BITS
from mcf.abi.directory import DIR_OP, DirOp
from mcf.abi.landing import LANDED_BITS
from mcf.abi.meta import META
from mcf.abi.node import CLASS_QUEUES, CMD, CMD_FLAGS, Queue, RecordClass
from mcf.abi.sequencer import (
    DEFAULT_DIR_SETTLE,
    DEFAULT_MAX_OUTSTANDING,
    ENGINE_CLASSES,
    KV_ID_BITS,
    LANDED_WAIT_CLASSES,
    SEQ_COUNTERS,
    SEQ_HALT,
    SEQ_STATUS,
    STREAM_OF,
    HaltCause,
    SeqCounter,
)

_LANDED_WAIT_CODES = frozenset(c.value for c in LANDED_WAIT_CLASSES)
"""The codes of :data:`LANDED_WAIT_CLASSES` (looked up every modelled cycle)."""

__all__ = ["SeqInputs", "SeqOutputs", "SequencerModel"]


def _fld(raw: int, layout, name: str) -> int:
    f = layout[name]
    return (raw >> f.offset) & ((1 << f.width) - 1)


def _pack(layout: data.StructLayout, values: dict[str, int]) -> int:
    return sum((values[n] & ((1 << f.width) - 1)) << f.offset for n, f in layout)


@dataclass
class SeqInputs:
    """One cycle's inputs of a :class:`SequencerModel` (the HDL ports of the same names)."""
    rec_valid: bool = False
    rec: int = 0                        # the CMD record, raw 128 bits
    enable: bool = True
    dir_landed: int = 0
    dir_fresh: bool = True              # dir_landed is the entry of last cycle's dir_kv_id
    counters: Sequence[int] = ()
    ready: dict[str, bool] = field(default_factory=dict)
    done: dict[str, bool] = field(default_factory=dict)
    timeout: int = 0
    skip: bool = False
    abort: bool = False


@dataclass
class SeqOutputs:
    """One cycle's outputs: ``valid``/``payload`` per issue stream (payload only when valid)."""
    rec_ready: bool
    dir_kv_id: int
    valid: dict[str, bool]
    payload: dict[str, int]
    irq_mark: bool
    halted: bool
    retired: int
    status: int                         # SEQ_STATUS packed


class SequencerModel:
    """Cycle-exact golden model of one :class:`mcf.hdl.node.sequencer.QueueSequencer`.

    :meth:`step` takes one cycle's inputs, returns the outputs the hardware shows in that cycle
    and advances to the next; the tests run it in lockstep with the HDL. :meth:`run` drives it
    from a record list, a directory/counter oracle and engine latencies and returns the issue
    and retire order with cycles. The ``issued`` and ``retired_log`` lists record
    ``(cycle, stream or "", record index)`` as they happen."""

    def __init__(self, queue: Queue, n_counters: int = len(SeqCounter),
                 max_outstanding: int = DEFAULT_MAX_OUTSTANDING,
                 dir_settle: int = DEFAULT_DIR_SETTLE):
        self.queue, self.n = Queue(queue), n_counters
        self.max_out, self.dir_settle = max_outstanding, dir_settle
        self.streams = [s for c, s in STREAM_OF.items() if self.queue in CLASS_QUEUES[c]]
        self.done_streams = [STREAM_OF[c] for c in ENGINE_CLASSES
                             if self.queue in CLASS_QUEUES[c]]
        self.s_valid = False
        self.s = 0
        self.committed = False
        self.wd = 0
        self.halted = False
        self.skip_req = False
        self.flushing = False
        self.pend = 0
        self.pend_cls = 0
        self.irq_q = 0
        self.base = [0] * n_counters
        self.prev_counters = [0] * n_counters
        self.lcond = False              # the slot's landed wait held in the previous cycle
        self.asked = False              # this cycle's directory answer is for the slot's kv_id
        self.settle = 0
        self.taken = 0
        self.irq_mark = False
        self.st = {n: 0 for n, _ in SEQ_COUNTERS}
        self.halt = {"halted": 0, "queue": 0, "cause": 0, "kv_id": 0}
        self.cycle = 0
        self.issued: list[tuple[int, str, int]] = []
        self.retired_log: list[tuple[int, int]] = []
        self.skipped_log: list[int] = []
        self._s_idx = -1
        self._pend_idx: list[int] = []

    def status_bits(self) -> int:
        """The :data:`SEQ_STATUS` word the hardware shows."""
        halt = _pack(SEQ_HALT, self.halt)
        return _pack(SEQ_STATUS, {**self.st, "halt": halt})

    def _bad(self, cls: int, wait: int, arg: int) -> bool:
        known = cls in {c.value for c in RecordClass} and \
            self.queue in CLASS_QUEUES[RecordClass(cls)]
        if not known:
            return True
        rc = RecordClass(cls)
        if rc in LANDED_WAIT_CLASSES and wait >= (1 << LANDED_BITS):
            return True
        if rc is RecordClass.WAIT and arg >= self.n:
            return True
        return rc is RecordClass.DIR and arg not in {o.value for o in DirOp}

    def step(self, i: SeqInputs) -> SeqOutputs:
        s = self.s
        cls, wait, arg = _fld(s, CMD, "cls"), _fld(s, CMD, "wait"), _fld(s, CMD, "arg")
        irq = _fld(_fld(s, CMD, "flags"), CMD_FLAGS, "irq")
        kv = _fld(_fld(s, CMD, "meta"), META, "kv_id")
        bad = self._bad(cls, wait, arg)
        rc = None if bad else RecordClass(cls)
        eng = rc in ENGINE_CLASSES
        stream = STREAM_OF.get(rc)
        is_wait = cls == RecordClass.WAIT.value
        dir_wait = cls in _LANDED_WAIT_CODES and wait != 0
        if is_wait:
            c = arg % (1 << max(1, (self.n - 1).bit_length()))
            # the counters of the previous cycle (the hardware registers the condition)
            cnt = self.prev_counters[c] - self.base[c] if c < self.n else 0   # c ≥ n: bad
            cond = cnt % (1 << COUNTER_BITS) >= wait
        else:
            # a landed wait passes on the directory's answer of the previous cycle, for the
            # record in the slot then (the hardware registers the condition)
            cond = not dir_wait or self.lcond
        landed_ok = (self.asked and self.settle == 0 and i.dir_fresh
                     and i.dir_landed >= wait % (1 << LANDED_BITS))
        order_ok = self.pend == 0 or (eng and cls == self.pend_cls and self.pend < self.max_out)
        active = self.s_valid and i.enable and not self.halted and not self.flushing and order_ok
        offer = stream is not None and self.s_valid and (self.committed or (active and cond))
        xfer = offer and i.ready.get(stream, False)
        go_ns = active and (bad or (stream is None and cond))
        skip_act = self.s_valid and self.halted and (i.skip or self.skip_req) and self.pend == 0
        leave = xfer or go_ns or skip_act
        waiting = active and not self.committed and not bad and not cond
        drop_s = self.flushing and self.s_valid and not self.committed
        imm = (xfer and not eng) or go_ns or skip_act
        pstream = STREAM_OF.get(RecordClass(self.pend_cls)) if self.pend else None
        done_ret = self.pend > 0 and i.done.get(pstream, False)
        stray = any(i.done.get(d, False) for d in self.done_streams if not
                    (done_ret and d == pstream))
        retire = imm or done_ret
        irq_next = (imm and not skip_act and not bad and bool(irq)) or \
            (done_ret and bool(self.irq_q & 1))
        if self.flushing:
            rec_ready = not (self.s_valid and self.committed)
        else:
            rec_ready = not self.s_valid or leave
        dir_kv = kv if (self.s_valid and dir_wait) else \
            _fld(_fld(i.rec, CMD, "meta"), META, "kv_id")
        valid = {n: offer and n == stream for n in self.streams}
        payload = {}
        if offer:
            payload[stream] = s if stream != "dir" else \
                _pack(DIR_OP, {"op": arg, "kv_id": kv, "count": wait})
        out = SeqOutputs(rec_ready, dir_kv, valid, payload, self.irq_mark, self.halted,
                         self.st["retired"], self.status_bits())

        # ---- next state
        cyc = self.cycle
        take = i.rec_valid and rec_ready
        load = take and not self.flushing
        in_drop = take and self.flushing
        if xfer:
            self.issued.append((cyc, stream, self._s_idx))
            if eng:
                self._pend_idx.append(self._s_idx)
        if imm:
            self.retired_log.append((cyc, self._s_idx))
        if done_ret:
            self.retired_log.append((cyc, self._pend_idx.pop(0)))
        halt_now = waiting and i.timeout != 0 and self.wd >= i.timeout - 1
        if halt_now:
            self.halted = True
            self.st["timeouts"] += 1
            self.st["halt_index"] = (self.taken - 1) % (1 << COUNTER_BITS)
            self.halt = {"halted": 1, "queue": self.queue.value,
                         "cause": (HaltCause.COUNTER if is_wait else HaltCause.LANDED).value,
                         "kv_id": arg % (1 << KV_ID_BITS) if is_wait else kv}
        if skip_act:
            self.halted, self.skip_req = False, False
            self.halt["halted"] = 0
            self.st["skipped"] += 1
            self.skipped_log.append(self._s_idx)
        elif self.halted and i.skip:
            self.skip_req = True
        if i.abort:
            self.flushing, self.halted, self.skip_req = True, False, False
            self.halt["halted"] = 0
        elif self.flushing and not i.enable:
            self.flushing = False
        self.st["wait_cycles"] += waiting
        self.st["aborted"] += int(drop_s) + int(in_drop)
        self.st["bad_runtime"] += int(go_ns and bad) + int(stray)
        self.st["retired"] += retire
        if go_ns and not bad and rc is RecordClass.MARK:
            self.st["marks"] += 1
            for c in range(self.n):
                if arg >> c & 1:
                    self.base[c] = i.counters[c]
        for k in self.st:
            self.st[k] %= 1 << COUNTER_BITS
        if xfer and eng:
            self.pend_cls = cls
        shift = self.irq_q >> 1 if done_ret else self.irq_q
        if xfer and eng:
            shift |= irq << (self.pend - int(done_ret))
        self.irq_q = shift
        self.pend += int(xfer and eng) - int(done_ret)
        self.settle = self.dir_settle if (xfer and rc is RecordClass.DIR) else \
            max(self.settle - 1, 0)
        if take:
            self.taken = (self.taken + 1) % (1 << COUNTER_BITS)
        if load:
            # the record taken was looked up now unless the slot presented its own kv_id
            self.asked = not (self.s_valid and dir_wait)
            self.s, self.s_valid, self.committed, self.wd = i.rec, True, False, 0
            self._s_idx = self.taken - 1
            self.lcond = False
        elif leave or drop_s:
            self.s_valid, self.committed, self.lcond, self.asked = False, False, False, False
        else:
            self.committed = offer and not xfer
            self.wd = (self.wd + int(waiting)) % (1 << COUNTER_BITS)
            self.lcond = self.s_valid and landed_ok
            self.asked = self.s_valid and dir_wait
        self.irq_mark = irq_next
        self.prev_counters = [int(x) for x in i.counters] or [0] * self.n
        self.cycle += 1
        return out

    def run(self, records: Sequence[int], *, landed: Callable[[int, int], int] | None = None,
            counters: Callable[[int], Sequence[int]] | None = None,
            latency: Callable[[int], int] | None = None,
            ready: Callable[[str, int], bool] | None = None, timeout: int = 0,
            max_cycles: int = 1_000_000) -> int:
        """Run ``records`` (raw CMD ints, offered back to back from cycle 0) until all retired
        (or ``max_cycles``) against an oracle: ``landed(kv_id, cycle)`` (the directory, read
        one cycle late like the synchronous memory), ``counters(cycle)``, engine
        ``latency(record index)`` (≥ 1 cycles from the transfer to ``*_done``) and stream
        ``ready(name, cycle)``; defaults: everything landed, counters 0, latency 1, always
        ready. Returns the cycle count; see ``issued`` and ``retired_log``."""
        landed = landed or (lambda kv, t: (1 << LANDED_BITS) - 1)
        counters = counters or (lambda t: [0] * self.n)
        latency = latency or (lambda idx: 1)
        ready = ready or (lambda name, t: True)
        nxt, kv_prev = 0, 0
        dones: dict[str, set[int]] = {}
        last_done: dict[str, int] = {}
        for t in range(max_cycles):
            if len(self.retired_log) >= len(records):
                return t
            inp = SeqInputs(rec_valid=nxt < len(records),
                            rec=records[nxt] if nxt < len(records) else 0,
                            dir_landed=landed(kv_prev, t - 1), counters=counters(t),
                            ready={s: ready(s, t) for s in self.streams},
                            done={s: t in dones.get(s, ()) for s in self.done_streams},
                            timeout=timeout)
            n_iss = len(self.issued)
            out = self.step(inp)
            kv_prev = out.dir_kv_id
            if inp.rec_valid and out.rec_ready:
                nxt += 1
            for cyc, stream, idx in self.issued[n_iss:]:
                if stream in self.done_streams:     # one strobe per record, in order
                    at = max(cyc + max(1, latency(idx)), last_done.get(stream, -1) + 1)
                    last_done[stream] = at
                    dones.setdefault(stream, set()).add(at)
        raise RuntimeError("SequencerModel.run: records did not retire")
