"""cocotb bench of the NIC router (flat top ``nic_router``): cocotbext-axi sources on every input,
sinks on every output with independent backpressure, idle × backpressure matrix, multicast to
1..P ports plus local, scoreboard from mcf.golden.nic.RouterModel, exact status counters."""

from __future__ import annotations

import logging
import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge, with_timeout
from cocotbext.axi import AxiStreamBus, AxiStreamFrame, AxiStreamSink, AxiStreamSource

from mcf.abi.meta import META, Meta
from mcf.abi.nic import ROUTER_STATUS
from mcf.golden.nic import Packet, RouterModel
from mcf.sim.benches import nic_traffic as traffic
from mcf.sim.tb import set_pauses
from mcf.sim.toolchain import bench_params


def unpack(layout, raw):
    return {n: (raw >> f.offset) & ((1 << f.width) - 1) for n, f in layout}


class TB:
    def __init__(self, dut, n_ports, n_inputs, data_width, max_payload):
        self.dut = dut
        self.n_ports, self.n_inputs = n_ports, n_inputs
        self.bpb = data_width // 8
        self.max_payload = max_payload
        cocotb.start_soon(Clock(dut.clk, 10, unit="ns").start())
        self.src = [AxiStreamSource(AxiStreamBus.from_prefix(dut, f"s_axis_i{i}"), dut.clk,
                                    dut.rst) for i in range(n_inputs)]
        names = [f"m_axis_o{p}" for p in range(n_ports)] + ["m_axis_local"]
        self.sink = [AxiStreamSink(AxiStreamBus.from_prefix(dut, n), dut.clk, dut.rst)
                     for n in names]
        for x in self.src + self.sink:
            x.log.setLevel(logging.WARNING)

    async def reset(self):
        self.dut.rst.value = 1
        self.dut.route_wr_en.value = 0
        await ClockCycles(self.dut.clk, 3)
        self.dut.rst.value = 0
        await RisingEdge(self.dut.clk)

    async def write_routes(self, table):
        for rid, e in table.items():
            self.dut.route_wr_addr.value = rid
            self.dut.route_wr_data.value = e
            self.dut.route_wr_en.value = 1
            await RisingEdge(self.dut.clk)
        self.dut.route_wr_en.value = 0

    def set_pauses(self, idle, backpressure, rng):
        set_pauses(rng, self.src, self.sink, idle=(0.0, 0.5) if idle else None,
                   backpressure=(0.2, 0.8) if backpressure else None)

    def frame(self, meta: Meta, payload: bytes) -> AxiStreamFrame:
        raw = meta.pack()
        if not payload:
            return AxiStreamFrame(bytes(self.bpb), tkeep=[0] * self.bpb, tuser=raw)
        return AxiStreamFrame(payload, tuser=raw)

    async def recv_packet(self, o):
        f = await self.sink[o].recv(compact=False)
        data = bytes(b for b, k in zip(f.tdata, f.tkeep) if k)
        metas = set(f.tuser)
        assert len(metas) == 1, "meta changed inside a packet"
        return Meta.unpack(metas.pop() & ((1 << META.size) - 1)), data


async def run_test(dut, idle, backpressure, seed, n_packets):
    prm = bench_params()
    tb = TB(dut, prm["n_ports"], prm["n_inputs"], prm["data_width"], prm["max_payload"])
    rng = random.Random(seed)
    await tb.reset()
    P = tb.n_ports
    # routes: every subset of the network ports ± local, local only, no route (+ a bad port)
    table = traffic.router_table(P)
    await tb.write_routes(table)
    model = RouterModel(P, tb.max_payload)
    for r, e in table.items():
        model.write_route(r, e)
    tb.set_pauses(idle, backpressure, rng)
    sends, expected = traffic.router_traffic(rng, tb.n_inputs, model, n_packets, tb.bpb)
    for i, pkts in enumerate(sends):
        for pkt in pkts:
            await tb.src[i].send(tb.frame(pkt.meta, pkt.payload))
    for o in [*range(P), "local"]:
        n = sum(len(v) for v in expected[o].values())
        got = {i: [] for i in range(tb.n_inputs)}
        for _ in range(n):
            meta, data = await with_timeout(tb.recv_packet(P if o == "local" else o), 200, "us")
            got[meta.src].append(Packet(meta, data))
        assert got == expected[o], f"output {o} differs from the golden model"
    for s in tb.src:
        await s.wait()
    await ClockCycles(dut.clk, 10)
    for s in tb.sink:
        assert s.empty(), "unexpected extra packet"
    status = unpack(ROUTER_STATUS, int(dut.status.value))
    assert status == model.counters, (status, model.counters)


@cocotb.test()
@cocotb.parametrize(idle=[False, True], backpressure=[False, True])
async def test_router(dut, idle, backpressure):
    n = bench_params().get("n_packets", 120)
    await run_test(dut, idle, backpressure, seed=int(idle) * 2 + int(backpressure) + 1,
                   n_packets=n)
