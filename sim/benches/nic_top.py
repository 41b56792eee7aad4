"""cocotb bench of the NIC block behind its AXI-Lite registers (flat top ``mcf_nic``,
:class:`mcf.hdl.nic.top.NicCsrTop`): everything the PS does goes through cocotbext-axi's
``AxiLiteMaster`` on ``s_axi_ctrl`` with addresses and field offsets from
:func:`mcf.abi.csrmap.nic_regmap` — node identity, route table, reduction configuration,
watchdogs — and every engine counter is read back over the bus and compared with the golden
models of :mod:`mcf.golden.nic`.

Traffic, all at once, with random idle cycles on every source and backpressure on every sink:

* router: packets on the three link inputs and the three local inputs, random routes
  (multicast to 1..3 links ± local, local only, unrouted, a bad port, oversize);
* links: every frame leaving ``mac_tx{p}`` is checked against the golden frame
  (``link_frame``, CRC-32 = zlib) and looped back into ``mac_rx{p}`` — some with a bit
  flipped, some dropped (a sequence gap), some sent twice (stale), plus frames with a bad
  magic and oversize frames — and ``link_rx{p}`` is checked against ``LinkRxModel``;
* reduction: MAX / SUM / softmax contributions, interleaved tags, malformed ones mixed in;
* all-to-all: scatters (some malformed) and gathers for 4 nodes with duplicates and
  foreign parts; finally one incomplete reduction and one incomplete gather that the
  watchdogs (armed over AXI-Lite) must free, visible as ``watchdog_trips`` / ``last_trip``.
"""

from __future__ import annotations

import logging
import random

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge, with_timeout
from cocotbext.axi import (
    AxiLiteBus,
    AxiLiteMaster,
    AxiStreamBus,
    AxiStreamFrame,
    AxiStreamSink,
    AxiStreamSource,
)

from mcf.abi.axi import AxiResp
from mcf.abi.csrmap import nic_regmap
from mcf.abi.meta import META, Collective, Meta, Op, ReduceOp
from mcf.abi.nic import (
    A2A_STATUS,
    CRC_BYTES,
    LINK_HEADER,
    LINK_MAGIC,
    LINK_RX_STATUS,
    LINK_TX_STATUS,
    REDUCE_STATUS,
    REDUCE_TAG,
    ROUTER_STATUS,
    link_crc,
    reduce_config,
)
from mcf.golden.nic import A2AModel, LinkRxModel, Packet, RouterModel, link_frame
from mcf.sim.benches import nic_traffic as traffic
from mcf.sim.benches.nic_reduce import HandshakeLog, HeldReduceModel, replay, send_with_credits
from mcf.sim.tb import set_pauses
from mcf.sim.toolchain import bench_params

LOCAL_ID, NUM_NODES = 1, 4


class Csr:
    """Register access by name through the bus, fields packed from the map."""

    def __init__(self, dut):
        self.map = nic_regmap()
        self.bus = AxiLiteMaster(AxiLiteBus.from_prefix(dut, "s_axi_ctrl"), dut.clk, dut.rst)
        for side in (self.bus.write_if, self.bus.read_if):
            side.log.setLevel(logging.WARNING)

    async def write(self, name: str, **fields) -> None:
        reg = self.map.register(name)
        word = 0
        for fld, off in reg.offsets():
            word |= (fields.get(fld.name, 0) & ((1 << fld.width) - 1)) << off
        await self.bus.write_dword(self.map.addr(name), word)

    async def read(self, name: str) -> int:
        return await self.bus.read_dword(self.map.addr(name))

    async def read_field(self, name: str, field: str) -> int:
        word = await self.read(name)
        fld, off = next((f, o) for f, o in self.map.register(name).offsets() if f.name == field)
        return (word >> off) & ((1 << fld.width) - 1)

    async def status(self, prefix: str, layout) -> dict[str, int]:
        return {n: await self.read(f"{prefix}_{n}") for n, _ in layout}


