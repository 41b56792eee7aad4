"""Send unit (mcf.hdl.node.send, docs/node.md §3, §5, §6 rule 3): amaranth.sim tests against the
golden model (mcf.golden.send.SendModel) with an in-test AXI read slave, random records on both
queues, staged packets, random idle/backpressure; and the runners of the cocotb + Verilator
bench (sim/benches/node_send.py: SendUnit → Packetizer(64) against cocotbext-axi AxiRam).

Rate measurement (reported and asserted ≥ 0.9): ``pytest tests/test_node_send.py -k rate -s``.
"""

from __future__ import annotations

import json
import random
from collections import deque

import pytest
from amaranth.sim import Simulator
from landing_sim import write_land_off

from mcf.abi.axi import AxiResp
from mcf.abi.framing import beat_layout, keep_mask, payload_beats
from mcf.abi.meta import Meta
from mcf.abi.node import PayloadSource
from mcf.abi.send import SEND_STATUS
from mcf.golden.send import SendModel, send_packets
from mcf.hdl.node.send import SendUnit
from mcf.sim.benches.node_send import MEM, Scenario, make_scenario, match_packets

BEAT = beat_layout(64)


def _beat(data: int, keep: int, last: int) -> int:
    return (data << BEAT["data"].offset) | (keep << BEAT["keep"].offset) | \
        (last << BEAT["last"].offset)


def staged_beats(payload: bytes) -> list[int]:
    """A staged packet as 64-bit beats (a 0-byte one is a single empty beat)."""
    chunks = [payload[k:k + 8] for k in range(0, len(payload), 8)] or [b""]
    return [_beat(int.from_bytes(c, "little"), (1 << len(c)) - 1, int(i == len(chunks) - 1))
            for i, c in enumerate(chunks)]


def simulate(sc: Scenario, *, idle=0.0, bp=0.0, rpause=0.0, seed=1, bad_beats=(),
             max_cycles=400_000, staged_delay=0):
    """Run the unit; returns (packets as (Meta, payload bytes, beats ok), status, cycles,
    first/last payload-beat cycles)."""
    dut = SendUnit()
    rng = random.Random(seed)
    bus = dut.bus
    out = {"metas": [], "beats": [], "beat_cycles": []}
    done = [False] * 4

    async def push(ctx, port, beats):
        """Offer ``beats`` on stream ``port`` in order, each after a random idle run."""
        for beat in beats:
            while rng.random() < idle:
                await ctx.tick()
            ctx.set(port.valid, 1)
            ctx.set(port.payload.as_value(), beat)
            await ctx.tick().until(port.ready)
            ctx.set(port.valid, 0)

    async def setup_and_queue(ctx, q):
        if q == 0:
            ctx.set(dut.cfg.as_value(), sc.cfg.pack())
            ctx.set(dut.qbuf_base, sc.qbuf_base)
            await write_land_off(ctx, dut, sc.land_off)
        else:
            await ctx.tick().repeat(len(sc.land_off) + 1)
        await push(ctx, getattr(dut, f"req{q}"), sc.records[q])
        done[q] = True

    async def req0(ctx):
        await setup_and_queue(ctx, 0)

    async def req1(ctx):
        await setup_and_queue(ctx, 1)

    def stager(src, k):
        port = dut.staged_attn if src is PayloadSource.ATTN else dut.staged_emit

        async def run(ctx):
            await ctx.tick().repeat(staged_delay + 1)
            await push(ctx, port, (b for pl in sc.staged[src] for b in staged_beats(pl)))
            done[k] = True
        return run

    async def slave(ctx):
        ctx.set(bus.arready, 1)
        ars: deque = deque()
        cur = None
        while True:
            ctx.set(bus.arready, int(rng.random() >= rpause))
            if cur is None and ars and rng.random() >= rpause:
                addr, n = ars.popleft()
                cur = [addr, n, 0]
            if cur is not None:
                a = cur[0] + 16 * cur[2]
                bad = a in bad_beats
                ctx.set(bus.rvalid, 1)
                ctx.set(bus.rdata, 0 if bad else int.from_bytes(sc.memory[a:a + 16], "little"))
                ctx.set(bus.rresp, AxiResp.SLVERR.value if bad else AxiResp.OKAY.value)
                ctx.set(bus.rlast, int(cur[2] == cur[1] - 1))
            else:
                ctx.set(bus.rvalid, 0)
            _, _, arv, ard, ara, arl, rr = await ctx.tick().sample(
                bus.arvalid, bus.arready, bus.araddr, bus.arlen, bus.rready)
            if arv and ard:
                ars.append((ara, arl + 1))
            if cur is not None and rr:
                cur[2] += 1
                if cur[2] == cur[1]:
                    cur = None

    async def sink(ctx):
        cycle = 0
        idle_for = 0
        while idle_for < 300:
            ctx.set(dut.o_meta.ready, int(rng.random() >= bp))
            ctx.set(dut.o_payload.ready, int(rng.random() >= bp))
            _, _, mv, mr, mp, pv, pr, pp = await ctx.tick().sample(
                dut.o_meta.valid, dut.o_meta.ready, dut.o_meta.payload,
                dut.o_payload.valid, dut.o_payload.ready, dut.o_payload.payload)
            cycle += 1
            if mv and mr:
                out["metas"].append(mp.as_bits())
            if pv and pr:
                out["beats"].append((int(pp.data), int(pp.keep), int(pp.last)))
                out["beat_cycles"].append(cycle)
            busy = mv or pv or not all(done)
            idle_for = 0 if busy else idle_for + 1
            assert cycle < max_cycles, "hang"
        raw = ctx.get(dut.status.as_value())
        out["status"] = {n: (raw >> f.offset) & ((1 << f.width) - 1) for n, f in SEND_STATUS}
        out["cycles"] = cycle

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(req0, background=True)
    sim.add_testbench(req1, background=True)
    sim.add_testbench(stager(PayloadSource.ATTN, 2), background=True)
    sim.add_testbench(stager(PayloadSource.EMIT, 3), background=True)
    sim.add_testbench(slave, background=True)
    sim.add_testbench(sink)
    sim.run()

    # pair metas with payload beats as the packetizer does
    beats = deque(out["beats"])
    packets = []
    for raw in out["metas"]:
        meta = Meta.unpack(raw)
        n = payload_beats(meta.length, 64)
        got = [beats.popleft() for _ in range(n)]
        ok = all(k == 0xFF for _, k, _ in got[:-1]) and all(not last for *_, last in got[:-1])
        if n:
            ok = ok and got[-1][1] == keep_mask(meta.length, 64) and got[-1][2] == 1
        payload = b"".join(d.to_bytes(8, "little") for d, _, _ in got)[:meta.length]
        packets.append((meta, payload, ok))
    assert not beats, f"{len(beats)} payload beats without a Meta"
    return packets, out["status"], out["cycles"], out["beat_cycles"]


