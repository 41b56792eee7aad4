"""cocotb bench of the NIC reduction engine (flat top ``nic_reduce``): cocotbext-axi source and
sink, idle × backpressure, MAX / SUM / softmax-merge contributions in random arrival order with
interleaved tags and malformed ones mixed in, new tags issued on credits as MARS does; results
and counters from mcf.golden.nic.ReduceModel, bit for bit.

The engine keeps a finished result in its slot until its last beat has left (docs/node.md §6
rule 2), so which contributions find a slot depends on when the output took the results.
:class:`HeldReduceModel` is the golden model of that rule and :func:`replay` feeds it the
recorded cycles of contribution heads and result ends: drops, counters and result bytes are
predicted by the model, only the environment's timing is taken from the run."""

from __future__ import annotations

import logging
import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge
from cocotbext.axi import AxiStreamBus, AxiStreamFrame, AxiStreamSink, AxiStreamSource

from mcf.abi.meta import META, Meta, ReduceOp
from mcf.abi.nic import LANE_BYTES, REDUCE_STATUS, REDUCE_TAG, ReduceDrop, reduce_config
from mcf.golden.nic import Packet, ReduceModel, reduce_key
from mcf.sim.benches import nic_traffic as t
from mcf.sim.tb import set_pauses
from mcf.sim.toolchain import bench_params


class _Held:
    """A slot whose result is complete but not yet sent: busy, matches no contribution."""

    def __init__(self, key):
        self.key = ("held", key)


class HeldReduceModel(ReduceModel):
    """:class:`mcf.golden.nic.ReduceModel` with rule 2 of docs/node.md §6: a finished result
    keeps its slot until :meth:`release` (its last beat left the engine; results leave in
    completion order). While held, the slot is busy for new tags and a contribution of the
    held tag that passes the length, op and configuration checks is a NO_SLOT drop."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.held: list = []

    def _well_formed(self, meta) -> bool:
        cfg = self.config_layout.from_bits(self.config.get(meta.route_id, 0))
        n = meta.length
        return not (n == 0 or n % LANE_BYTES or n > self.max_payload
                    or (meta.reduce_op == ReduceOp.SOFTMAX_MERGE and n < 2 * LANE_BYTES)
                    or meta.reduce_op == ReduceOp.NONE or int(cfg.k) == 0)

    def contribute(self, meta, payload):
        key = reduce_key(meta)
        if key in self.held and self._well_formed(meta):
            self.counters["rx_packets"] += 1
            return self._drop(ReduceDrop.NO_SLOT)
        r = super().contribute(meta, payload)
        if isinstance(r, Packet):
            self.slots[self.slots.index(None)] = _Held(key)
            self.held.append(key)
        return r

    def release(self) -> None:
        key = self.held.pop(0)
        self.slots[next(i for i, s in enumerate(self.slots)
                        if isinstance(s, _Held) and s.key == ("held", key))] = None

    def expire(self, key) -> None:
        """The watchdog freed the open slot of ``key`` (route_id, kv_id, seq)."""
        idx = next(i for i, s in enumerate(self.slots)
                   if s is not None and not isinstance(s, _Held) and s.key == key)
        self.slots[idx] = None
        self.counters["watchdog_trips"] += 1
        route_id, kv_id, seq = key
        self.counters["last_trip"] = REDUCE_TAG.const(
            {"kv_id": kv_id, "seq": seq, "route_id": route_id}).as_bits()

    def expire_all(self) -> int:
        n = sum(s is not None and not isinstance(s, _Held) for s in self.slots)
        self.slots = [s if isinstance(s, _Held) else None for s in self.slots]
        self.counters["watchdog_trips"] += n
        return n


def replay(model: HeldReduceModel, contribs, heads: list[int], ends: list[int],
           trips=()) -> list:
    """Feed ``contribs`` to ``model`` at the cycles their heads were accepted (``heads``),
    releasing the oldest held result at each cycle in ``ends`` (a result's last beat left; it
    frees the slot for heads of later cycles) and freeing the open slot of ``key`` at each
    ``(cycle, key)`` of ``trips`` (a watchdog trip; likewise for later heads). Returns the
    model's results in order."""
    assert len(heads) == len(contribs)
    events = sorted([(c, 0, i) for i, c in enumerate(heads)] + [(c, 1, 0) for c in ends]
                    + [(c, 2, k) for c, k in trips])
    out = []
    for _, kind, i in events:
        if kind == 1:
            model.release()
        elif kind == 2:
            model.expire(i)
        else:
            r = model.contribute(*contribs[i])
            if isinstance(r, Packet):
                out.append(r)
    return out