class TB:
    def __init__(self, dut, prm):
        self.dut, self.prm = dut, prm
        self.bpb = prm["data_width"] // 8
        self.links = prm["n_links"]
        cocotb.start_soon(Clock(dut.clk, 10, unit="ns").start())
        self.csr = Csr(dut)

        def src(name):
            return AxiStreamSource(AxiStreamBus.from_prefix(dut, f"s_axis_{name}"), dut.clk,
                                   dut.rst)

        def sink(name):
            return AxiStreamSink(AxiStreamBus.from_prefix(dut, f"m_axis_{name}"), dut.clk,
                                 dut.rst)

        self.net_in = [src(f"net_in{p}") for p in range(self.links)]
        self.inject = [src(f"inject{j}") for j in range(prm["n_inject"])]
        self.mac_rx = [src(f"mac_rx{p}") for p in range(self.links)]
        self.mac_tx = [sink(f"mac_tx{p}") for p in range(self.links)]
        self.link_rx = [sink(f"link_rx{p}") for p in range(self.links)]
        self.deliver = sink("deliver")
        self.reduce_in, self.reduce_out = src("reduce_in"), sink("reduce_out")
        self.a2a_scatter, self.a2a_in = src("a2a_scatter"), src("a2a_in")
        self.a2a_net, self.a2a_out = sink("a2a_net"), sink("a2a_out")
        self.sources = [*self.net_in, *self.inject, *self.mac_rx, self.reduce_in,
                        self.a2a_scatter, self.a2a_in]
        self.sinks = [*self.mac_tx, *self.link_rx, self.deliver, self.reduce_out,
                      self.a2a_net, self.a2a_out]
        for x in self.sources + self.sinks:
            x.log.setLevel(logging.WARNING)

    @property
    def router_inputs(self):
        return self.net_in + self.inject

    async def reset(self):
        self.dut.rst.value = 1
        await ClockCycles(self.dut.clk, 4)
        self.dut.rst.value = 0
        await RisingEdge(self.dut.clk)

    def pauses(self, rng):
        set_pauses(rng, self.sources, self.sinks, idle=(0.0, 0.3), backpressure=(0.2, 0.7))

    def parsed_frame(self, meta: Meta, payload: bytes) -> AxiStreamFrame:
        """A parsed-layout packet (meta on tuser, zero-length = one beat with keep 0)."""
        if not payload:
            return AxiStreamFrame(bytes(self.bpb), tkeep=[0] * self.bpb, tuser=meta.pack())
        return AxiStreamFrame(payload, tuser=meta.pack())

    @staticmethod
    async def recv_parsed(sink) -> Packet:
        f = await with_timeout(sink.recv(compact=False), 2, "ms")
        data = bytes(b for b, k in zip(f.tdata, f.tkeep) if k)
        metas = set(f.tuser)
        assert len(metas) == 1, "meta changed inside a packet"
        return Packet(Meta.unpack(metas.pop() & ((1 << META.size) - 1)), data)

    async def recv_wire_beats(self, sink) -> list[tuple[bytes, int]]:
        """A wire-layout frame as (beat bytes, keep) pairs."""
        f = await with_timeout(sink.recv(compact=False), 2, "ms")
        beats = []
        for b in range(0, len(f.tdata), self.bpb):
            chunk = bytes(f.tdata[b:b + self.bpb])
            keep = sum(int(k) << i for i, k in enumerate(f.tkeep[b:b + self.bpb]))
            n = bin(keep).count("1")
            beats.append((chunk[:n].ljust(self.bpb, b"\0"), keep))
        return beats

    def wire_frame(self, beats: list[tuple[bytes, int]]) -> AxiStreamFrame:
        data = b"".join(d for d, _ in beats)
        keep = [(k >> i) & 1 for _, k in beats for i in range(self.bpb)]
        return AxiStreamFrame(data, tkeep=keep)


def wire_packet(beats, bpb) -> Packet:
    """The wire packet LinkRx delivers: Meta beat, then payload beats."""
    meta = Meta.unpack(int.from_bytes(beats[0][0], "little") & ((1 << META.size) - 1))
    return Packet(meta, b"".join(d[:bin(k).count("1")] for d, k in beats[1:]))


