"""cocotb bench of the all-to-all engine (flat top ``nic_all_to_all``, paper §5): cocotbext-axi
sources on the scatter and gather inputs, sinks on the part and gathered-tensor outputs, idle ×
backpressure on all four streams, N ∈ {2, 4, 8} (``num_nodes`` is a runtime input: one build).

Scatter: tensors of N whole-beat parts mixed with malformed lengths (not N × a whole-beat
part, zero, parts longer than ``part_max``). Gather: the parts of several tags (``kv_id``) in
random interleaved arrival order with duplicates, foreign sources (``src ≥ N``), bad lengths
(zero, partial beat, too long, different from the tag's first part) and parts that find every
slot busy mixed in; at the end a few gathers are left incomplete and the watchdog is switched on.
Scoreboard: :class:`mcf.golden.nic.A2AModel` fed in arrival order gives every part on ``net``
(in order, bit-exact), every gathered tensor on ``o`` (bit-exact; completion order is not
emission order when two slots finish while the output is stalled, so these are matched by tag)
and every ``A2A_STATUS`` counter exactly.
"""

from __future__ import annotations

import logging
import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge, with_timeout
from cocotbext.axi import AxiStreamBus, AxiStreamFrame, AxiStreamSink, AxiStreamSource

from mcf.abi.meta import META, Collective, Meta, Op, Stage
from mcf.abi.nic import A2A_STATUS
from mcf.golden.nic import A2AModel, Packet
from mcf.sim.tb import set_pauses
from mcf.sim.toolchain import bench_params

NODE_IDS = 1 << META["src"].width
ROUTE_IDS = 1 << META["route_id"].width
KV_IDS = 1 << META["kv_id"].width


def unpack(layout, raw):
    return {n: (raw >> f.offset) & ((1 << f.width) - 1) for n, f in layout}


class TB:
    def __init__(self, dut, bpb):
        self.dut = dut
        self.bpb = bpb
        cocotb.start_soon(Clock(dut.clk, 10, unit="ns").start())
        bus = AxiStreamBus.from_prefix
        self.scatter = AxiStreamSource(bus(dut, "s_axis_scatter"), dut.clk, dut.rst)
        self.net = AxiStreamSink(bus(dut, "m_axis_net"), dut.clk, dut.rst)
        self.parts = AxiStreamSource(bus(dut, "s_axis"), dut.clk, dut.rst)
        self.out = AxiStreamSink(bus(dut, "m_axis"), dut.clk, dut.rst)
        for x in (self.scatter, self.net, self.parts, self.out):
            x.log.setLevel(logging.WARNING)

    async def reset(self, local_id, num_nodes):
        self.dut.rst.value = 1
        self.dut.local_id.value = local_id
        self.dut.num_nodes.value = num_nodes
        self.dut.timeout.value = 0
        await ClockCycles(self.dut.clk, 3)
        self.dut.rst.value = 0
        await RisingEdge(self.dut.clk)

    def frame(self, meta: Meta, payload: bytes) -> AxiStreamFrame:
        if not payload:
            return AxiStreamFrame(bytes(self.bpb), tkeep=[0] * self.bpb, tuser=meta.pack())
        return AxiStreamFrame(payload, tuser=meta.pack())

    async def recv(self, sink, timeout_us):
        f = await with_timeout(sink.recv(compact=False), timeout_us, "us")
        data = bytes(b for b, k in zip(f.tdata, f.tkeep) if k)
        metas = set(f.tuser)
        assert len(metas) == 1, "meta changed inside a packet"
        return Packet(Meta.unpack(metas.pop() & ((1 << META.size) - 1)), data)


def _tag(p: Packet) -> int:
    return p.meta.kv_id


def part_length(rng, bpb, part_max):
    beats = part_max // bpb
    return bpb * rng.choice([1, 1, 2, 3, 4, rng.randrange(1, 9), rng.randrange(1, beats + 1)])


