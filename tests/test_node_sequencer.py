"""The node sequencer (mcf.hdl.node.sequencer, docs/node.md §3).

Every test runs the HDL in lockstep with the cycle-exact golden model
(:class:`mcf.golden.sequencer.SequencerModel`): the same inputs each cycle, every output compared
(``rec.ready``, the directory address, each issue stream's ``valid`` and payload, ``irq_mark``,
``halted``, ``retired``, the whole ``SEQ_STATUS``). The environment (producer with idle
cycles, random ``ready`` on every issue stream, engines with random latencies, a directory
with landings and FREEs, evolving counters, the PS reacting to halts) lives in the testbench,
and independent scoreboards check the issue order, the waits and the interrupt pulses.
"""

from __future__ import annotations

import random

import pytest
from amaranth.sim import Simulator

from mcf.abi.directory import DIR_OP, DirOp
from mcf.abi.landing import LANDED_BITS
from mcf.abi.meta import META, Meta
from mcf.abi.node import CLASS_QUEUES, CMD, Cmd, Queue, RecordClass
from mcf.abi.sequencer import (
    ENGINE_CLASSES,
    LANDED_WAIT_CLASSES,
    SEQ_STATUS,
    STREAM_OF,
    HaltCause,
    SeqCounter,
)
from mcf.golden.sequencer import SeqInputs, SequencerModel
from mcf.hdl.node.sequencer import QueueSequencer

N_CNT = len(SeqCounter)
SETTLE = 3


def rec(cls, queue=Queue.COMPUTE, *, kv=0, wait=0, arg=0, irq=False) -> int:
    return int.from_bytes(Cmd(cls, queue, meta=Meta(kv_id=kv).pack(), wait=wait, arg=arg,
                              irq=irq).pack(), "little")


def field(raw, name):
    f = CMD[name]
    return (raw >> f.offset) & ((1 << f.width) - 1)


def status_dict(bits: int) -> dict:
    out = {}
    for name, f in SEQ_STATUS:
        out[name] = (bits >> f.offset) & ((1 << f.width) - 1)
    halt = out.pop("halt")
    from mcf.abi.sequencer import SEQ_HALT
    for name, f in SEQ_HALT:
        out[f"halt_{name}"] = (halt >> f.offset) & ((1 << f.width) - 1)
    return out