def bad_magic_frame(packet: Packet, seq: int, dw: int) -> list[tuple[bytes, int]]:
    """A frame with a correct CRC but the wrong magic (a foreign protocol on the wire)."""
    beats = link_frame(packet, seq, dw)
    bpb = dw // 8
    hdr = LINK_HEADER.const({"magic": LINK_MAGIC ^ 0x0101, "seq": seq}).as_bits()
    beats[0] = (hdr.to_bytes(bpb, "little"), beats[0][1])
    beats[-1] = (link_crc(beats[:-1]).to_bytes(CRC_BYTES, "little").ljust(bpb, b"\0"), beats[-1][1])
    return beats


# ---- the engines' traffic -------------------------------------------------------------------

def a2a_traffic(rng, n_tags):
    """(scatter requests, arriving parts) with malformed / duplicate / foreign ones."""
    scatters, parts = [], []
    for tag in range(n_tags):
        plen = 8 * rng.randrange(1, 9)
        meta = Meta(op=Op.KV_REPLICA, collective=Collective.ALL_TO_ALL, kv_id=tag,
                    route_id=16 * (tag % 8), src=LOCAL_ID, length=NUM_NODES * plen)
        scatters.append((meta, rng.randbytes(meta.length)))
        if tag % 7 == 3:
            bad = meta.replace(length=meta.length + 4)
            scatters.append((bad, rng.randbytes(bad.length)))
        chunk = []
        for s in range(NUM_NODES):
            pm = Meta(op=Op.KV_REPLICA, collective=Collective.ALL_TO_ALL, kv_id=500 + tag,
                      src=s, dst=LOCAL_ID, route_id=LOCAL_ID, length=plen, seq=LOCAL_ID)
            chunk.append((pm, rng.randbytes(plen)))
        rng.shuffle(chunk)
        for k, (m, p) in enumerate(chunk):
            parts.append((m, p))
            if k == 1 and tag % 3 == 0:
                parts.append((m, p))                                    # duplicate
            if k == 2 and tag % 4 == 1:
                parts.append((m.replace(src=NUM_NODES + 1), p))          # foreign source
            if k == 0 and tag % 5 == 2:
                parts.append((m.replace(length=m.length + 4), p + bytes(4)))  # bad length
    return scatters, parts


# ---- the test -------------------------------------------------------------------------------

