"""cocotb bench of the NIC router (flat top ``nic_router``): cocotbext-axi sources on every input,
sinks on every output with independent backpressure, idle × backpressure matrix, multicast to
1..P ports plus local, scoreboard from mcf.golden.nic.RouterModel, exact status counters."""

from __future__ import annotations

import itertools
import logging
import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge, with_timeout
from cocotbext.axi import AxiStreamBus, AxiStreamFrame, AxiStreamSink, AxiStreamSource

from mcf.abi.meta import META, Collective, Meta, Op
from mcf.abi.nic import ROUTER_STATUS
from mcf.abi.route import route_entry
from mcf.golden.nic import RouterModel
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
        for s in self.src:
            s.set_pause_generator(_gen(rng.random() * 0.5, rng) if idle else None)
        for s in self.sink:
            s.set_pause_generator(_gen(0.2 + 0.6 * rng.random(), rng) if backpressure
                                  else None)

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


def _gen(p, rng):
    seq = [int(rng.random() < p) for _ in range(97)]
    return itertools.cycle(seq)


async def run_test(dut, idle, backpressure, seed, n_packets):
    prm = bench_params()
    tb = TB(dut, prm["n_ports"], prm["n_inputs"], prm["data_width"], prm["max_payload"])
    rng = random.Random(seed)
    await tb.reset()
    P = tb.n_ports
    # routes: every subset size 1..P of network ports (with and without local), local only,
    # no route
    table, rid = {}, 0
    for size in range(1, P + 1):
        for ports in itertools.combinations(range(P), size):
            table[rid] = route_entry(set(ports), local=bool(rid % 2))
            rid += 1
    table[rid] = route_entry(set(), local=True)
    table[rid + 1] = 0
    await tb.write_routes(table)
    model = RouterModel(P, tb.max_payload)
    for r, e in table.items():
        model.write_route(r, e)
    tb.set_pauses(idle, backpressure, rng)
    expected = [{i: [] for i in range(tb.n_inputs)} for _ in range(P + 1)]
    sends = [[] for _ in range(tb.n_inputs)]
    for uid in range(n_packets):
        i = rng.randrange(tb.n_inputs)
        length = rng.choice([0, 1, tb.bpb, tb.bpb + 1, 2 * tb.bpb, 4 * tb.bpb,
                             tb.max_payload, rng.randrange(tb.max_payload + 1)])
        if rng.random() < 0.03:                       # malformed: longer than the maximum
            length = tb.max_payload + rng.randrange(1, 2 * tb.bpb)
        meta = Meta(op=Op.KV_REPLICA, collective=Collective.MULTICAST, src=i,
                    route_id=rng.randrange(len(table)), kv_id=uid, length=length)
        payload = rng.randbytes(length)
        dest = model.route(meta)
        if isinstance(dest, list):
            for d in dest:
                expected[P if d == "local" else d][i].append((meta, payload))
        sends[i].append(tb.frame(meta, payload))
    for i, frames in enumerate(sends):
        for f in frames:
            await tb.src[i].send(f)
    for o in range(P + 1):
        n = sum(len(v) for v in expected[o].values())
        got = {i: [] for i in range(tb.n_inputs)}
        for _ in range(n):
            meta, data = await with_timeout(tb.recv_packet(o), 200, "us")
            got[meta.src].append((meta, data))
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