class Env:
    """The sequencer's surroundings, driven per cycle; knobs are probabilities/ranges."""

    def __init__(self, queue, records, *, seed=0, p_idle=0.0, p_bp=0.0, lat=(1, 1),
                 p_land=0.0, kvs=(0,), p_cnt=0.0, p_disable=0.0, timeout=0,
                 landed0=0, counters0=None, free_delay=SETTLE - 1, script=None,
                 skip_delay=None, p_stale=0.0):
        self.q, self.records = queue, records
        self.rng = random.Random(seed)
        self.p_idle, self.p_bp, self.lat = p_idle, p_bp, lat
        self.p_land, self.kvs, self.p_cnt, self.p_disable = p_land, list(kvs), p_cnt, p_disable
        self.timeout = timeout
        self.p_stale = p_stale              # the directory read port not yet fresh
        self.landed: dict[int, int] = {}
        self.landed0 = landed0
        self.skip_delay = skip_delay        # the PS: strobe skip this many cycles after a halt
        self.last_halted = False
        self.counters = list(counters0 or [0] * N_CNT)
        self.free_delay = free_delay
        self.script = script or {}          # cycle -> dict of input overrides
        self.nxt = 0
        self.offering = False
        self.next_landed = landed0
        self.dones: dict[str, list[int]] = {}
        self.frees: dict[int, list[tuple[int, int]]] = {}
        self.halt_seen = None
        self.enable = True
        self.run_bit = True

    def get_landed(self, kv):
        return self.landed.get(kv, self.landed0)

    def inputs(self, t, streams, done_streams) -> SeqInputs:
        rng = self.rng
        if not self.offering and self.nxt < len(self.records) and rng.random() >= self.p_idle:
            self.offering = True
        en = self.run_bit and not (self.p_disable and rng.random() < self.p_disable)
        inp = SeqInputs(
            rec_valid=self.offering, rec=self.records[self.nxt] if self.offering else 0,
            enable=en, dir_landed=self.next_landed, counters=list(self.counters),
            dir_fresh=not (self.p_stale and rng.random() < self.p_stale),
            ready={s: rng.random() >= self.p_bp for s in streams},
            done={s: t in self.dones.get(s, ()) for s in done_streams},
            timeout=self.timeout)
        if self.skip_delay is not None:
            if self.last_halted and self.halt_seen is None:
                self.halt_seen = t
            if self.halt_seen is not None and t == self.halt_seen + self.skip_delay:
                inp.skip, self.halt_seen = True, None
        for k, v in self.script.get(t, {}).items():
            setattr(inp, k, v)
        return inp

    def after(self, t, inp, out):
        """Update the surroundings from this cycle's outputs (visible from the next cycle)."""
        rng = self.rng
        self.last_halted = out.halted
        if inp.rec_valid and out.rec_ready:
            self.offering = False
            self.nxt += 1
        self.next_landed = self.get_landed(out.dir_kv_id)     # synchronous read
        for s, v in out.valid.items():
            if v and inp.ready[s]:
                if s in self.dones_streams:
                    last = self.dones.setdefault(s, [-1])[-1]
                    self.dones[s].append(max(t + rng.randint(*self.lat), last + 1))
                if s == "dir":
                    op = (out.payload[s] >> DIR_OP["op"].offset) & 1
                    kv = (out.payload[s] >> DIR_OP["kv_id"].offset) & 0xFFFF
                    cnt = (out.payload[s] >> DIR_OP["count"].offset) & ((1 << LANDED_BITS) - 1)
                    if op == DirOp.FREE.value:
                        self.frees.setdefault(t + self.free_delay, []).append((kv, cnt))
        for kv, cnt in self.frees.pop(t, ()):
            self.landed[kv] = max(0, self.get_landed(kv) - cnt)
        if self.p_land and rng.random() < self.p_land:
            kv = rng.choice(self.kvs)
            self.landed[kv] = min((1 << LANDED_BITS) - 1, self.get_landed(kv) + 1)
        if self.p_cnt and rng.random() < self.p_cnt:
            c = rng.randrange(N_CNT)
            self.counters[c] = (self.counters[c] + rng.randint(1, 2)) % (1 << 32)


def lockstep(queue, records, env: Env, *, max_cycles=20_000, max_out=4, until=None):
    """Run DUT and model side by side; returns (model, trace) where trace holds per-cycle
    (inputs, outputs)."""
    dut = QueueSequencer(queue, max_outstanding=max_out, dir_settle=SETTLE)
    model = SequencerModel(queue, max_outstanding=max_out, dir_settle=SETTLE)
    streams = dut.streams
    done_streams = [STREAM_OF[c] for c in ENGINE_CLASSES if STREAM_OF[c] in streams]
    env.dones_streams = done_streams
    trace = []

    async def bench(ctx):
        for t in range(max_cycles):
            inp = env.inputs(t, streams, done_streams)
            ctx.set(dut.rec.valid, inp.rec_valid)
            ctx.set(dut.rec.payload.as_value(), inp.rec)
            ctx.set(dut.enable, inp.enable)
            ctx.set(dut.dir_landed, inp.dir_landed)
            ctx.set(dut.dir_fresh, inp.dir_fresh)
            ctx.set(dut.counters.as_value(),
                    sum(v << (32 * i) for i, v in enumerate(inp.counters)))
            for s in streams:
                ctx.set(getattr(dut, s).ready, inp.ready[s])
            for s in done_streams:
                ctx.set(getattr(dut, f"{s}_done"), inp.done[s])
            ctx.set(dut.timeout, inp.timeout)
            ctx.set(dut.skip, inp.skip)
            ctx.set(dut.abort, inp.abort)
            exp = model.step(inp)
            got_valid = {s: bool(ctx.get(getattr(dut, s).valid)) for s in streams}
            assert got_valid == exp.valid, f"cycle {t}: valid {got_valid} != {exp.valid}"
            for s, v in got_valid.items():
                if v:
                    got = ctx.get(getattr(dut, s).payload.as_value())
                    assert got == exp.payload[s], f"cycle {t}: {s} payload"
            assert ctx.get(dut.rec.ready) == exp.rec_ready, f"cycle {t}: rec.ready"
            assert ctx.get(dut.dir_kv_id) == exp.dir_kv_id, f"cycle {t}: dir_kv_id"
            assert ctx.get(dut.irq_mark) == exp.irq_mark, f"cycle {t}: irq_mark"
            assert ctx.get(dut.halted) == exp.halted, f"cycle {t}: halted"
            assert ctx.get(dut.retired) == exp.retired, f"cycle {t}: retired"
            got_st = ctx.get(dut.status.as_value())
            assert got_st == exp.status, \
                f"cycle {t}: status {status_dict(got_st)} != {status_dict(exp.status)}"
            trace.append((inp, exp))
            env.after(t, inp, exp)
            await ctx.tick()
            if until is not None and until(model, env):
                break

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return model, trace


