"""The node ingress ABI (mcf.abi.node, docs/node.md §2): the CMD entry's bit positions as the
design tabulates them, host pack/unpack, the golden record checks and the ring registers."""

from __future__ import annotations

import random

import pytest

from mcf.abi.framing import MAX_PAYLOAD
from mcf.abi.meta import META, Meta, Op
from mcf.abi.node import (
    CMD,
    CMD_BYTES,
    CMD_RING_MAX_LOG2,
    INGRESS_STATUS,
    IRQ_CAUSES,
    Cmd,
    PayloadSource,
    Queue,
    RecordClass,
    cmd_malformed,
    cmd_raw,
    ingress_registers,
    irq_registers,
)
from mcf.abi.regs import Access


def test_cmd_layout_matches_design_table():
    bits = {name: (f.offset, f.offset + f.width - 1) for name, f in CMD}
    assert bits == {"meta": (0, 63), "cls": (64, 67), "queue": (68, 68), "src": (69, 71),
                    "flags": (72, 75), "wait": (76, 95), "arg": (96, 127)}
    assert CMD.size == 128 and CMD_BYTES == 16 and CMD_RING_MAX_LOG2 == 16
    assert [c.value for c in RecordClass] == list(range(8))
    assert [c.name for c in RecordClass] == ["NOP", "SEND", "DIR", "JOB", "EMIT", "ATTEND",
                                             "WAIT", "MARK"]
    assert (Queue.NET.value, Queue.COMPUTE.value) == (0, 1)
    assert [s.name for s in PayloadSource] == ["HDR", "KV", "QBUF", "ATTN", "EMIT"]


def test_cmd_pack_unpack_roundtrip():
    rng = random.Random(3)
    for _ in range(200):
        c = Cmd(cls=rng.choice(list(RecordClass)), queue=rng.choice(list(Queue)),
                meta=rng.getrandbits(64), src=rng.choice(list(PayloadSource)),
                irq=rng.random() < 0.5, replicate=rng.random() < 0.5,
                wait=rng.getrandbits(20), arg=rng.getrandbits(32))
        raw = c.pack()
        assert len(raw) == 16 and Cmd.unpack(raw) == c
        word = int.from_bytes(raw, "little")
        assert word & ((1 << 64) - 1) == c.meta
        assert (word >> 64) & 0xF == c.cls.value
        assert (word >> 72) & 1 == c.irq and (word >> 73) & 1 == c.replicate
        assert word >> 96 == c.arg and (word >> 76) & 0xFFFFF == c.wait
        assert CMD.const({"cls": c.cls, "queue": c.queue, "src": c.src, "meta": c.meta,
                          "wait": c.wait, "arg": c.arg,
                          "flags": {"irq": int(c.irq), "replicate": int(c.replicate)}}
                         ).as_bits() == word


def test_cmd_rejects():
    with pytest.raises(ValueError):
        Cmd(RecordClass.NOP, Queue.NET, wait=1 << 20).pack()
    with pytest.raises(ValueError):
        Cmd.unpack(cmd_raw(cls=9).to_bytes(16, "little"))
    with pytest.raises(ValueError):
        Cmd.unpack(cmd_raw(flags=0b0100).to_bytes(16, "little"))
    with pytest.raises(ValueError):
        cmd_raw(queue=2)


def _send(length, op=Op.KV_REPLICA, src=PayloadSource.KV, queue=Queue.NET, **kw):
    return int.from_bytes(Cmd(RecordClass.SEND, queue, meta=Meta(op=op, length=length).pack(),
                              src=src, **kw).pack(), "little")


def test_record_checks():
    net, comp = Queue.NET, Queue.COMPUTE
    assert not cmd_malformed(_send(MAX_PAYLOAD), net)
    assert cmd_malformed(_send(MAX_PAYLOAD + 1), net)
    assert not cmd_malformed(_send(0, src=PayloadSource.HDR), net)
    assert cmd_malformed(_send(4, src=PayloadSource.HDR), net)
    assert cmd_malformed(_send(4), comp)                       # queue field != ring
    op7 = _send(4) | (7 << META["op"].offset)
    assert cmd_malformed(op7, net)
    assert cmd_malformed(_send(4) | (6 << CMD["src"].offset), net)   # unassigned source
    assert cmd_malformed(_send(4) | (1 << (CMD["flags"].offset + 2)), net)
    for cls in RecordClass:
        ok_net = cls in (RecordClass.NOP, RecordClass.SEND, RecordClass.WAIT, RecordClass.MARK)
        # all-zero other fields: a SEND of a header-only KV_REPLICA, well-formed
        assert cmd_malformed(cmd_raw(cls=cls.value, queue=0), net) is not ok_net
        assert not cmd_malformed(cmd_raw(cls=cls.value, queue=1), comp)
    for code in range(8, 16):
        assert cmd_malformed(cmd_raw(cls=code), net)
    # non-SEND classes do not look at meta or src
    assert not cmd_malformed(cmd_raw(cls=RecordClass.JOB.value, queue=1, meta=(1 << 64) - 1,
                                     src=7), comp)


def test_ingress_registers():
    regs = {r.name: r for r in ingress_registers(2)}
    for q in range(2):
        assert regs[f"CMD{q}_PROD"].fields[0].access is Access.W
        assert regs[f"CMD{q}_HEAD"].fields[0].access is Access.R
        assert regs[f"CMD{q}_CONS"].fields[0].access is Access.R
        assert regs[f"CMD{q}_PROD"].fields[0].width == 16
        assert regs[f"CMD{q}_SIZE"].fields[0].width == 5
        assert regs[f"CMD{q}_BASE_LO"].fields[0].width + regs[f"CMD{q}_BASE_HI"].fields[0].width \
            == 40
        for name, _ in INGRESS_STATUS:
            assert regs[f"cmd{q}_{name}"].fields[0].access is Access.R
    assert len(regs) == 2 * (6 + len(list(INGRESS_STATUS)))


def test_irq_registers_pair_causes():
    status, enable = irq_registers()
    assert [f.name for f in status.fields] == [n for n, _ in IRQ_CAUSES]
    assert [f.name for f in enable.fields] == [n for n, _ in IRQ_CAUSES]
    assert all(f.access is Access.RW1C and f.width == 1 for f in status.fields)
    assert all(f.access is Access.RW and f.reset == 0 for f in enable.fields)