def _expected(sc: Scenario, bad_beats=()):
    """Golden packets per queue and the summed status (staged sources run on queue 1)."""
    exp, status = [], dict.fromkeys((n for n, _ in SEND_STATUS), 0)
    for q in range(2):
        model = SendModel(sc.cfg, sc.land_off, lambda a, n: sc.memory[a:a + n], sc.qbuf_base,
                          sc.staged if q == 1 else None, bad_beats)
        exp.append([p for p in (model.send(r) for r in sc.records[q]) if p is not None])
        for k, v in model.status.items():
            status[k] += v
    return exp, status


def _run_and_check(sc, bad_beats=(), **kw):
    exp, status = _expected(sc, bad_beats)
    packets, got_status, cycles, _ = simulate(sc, bad_beats=bad_beats, **kw)
    assert all(ok for *_, ok in packets), "payload framing (keep/last/beat count) wrong"
    match_packets([(m, p) for m, p, _ in packets], exp)
    assert got_status == status
    return status


@pytest.mark.parametrize("seed,idle,bp,rpause", [(1, 0.0, 0.0, 0.0), (2, 0.3, 0.3, 0.3),
                                                 (3, 0.1, 0.6, 0.5)])
def test_send_random(seed, idle, bp, rpause):
    """Random KV/QBUF/HDR/staged records on both queues, malformed ones of every kind, staged
    packets of the wrong length: every packet bit-exact, every counter exact."""
    sc = make_scenario(seed, n=60)
    status = _run_and_check(sc, idle=idle, bp=bp, rpause=rpause, seed=seed)
    for k in ("drop_unmapped", "drop_bad_seq", "drop_bad_record", "framing_errors"):
        assert status[k] > 0, k


def test_send_read_error():
    """A KV payload beat answered SLVERR: the packet is still sent (length bytes), counted in
    read_errors; later packets are exact."""
    sc = make_scenario(5, n=30, bad_fraction=0.0, staged=False)
    exp, _ = _expected(sc)
    victim = next(m for m, p in exp[0] if p and m.length > 32)
    addr = sc.cfg.kv_base + victim.kv_id * sc.cfg.kv_slot + sc.land_off[victim.seq] + 16
    bad = {addr - addr % 16}
    status = _run_and_check(sc, bad_beats=bad, seed=5)
    assert status["read_errors"] >= 1


