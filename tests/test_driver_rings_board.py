"""The driver's plan-free path and its refusals against the RTL (issue #36 item 5;
docs/board.md "The driver"): ``mcf_node_sim`` under Verilator as a ``SimBoard``, bound by
``pynq.Overlay`` as in tests/test_sim_board.py (the same Verilator build).

This file is both the pytest runner and the cocotb module it runs (``hand_made_rings``):

* layouts the node cannot hold (a 2^17-entry ring; ``KV_COUNT`` 300 on the 256-entry directory,
  through ``attach`` and ``configure``) raise ``LayoutError`` and leave every RW register the
  configuration would write at its reset value;
* ``configure_rings`` + hand-made records, no plan: three rounds of five CONTROL SENDs and a
  MARK through an 8-entry NET ring (it wraps), counted by the local sink; a COMPUTE WAIT on the
  NET queue's retired count, then a NOP landed wait on ``kv_id`` 300 — beyond the directory, so
  it reads 0 landed and the watchdog halts the queue (LANDED, 300) — and a MARK. The timeout
  names that NOP at ring index ``seq1_halt_index`` = 1; ``skip`` lets the MARK retire.

Marked slow: a second simulator run of the node top (the first is tests/test_sim_board.py's);
the records would cost nothing as one more testcase of that run
(``sim/benches/board_node.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import cocotb
import pytest

MODULE = "test_driver_rings_board"


@cocotb.test()
async def hand_made_rings(dut):
    import dataclasses as dc

    import numpy as np
    from cocotb.task import bridge

    from mcf.abi.csrmap import node_regmap
    from mcf.abi.meta import Meta, Op
    from mcf.abi.node import Cmd, Queue, RecordClass
    from mcf.abi.node_config import SIM
    from mcf.abi.sequencer import HaltCause, SeqCounter
    from mcf.mars.plan import tiny_plan
    from mcf.node.layout import NodeLayout
    from mcf.sim.board.device import SimBoard
    from mcf.sim.board.links import LinkPorts
    from mcf.sim.toolchain import bench_params

    params = bench_params()
    board = SimBoard(dut, seed=1)
    LinkPorts(dut, dut.aclk, dut.aresetn)
    rm = node_regmap()
    out = {}
    untouched = ["NODE", "LINK_MAP", "KV_COUNT", "KV_SLOT", "CMD0_BASE_LO", "CMD0_SIZE",
                 "CMD1_SIZE", "SEQ_TIMEOUT", "IRQ_ENABLE", "SEQ0_CTRL", "SEQ1_CTRL"]

    def host():
        from pynq import Overlay, allocate

        from mcf.driver import LayoutError, RingLayout, StepTimeout
        ip = Overlay(params["hwh"], device=board).node
        resets = {n: rm.register(n).reset for n in untouched}
        assert {n: ip.read_reg(n) for n in untouched} == resets
        # --- refused before any write ----------------------------------------------------------
        p = tiny_plan()
        lay = NodeLayout.for_plan(p, SIM)
        buf = allocate((lay.size,), np.uint8, target=board)
        lay = NodeLayout.for_plan(p, SIM, base=int(buf.device_address))
        refusals = []
        for bad in (RingLayout.at(lay.base, 17),
                    dc.replace(lay, kv=dc.replace(lay.kv, kv_count=300))):
            try:
                ip.attach(buf, bad)
            except LayoutError as e:
                refusals.append(str(e))
            else:
                raise AssertionError(f"{bad} was attached")
        ip.attach(buf, lay)
        ip.layout = dc.replace(lay, kv=dc.replace(lay.kv, kv_count=300))
        try:
            ip.configure(p, 0)
        except LayoutError as e:
            refusals.append(str(e))
        else:
            raise AssertionError("configure took KV_COUNT 300")
        assert {n: ip.read_reg(n) for n in untouched} == resets
        out["refusals"] = refusals
        # --- the rings alone, hand-made records ------------------------------------------------
        rings = allocate((RingLayout.nbytes(3),), np.uint8, target=board)
        ip.attach(rings, RingLayout.at(int(rings.device_address), log2=3))
        ip.configure_rings(seq_timeout=200)
        ctl = Meta(op=Op.CONTROL, src=0, dst=0, route_id=0, kv_id=0, length=0).pack()
        for r in range(3):
            ip.push(Queue.NET, [Cmd(RecordClass.SEND, Queue.NET, meta=ctl)] * 5 +
                    [Cmd(RecordClass.MARK, Queue.NET, irq=True)])
            ip.wait_marks({Queue.NET: r + 1}, timeout=1e-3)
        far = Meta(op=Op.KV_REPLICA, src=0, dst=0, route_id=0, kv_id=300, length=0).pack()
        ip.push(Queue.COMPUTE, [
            Cmd(RecordClass.WAIT, Queue.COMPUTE, arg=SeqCounter.OTHER_RETIRED.value, wait=18),
            Cmd(RecordClass.NOP, Queue.COMPUTE, meta=far, wait=1),
            Cmd(RecordClass.MARK, Queue.COMPUTE, irq=True)])
        try:
            ip.wait_marks({Queue.COMPUTE: 1}, timeout=2e-5)
        except StepTimeout as e:
            out["stuck"] = str(e)
            assert e.queue is Queue.COMPUTE and e.counters["seq1_halt_index"] == 1, e.counters
        else:
            raise AssertionError("the landed wait on kv_id 300 was satisfied")
        assert ip.halt(Queue.COMPUTE) == {"halted": 1, "queue": Queue.COMPUTE.value,
                                          "cause": HaltCause.LANDED.value, "kv_id": 300}
        ip.skip(Queue.COMPUTE)
        ip.wait_marks({Queue.COMPUTE: 1}, timeout=1e-4)
        snap = ip.snapshot()
        out["snapshot"] = {k: v for k, v in snap.as_dict().items()
                           if k.startswith(("cmd0_", "cmd1_", "seq0_", "seq1_", "lsink_",
                                            "send_", "CMD"))}
        irq = ip.irq_status()
        out["irq"] = {k: v for k, v in irq.items() if v}

    await bridge(host)()
    with open(params["out"], "w") as f:
        json.dump(out, f)


@pytest.mark.slow
def test_driver_rings_on_the_simulated_board(tmp_path):
    from mcf.commands.verilog import top_description
    from mcf.hdl.tops import TOPS
    from mcf.sim import build, run
    from mcf.sim.board.hwh import verilog_ports, write_hwh
    built = build(TOPS["mcf_node_sim"](), "mcf_node_sim",
                  describe=top_description("mcf_node_sim"))
    ports = verilog_ports((built.build_dir / "mcf_node_sim.v").read_text(), "mcf_node_sim")
    hwh = write_hwh(tmp_path / "mcf_node_sim.hwh", "mcf_node_sim", ports)
    res = tmp_path / "rings.json"
    run(built, MODULE, testcase="hand_made_rings", params={"hwh": str(hwh), "out": str(res)})
    got = json.loads(Path(res).read_text())
    print(json.dumps(got, indent=1))
    r = got["refusals"]
    assert len(r) == 3 and all("\n" not in m for m in r)
    assert "ring size 2^17" in r[0] and "CAPS.ring_max_log2 16" in r[0]
    assert "KV_COUNT 300" in r[1] and "directory of 256 entries" in r[1] and r[2] == r[1]
    assert "waiting at record 1: NOP wait 1 kv_id 300" in got["stuck"]
    s = got["snapshot"]
    assert s["cmd0_records"] == 18 and s["cmd1_records"] == 3
    assert s["send_packets"] == 15 and s["lsink_control"] == 15
    assert s["seq0_retired"] == 18 and s["seq0_marks"] == 3
    assert s["seq1_retired"] == 3 and s["seq1_marks"] == 1 and s["seq1_skipped"] == 1
    assert s["seq1_timeouts"] == 1 and s["seq1_halt_index"] == 1
    assert not any(s[f"cmd{q}_{c}"] for q in (0, 1)
                   for c in ("bad_records", "overruns", "read_errors"))
    assert s["CMD0_HEAD"] == s["CMD0_CONS"] == 18 and s["CMD1_CONS"] == 3
    assert got["irq"] == {"mark0": 1, "mark1": 1, "halt1": 1}