def all_done(n):
    def check(model, env):
        return model.st["retired"] + model.st["aborted"] >= n and not model.s_valid
    return check


def random_records(rng, queue, n, *, p_bad=0.05, kvs=(0, 1, 2, 3), p_never=0.0):
    """Random records of every class ``queue`` runs; ``p_bad``: bad at run time; ``p_never``:
    a wait nothing satisfies (kv_id 9 never lands, or a counter threshold out of reach)."""
    classes = [c for c in RecordClass if queue in {Queue.COMPUTE} or
               c in (RecordClass.NOP, RecordClass.SEND, RecordClass.WAIT, RecordClass.MARK)]
    out = []
    for _ in range(n):
        cls = rng.choice(classes)
        never = rng.random() < p_never
        kv = 9 if never else rng.choice(kvs)
        wait = rng.choice([1, 2] if never else [0, 0, 1, 2, 3])
        arg = rng.getrandbits(32)
        if cls is RecordClass.WAIT:
            arg = rng.randrange(N_CNT)
            wait = 1000 if never else wait
        elif cls is RecordClass.MARK:
            arg = rng.getrandbits(N_CNT) if rng.random() < 0.5 else 0
        elif cls is RecordClass.DIR:
            arg = rng.choice(list(DirOp)).value
        raw = rec(cls, queue, kv=kv, wait=wait, arg=arg, irq=rng.random() < 0.3)
        if rng.random() < p_bad:
            bad = rng.randrange(4)
            if bad == 0:      # unassigned class (or one the NET queue does not run)
                c = rng.choice([8, 15] + ([2, 3, 4, 5] if queue is Queue.NET else []))
                raw = (raw & ~(0xF << CMD["cls"].offset)) | (c << CMD["cls"].offset)
            elif bad == 1:    # WAIT on an unassigned counter
                raw = rec(RecordClass.WAIT, queue, arg=rng.randint(N_CNT, 1 << 32 - 1), wait=1)
            elif bad == 2:    # a landed wait no count reaches
                raw = rec(RecordClass.SEND, queue, kv=kv,
                          wait=rng.randint(1 << LANDED_BITS, (1 << 20) - 1))
            else:             # DIR with an unassigned op (or an unassigned class on NET)
                raw = rec(RecordClass.DIR, Queue.COMPUTE, kv=kv, wait=1, arg=rng.randint(2, 9))
                if queue is Queue.NET:
                    raw = (raw & ~(1 << CMD["queue"].offset))
        out.append(raw)
    return out


def check_stream_rule(trace):
    """Once ``valid`` is high it stays high, with the same payload, until ``ready``."""
    for (inp, out), (_, nxt) in zip(trace, trace[1:]):
        for name, v in out.valid.items():
            if v and not inp.ready[name]:
                assert nxt.valid[name] and nxt.payload[name] == out.payload[name]


