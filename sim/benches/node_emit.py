"""cocotb bench of the EMIT executor feeding the KV landing engine (flat top ``node_emit``:
``EmitUnit`` → ``LandingEngine`` under ``FlatTop``, their read and write channels on one AXI4
master; docs/node.md §3 EMIT row, §5, §6 rule 3) against cocotbext-axi ``AxiRam``.

Traffic (:func:`make_plan`): an ACT K/V buffer (:mod:`mcf.abi.emit` row layout: per token row,
per KV head a K row then a V row of ACT words) of random codes for a slice of the MARS ``tiny``
model at the ``sim`` geometry (head_dim 16, 2 KV heads); per ``kv_id`` the EMIT records of every
fragment MARS cuts (``MetaEncoder.fragments`` / ``fragment_tokens``: ``seq = f·H_kv + h``),
``replicate`` at random, mixed with bad records (length, op, zero tokens) and one fragment whose
rows answer SLVERR on a read (``AxiRam``'s own mechanism: an access that raises).

Scoreboard (:class:`mcf.golden.emit.EmitModel`): every byte of the KV region equals the golden
fragments at :func:`mcf.abi.landing.kv_address` (``LAND_OFF`` = :func:`per_token_land_off`),
bytes never landed stay at the fill pattern; the land events are ``(kv_id, owner=True)`` per
good fragment in order (the local copy carries ``src = local_id``); the staged payloads equal
the model's, in order; one ``done`` per record; every ``EMIT_STATUS`` counter and the landing
engine's ``packets``/``bytes`` exactly. Pauses on AR/R/AW/W/B, on the staged sink and idle
records.

Params: ``seed``, ``kv_ids``, ``pause``, ``tests``; ``out``: a JSON file for the ``rate`` test
(no pauses, all records good and replicated: payload beats per cycle from the first record
taken to the last ``done``).
"""

from __future__ import annotations

import json
import logging
import random
from dataclasses import dataclass

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge
from cocotbext.axi import AxiStreamBus, AxiStreamSink

from mcf.abi.emit import EMIT_STATUS, EmitArg, EmitConfig, kv_pair_bytes
from mcf.abi.framing import payload_beats
from mcf.abi.landing import LANDING_STATUS, LandingConfig, kv_address, per_token_land_off
from mcf.abi.meta import Collective, Meta, Op, Stage
from mcf.abi.node import Cmd, Queue, RecordClass
from mcf.abi.node_config import SIM
from mcf.golden.emit import EmitModel
from mcf.sim.benches.packet_lander import write_land_off
from mcf.sim.ddr import ddr_ram
from mcf.sim.tb import pattern
from mcf.sim.toolchain import bench_params, skip_unless_selected

MEM = 1 << 20
FILL = 0xA5
HEAD_DIM = SIM.attn_head_dim    # the sim node's emitter, built for MARS's tiny model
KV_CAPACITY = 256
LOCAL_ID = 3
ACT_GAP = 0x40              # the ACT rows start this far past the 4 KiB page after the KV region
KV_BASE = 0x1008


@dataclass
class Plan:
    emit_cfg: EmitConfig
    land_cfg: LandingConfig
    land_off: tuple
    act: bytes
    records: list          # [(Meta, EmitArg, replicate)]
    err_rec: int | None    # index of the record whose read answers SLVERR
    bad_read: int | None   # the 16-byte beat address that raises


