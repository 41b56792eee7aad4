"""cocotb bench of the send unit (:class:`mcf.hdl.node.send.SendUnit`) feeding a
``Packetizer(data_width=64)`` (flat top: :func:`harness`), its DDR reads served by
cocotbext-axi ``AxiRam`` (docs/node.md §3, §5, §6 rule 3).

Traffic (:func:`make_scenario`, shared with the amaranth.sim tests): SEND records on both queues
— KV sends through a ``LAND_OFF`` table with offsets off the bus beat, QBUF sends at
``qbuf_base + arg`` (a register off a word: its low bits taken as 0), header-only packets, and on
the COMPUTE queue ATTN/EMIT sends whose payloads wait in the two staging streams (some staged
packets of the wrong length) — mixed with malformed records of every kind (unmapped ``kv_id``,
``seq`` without an entry, past the slot, zero/oversize length, HDR with a length, unassigned
``src``/``op``, not a SEND, a QBUF ``arg`` off a word).

Scoreboard: the packets on ``m_axis_pkt`` (decoded with :mod:`mcf.abi.framing`'s format:
header beat = ``Meta``, then the payload) against :class:`mcf.golden.send.SendModel` run per queue
(:func:`match_packets`: any interleaving of the two queues, each in order), and every
``SEND_STATUS`` counter exactly. AxiRam pauses on AR/R (``pause``), backpressure on the
packet output and idle cycles on every input (``bp``).

``rate``: ``rate_n`` back-to-back 2,048-B KV sends, no pauses: payload beats per cycle on the
64-bit packet output from its first payload beat to its last (``out``: JSON).
"""

from __future__ import annotations

import json
import logging
import random
from dataclasses import dataclass, field

import cocotb
from amaranth import Module
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge
from cocotbext.axi import (
    AxiStreamBus,
    AxiStreamFrame,
    AxiStreamSink,
    AxiStreamSource,
)

from mcf.abi.csrmap import PACKETIZER_STATUS
from mcf.abi.framing import MAX_PAYLOAD, beat_layout
from mcf.abi.landing import LAND_OFF_ENTRIES, LANDING_CONFIG, LandingConfig
from mcf.abi.meta import META, Collective, Meta, Op
from mcf.abi.node import CMD, PayloadSource, Queue, RecordClass, cmd_raw
from mcf.abi.send import SEND_STATUS, STAGED_SOURCES
from mcf.golden.send import SendModel
from mcf.hdl.mem.axi import AXI4Signature
from mcf.sim.benches.packet_lander import write_land_off
from mcf.sim.ddr import READ, ddr_ram
from mcf.sim.tb import pattern
from mcf.sim.toolchain import bench_params, skip_unless_selected

MEM = 1 << 20


@dataclass
class Scenario:
    cfg: LandingConfig
    land_off: list
    qbuf_base: int
    memory: bytes
    records: list = field(default_factory=lambda: [[], []])   # raw CMD ints per queue
    staged: dict = field(default_factory=dict)                 # PayloadSource -> [bytes]