def check_order(model, records, queue):
    """Independent of the model's internals: retire order is input order; each stream's
    issue order is input order; every issued record went to its class's stream."""
    idx = [i for _, i in model.retired_log]
    assert idx == sorted(idx) and len(set(idx)) == len(idx)
    by_stream: dict[str, list[int]] = {}
    for _, s, i in model.issued:
        by_stream.setdefault(s, []).append(i)
        assert STREAM_OF[RecordClass(field(records[i], "cls"))] == s
    for lst in by_stream.values():
        assert lst == sorted(lst)


@pytest.mark.parametrize("queue", list(Queue))
@pytest.mark.parametrize("seed", [1, 2])
def test_random_streams_lockstep(queue, seed):
    rng = random.Random(seed)
    n = 400
    records = random_records(rng, queue, n, p_never=0.04)
    env = Env(queue, records, seed=seed, p_idle=0.3, p_bp=0.3, lat=(1, 12), p_land=0.3,
              kvs=(0, 1, 2, 3), p_cnt=0.2, p_disable=0.05, timeout=150,
              skip_delay=rng.randint(0, 5), p_stale=0.25 if seed == 2 else 0.0)
    model, trace = lockstep(queue, records, env, max_cycles=30_000, until=all_done(n))
    st = model.st
    assert st["retired"] == n and st["aborted"] == 0
    check_order(model, records, queue)
    check_stream_rule(trace)
    runs = {c.value for c in RecordClass if queue in CLASS_QUEUES[c]}
    assert runs <= {field(r, "cls") for r in records}
    assert st["wait_cycles"] > 0 and st["bad_runtime"] > 0 and st["marks"] > 0
    assert st["timeouts"] == st["skipped"] > 0
    # irq pulses: one per executed (not bad, not skipped) irq record, the cycle after it retired
    pulses = [t for t, (_, out) in enumerate(trace) if out.irq_mark]
    expect = [t + 1 for t, i in model.retired_log if field(records[i], "flags") & 1
              and not _unexecuted(model, records, i) and i not in model.skipped_log
              and t + 1 < len(trace)]
    assert pulses == expect
    # landed waits: a record is first offered only when the directory said landed ≥ wait,
    # on a fresh read, in the cycle before (the condition is a register), for the record's
    # own kv_id (the lookup presented the cycle before that)
    for t, (_, out) in enumerate(trace):
        for s, v in out.valid.items():
            if v and s != "dir" and (t == 0 or not trace[t - 1][1].valid[s]):
                raw = out.payload[s]
                if RecordClass(field(raw, "cls")) in LANDED_WAIT_CLASSES and field(raw, "wait"):
                    before = trace[t - 1][0]
                    assert t > 1 and before.dir_landed >= field(raw, "wait")
                    assert before.dir_fresh
                    kv = (field(raw, "meta") >> META["kv_id"].offset) & 0xFFFF
                    assert trace[t - 2][1].dir_kv_id == kv, f"cycle {t}: another kv_id's count"
    print(f"queue {queue.name}: {n} records in {len(trace)} cycles, {st['timeouts']} halts")


@pytest.mark.parametrize("queue", list(Queue))
def test_random_abort(queue):
    """An abort at a random moment of a random stream under backpressure: every record either
    retires or is dropped, the queue runs again after run is cleared and set."""
    rng = random.Random(7 + queue.value)
    n = 200
    records = random_records(rng, queue, n, p_never=0.02)
    env = Env(queue, records, seed=3, p_idle=0.2, p_bp=0.4, lat=(1, 20), p_land=0.3,
              p_cnt=0.2, timeout=60, skip_delay=3)
    t_abort = rng.randint(150, 300)
    orig = env.inputs

    def inputs(t, streams, done_streams):
        env.run_bit = not t_abort + 40 <= t < t_abort + 45
        inp = orig(t, streams, done_streams)
        inp.abort = t == t_abort
        return inp
    env.inputs = inputs
    tail = [rec(RecordClass.MARK, queue, irq=True) for _ in range(5)]
    env.records = records + tail
    model, trace = lockstep(queue, records, env, max_cycles=20_000,
                            until=all_done(n + len(tail)))
    st = model.st
    assert st["aborted"] > 0 and st["retired"] + st["aborted"] == n + len(tail)
    # nothing after the abort's end was dropped: the tail ran
    assert [i for _, i in model.retired_log[-5:]] == list(range(n, n + 5))
    check_order(model, env.records, queue)
    check_stream_rule(trace)


