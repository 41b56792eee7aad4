"""cocotb bench of the tiled prefill on a node configuration's whole compute half (issue #33; the
flat top ``tile_prefill_<config>``: :class:`~mcf.hdl.node.compute.NodeCompute` built by
:func:`mcf.sim.tile_records.rtl_build`): ATTEND PREFILL_TILE records one after another, their
cycles, the bytes they write and the node's counters.

The memory image (``image``, a file written by :func:`mcf.sim.tile_records.rtl_run`) is shared
by three cocotbext-axi RAM models (no pauses: the DDR at full rate): ``m_axi_att_rd`` (lists and
query rows, read), ``m_axi_kvr`` (the KV reader's K/V records, read) and ``m_axi_att_wr`` (the
rows, written); the other buses of the compute half stay idle. The host touches the design only
to hand over a record (its ``CMD`` beat, a few cycles) and wakes on ``attend_done``; the AXI
bursts are the RAM models' (cocotbext-axi's channel models, which follow their handshakes each
cycle).

Per record: ``cycles`` — clock edges from the edge the record is taken to the edge after which
``attend_done`` is high; ``busy`` — the node's own ``cmp_status.attend_cycles`` over the record
(its count of cycles with an ATTEND record in progress); ``timed_out`` — no ``done`` within
``limit`` cycles (the run ends there). Output (``out``, JSON): those, ``att_status`` and
``kvr_status`` after the run, and the memory after the run with a mask of the bytes written
(``dump``, ``.npz``). Params: ``image``, ``list_base``, ``args``, ``limit``, ``out``, ``dump``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge, SimTimeoutError, with_timeout
from cocotb.utils import get_sim_time
from cocotbext.axi import AxiRamRead, AxiRamWrite, AxiReadBus, AxiWriteBus

from mcf.abi.attend import ATTEND_STATUS
from mcf.abi.compute import COMPUTE_BUSY_STATUS, status_values
from mcf.abi.kv_reader import KV_READER_STATUS

PERIOD_NS = 10
IDLE_BUSES = ("walker", "mat0", "mat1", "emit", "w0", "w1", "w2", "w3")
"""The compute half's AXI masters a PREFILL_TILE record does not use: their slave-side inputs
are held at 0 (never ready, never valid)."""
SLAVE_INPUTS = ("arready", "rvalid", "awready", "wready", "bvalid")


class _Writes(AxiRamWrite):
    """An ``AxiRamWrite`` that marks every byte it writes in ``mask``."""

    def __init__(self, *args, mask: bytearray, **kw):
        super().__init__(*args, **kw)
        self.mask = mask

    async def _write(self, address, data):
        self.mask[address:address + len(data)] = b"\x01" * len(data)
        await super()._write(address, data)


def _quiet(*models) -> None:
    for m in models:
        m.log.setLevel(logging.WARNING)


def _idle(dut) -> None:
    """Every input the run does not drive, at rest: no JOB or EMIT record, the unused buses
    never ready, every output stream taken."""
    for name in ("job", "emit", "attend"):
        getattr(dut, f"{name}_tvalid").value = 0
    for name in ("local", "staged_emit", "staged_attn"):
        getattr(dut, f"{name}_tready").value = 1
    for bus in IDLE_BUSES:
        for sig in SLAVE_INPUTS:
            getattr(dut, f"m_axi_{bus}_{sig}").value = 0
    for bus in ("att_rd", "kvr"):
        for sig in ("awready", "wready", "bvalid"):
            getattr(dut, f"m_axi_{bus}_{sig}").value = 0
    for sig in ("arready", "rvalid"):
        getattr(dut, f"m_axi_att_wr_{sig}").value = 0
    for name in ("jobs_table", "jobs_table_len", "emit_cfg", "local_id"):
        getattr(dut, name).value = 0


def _busy(dut) -> int:
    return status_values(COMPUTE_BUSY_STATUS, dut.cmp_status.value.to_unsigned())["attend_cycles"]


async def _record(dut, arg: int, limit: int) -> dict:
    """One record: its ``CMD`` beat (``arg``; every other field 0) until taken, then ``done``."""
    clk = dut.clk
    busy0 = _busy(dut)
    dut.attend_targ.value = arg
    for name in ("tuser", "tcls", "tqueue", "tsrc", "tflags", "twait"):
        getattr(dut, f"attend_{name}").value = 0
    dut.attend_tvalid.value = 1
    await RisingEdge(clk)
    while not dut.attend_tready.value:
        await RisingEdge(clk)
    t0 = get_sim_time("ns")
    dut.attend_tvalid.value = 0
    try:
        await with_timeout(RisingEdge(dut.attend_done), limit * PERIOD_NS, "ns")
    except SimTimeoutError:
        return {"cycles": limit, "busy": _busy(dut) - busy0, "timed_out": True}
    cycles = round((get_sim_time("ns") - t0) / PERIOD_NS)
    await RisingEdge(clk)                      # the counter's last increment
    await RisingEdge(clk)
    return {"cycles": cycles, "busy": _busy(dut) - busy0, "timed_out": False}


@cocotb.test()
async def perf(dut):
    """The records of ``args`` back to back (one at a time, as the sequencer issues them)."""
    from mcf.sim.toolchain import bench_params

    p = bench_params()
    mem = bytearray(Path(p["image"]).read_bytes())
    mask = bytearray(len(mem))
    cocotb.start_soon(Clock(dut.clk, PERIOD_NS, unit="ns").start())
    dut.rst.value = 1
    _idle(dut)
    dut.att_list_base.value = p["list_base"]
    kw = {"reset_active_level": True, "size": len(mem), "mem": mem}
    rams = [AxiRamRead(AxiReadBus.from_prefix(dut, "m_axi_att_rd"), dut.clk, dut.rst, **kw),
            AxiRamRead(AxiReadBus.from_prefix(dut, "m_axi_kvr"), dut.clk, dut.rst, **kw),
            _Writes(AxiWriteBus.from_prefix(dut, "m_axi_att_wr"), dut.clk, dut.rst, mask=mask,
                    **kw)]
    _quiet(*rams)
    await ClockCycles(dut.clk, 8)
    dut.rst.value = 0
    await ClockCycles(dut.clk, 8)
    records = []
    for arg in p["args"]:
        rec = await _record(dut, int(arg), int(p["limit"]))
        records.append(rec)
        if rec["timed_out"]:
            break
    await ClockCycles(dut.clk, 32)              # the last write's response
    att = status_values(ATTEND_STATUS, dut.att_status.value.to_unsigned())
    kvr = status_values(KV_READER_STATUS, dut.kvr_status.value.to_unsigned())
    np.savez(p["dump"], mem=np.frombuffer(bytes(mem), np.uint8),
             mask=np.frombuffer(bytes(mask), np.uint8))
    Path(p["out"]).write_text(json.dumps({"records": records, "att_status": att,
                                          "kvr_status": kvr}))