def make_plan(seed: int, kv_ids: int = 6, slice_tokens: int = 40, max_payload: int = 200,
              bad: bool = True) -> Plan:
    from mcf.mars.metadata import MetaEncoder
    from mcf.mars.model import get_model

    rng = random.Random(seed)
    model = get_model("tiny")
    assert model.head_dim == HEAD_DIM
    enc = MetaEncoder(model, nodes=2, num_chunks=4, max_payload=max_payload)
    layout = per_token_land_off(enc, slice_tokens)
    land_cfg = LandingConfig(KV_BASE, layout.kv_slot, kv_count=200)
    H = model.kv_heads
    stride = H * kv_pair_bytes(HEAD_DIM) + 48
    g = np.random.default_rng(seed)
    rows = slice_tokens + 16            # 16 spare rows: the read-error fragment's own
    words = g.integers(-(1 << 18), 1 << 18, size=rows * stride // 4)
    words[:kv_pair_bytes(HEAD_DIM) // 4] *= 1 << 9      # token 0, head 0: saturating scales
    words[stride // 4:(stride + kv_pair_bytes(HEAD_DIM)) // 4] = 0     # token 1: zero rows
    act = words.astype("<i4").tobytes()
    kv_end = land_cfg.kv_base + land_cfg.kv_slot * land_cfg.kv_count
    emit_cfg = EmitConfig(-(-kv_end // 4096) * 4096 + ACT_GAP, stride)
    rec = enc.token_record_bytes
    records = []
    for kv_id in rng.sample(range(199), kv_ids):
        for seq, length in enumerate(enc.fragments(slice_tokens)):
            head, t0 = enc.fragment_tokens(seq)
            meta = Meta(stage=Stage.PREFILL, op=Op.KV_REPLICA, collective=Collective.MULTICAST,
                        src=0, dst=1, route_id=2, kv_id=kv_id, length=length, seq=seq)
            records.append((meta, EmitArg(t0, head, length // rec), rng.random() < 0.5))
    rng.shuffle(records)
    err_rec = bad_read = None
    if bad:
        meta, arg, _ = records[0]
        for i, (m_, a_) in enumerate([
                (meta.replace(length=meta.length + 1), arg),
                (meta.replace(op=Op.FETCH_REQUEST), arg),
                (meta.replace(length=0), EmitArg(arg.row, arg.head, 0))]):
            records.insert(rng.randrange(len(records)), (m_, a_, i % 2 == 0))
        # a read error on a kv_id of its own (nothing of it lands)
        n = enc.fragments(slice_tokens)[0] // rec
        err_meta = Meta(stage=Stage.PREFILL, op=Op.KV_REPLICA, collective=Collective.P2P,
                        src=0, dst=1, route_id=2, kv_id=199, length=n * rec, seq=0)
        err_rec = rng.randrange(len(records))
        records.insert(err_rec, (err_meta, EmitArg(slice_tokens, 0, n), True))
        bad_read = emit_cfg.pair_address(HEAD_DIM, slice_tokens + 2, 0) + 16
    return Plan(emit_cfg, land_cfg, layout.land_off, act, records, err_rec, bad_read)


def run_model(p: Plan) -> EmitModel:
    model = EmitModel(p.emit_cfg, HEAD_DIM, LOCAL_ID, p.act, base=p.emit_cfg.kv_base)
    for i, (meta, arg, rep) in enumerate(p.records):
        model.run(meta, arg, rep, read_error=i == p.err_rec)
    return model


def cmd_word(meta: Meta, arg: EmitArg, replicate: bool) -> int:
    raw = Cmd(cls=RecordClass.EMIT, queue=Queue.COMPUTE, meta=meta.pack(), arg=arg.pack(),
              replicate=replicate).pack()
    return int.from_bytes(raw, "little")


def _fields(raw: int, layout) -> dict[str, int]:
    return {n: (raw >> f.offset) & ((1 << f.width) - 1) for n, f in layout}


class TB:
    def __init__(self, dut, rng, pause=0.0):
        self.dut = dut
        cocotb.start_soon(Clock(dut.clk, 4, unit="ns").start())
        dut.rst.value = 1
        self.ram = ddr_ram(dut, "m_axi", dut.clk, dut.rst, size=MEM, fill=FILL, pause=pause,
                           rng=rng)
        self.bad_read: set[int] = set()
        ri = self.ram.read_if
        orig = ri._read

        async def read(address, length):      # any byte of a bad beat raises: SLVERR
            if any(address < b + 16 and b < address + length for b in self.bad_read):
                raise OSError("injected read error")
            return await orig(address, length)
        ri._read = read
        self.staged = AxiStreamSink(AxiStreamBus.from_prefix(dut, "m_axis_staged"), dut.clk,
                                    dut.rst)
        self.staged.log.setLevel(logging.WARNING)
        if pause:
            self.staged.set_pause_generator(pattern(pause, rng))
        self.events: list[tuple[int, bool]] = []
        self.done = 0
        self.cycle = 0
        cocotb.start_soon(self._monitor())
        dut.local_id.value = LOCAL_ID
        dut.land_off_we.value = 0
        dut.landed_tready.value = 1
        dut.s_axis_rec_tvalid.value = 0

    async def _monitor(self):
        d = self.dut
        while True:
            await RisingEdge(d.clk)
            self.cycle += 1
            if d.landed_tvalid.value and d.landed_tready.value:
                self.events.append((int(d.landed_tkv_id.value), bool(d.landed_towner.value)))
            self.done += int(d.done.value)

    async def reset(self, p: Plan):
        d = self.dut
        d.land_cfg.value = p.land_cfg.pack()
        d.emit_cfg.value = p.emit_cfg.pack()
        self.ram.write(0, bytes([FILL]) * MEM)
        self.ram.write(p.emit_cfg.kv_base, p.act)
        d.rst.value = 1
        await ClockCycles(d.clk, 3)
        d.rst.value = 0
        await write_land_off(d, p.land_off)
        await RisingEdge(d.clk)
        self.events.clear()
        self.done = 0

    async def feed(self, p: Plan, rng, idle=0.0) -> int:
        """Drive the records; returns the cycle the first one was taken."""
        d = self.dut
        first = None
        for meta, arg, rep in p.records:
            d.s_axis_rec_tdata.value = cmd_word(meta, arg, rep)
            d.s_axis_rec_tvalid.value = 1
            while True:
                await RisingEdge(d.clk)
                if d.s_axis_rec_tready.value:
                    break
            first = self.cycle if first is None else first
            d.s_axis_rec_tvalid.value = 0
            while rng.random() < idle:
                await RisingEdge(d.clk)
        return first

    async def wait_done(self, n: int, limit: int) -> int:
        for _ in range(limit):
            if self.done >= n:
                return self.cycle
            await RisingEdge(self.dut.clk)
        raise AssertionError(f"{self.done} of {n} records retired: emitter hung")

    async def check(self, p: Plan, model: EmitModel):
        d = self.dut
        for _ in range(2000):              # the last landings trail their done
            if len(self.events) >= len(model.local) and \
                    self.staged.count() >= len(model.staged):
                break
            await RisingEdge(d.clk)
        await ClockCycles(d.clk, 20)
        assert self.done == len(p.records)
        assert _fields(int(d.emit_status.value), EMIT_STATUS) == model.status
        land = _fields(int(d.land_status.value), LANDING_STATUS)
        assert land["packets"] == len(model.local)
        assert land["bytes"] == sum(len(pl) for _, pl in model.local)
        assert self.events == [(m.kv_id, True) for m, _ in model.local]
        want = bytearray([FILL]) * (p.land_cfg.kv_slot * p.land_cfg.kv_count)
        for meta, payload in model.local:
            a = kv_address(p.land_cfg, meta.kv_id, meta.seq, p.land_off) - KV_BASE
            want[a:a + len(payload)] = payload
        got = self.ram.read(KV_BASE, len(want))
        if got != bytes(want):
            first = next(i for i in range(len(want)) if got[i] != want[i])
            raise AssertionError(f"KV region differs from the golden fragments at "
                                 f"{KV_BASE + first:#x}")
        staged = []
        while not self.staged.empty():
            staged.append(bytes((await self.staged.recv()).tdata))
        assert staged == model.staged, f"{len(staged)} staged, {len(model.staged)} expected"


@cocotb.test()
async def emit_land(dut):
    """MARS fragments of several kv_ids, bad records, a read error, pauses: KV lands at
    kv_address bit-exact, staged copies bit-exact, every counter."""
    prm = bench_params()
    skip_unless_selected("emit_land", prm)
    rng = random.Random(prm.get("seed", 1))
    pause = prm.get("pause", 0.3)
    p = make_plan(prm.get("seed", 1), prm.get("kv_ids", 6))
    tb = TB(dut, rng, pause)
    await tb.reset(p)
    tb.bad_read.add(p.bad_read)
    model = run_model(p)
    assert model.status["read_errors"] == 1 and model.status["bad_record"] == 3
    assert model.status["scale_sat"] > 0 and model.status["staged"] > 0
    await tb.feed(p, rng, idle=pause)
    await tb.wait_done(len(p.records), 400_000)
    await tb.check(p, model)


@cocotb.test()
async def rate(dut):
    """No pauses, every record good and replicated: payload beats per cycle (reported)."""
    prm = bench_params()
    skip_unless_selected("rate", prm)
    rng = random.Random(prm.get("seed", 1))
    tb = TB(dut, rng)
    results = []
    for max_payload in prm.get("rate_payloads", [200, 640]):
        p = make_plan(prm.get("seed", 1), prm.get("kv_ids", 4), slice_tokens=64,
                      max_payload=max_payload, bad=False)
        p.records = [(m, a, True) for m, a, _ in p.records]
        await tb.reset(p)
        model = run_model(p)
        start = await tb.feed(p, rng)
        end = await tb.wait_done(len(p.records), 400_000)
        await tb.check(p, model)
        beats = sum(payload_beats(len(pl), 64) for _, pl in model.local)
        tokens = model.status["tokens"]
        results.append({"max_payload": max_payload, "records": len(p.records),
                        "tokens": tokens, "payload_beats": beats, "cycles": end - start,
                        "beats_per_cycle": round(beats / (end - start), 4),
                        "cycles_per_token": round((end - start) / tokens, 2)})
        dut._log.info("emit rate: %s", results[-1])
    if prm.get("out"):
        with open(prm["out"], "w") as fh:
            json.dump(results, fh)