def bad_part_length(rng, bpb, part_max, slot_len=None):
    """A part length the engine must refuse (``slot_len``: the tag's open slot, if any)."""
    choices = [0, rng.randrange(1, bpb), bpb * rng.randrange(1, 4) + rng.randrange(1, bpb),
               part_max + bpb * rng.randrange(1, 4)]
    if slot_len is not None:                # valid on its own, but not this tag's length
        choices.append(bpb * rng.choice([b for b in range(1, part_max // bpb + 1)
                                         if b * bpb != slot_len]))
    return rng.choice(choices)


def make_scatters(rng, n, n_scatter, bpb, part_max, local_id):
    out = []
    for k in range(n_scatter):
        plen = part_length(rng, bpb, part_max)
        length = n * plen
        r = rng.random()
        if r < 0.05:
            length = 0
        elif r < 0.10:
            length = n * plen + rng.randrange(1, bpb)        # not N whole-beat parts
        elif r < 0.13:
            length = n * (part_max + bpb)                    # parts too long
        elif r < 0.16 and n > 1:
            length = n * plen + bpb                          # not a multiple of N parts
        meta = Meta(stage=rng.choice(list(Stage)), op=Op.KV_REPLICA,
                    collective=Collective.ALL_TO_ALL, src=local_id,
                    route_id=rng.randrange(ROUTE_IDS - n + 1), kv_id=k % KV_IDS,
                    length=length, seq=rng.randrange(256))
        out.append((meta, rng.randbytes(length)))
    return out


def make_gathers(rng, model: A2AModel, n, n_tags, bpb, part_max, local_id, malformed=0.15,
                 leave_open=1):
    """Arrival-order gather traffic, fed through ``model`` as it is generated (so that
    duplicates are sent only while their tag is open and refused parts are retried).
    Returns (parts in arrival order, expected gathered packets)."""
    arrivals, expected = [], []
    pending: dict[int, list] = {}           # tag -> parts still to arrive
    started = 0
    route = rng.randrange(ROUTE_IDS)

    def slot_of(tag):
        return next((s for s in model.slots if s is not None and s["tag"] == tag), None)

    def feed(meta, payload):
        arrivals.append((meta, payload))
        r = model.part(meta, payload)
        if isinstance(r, Packet):
            expected.append(r)
        return r

    while started < n_tags or pending:
        # open tags at once; one more than the slots now and then: NO_SLOT drops
        window = rng.choice([1] + [model.n_slots] * 5 + [model.n_slots + 1])
        if started < n_tags and len(pending) < window:
            tag = started % KV_IDS
            plen = part_length(rng, bpb, part_max)
            meta = Meta(stage=Stage.PREFILL, op=Op.KV_REPLICA,
                        collective=Collective.ALL_TO_ALL, dst=local_id, route_id=route,
                        kv_id=tag, length=plen, seq=local_id)
            pending[tag] = [(meta.replace(src=s), rng.randbytes(plen)) for s in range(n)]
            started += 1
            continue
        tag = rng.choice(list(pending))
        parts = pending[tag]
        meta, payload = parts.pop(rng.randrange(len(parts)))
        if feed(meta, payload) == "drop_no_slot":
            parts.append((meta, payload))            # every slot busy: it comes again later
        if not parts:
            del pending[tag]
        if rng.random() < malformed:
            slot = slot_of(tag)
            kind = rng.randrange(3)
            if kind == 0 and slot is not None:               # duplicate of an accepted part
                src = rng.choice(list(slot["parts"]))
                feed(meta.replace(src=src), slot["parts"][src])
            elif kind == 1:                                  # foreign source
                feed(meta.replace(src=rng.randrange(n, NODE_IDS)), payload)
            else:
                length = bad_part_length(rng, bpb, part_max, slot and slot["len"])
                feed(meta.replace(length=length), rng.randbytes(length))
    # gathers that never complete: the watchdog must free them
    for k in range(leave_open if n > 1 else 0):
        tag = (started + k) % KV_IDS
        plen = part_length(rng, bpb, part_max)
        for s in range(n - 1):
            feed(Meta(collective=Collective.ALL_TO_ALL, dst=local_id, kv_id=tag, src=s,
                      length=plen), rng.randbytes(plen))
    return arrivals, expected


async def run_test(dut, n, idle, backpressure, seed):
    prm = bench_params()
    dw = prm["data_width"]
    bpb = dw // 8
    part_max, n_slots, max_nodes = prm["part_max"], prm["n_slots"], prm["max_nodes"]
    tb = TB(dut, bpb)
    rng = random.Random(seed)
    local_id = rng.randrange(n)
    await tb.reset(local_id, n)
    set_pauses(rng, [tb.scatter, tb.parts], [tb.net, tb.out], idle=0.3 if idle else None,
               backpressure=(0.2, 0.7) if backpressure else None)

    model = A2AModel(dw, max_nodes, part_max, n_slots, n, local_id=local_id)
    scatters = make_scatters(rng, n, prm.get("n_scatter", 40), bpb, part_max, local_id)
    exp_net = []
    for meta, payload in scatters:
        r = model.scatter(meta, payload)
        if isinstance(r, list):
            exp_net += r
    arrivals, exp_out = make_gathers(rng, model, n, prm.get("n_tags", 10), bpb, part_max,
                                     local_id)
    for meta, payload in scatters:
        await tb.scatter.send(tb.frame(meta, payload))
    for meta, payload in arrivals:
        await tb.parts.send(tb.frame(meta, payload))

    got_net = [await tb.recv(tb.net, 500) for _ in exp_net]
    assert got_net == exp_net, "scattered parts differ from the model"
    got_out = [await tb.recv(tb.out, 2000) for _ in exp_out]
    assert sorted(got_out, key=_tag) == sorted(exp_out, key=_tag), \
        "gathered tensors differ from the model"
    beats = sum(len(p) // bpb + 1 for _, p in scatters + arrivals)
    await with_timeout(tb.scatter.wait(), 10 * (1000 + 100 * beats), "ns")
    await with_timeout(tb.parts.wait(), 10 * (1000 + 100 * beats), "ns")
    await ClockCycles(dut.clk, 50)
    assert tb.net.empty() and tb.out.empty(), "unexpected extra packet"

    # the watchdog frees the gathers left incomplete
    open_slots = sum(s is not None for s in model.slots)
    dut.timeout.value = 64
    await ClockCycles(dut.clk, 200)
    model.counters["watchdog_trips"] += open_slots
    model.slots = [None] * n_slots
    status = unpack(A2A_STATUS, int(dut.status.value))
    assert status == model.counters, (status, model.counters)
    if n > 1:
        assert status["watchdog_trips"] > 0
    if len(arrivals) >= 100 * n:
        for c in ("drop_bad_length", "drop_duplicate", "drop_bad_src", "drop_no_slot",
                  "scatter_drops"):
            assert status[c] > 0, f"never exercised {c}"
    dut._log.info("all-to-all N=%d: %d scatter requests, %d parts in, %d parts out, %d gathers "
                  "%s", n, len(scatters), len(arrivals), len(exp_net), len(exp_out), status)


@cocotb.test()
@cocotb.parametrize(n=[2, 4, 8], idle=[False, True], backpressure=[False, True])
async def test_all_to_all(dut, n, idle, backpressure):
    await run_test(dut, n, idle, backpressure, seed=60 + 4 * n + 2 * int(idle) + int(backpressure))