def _unexecuted(model, records, i):
    cls = field(records[i], "cls")
    return model._bad(cls, field(records[i], "wait"), field(records[i], "arg"))


@pytest.mark.parametrize("wait", [0, 1])
def test_header_only_send_rate(wait):
    """N header-only SENDs, a producer that never idles, always-ready streams: one record
    retires per cycle with ``wait = 0``; with landed waits already satisfied (each on another
    ``kv_id`` than the one before) one per 3 cycles — the next record's lookup is presented
    once the landed wait before it has left the slot, and a landed wait passes on the
    directory's answer of the previous cycle, for its own ``kv_id`` (registered, issue #35);
    the model's cycle count is deterministic and matches."""
    n = 300
    records = [rec(RecordClass.SEND, Queue.NET, kv=i % 7, wait=wait) for i in range(n)]
    ref = SequencerModel(Queue.NET, dir_settle=SETTLE)
    cycles = ref.run(records)
    env = Env(Queue.NET, records, landed0=1)
    model, trace = lockstep(Queue.NET, records, env, until=all_done(n))
    sends = [t for t, (inp, out) in enumerate(trace) if out.valid["send"] and inp.ready["send"]]
    assert len(sends) == n
    step, first = (3, 2) if wait else (1, 1)          # back to back from cycle 1 (wait = 0)
    assert sends == list(range(first, first + step * n, step))
    assert len(trace) == cycles == sends[-1] + 1
    rate = n / (sends[-1] - sends[0] + step)
    assert rate == 1 / step
    print(f"header-only SEND, wait={wait}: {n} records in {cycles} cycles, "
          f"{rate:.2f} records/cycle")


def test_watchdog_halt_then_skip():
    timeout = 40
    records = [rec(RecordClass.NOP), rec(RecordClass.SEND, kv=7, wait=2, irq=True),
               rec(RecordClass.MARK, irq=True), rec(RecordClass.WAIT, arg=2, wait=5)]
    env = Env(Queue.COMPUTE, records, timeout=timeout, landed0=1, skip_delay=7)
    model, trace = lockstep(Queue.COMPUTE, records, env, max_cycles=400)
    st = status_dict(trace[-1][1].status)
    # the SEND (index 1) waited `timeout` cycles, halted, was skipped: never issued
    assert [i for _, _, i in model.issued] == []
    assert st["timeouts"] == 2 and st["skipped"] == 2     # the WAIT (counter 2 stays 0) too
    assert st["retired"] == 4 and st["marks"] == 1 and st["bad_runtime"] == 0
    assert st["halt_halted"] == 0 and st["halt_cause"] == HaltCause.COUNTER.value
    assert st["halt_kv_id"] == SeqCounter.CONTROL.value and st["halt_index"] == 3
    first = next(t for t, (_, o) in enumerate(trace) if o.halted)
    assert first == 2 + timeout                      # offered from cycle 2; halted after
    s_first = status_dict(trace[first][1].status)
    assert (s_first["halt_cause"], s_first["halt_kv_id"], s_first["halt_index"]) == (
        HaltCause.LANDED.value, 7, 1)
    assert sum(o.irq_mark for _, o in trace) == 1        # the MARK's; skipped SEND: none


