"""cocotb bench of the KV landing engine (flat top ``node_landing``: ``LandingEngine`` under
``FlatTop``; docs/node.md §5) against cocotbext-axi ``AxiRam``.

Traffic (:func:`make_traffic`): KV_REPLICA fragments cut from real token records
(:func:`mcf.abi.kv.pack_kv_block` of random INT4 codes and scales per ``(kv_id, head)``) at
MARS's fragment boundaries (``MetaEncoder.fragments`` / ``fragment_tokens`` of the ``tiny``
model), random ``kv_id`` and ``seq``, mixed with malformed packets: unmapped ``kv_id``, ``seq``
without a ``LAND_OFF`` entry, lengths that overflow the slot, zero length, and every other op.
``LAND_OFF`` is :func:`mcf.abi.landing.per_token_land_off`. One ``kv_id`` has an injected
SLVERR on the first beat of its slot (``AxiRam``'s own mechanism: an access that raises).

Scoreboard (:class:`mcf.golden.landing.LandingModel`): every byte of the KV region equals the
model's (bytes never written stay at the fill pattern; the failed write's bytes are skipped),
the land-event stream (``landed``: ``(kv_id, owner)`` per landed packet, in order; the bench's
``local_id`` is :data:`LOCAL_ID`, traffic ``src`` is 0 or 1), and every ``LANDING_STATUS``
counter exactly. Idle cycles on the input, pauses on AW/W/B and on ``landed.ready``.

Params: ``seed``, ``n`` (packets), ``idle``, ``pause`` (AXI channel pause probability),
``tests``; ``out``: a JSON file for the rate measurement (``rate`` test: full input rate, no
pauses; payload beats landed per cycle from the first input beat to the last count).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

import cocotb
import numpy as np
from cocotb.triggers import RisingEdge

from mcf.abi.framing import MAX_PAYLOAD, payload_beats
from mcf.abi.kv import pack_kv_block
from mcf.abi.landing import (
    LANDING_STATUS,
    LandingConfig,
    LandResult,
    land_decision,
    per_token_land_off,
)
from mcf.abi.meta import META, Collective, Meta, Op
from mcf.golden.landing import LandingModel
from mcf.sim.benches.packet_lander import LanderTB, write_land_off
from mcf.sim.tb import pattern
from mcf.sim.toolchain import bench_params, skip_unless_selected

MEM = 1 << 21
FILL = 0xA5
KV_CAPACITY = 256      # the bench's LandingEngine(kv_count=...)
LOCAL_ID = 1           # the bench's local_id: packets with src 1 are local copies


@dataclass
class Traffic:
    cfg: LandingConfig
    land_off: tuple
    packets: list          # [(Meta, bytes)]
    bad_kv: int            # kv_id whose seq 0 write answers SLVERR
    bad_addr: int          # the AXI beat (16 B) that raises
    beat_bytes: int = 16

    def span(self, meta: Meta) -> range | None:
        """Bytes a packet lands on, or ``None`` when it is dropped."""
        result, addr = land_decision(self.cfg, meta, self.land_off, KV_CAPACITY)
        return range(addr, addr + meta.length) if result is LandResult.LANDED else None

    def write_error(self, meta: Meta) -> bool:
        """The packet's bursts include the raising beat."""
        span = self.span(meta)
        return span is not None and span.start < self.bad_addr + self.beat_bytes and \
            self.bad_addr < span.stop


