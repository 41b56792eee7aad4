"""mcf.abi.sequencer: layouts, registers and the golden model on its own (no HDL)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcf.abi.csrmap import COUNTER_BITS, node_regmap
from mcf.abi.directory import DIR_OP, DirOp
from mcf.abi.landing import LANDED_BITS
from mcf.abi.meta import Meta
from mcf.abi.node import CMD, Cmd, Queue, RecordClass
from mcf.abi.regs import Access, RegisterMap
from mcf.abi.sequencer import (
    SEQ_COUNTERS,
    SEQ_CTRL,
    SEQ_HALT,
    SEQ_STATUS,
    STREAM_OF,
    HaltCause,
    SeqCounter,
    sequencer_registers,
)
from mcf.golden.sequencer import SeqInputs, SequencerModel


def rec(cls, queue=Queue.COMPUTE, *, kv=0, wait=0, arg=0, irq=False) -> int:
    return int.from_bytes(Cmd(cls, queue, meta=Meta(kv_id=kv).pack(), wait=wait, arg=arg,
                              irq=irq).pack(), "little")


def test_counters_and_layouts():
    assert [c.name for c in SeqCounter] == ["RESULTS_LANDED", "QUERIES_LANDED", "CONTROL",
                                             "OTHER_RETIRED", "MAXES_LANDED", "SUMS_LANDED"]
    names = [n for n, _ in SEQ_COUNTERS]
    assert names == ["retired", "marks", "wait_cycles", "timeouts", "skipped", "aborted",
                     "bad_runtime", "halt_index"]
    assert all(f.width == COUNTER_BITS for _, f in SEQ_COUNTERS)
    assert SEQ_HALT.size <= 32 and SEQ_HALT["kv_id"].width == 16
    assert [n for n, _ in SEQ_STATUS] == names + ["halt"]
    assert [n for n, _ in SEQ_CTRL] == ["run", "skip", "abort"]


def test_registers_fit_the_node_map():
    regs = sequencer_registers()
    assert regs[0].name == "SEQ_TIMEOUT" and regs[0].fields[0].access is Access.RW
    for q in range(2):
        ctrl = next(r for r in regs if r.name == f"SEQ{q}_CTRL")
        assert [(f.name, f.access) for f in ctrl.fields] == [
            ("run", Access.RW), ("skip", Access.W), ("abort", Access.W)]
        status = [r.name for r in regs if r.name.startswith(f"seq{q}_")]
        assert status == [f"seq{q}_{n}" for n, _ in SEQ_STATUS]
    mine = {r.name for r in regs}
    m = RegisterMap("t", 1)
    m.extend(r for _, r in list(node_regmap())[2:] if r.name not in mine)
    m.extend(regs)                       # no name collides with the rest of the node map
    assert len(sequencer_registers(1)) == 2 + len(list(SEQ_STATUS))


def test_header_only_sends_one_per_cycle():
    n = 500
    m = SequencerModel(Queue.NET)
    cycles = m.run([rec(RecordClass.SEND, Queue.NET)] * n)
    assert cycles == n + 1
    assert [t for t, _, _ in m.issued] == list(range(1, n + 1))


def test_bad_at_run_time():
    net = [
        rec(RecordClass.WAIT, Queue.NET, arg=len(SeqCounter), wait=1),   # unassigned counter
        rec(RecordClass.SEND, Queue.NET, kv=1, wait=1 << LANDED_BITS),   # unreachable count
        rec(RecordClass.JOB, Queue.NET),                                 # not a NET class
        rec(RecordClass.NOP, Queue.NET) | (9 << CMD["cls"].offset),     # unassigned class
        rec(RecordClass.MARK, Queue.NET, irq=True),
    ]
    m = SequencerModel(Queue.NET)
    m.run(net)
    assert m.st["bad_runtime"] == 4 and m.st["retired"] == 5 and m.issued == []
    m = SequencerModel(Queue.COMPUTE)
    m.run([rec(RecordClass.DIR, kv=3, wait=2, arg=len(DirOp)),
           rec(RecordClass.DIR, kv=3, wait=2, arg=DirOp.DRAIN.value)])
    assert m.st["bad_runtime"] == 1 and [(s, i) for _, s, i in m.issued] == [("dir", 1)]


def test_dir_payload_is_dir_op():
    m = SequencerModel(Queue.COMPUTE)
    out = m.step(SeqInputs(rec_valid=True, rec=rec(RecordClass.DIR, kv=0x1234, wait=7,
                                                   arg=DirOp.FREE.value)))
    out = m.step(SeqInputs(dir_landed=7, ready={"dir": False}))
    assert not out.valid["dir"]          # the landed condition is a register: a cycle later
    out = m.step(SeqInputs(dir_landed=7, ready={"dir": False}))
    assert out.valid["dir"]
    assert out.payload["dir"] == DIR_OP.const(
        {"op": DirOp.FREE, "kv_id": 0x1234, "count": 7}).as_bits()


def test_wait_and_mark_rebase():
    """WAIT compares counter − base, on the counters of the previous cycle; MARK's mask loads
    the base when it retires."""
    def counters(t):
        return [t // 10, 0, 0, 1000, 7, 9]
    recs = [rec(RecordClass.WAIT, arg=0, wait=3),      # counter 0 reaches 3 at cycle 30: seen 31
            rec(RecordClass.MARK, arg=0b111001),       # base0 = 3, base3 = 1000, base4 = 7, 5 = 9
            rec(RecordClass.WAIT, arg=0, wait=2),      # 3 + 2 = 5: cycle 50, seen 51
            rec(RecordClass.WAIT, arg=3, wait=0)]
    m = SequencerModel(Queue.NET)
    m.run([r & ~(1 << CMD["queue"].offset) for r in recs], counters=counters)
    assert [t for t, _ in m.retired_log] == [31, 32, 51, 52]
    assert m.base == [3, 0, 0, 1000, 7, 9] and m.st["marks"] == 1


def test_watchdog_halts_and_run_reports_it():
    m = SequencerModel(Queue.NET)
    with pytest.raises(RuntimeError):
        m.run([rec(RecordClass.SEND, Queue.NET, kv=4, wait=1)], landed=lambda kv, t: 0,
              timeout=20, max_cycles=200)
    assert m.halted and m.st["timeouts"] == 1 and m.st["wait_cycles"] == 20
    assert m.halt == {"halted": 1, "queue": Queue.NET.value,
                      "cause": HaltCause.LANDED.value, "kv_id": 4}


def test_engine_latency_in_order():
    lat = {0: 30, 1: 5, 2: 5}
    recs = [rec(RecordClass.JOB), rec(RecordClass.JOB), rec(RecordClass.JOB, irq=True),
            rec(RecordClass.SEND)]
    m = SequencerModel(Queue.COMPUTE)
    m.run(recs, latency=lambda i: lat[i])
    assert [t for t, _, _ in m.issued] == [1, 2, 3, 34]
    # the strobes come in order: the 2nd and 3rd wait for the 1st
    assert m.retired_log == [(31, 0), (32, 1), (33, 2), (34, 3)]


classes = st.sampled_from(list(RecordClass))


@given(st.lists(st.tuples(classes, st.integers(0, 3), st.integers(0, 3), st.booleans()),
                min_size=1, max_size=40),
       st.integers(0, 5), st.integers(1, 6))
def test_model_properties(items, lat, max_out):
    """Everything retires, in input order; each stream issues its class in input order; the
    cycle count is at least one per record plus the pipeline fill."""
    recs = []
    for cls, wait, arg, irq in items:
        if cls is RecordClass.WAIT:
            arg = arg % len(SeqCounter)
        if cls is RecordClass.DIR:
            arg = arg % len(DirOp)
        recs.append(rec(cls, wait=wait, arg=arg, irq=irq))
    m = SequencerModel(Queue.COMPUTE, max_outstanding=max_out)
    cycles = m.run(recs, counters=lambda t: [t] * len(SeqCounter),
                   landed=lambda kv, t: min(max(0, t), (1 << LANDED_BITS) - 1),
                   latency=lambda i: lat)
    assert [i for _, i in m.retired_log] == list(range(len(recs)))
    for s in set(STREAM_OF.values()):
        idx = [i for _, name, i in m.issued if name == s]
        assert idx == sorted(idx)
        assert all(STREAM_OF[items[i][0]] == s for i in idx)
    assert m.st["retired"] == len(recs) and m.st["bad_runtime"] == 0
    assert cycles >= len(recs) + 1 and m.pend == 0