def make_scenario(seed: int, n: int, bad_fraction: float = 0.2, staged: bool = True
                  ) -> Scenario:
    """``n`` records per queue; staged sources only on COMPUTE (queue 1), since which record
    takes which staged packet follows the order records are taken."""
    rng = random.Random(seed)
    memory = rng.randbytes(MEM)
    cfg = LandingConfig(kv_base=0x1_0008 + 16 * rng.randrange(8) + 4 * rng.randrange(4),
                        kv_slot=6000 + 4 * rng.randrange(16), kv_count=24)
    land_off: list = [None] * LAND_OFF_ENTRIES
    for k in range(10):
        land_off[k] = k * 500 + 4 * rng.randrange(4)
    sc = Scenario(cfg, land_off, 0x9_0003, memory,
                  staged={s: [] for s in STAGED_SOURCES})
    ops = [o for o in Op]

    def meta(**kw):
        base = dict(op=rng.choice([Op.KV_REPLICA] * 3 + ops), src=rng.randrange(4),
                    dst=rng.randrange(4), route_id=rng.randrange(256),
                    collective=rng.choice(list(Collective)), seq=rng.randrange(256))
        base.update(kw)
        return Meta(**base).pack()

    for q in (0, 1):
        kinds = ["kv"] * 4 + ["qbuf"] * 2 + ["hdr"] * 2
        if q == 1 and staged:
            kinds += ["attn", "emit"] * 2
        for _ in range(n):
            kind = rng.choice(kinds)
            fields = dict(cls=RecordClass.SEND.value, queue=q, wait=rng.randrange(1 << 20),
                          arg=0)
            stage = None
            if kind == "kv":
                seq = rng.randrange(10)
                room = cfg.kv_slot - land_off[seq]
                length = rng.choice([rng.randint(1, 64), rng.randint(1, min(room, MAX_PAYLOAD))])
                fields |= dict(src=PayloadSource.KV.value,
                               meta=meta(kv_id=rng.randrange(cfg.kv_count), seq=seq,
                                         length=length))
            elif kind == "qbuf":
                fields |= dict(src=PayloadSource.QBUF.value, arg=rng.randrange(0, 1 << 16, 4),
                               meta=meta(length=rng.randint(1, MAX_PAYLOAD)))
            elif kind == "hdr":
                fields |= dict(src=PayloadSource.HDR.value, meta=meta(length=0))
            else:
                src = PayloadSource.ATTN if kind == "attn" else PayloadSource.EMIT
                length = rng.choice([rng.randint(1, 40), rng.randint(1, MAX_PAYLOAD)])
                fields |= dict(src=src.value, meta=meta(length=length))
                stage = (src, length)
            if rng.random() < bad_fraction:
                bad = rng.randrange(8)
                m = fields["meta"]
                lf = META["length"]
                if bad == 0 and kind == "kv":           # unmapped
                    fields["meta"] = _set(m, "kv_id", rng.randrange(cfg.kv_count, 1 << 16))
                elif bad == 1 and kind == "kv":         # no LAND_OFF entry
                    fields["meta"] = _set(m, "seq", rng.randrange(10, 256))
                elif bad == 2 and kind == "kv":         # past the slot
                    fields["meta"] = _set(_set(m, "seq", 9), "length",
                                          cfg.kv_slot - land_off[9] + rng.randint(1, 100))
                elif bad == 3:                          # oversize / zero / HDR with length
                    fields["meta"] = _set(m, "length", rng.choice(
                        [MAX_PAYLOAD + 1, (1 << lf.width) - 1, 0 if kind != "hdr" else 5]))
                elif bad == 4:                          # unassigned op
                    fields["meta"] = _set(m, "op", 7)
                elif bad == 5 and stage is None:        # unassigned src
                    fields["src"] = rng.randrange(5, 8)
                elif bad == 6:                          # not a SEND
                    fields["cls"] = rng.choice([RecordClass.NOP.value, RecordClass.EMIT.value,
                                                12])
                elif stage is not None:                 # staged packet of the wrong length
                    stage = (stage[0], rng.randint(1, stage[1] + 40))
                elif kind == "qbuf":                    # arg off a word (DEC_ALIGN)
                    fields["arg"] += rng.randint(1, 3)
            if stage is not None:
                sc.staged[stage[0]].append(rng.randbytes(stage[1]))
            sc.records[q].append(cmd_raw(**fields))
    return sc


def _set(raw: int, name: str, value: int) -> int:
    f = META[name]
    mask = ((1 << f.width) - 1) << f.offset
    return (raw & ~mask) | (value << f.offset)


def match_packets(got, expected) -> None:
    """``got``: [(Meta, payload)] as they left; ``expected``: per queue [(Meta, payload or
    None)] from the golden model. Each packet must be the head of one queue's list (a payload
    ``None`` — a read error — matches any bytes of the right length); all lists end empty."""
    heads = [list(e) for e in expected]
    for k, (meta, payload) in enumerate(got):
        for exp in heads:
            if exp and exp[0][0] == meta and (
                    exp[0][1] == payload or (exp[0][1] is None and len(payload) == meta.length)):
                exp.pop(0)
                break
        else:
            raise AssertionError(f"packet {k} {meta} matches neither queue's next packet: "
                                 f"{[e[0] if e else None for e in heads]}")
    assert not any(heads), f"packets missing: {[len(e) for e in heads]}"