def make_traffic(seed: int, n: int, kv_count: int = 200, kv_base: int = 0x1008,
                 slice_tokens: int = 80, max_payload: int = 640,
                 bad_fraction: float = 0.25) -> Traffic:
    """``n`` packets; ``bad_fraction`` of them malformed in one of the ways above."""
    from mcf.mars.metadata import MetaEncoder
    from mcf.mars.model import get_model

    rng = random.Random(seed)
    model = get_model("tiny")
    enc = MetaEncoder(model, nodes=2, num_chunks=4, max_payload=max_payload)
    layout = per_token_land_off(enc, slice_tokens)
    cfg = LandingConfig(kv_base, layout.kv_slot, kv_count)
    frags = enc.fragments(slice_tokens)
    blocks: dict[tuple[int, int], bytes] = {}

    def block(kv_id, head):
        if (kv_id, head) not in blocks:
            g = np.random.default_rng([seed, kv_id, head])
            t, d = slice_tokens, model.head_dim
            blocks[(kv_id, head)] = pack_kv_block(
                g.integers(-8, 8, (t, d)), g.integers(1, 1 << 16, t),
                g.integers(-8, 8, (t, d)), g.integers(1, 1 << 16, t))
        return blocks[(kv_id, head)]

    def good(kv_id, seq):
        head, t0 = enc.fragment_tokens(seq)
        rec = enc.token_record_bytes
        payload = block(kv_id, head)[t0 * rec:t0 * rec + frags[seq]]
        return Meta(op=Op.KV_REPLICA, collective=Collective.MULTICAST, kv_id=kv_id,
                    length=len(payload), seq=seq, src=rng.randrange(2), route_id=3), payload

    kv_ids = 1 << META["kv_id"].width
    packets = []
    for _ in range(n):
        kv_id, seq = rng.randrange(kv_count), rng.randrange(len(frags))
        meta, payload = good(kv_id, seq)
        if rng.random() < bad_fraction:
            kind = rng.randrange(5)
            if kind == 0:           # unmapped: beyond KV_COUNT, or beyond the directory
                meta = meta.replace(kv_id=rng.choice([kv_count, KV_CAPACITY - 1,
                                                      rng.randrange(kv_count, kv_ids)]))
            elif kind == 1:         # no LAND_OFF entry
                meta = meta.replace(seq=rng.randrange(len(frags), 1 << META["seq"].width))
            elif kind == 2:         # overflows the slot (valid entry, too long)
                seq = len(frags) - 1
                extra = rng.randrange(1, 200)
                length = frags[seq] + extra
                meta = meta.replace(seq=seq, length=length)
                payload = bytes(rng.randrange(256) for _ in range(length))
            elif kind == 3:         # zero length
                meta, payload = meta.replace(length=0), b""
            else:                   # another op (later work: counted as land_drop_op)
                op = rng.choice([o for o in Op if o != Op.KV_REPLICA])
                length = rng.choice([0, rng.randrange(1, 300)])
                meta = meta.replace(op=op, length=length)
                payload = bytes(rng.randrange(256) for _ in range(length))
        packets.append((meta, payload))
    bad_kv = rng.randrange(kv_count)
    packets += [good(bad_kv, 0), good(bad_kv, 1)]
    rng.shuffle(packets)
    bad_addr = cfg.kv_base + bad_kv * cfg.kv_slot + layout.land_off[0]
    return Traffic(cfg, layout.land_off, packets, bad_kv, bad_addr - bad_addr % 16)


class TB(LanderTB):
    def __init__(self, dut, rng, idle=0.0, pause=0.0):
        super().__init__(dut, rng, bus="m_axi", size=MEM, fill=FILL, fields=LANDING_STATUS,
                         idle=idle, pause=pause)
        self.events: list[tuple[int, bool]] = []
        cocotb.start_soon(self._events(pattern(pause, rng) if pause else None))
        dut.land_off_we.value = 0
        dut.local_id.value = LOCAL_ID
        dut.landed_tready.value = 1

    async def _events(self, pauses):
        """Collect the land events; ``landed.ready`` low when ``pauses`` says so."""
        d = self.dut
        while True:
            await RisingEdge(d.clk)
            if d.landed_tvalid.value and d.landed_tready.value:
                self.events.append((int(d.landed_tkv_id.value), bool(d.landed_towner.value)))
            if pauses is not None:
                d.landed_tready.value = int(not next(pauses))

    async def reset(self, t: Traffic):
        d = self.dut
        await self.release(t.cfg)
        await write_land_off(d, t.land_off)
        await RisingEdge(d.clk)