def test_abort_flushes_until_run_clears():
    records = [rec(RecordClass.JOB, arg=1), rec(RecordClass.SEND, kv=3, wait=1)] + \
        [rec(RecordClass.NOP) for _ in range(6)] + [rec(RecordClass.MARK, irq=True)]
    # the SEND never lands: the queue halts; abort at 100, run cleared at 130 (ends the
    # flush), set again at 140 — nothing is left then, except records that arrive after
    script = {100: {"abort": True}}
    env = Env(Queue.COMPUTE, records, timeout=30, lat=(50, 50), script=script)
    env.p_idle = 0.0
    late = [rec(RecordClass.MARK, irq=True), rec(RecordClass.SEND, wait=0)]
    orig_inputs = env.inputs

    def inputs(t, streams, done_streams):
        if t == 120:
            env.records = env.records + late     # arrive during the flush → dropped
        if t == 130:
            env.run_bit = False
        if t == 140:
            env.run_bit = True
            env.records = env.records + late     # after the flush → executed
        return orig_inputs(t, streams, done_streams)
    env.inputs = inputs
    model, trace = lockstep(Queue.COMPUTE, records, env, max_cycles=200)
    st = status_dict(trace[-1][1].status)
    # JOB retired (its done came during the wait), SEND halted, then dropped with the 7 behind
    # it and the 2 late ones; the 2 after the flush run
    assert st["timeouts"] == 1 and st["skipped"] == 0
    assert st["aborted"] == 1 + 7 + 2
    assert st["retired"] == 1 + 2 and st["marks"] == 1
    assert [s for _, s, _ in model.issued] == ["job", "send"]
    assert not trace[-1][1].halted and not model.flushing


@pytest.mark.parametrize("counter", list(SeqCounter))
def test_wait_on_every_counter(counter):
    """WAIT(c, 3) blocks until counter c has risen by 3 since the last MARK that cleared it;
    the other counters do not matter."""
    c = counter.value
    records = [rec(RecordClass.MARK, arg=1 << c), rec(RecordClass.WAIT, arg=c, wait=3),
               rec(RecordClass.MARK, arg=1 << c), rec(RecordClass.WAIT, arg=c, wait=2, irq=True),
               rec(RecordClass.NOP)]
    bumps = {20: c, 25: (c + 1) % N_CNT, 30: c, 40: c, 60: (c + 2) % N_CNT, 70: c, 90: c}
    counters0 = [100 * (i + 1) for i in range(N_CNT)]
    env = Env(Queue.NET, records, counters0=counters0)
    orig = env.after

    def after(t, inp, out):
        orig(t, inp, out)
        if t in bumps:
            env.counters[bumps[t]] += 1
    env.after = after
    model, trace = lockstep(Queue.NET, records, env, max_cycles=120)
    ret = dict((i, t) for t, i in model.retired_log)
    # counter c reaches +3 after the bump at cycle 40 (visible at 41, seen by the WAIT, which
    # tests the previous cycle's counters, at 42); the MARK clears at 43; +2 more after the
    # bump at 90 (visible at 91, seen at 92)
    assert ret == {0: 1, 1: 42, 2: 43, 3: 92, 4: 93}
    assert [t for t, (_, o) in enumerate(trace) if o.irq_mark] == [93]
    assert model.base[c] == counters0[c] + 3


def test_dir_settle_and_payload():
    """A DIR FREE's payload is {op, kv_id, count = wait}; a landed wait behind it uses only
    directory reads at least dir_settle cycles after the DIR transfer."""
    records = [rec(RecordClass.DIR, kv=5, wait=2, arg=DirOp.FREE.value),
               rec(RecordClass.SEND, kv=5, wait=2)]
    env = Env(Queue.COMPUTE, records, landed0=4)
    model, trace = lockstep(Queue.COMPUTE, records, env, max_cycles=30)
    (t_dir, _, _), (t_send, _, _) = model.issued
    # both landed waits (a DIR's count is its wait) pass on the previous cycle's answer
    assert t_dir == 2 and t_send == t_dir + SETTLE + 2
    dir_word = trace[t_dir][1].payload["dir"]
    assert DIR_OP.from_bits(dir_word).kv_id == 5 and DIR_OP.from_bits(dir_word).count == 2
    # the directory applied the FREE (4 → 2): still ≥ 2, the SEND goes; with 3 it would not
    records[1] = rec(RecordClass.SEND, kv=5, wait=3)
    env = Env(Queue.COMPUTE, records, landed0=4)
    model, _ = lockstep(Queue.COMPUTE, records, env, max_cycles=60)
    assert [s for _, s, _ in model.issued] == ["dir"]