class SendHarness(wiring.Component):
    """``SendUnit`` → ``Packetizer(64)``; the queues as plain 128-bit streams (one CMD per
    beat) so a cocotbext-axi source drives them."""

    def __init__(self):
        from mcf.hdl.node.send import SendUnit
        from mcf.hdl.packet.packetizer import Packetizer
        self.unit = SendUnit()
        self.pktz = Packetizer(64)
        beat = beat_layout(64)
        sig = self.unit.signature.members
        super().__init__({
            "req0": In(stream.Signature(CMD.size)), "req1": In(stream.Signature(CMD.size)),
            "staged_attn": In(stream.Signature(beat)), "staged_emit": In(stream.Signature(beat)),
            "cfg": In(LANDING_CONFIG), "land_off_we": sig["land_off_we"],
            "land_off_seq": sig["land_off_seq"], "land_off_data": sig["land_off_data"],
            "qbuf_base": sig["qbuf_base"],
            "o_packet": Out(stream.Signature(beat)),
            "m_axi": Out(AXI4Signature()),
            "status": Out(SEND_STATUS), "pkt_status": Out(PACKETIZER_STATUS),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.unit = u = self.unit
        m.submodules.pktz = p = self.pktz
        for q in (0, 1):
            src, dst = getattr(self, f"req{q}"), getattr(u, f"req{q}")
            m.d.comb += [dst.valid.eq(src.valid), dst.payload.as_value().eq(src.payload),
                         src.ready.eq(dst.ready)]
        for name in ("staged_attn", "staged_emit"):
            wiring.connect(m, wiring.flipped(getattr(self, name)), getattr(u, name))
        m.d.comb += [u.cfg.eq(self.cfg), u.land_off_we.eq(self.land_off_we),
                     u.land_off_seq.eq(self.land_off_seq),
                     u.land_off_data.eq(self.land_off_data), u.qbuf_base.eq(self.qbuf_base),
                     self.status.eq(u.status), self.pkt_status.eq(p.status)]
        wiring.connect(m, u.o_meta, p.i_meta)
        wiring.connect(m, u.o_payload, p.i_payload)
        wiring.connect(m, p.o_packet, wiring.flipped(self.o_packet))
        wiring.connect(m, u.bus, wiring.flipped(self.m_axi))
        return m


def harness():
    from mcf.hdl.flat import FlatTop
    return FlatTop(SendHarness(), {"req0": "s_axis_req0", "req1": "s_axis_req1",
                                   "staged_attn": "s_axis_attn", "staged_emit": "s_axis_emit",
                                   "o_packet": "m_axis_pkt"})


def _status(dut) -> dict[str, int]:
    raw = int(dut.status.value)
    return {n: (raw >> f.offset) & ((1 << f.width) - 1) for n, f in SEND_STATUS}


class TB:
    def __init__(self, dut, rng, pause=0.0, bp=0.0):
        self.dut = dut
        cocotb.start_soon(Clock(dut.clk, 4, unit="ns").start())
        dut.rst.value = 1
        self.ram = ddr_ram(dut, "m_axi", dut.clk, dut.rst, size=MEM, pause=pause, rng=rng,
                           channels=READ)
        self.src = {}
        for name in ("req0", "req1", "attn", "emit"):
            s = AxiStreamSource(AxiStreamBus.from_prefix(dut, f"s_axis_{name}"), dut.clk,
                                dut.rst)
            s.log.setLevel(logging.WARNING)
            if bp:
                s.set_pause_generator(pattern(bp, rng))
            self.src[name] = s
        self.sink = AxiStreamSink(AxiStreamBus.from_prefix(dut, "m_axis_pkt"), dut.clk, dut.rst)
        self.sink.log.setLevel(logging.WARNING)
        if bp:
            self.sink.set_pause_generator(pattern(bp, rng))
        dut.land_off_we.value = 0
        self.cycle = 0
        self.out_beats: list[tuple[int, int]] = []      # (cycle, tlast) of packet beats

    async def reset(self, sc: Scenario):
        d = self.dut
        d.cfg.value = sc.cfg.pack()
        d.qbuf_base.value = sc.qbuf_base
        d.rst.value = 1
        await ClockCycles(d.clk, 3)
        d.rst.value = 0
        await write_land_off(d, sc.land_off)
        self.ram.write(0, sc.memory)
        cocotb.start_soon(self._monitor())
        await RisingEdge(d.clk)

    async def _monitor(self):
        d = self.dut
        while True:
            await RisingEdge(d.clk)
            self.cycle += 1
            if d.m_axis_pkt_tvalid.value and d.m_axis_pkt_tready.value:
                self.out_beats.append((self.cycle, int(d.m_axis_pkt_tlast.value)))

    async def feed(self, sc: Scenario):
        for q in (0, 1):
            for raw in sc.records[q]:
                await self.src[f"req{q}"].send(AxiStreamFrame(raw.to_bytes(16, "little")))
        for s, name in ((PayloadSource.ATTN, "attn"), (PayloadSource.EMIT, "emit")):
            for payload in sc.staged.get(s, []):
                await self.src[name].send(AxiStreamFrame(payload))

    async def collect(self, count: int) -> list[tuple[Meta, bytes]]:
        got = []
        for _ in range(count):
            fr = await self.sink.recv()
            raw = bytes(fr.tdata)
            got.append((Meta.unpack(int.from_bytes(raw[:8], "little")), raw[8:]))
        return got


def expected(sc: Scenario):
    exp, status = [], dict.fromkeys((n for n, _ in SEND_STATUS), 0)
    for q in (0, 1):
        model = SendModel(sc.cfg, sc.land_off, lambda a, n: sc.memory[a:a + n], sc.qbuf_base,
                          sc.staged if q == 1 else None)
        exp.append([p for p in (model.send(r) for r in sc.records[q]) if p is not None])
        for k, v in model.status.items():
            status[k] += v
    return exp, status


@cocotb.test()
async def random_mix(dut):
    p = bench_params()
    skip_unless_selected("random_mix", p)
    rng = random.Random(p.get("seed", 1))
    sc = make_scenario(p.get("seed", 1), p.get("n", 60))
    tb = TB(dut, rng, p.get("pause", 0.0), p.get("bp", 0.0))
    await tb.reset(sc)
    exp, status = expected(sc)
    cocotb.start_soon(tb.feed(sc))
    got = await tb.collect(sum(len(e) for e in exp))
    for meta, payload in got:
        assert len(payload) == meta.length, f"{meta}: {len(payload)} payload bytes"
    match_packets(got, exp)
    for _ in range(2000):
        await RisingEdge(dut.clk)
        if _status(dut) == status:
            break
    assert _status(dut) == status, f"{_status(dut)} != {status}"
    assert all(status[k] for k in ("drop_unmapped", "drop_bad_seq", "drop_bad_record",
                                   "framing_errors"))


@cocotb.test()
async def rate(dut):
    p = bench_params()
    skip_unless_selected("rate", p)
    rng = random.Random(p.get("seed", 1))
    sc = Scenario(LandingConfig(kv_base=0x1_0000, kv_slot=8192, kv_count=16),
                  [k * 2048 if k < 4 else None for k in range(LAND_OFF_ENTRIES)], 0,
                  rng.randbytes(MEM))
    for _ in range(p.get("rate_n", 40)):
        m = Meta(op=Op.KV_REPLICA, kv_id=rng.randrange(16), seq=rng.randrange(4), length=2048,
                 route_id=rng.randrange(256)).pack()
        sc.records[0].append(cmd_raw(cls=RecordClass.SEND.value, queue=Queue.NET.value,
                                     src=PayloadSource.KV.value, meta=m))
    tb = TB(dut, rng)
    await tb.reset(sc)
    exp, status = expected(sc)
    cocotb.start_soon(tb.feed(sc))
    got = await tb.collect(len(exp[0]))
    match_packets(got, exp)
    assert _status(dut) == status
    first = next(k for k, (_, last) in enumerate(tb.out_beats) if not last) + 1  # 1st payload
    beats = tb.out_beats[first:]
    cycles = beats[-1][0] - beats[0][0] + 1
    payload = len(beats) - (len(exp[0]) - 1)        # minus the later packets' header beats
    result = {"packets": len(exp[0]), "packet_bytes": 2048, "payload_beats": payload,
              "cycles": cycles, "payload_beats_per_cycle": round(payload / cycles, 4),
              "limit_with_headers": round(256 / 257, 4)}
    dut._log.info("send rate: %s", result)
    if p.get("out"):
        with open(p["out"], "w") as fh:
            json.dump(result, fh)
