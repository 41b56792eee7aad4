"""cocotb bench of the NIC reduction engine (flat top ``nic_reduce``): cocotbext-axi source and
sink, idle × backpressure, MAX / SUM / softmax-merge contributions in random arrival order with
interleaved tags and malformed ones mixed in; results and counters from
mcf.golden.nic.ReduceModel, bit for bit."""

from __future__ import annotations

import logging
import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge, with_timeout
from cocotbext.axi import AxiStreamBus, AxiStreamFrame, AxiStreamSink, AxiStreamSource

from mcf.abi.meta import META, Meta
from mcf.abi.nic import REDUCE_STATUS, reduce_config
from mcf.golden.nic import Packet, ReduceModel
from mcf.sim.benches import nic_traffic as t
from mcf.sim.benches.pauses import set_pauses
from mcf.sim.toolchain import bench_params


async def run_test(dut, idle, backpressure, seed, n_tags):
    prm = bench_params()
    cocotb.start_soon(Clock(dut.clk, 10, unit="ns").start())
    src = AxiStreamSource(AxiStreamBus.from_prefix(dut, "s_axis"), dut.clk, dut.rst)
    sink = AxiStreamSink(AxiStreamBus.from_prefix(dut, "m_axis"), dut.clk, dut.rst)
    for x in (src, sink):
        x.log.setLevel(logging.WARNING)
    rng = random.Random(seed)
    dut.rst.value = 1
    dut.cfg_wr_en.value = 0
    dut.local_id.value = 3
    dut.timeout.value = 0
    await ClockCycles(dut.clk, 3)
    dut.rst.value = 0
    for rid, k in t.K_OF_ROUTE.items():
        dut.cfg_wr_addr.value = rid
        dut.cfg_wr_data.value = reduce_config(k)
        dut.cfg_wr_en.value = 1
        await RisingEdge(dut.clk)
    dut.cfg_wr_en.value = 0
    set_pauses(rng, [src], [sink], idle=0.3 if idle else None,
               backpressure=0.5 if backpressure else None)
    contribs = t.make_stream(seed=seed, n_tags=n_tags, window=prm.get("window", 4))
    model = ReduceModel(prm["n_slots"], prm["max_payload"], local_id=3)
    for rid, k in t.K_OF_ROUTE.items():
        model.write_config(rid, reduce_config(k))
    expected = []
    for meta, payload in contribs:
        r = model.contribute(meta, payload)
        if isinstance(r, Packet):
            expected.append(r)
        await src.send(AxiStreamFrame(payload or bytes(8), tkeep=None if payload else [0] * 8,
                                      tuser=meta.pack()))
    for exp in expected:
        f = await with_timeout(sink.recv(compact=False), 500, "us")
        data = bytes(b for b, k in zip(f.tdata, f.tkeep) if k)
        metas = set(f.tuser)
        assert len(metas) == 1
        got = Packet(Meta.unpack(metas.pop() & ((1 << META.size) - 1)), data)
        assert got == exp, "result differs from the golden model"
    await src.wait()
    await ClockCycles(dut.clk, 20)
    assert sink.empty()
    raw = int(dut.status.value)
    status = {n: (raw >> f.offset) & ((1 << f.width) - 1) for n, f in REDUCE_STATUS}
    status.pop("last_trip")
    model.counters.pop("last_trip")
    assert status == model.counters, (status, model.counters)


@cocotb.test()
@cocotb.parametrize(idle=[False, True], backpressure=[False, True])
async def test_reduce(dut, idle, backpressure):
    await run_test(dut, idle, backpressure, seed=20 + 2 * int(idle) + int(backpressure),
                   n_tags=bench_params().get("n_tags", 40))