def _model(t: Traffic) -> LandingModel:
    model = LandingModel(t.cfg, t.land_off, KV_CAPACITY, LOCAL_ID)
    for meta, payload in t.packets:
        model.land(meta, payload, t.write_error(meta))
    return model


async def _check(tb: TB, t: Traffic, model) -> None:
    """DDR bytes of the region and around it, and the land events (the run's only: the
    caller empties ``tb.events`` before it)."""
    region = t.cfg.kv_slot * t.cfg.kv_count
    got = tb.ram.read(t.cfg.kv_base, region)
    skip = {a for meta, _ in t.packets if t.write_error(meta) for a in t.span(meta)}
    bad = []
    for i in range(region):
        a = t.cfg.kv_base + i
        if a in skip:
            continue
        if got[i] != model.mem.get(a, FILL):
            bad.append(a)
    assert not bad, f"{len(bad)} DDR bytes differ, first at {bad[0]:#x}"
    # nothing written outside the region
    assert tb.ram.read(0, t.cfg.kv_base) == bytes([FILL]) * t.cfg.kv_base
    tail = t.cfg.kv_base + region
    assert tb.ram.read(tail, 4096) == bytes([FILL]) * 4096
    for _ in range(2000):               # events trail their status under landed backpressure
        if len(tb.events) >= len(model.events):
            break
        await RisingEdge(tb.dut.clk)
    for _ in range(5):
        await RisingEdge(tb.dut.clk)
    assert tb.events == model.events, f"{len(tb.events)} land events, " \
        f"expected {len(model.events)}"
    assert {o for _, o in model.events} == {True, False}


@cocotb.test()
async def random_mix(dut):
    """Random KV fragments and malformed packets, idle input, AXI pauses: bytes, counts."""
    p = bench_params()
    skip_unless_selected("random_mix", p)
    rng = random.Random(p.get("seed", 1))
    t = make_traffic(p.get("seed", 1), p.get("n", 300))
    tb = TB(dut, rng, p.get("idle", 0.3), p.get("pause", 0.3))
    assert t.beat_bytes == len(dut.m_axi_wdata) // 8
    tb.bad_write.add(t.bad_addr)
    await tb.reset(t)
    model = _model(t)
    for meta, payload in t.packets:
        await tb.src.send(tb.frame(meta, payload))
    beats = sum(max(1, payload_beats(len(pl), 64)) for _, pl in t.packets)
    await tb.drain(model.status, 20 * beats + 20_000)
    assert model.status["write_errors"] >= 1 and model.status["drop_op"] > 0
    assert min(model.status[k] for k in ("drop_unmapped", "drop_bad_seq")) > 0
    await _check(tb, t, model)


@cocotb.test()
async def rate(dut):
    """Full input rate, no pauses: payload beats landed per cycle for KV fragments of MARS's
    cut at each ``rate_payloads`` limit (reported, not asserted)."""
    p = bench_params()
    skip_unless_selected("rate", p)
    rng = random.Random(p.get("seed", 1))
    tb = TB(dut, rng)
    results = []
    for max_payload in p.get("rate_payloads", [MAX_PAYLOAD]):
        t = make_traffic(p.get("seed", 1) + max_payload, p.get("rate_n", 100),
                         bad_fraction=0.0, kv_count=80, max_payload=max_payload,
                         slice_tokens=256)
        t.packets = [pk for pk in t.packets if not t.write_error(pk[0])]
        await tb.reset(t)
        model = _model(t)
        tb.events.clear()
        beats, cycles = await tb.timed_run(t.packets, model.status)
        await _check(tb, t, model)
        results.append({"max_payload": max_payload,
                        **tb.rate_record(t.packets, "payload_beats", beats, cycles)})
        dut._log.info("landing rate: %s", results[-1])
    if p.get("out"):
        with open(p["out"], "w") as fh:
            json.dump(results, fh)