async def run(dut, seed, n_router, n_tags, n_gathers):
    prm = bench_params()
    tb = TB(dut, prm)
    rng = random.Random(seed)
    csr = tb.csr
    await tb.reset()

    # identity and bus sanity: ID word from the map, an unmapped read answered SLVERR + counted
    assert await csr.read("ID") == csr.map.id_word
    resp = await csr.bus.read(csr.map.size + 4 * rng.randrange(16), 4)
    assert int(resp.resp) == AxiResp.SLVERR.value
    assert await csr.read("BUS_ERRORS") == 1
    await csr.write("NODE", local_id=LOCAL_ID, num_nodes=NUM_NODES)
    assert await csr.read_field("NODE", "local_id") == LOCAL_ID
    assert await csr.read_field("NODE", "num_nodes") == NUM_NODES

    # route table over AXI-Lite: every non-empty subset of the links, ± local; local only;
    # no route; a port this 3-link router lacks
    table = traffic.router_table(tb.links)
    rmodel = RouterModel(tb.links, prm["max_payload"])
    for r, e in table.items():
        await csr.write("ROUTE_WR", route_id=r, entry=e)
        rmodel.write_route(r, e)
    # reduction configuration over AXI-Lite
    redmodel = HeldReduceModel(prm["reduce_slots"], prm["max_payload"], local_id=LOCAL_ID)
    for r, k in traffic.K_OF_ROUTE.items():
        await csr.write("REDUCE_CFG_WR", route_id=r, config=reduce_config(k))
        redmodel.write_config(r, reduce_config(k))
    a2amodel = A2AModel(prm["data_width"], prm["a2a_max_nodes"], prm["a2a_part_max"],
                        prm["a2a_slots"], NUM_NODES, local_id=LOCAL_ID)

    tb.pauses(rng)
    sends, exp_router = traffic.router_traffic(rng, len(tb.router_inputs), rmodel, n_router,
                                               tb.bpb, oversize=0.02)
    contribs = traffic.make_stream(seed=seed, n_tags=n_tags, window=3)
    # a reduction result holds its slot until it left: the model is replayed after the run at
    # the recorded head / result-end cycles (mcf.sim.benches.nic_reduce.replay)
    red_log = HandshakeLog()
    cocotb.start_soon(red_log.run(
        dut.clk, dut.s_axis_reduce_in_tvalid, dut.s_axis_reduce_in_tready,
        dut.s_axis_reduce_in_tlast, dut.m_axis_reduce_out_tvalid, dut.m_axis_reduce_out_tready,
        dut.m_axis_reduce_out_tlast))
    scatters, parts = a2a_traffic(rng, n_gathers)
    exp_net = [p for m, d in scatters for p in (lambda r: r if isinstance(r, list) else [])(
        a2amodel.scatter(m, d))]
    exp_gathers = [r for r in (a2amodel.part(m, d) for m, d in parts) if isinstance(r, Packet)]

    # ---- sources ----
    async def send_all(source, items):
        for meta, payload in items:
            await source.send(tb.parsed_frame(meta, payload))

    for i, s in enumerate(tb.router_inputs):
        cocotb.start_soon(send_all(s, [(p.meta, p.payload) for p in sends[i]]))
    got_results = []

    async def collect_results():
        while True:
            got_results.append(await tb.recv_parsed(tb.reduce_out))

    cocotb.start_soon(collect_results())
    # new reduction tags on credits, as MARS issues them (slots free once a result left)
    cocotb.start_soon(send_with_credits(dut.clk, tb.reduce_in, contribs, tb.parsed_frame,
                                        redmodel, got_results))
    cocotb.start_soon(send_all(tb.a2a_scatter, scatters))
    cocotb.start_soon(send_all(tb.a2a_in, parts))

    # ---- links: check each frame, loop it back with faults, model the receiver ----
    rx_models = [LinkRxModel(prm["data_width"], prm["max_payload"]) for _ in range(tb.links)]
    rx_expected = [[] for _ in range(tb.links)]
    got_router = {o: {i: [] for i in range(len(tb.router_inputs))}
                  for o in [*range(tb.links), "local"]}

    def feed(p, beats):
        r = rx_models[p].receive(beats)
        if isinstance(r, Packet):
            rx_expected[p].append(r)
        tb.mac_rx[p].send_nowait(tb.wire_frame(beats))

    async def link(p):
        lrng = random.Random(seed * 100 + p)
        n = sum(len(v) for v in exp_router[p].values())
        for seq in range(n):
            beats = await tb.recv_wire_beats(tb.mac_tx[p])
            pkt = wire_packet(beats[1:-1], tb.bpb)
            assert beats == link_frame(pkt, seq, prm["data_width"]), f"link {p} frame {seq}"
            got_router[p][pkt.meta.src].append(pkt)
            x = lrng.random()
            if x < 0.05:
                continue                                    # lost on the wire: a gap
            if x < 0.12:                                    # one bit flipped: CRC error
                bi = lrng.randrange(len(beats))
                d, k = beats[bi]
                nbytes = bin(k).count("1")
                pos = lrng.randrange(8 * nbytes)
                flipped = bytearray(d)
                flipped[pos // 8] ^= 1 << (pos % 8)
                feed(p, beats[:bi] + [(bytes(flipped), k)] + beats[bi + 1:])
                continue
            feed(p, beats)
            if x < 0.16:
                feed(p, beats)                              # duplicate: stale
            if x > 0.98:
                feed(p, bad_magic_frame(pkt, seq, prm["data_width"]))
            if 0.97 < x <= 0.98:                            # longer than the receive buffer
                big = Packet(pkt.meta, bytes(prm["max_payload"] + 2 * tb.bpb))
                feed(p, link_frame(big, seq, prm["data_width"]))

    async def deliver():
        n = sum(len(v) for v in exp_router["local"].values())
        for _ in range(n):
            pkt = await tb.recv_parsed(tb.deliver)
            got_router["local"][pkt.meta.src].append(pkt)

    tasks = [cocotb.start_soon(link(p)) for p in range(tb.links)]
    tasks.append(cocotb.start_soon(deliver()))
    got_net = [await tb.recv_parsed(tb.a2a_net) for _ in exp_net]
    got_gathers = [await tb.recv_parsed(tb.a2a_out) for _ in exp_gathers]
    for t in tasks:
        await t
    for p in range(tb.links):
        await tb.mac_rx[p].wait()
        got = [wire_packet(await tb.recv_wire_beats(tb.link_rx[p]), tb.bpb)
               for _ in rx_expected[p]]
        assert got == rx_expected[p], f"link {p} receiver differs from LinkRxModel"
    for s in tb.sources:
        await s.wait()
    await ClockCycles(dut.clk, 50)
    for s in tb.sinks:
        assert s.empty(), "unexpected extra packet"

    assert got_router == exp_router, "router outputs differ from the golden model"
    assert got_net == exp_net, "scattered parts differ from the golden model"
    key = lambda p: p.meta.kv_id  # noqa: E731
    assert sorted(got_gathers, key=key) == sorted(exp_gathers, key=key)

    # ---- watchdogs armed over AXI-Lite free an incomplete reduction and gather ----
    lonely_rid = next(r for r, k in traffic.K_OF_ROUTE.items() if k >= 2)
    meta, payload = traffic.contribution(np.random.default_rng(seed), 4000, lonely_rid,
                                         ReduceOp.SUM, 16, 0)
    await tb.reduce_in.send(tb.parsed_frame(meta, payload))
    part = Meta(collective=Collective.ALL_TO_ALL, kv_id=4000, src=0, dst=LOCAL_ID, length=8)
    assert a2amodel.part(part, bytes(8)) is None
    await tb.a2a_in.send(tb.parsed_frame(part, bytes(8)))
    await tb.reduce_in.wait()
    await tb.a2a_in.wait()
    await csr.write("reduce_timeout", reduce_timeout=64)
    await csr.write("a2a_timeout", a2a_timeout=64)
    await ClockCycles(dut.clk, 200)
    exp_results = replay(redmodel, [*contribs, (meta, payload)], red_log.heads, red_log.ends)
    assert got_results == exp_results, "reduction results differ from the golden model"
    assert len(exp_results) > 0.9 * n_tags
    redmodel.expire_all()
    a2amodel.counters["watchdog_trips"] += 1
    redmodel.counters["last_trip"] = REDUCE_TAG.const(
        {"kv_id": meta.kv_id, "seq": meta.seq, "route_id": meta.route_id}).as_bits()

    # ---- every counter, read over AXI-Lite ----
    assert await csr.status("nic_router", ROUTER_STATUS) == rmodel.counters
    assert await csr.status("nic_reduce", REDUCE_STATUS) == redmodel.counters
    assert await csr.status("nic_a2a", A2A_STATUS) == a2amodel.counters
    for p in range(tb.links):
        n_frames = sum(len(v) for v in exp_router[p].values())
        n_beats = sum(len(link_frame(pkt, 0, prm["data_width"]))
                      for v in exp_router[p].values() for pkt in v)
        assert await csr.status(f"link{p}_tx", LINK_TX_STATUS) == {
            "frames": n_frames, "beats": n_beats}
        assert await csr.status(f"link{p}_rx", LINK_RX_STATUS) == rx_models[p].counters
    causes = {c for m in rx_models for c, v in m.counters.items() if v}
    assert causes == {n for n, _ in LINK_RX_STATUS}, f"link faults not all exercised: {causes}"
    assert await csr.read("BUS_ERRORS") == 1
    dut._log.info(
        "checked: router %s, link rx %s, reduce %s, a2a %s",
        rmodel.counters, [m.counters for m in rx_models], redmodel.counters, a2amodel.counters)


@cocotb.test()
async def test_nic_block(dut):
    prm = bench_params()
    await run(dut, seed=prm.get("seed", 7), n_router=prm.get("n_router", 300),
              n_tags=prm.get("n_tags", 60), n_gathers=prm.get("n_gathers", 20))