async def send_with_credits(clk, source, contribs, frame, model: HeldReduceModel,
                            results: list) -> None:
    """Send ``contribs`` (``frame(meta, payload)`` makes the source's frame) the way MARS
    issues reductions (docs/node.md §7): a well-formed contribution that opens a new tag waits
    until fewer than ``model.n_slots`` tags are open or held — tags opened minus ``results``
    received (a result is received after its last beat left, when its slot is free). The
    stream's own order is kept; without the credit a sustained slow output would make the
    engine drop (NO_SLOT), which the replay models but which leaves little to check."""
    opened = set()
    for meta, payload in contribs:
        key = reduce_key(meta)
        if model._well_formed(meta) and key not in opened:
            while len(opened) - len(results) >= model.n_slots:
                await RisingEdge(clk)
            opened.add(key)
        await source.send(frame(meta, payload))


def trip_key(last_trip: int) -> tuple[int, int, int]:
    """The (route_id, kv_id, seq) key of a ``last_trip`` status value."""
    tag = REDUCE_TAG.from_bits(last_trip)
    return int(tag.route_id), int(tag.kv_id), int(tag.seq)


class HandshakeLog:
    """Cycle numbers of stream transfers seen at a clock edge: ``heads`` (first beats of
    packets on the input) and ``ends`` (last beats on the output); with the status signal,
    ``trips`` — ``(cycle, key)`` of every watchdog trip (the counter and ``last_trip`` change
    one edge after the trip; two slots never trip in one cycle, their last activity differs)."""

    def __init__(self):
        self.heads: list[int] = []
        self.ends: list[int] = []
        self.trips: list = []

    async def run(self, clk, i_valid, i_ready, i_last, o_valid, o_ready, o_last, status=None):
        cycle, in_pkt, n_trips = 0, False, 0
        while True:
            await RisingEdge(clk)
            cycle += 1
            if int(i_valid.value) and int(i_ready.value):
                if not in_pkt:
                    self.heads.append(cycle)
                in_pkt = not int(i_last.value)
            if int(o_valid.value) and int(o_ready.value) and int(o_last.value):
                self.ends.append(cycle)
            if status is not None:
                raw = int(status.value)
                st = {n: (raw >> f.offset) & ((1 << f.width) - 1) for n, f in REDUCE_STATUS}
                if st["watchdog_trips"] != n_trips:
                    assert st["watchdog_trips"] == n_trips + 1, "two trips in one cycle"
                    n_trips += 1
                    self.trips.append((cycle - 1, trip_key(st["last_trip"])))


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
    dut.timeout.value = prm.get("timeout", 1500)
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
    model = HeldReduceModel(prm["n_slots"], prm["max_payload"], local_id=3)
    for rid, k in t.K_OF_ROUTE.items():
        model.write_config(rid, reduce_config(k))
    log = HandshakeLog()
    cocotb.start_soon(log.run(dut.clk, dut.s_axis_tvalid, dut.s_axis_tready, dut.s_axis_tlast,
                              dut.m_axis_tvalid, dut.m_axis_tready, dut.m_axis_tlast,
                              dut.status))
    got = []

    async def collect():
        while True:
            f = await sink.recv(compact=False)
            data = bytes(b for b, k in zip(f.tdata, f.tkeep) if k)
            metas = set(f.tuser)
            assert len(metas) == 1
            got.append(Packet(Meta.unpack(metas.pop() & ((1 << META.size) - 1)), data))

    def frame(meta, payload):
        return AxiStreamFrame(payload or bytes(8), tkeep=None if payload else [0] * 8,
                              tuser=meta.pack())

    cocotb.start_soon(collect())
    await send_with_credits(dut.clk, src, contribs, frame, model, got)
    await src.wait()
    n = -1
    while n != len(got):        # results drain: nothing new for 1000 cycles
        n = len(got)
        await ClockCycles(dut.clk, 1000)
    await ClockCycles(dut.clk, 2 * prm.get("timeout", 1500))    # stranded slots trip
    expected = replay(model, contribs, log.heads, log.ends, log.trips)
    assert len(got) == len(expected) and len(expected) > 0.9 * n_tags, (len(got), len(expected))
    for g, exp in zip(got, expected):
        assert g == exp, "result differs from the golden model"
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