def test_golden_model_rules():
    """send_packets on hand-made records: each drop rule and each source once."""
    from mcf.abi.landing import LandingConfig
    from mcf.abi.node import Cmd, Queue, RecordClass, cmd_raw
    mem = bytes(range(256)) * 64
    cfg = LandingConfig(kv_base=0x100, kv_slot=1000, kv_count=4)
    land_off = [None] * 256
    land_off[0], land_off[1] = 0, 900
    send = RecordClass.SEND

    def rec(src, **meta):
        return Cmd(send, Queue.NET, Meta(**meta).pack(), src, arg=0x40)
    records = [rec(PayloadSource.KV, kv_id=2, seq=0, length=10),       # sent
               rec(PayloadSource.KV, kv_id=4, seq=0, length=10),       # unmapped
               rec(PayloadSource.KV, kv_id=1, seq=2, length=10),       # no entry
               rec(PayloadSource.KV, kv_id=1, seq=1, length=101),      # past the slot
               rec(PayloadSource.HDR, length=3),                       # bad record
               rec(PayloadSource.QBUF, length=5),                      # sent
               rec(PayloadSource.ATTN, length=9),                      # sent, padded
               rec(PayloadSource.HDR),                                 # sent
               cmd_raw(cls=send.value, src=6, meta=Meta(length=4).pack())]  # bad src
    packets, status = send_packets(records, mem, cfg, land_off, qbuf_base=0x1000,
                                   staged={PayloadSource.ATTN: [b"\x07" * 3]})
    assert [p for _, p in packets] == [mem[0x100 + 2000:0x100 + 2010], mem[0x1040:0x1045],
                                       b"\x07" * 3 + bytes(6), b""]
    assert status == {"packets": 4, "bytes": 24, "drop_unmapped": 1, "drop_bad_seq": 2,
                      "drop_bad_record": 2, "read_errors": 0, "framing_errors": 1}


# --- cocotb + Verilator bench ---------------------------------------------------------------

BENCH = "mcf.sim.benches.node_send"


def send_built():
    from mcf.sim import build
    from mcf.sim.benches.node_send import harness
    return build(harness(), "node_send", width_warnings=True)


@pytest.mark.parametrize("seed,pause,bp", [(1, 0.0, 0.0), (2, 0.3, 0.3), (3, 0.5, 0.6)])
def test_send_bench(seed, pause, bp):
    from mcf.sim import run
    run(send_built(), BENCH, params={"seed": seed, "n": 80, "pause": pause, "bp": bp,
                                     "tests": ["random_mix"]})


def test_send_rate(tmp_path):
    """Back-to-back 2,048-B KV sends from AxiRam, no pauses: payload beats per cycle on the
    64-bit output (printed with ``-s``; asserted ≥ 0.9)."""
    from mcf.sim import run
    out = tmp_path / "rate.json"
    run(send_built(), BENCH, params={"seed": 4, "tests": ["rate"], "out": str(out)})
    r = json.loads(out.read_text())
    print("send rate:", r)
    assert r["payload_beats_per_cycle"] >= 0.9
    assert MEM > 0


def test_send_registers():
    """One read-only ``send_<counter>`` register per SEND_STATUS field, widths from the ABI."""
    from mcf.abi.regs import Access
    from mcf.abi.send import send_registers
    regs = send_registers()
    assert [r.name for r in regs] == [f"send_{n}" for n, _ in SEND_STATUS]
    for r, (_, f) in zip(regs, SEND_STATUS):
        assert [fl.access for fl in r.fields] == [Access.R]
        assert sum(fl.width for fl in r.fields) == f.width


def test_staged_wait_does_not_block_other_queue():
    """Rule 3: an ATTN record whose staged packet is not there yet is not taken, so the NET
    queue's KV sends behind it in time all leave first; then the ATTN packet follows."""
    from mcf.abi.node import RecordClass, cmd_raw
    sc = make_scenario(8, n=12, bad_fraction=0.0, staged=False)
    sc.records[0] = sc.records[0][:12]
    attn = Meta(length=100, route_id=9).pack()
    sc.records[1] = [cmd_raw(cls=RecordClass.SEND.value, queue=1,
                             src=PayloadSource.ATTN.value, meta=attn)]
    sc.staged = {PayloadSource.ATTN: [bytes(range(100))], PayloadSource.EMIT: []}
    exp, status = _expected(sc)
    packets, got_status, _, _ = simulate(sc, staged_delay=4000, seed=8)
    assert [(m, p) for m, p, _ in packets] == exp[0] + exp[1]
    assert got_status == status