def test_engine_records_outstanding_and_irq():
    """Same-engine records pipeline up to max_outstanding; a different class waits for all of
    them; each retires on its own done strobe; irq pulses follow the flagged ones."""
    records = [rec(RecordClass.JOB, irq=i == 1) for i in range(6)] + \
        [rec(RecordClass.EMIT, irq=True), rec(RecordClass.SEND)]
    env = Env(Queue.COMPUTE, records, lat=(10, 10))
    model, trace = lockstep(Queue.COMPUTE, records, env, max_cycles=120, max_out=4)
    iss = [(t, s) for t, s, _ in model.issued]
    assert iss[:4] == [(1, "job"), (2, "job"), (3, "job"), (4, "job")]
    assert iss[4] == (12, "job")                 # the first JOB's done at 11 frees a slot
    ret = [t for t, _ in model.retired_log]
    emit_t = iss[6][0]
    assert emit_t > ret[5] and iss[7][0] > ret[6]
    pulses = [t for t, (_, o) in enumerate(trace) if o.irq_mark]
    assert pulses == [ret[1] + 1, ret[6] + 1]


@pytest.mark.parametrize("settle", [0, 1])
def test_with_directory(settle):
    """The sequencer against the real ``Directory``: the DIR stream feeds ``Directory.op``, the
    read port answers the landed waits. A FREE that brings kv 5 from 4 to 2 packets must hold
    a following SEND that waits for 3 until a third packet lands again, with ``dir_settle = 1``
    (the directory's update reaches its read ports 2 cycles after the op is accepted) and, here,
    with ``dir_settle = 0`` too: the SEND's lookup is presented once the DIR (a landed wait
    itself) has left the slot and its landed condition is a register, 3 cycles in all — more
    than the directory's 2 (in the node top the ops reach the directory through slices,
    ``DIR_OP_DELAY`` = 6, so ``dir_settle`` = 7 stays what holds a SEND there)."""
    from amaranth import Module
    from amaranth.lib import wiring

    from mcf.hdl.node.directory import Directory

    top = Module()
    top.submodules.seq = seq = QueueSequencer(Queue.COMPUTE, dir_settle=settle)
    top.submodules.dir = dr = Directory(kv_count=16, n_read=1)
    wiring.connect(top, seq.dir, dr.op)
    top.d.comb += [dr.read0.kv_id.eq(seq.dir_kv_id), seq.dir_landed.eq(dr.read0.landed),
                   seq.dir_fresh.eq(dr.read0.fresh), seq.enable.eq(dr.ready)]
    records = [rec(RecordClass.DIR, kv=5, wait=2, arg=DirOp.FREE.value),
               rec(RecordClass.SEND, kv=5, wait=3)]
    log = {}

    async def land(ctx, kv):
        ctx.set(dr.land.payload.kv_id, kv)
        ctx.set(dr.land.valid, 1)
        await ctx.tick().until(dr.land.ready)
        ctx.set(dr.land.valid, 0)

    async def bench(ctx):
        ctx.set(seq.send.ready, 1)
        await ctx.tick().until(dr.ready)
        for _ in range(4):
            await land(ctx, 5)
        for raw in records:
            ctx.set(seq.rec.payload.as_value(), raw)
            ctx.set(seq.rec.valid, 1)
            await ctx.tick().until(seq.rec.ready)
        ctx.set(seq.rec.valid, 0)
        for t in range(40):
            if ctx.get(seq.send.valid):
                log.setdefault("send", t)
            await ctx.tick()
        log["early"] = "send" in log
        await land(ctx, 5)
        for t in range(10):
            if ctx.get(seq.send.valid):
                log.setdefault("late", t)
            await ctx.tick()
        log["status"] = ctx.get(dr.status.frees)

    sim = Simulator(top)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert log["status"] == 1
    assert not log["early"] and "late" in log
