"""EMIT executor (mcf.hdl.node.emit, docs/node.md §3 EMIT row, §6 rule 3): amaranth.sim unit tests
of ``EmitUnit`` against the golden model (:class:`mcf.golden.emit.EmitModel`) with an in-test AXI
read slave — the tee's two outputs bit-exact, backpressure on each independently, replicate on
and off, bad records and read errors counted and retired, staged copies offered only when
complete — and the runner of the cocotb + Verilator bench (``sim/benches/node_emit.py``).
"""

from __future__ import annotations

import json
import random
import types

import numpy as np
import pytest
from amaranth import Module, unsigned
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator

from mcf.abi.directory import LAND_EVENT
from mcf.abi.emit import (
    EMIT_ARG,
    EMIT_CONFIG,
    EMIT_STATUS,
    EmitArg,
    EmitConfig,
    emit_registers,
    kv_pair_bytes,
    max_fragment_tokens,
)
from mcf.abi.framing import beat_layout
from mcf.abi.kv import kv_token_bytes, pack_kv_block, quantize_kv_rows, unpack_kv_block
from mcf.abi.landing import LAND_OFF_ENTRY, LANDING_CONFIG, LANDING_STATUS
from mcf.abi.meta import META, Collective, Meta, Op, Stage
from mcf.abi.node import CMD, Cmd, Queue, RecordClass
from mcf.abi.node_config import SIM
from mcf.golden.emit import EmitModel
from mcf.hdl.mem.axi import ADDR_BITS, AXI4Signature
from mcf.hdl.node.emit import EmitUnit
from mcf.hdl.node.landing import LandingEngine
from mcf.sim.axi_slave import read_slave

BB = 16
D = SIM.attn_head_dim
H_KV = 2
BASE = 0x2_0000_0100
LOCAL_ID = 5


def act_memory(rng, rows, head_dim=D, heads=H_KV, stride_pad=32, big=False):
    """ACT K/V buffer image: ``rows`` token rows of ``heads`` K/V pairs (plus padding)."""
    stride = heads * kv_pair_bytes(head_dim) + stride_pad
    lim = 1 << 24 if big else 1 << 18
    words = rng.integers(-lim, lim, size=(rows * stride) // 4, dtype=np.int64)
    zero = rng.integers(0, rows)              # one all-zero row pair (scale 1, zero codes)
    words[zero * stride // 4:(zero * stride + kv_pair_bytes(head_dim)) // 4] = 0
    return words.astype("<i4").tobytes(), EmitConfig(kv_base=BASE, row_stride=stride)


def frag_meta(kv_id, seq, tokens, head_dim=D, op=Op.KV_REPLICA, length=None):
    return Meta(stage=Stage.PREFILL, op=op, collective=Collective.MULTICAST, src=1, dst=2,
                route_id=3, kv_id=kv_id, seq=seq,
                length=tokens * kv_token_bytes(head_dim) if length is None else length)


def cmd(meta, arg, replicate):
    raw = Cmd(cls=RecordClass.EMIT, queue=Queue.COMPUTE, meta=meta.pack(), arg=arg.pack(),
              replicate=bool(replicate)).pack()
    return int.from_bytes(raw, "little")


def _payload(beats):
    out = bytearray()
    for data_, keep in beats:
        out += bytes((data_ >> (8 * i)) & 0xFF for i in range(8) if keep >> i & 1)
    return bytes(out)


def simulate(dut, mem, cfg, recs, *, l_bp=0.0, s_bp=0.0, r_pause=0.0, err_rows=(), seed=1,
             staged_hold=0):
    """Run ``recs`` (raw CMD ints) through ``dut``; returns local packets ``[(meta, payload)]``,
    staged payloads, the number of ``done`` strobes, the status and cycles. ``err_rows``: byte
    addresses whose 16-byte beat answers SLVERR. ``staged_hold``: the staged sink takes
    nothing for that many cycles."""
    rng = random.Random(seed)
    bus = dut.bus
    got_l, got_s, info = [], [], {"done": 0, "early": 0}
    cur_l, cur_s = [], []

    async def host(ctx):
        ctx.set(dut.cfg.kv_base, cfg.kv_base)
        ctx.set(dut.cfg.row_stride, cfg.row_stride)
        ctx.set(dut.local_id, LOCAL_ID)
        for r in recs:
            ctx.set(dut.rec.valid, 1)
            ctx.set(dut.rec.payload.as_value(), r)
            await ctx.tick().until(dut.rec.ready)
            ctx.set(dut.rec.valid, 0)
            for _ in range(rng.randrange(3)):
                await ctx.tick()

    slave = read_slave(bus, rng, lambda a: mem[a - BASE:a - BASE + BB].ljust(BB, b"\xee"),
                       r_pause=r_pause, is_error=set(err_rows).__contains__)

    async def l_sink(ctx):
        lrng = random.Random(seed + 1)
        while True:
            ready = lrng.random() >= l_bp
            ctx.set(dut.local.ready, ready)
            _, _, valid, p = await ctx.tick().sample(dut.local.valid, dut.local.payload)
            if valid and ready:
                cur_l.append((p.meta.as_value().value, int(p.data), int(p.keep)))
                if p.last:
                    metas = {c[0] for c in cur_l}
                    assert len(metas) == 1, "meta must stay beside every beat"
                    got_l.append((Meta.unpack(metas.pop()),
                                  _payload([(c[1], c[2]) for c in cur_l])))
                    cur_l.clear()

    async def s_sink(ctx):
        srng = random.Random(seed + 2)
        cycle = 0
        while True:
            ready = cycle >= staged_hold and srng.random() >= s_bp
            ctx.set(dut.staged.ready, ready)
            _, _, valid, p, staged = await ctx.tick().sample(
                dut.staged.valid, dut.staged.payload, dut.status.staged)
            cycle += 1
            if valid and not cur_s and staged <= len(got_s):
                info["early"] += 1          # offered before its copy was complete
            if valid and ready:
                cur_s.append((int(p.data), int(p.keep)))
                if p.last:
                    got_s.append(_payload(cur_s))
                    cur_s.clear()

    async def done(ctx):
        cycles = 0
        while info["done"] < len(recs):
            _, _, d = await ctx.tick().sample(dut.done)
            info["done"] += d
            cycles += 1
            assert cycles < 200_000, "emitter hung"
        info["cycles"] = cycles
        # drain the outputs; nothing more may retire
        for _ in range(200 + max(0, staged_hold + 100 - cycles)):
            _, _, d = await ctx.tick().sample(dut.done)
            assert not d
        info["status"] = {n: int(ctx.get(dut.status[n])) for n, _ in EMIT_STATUS}

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    for tb in (host, slave, l_sink, s_sink):
        sim.add_testbench(tb, background=True)
    sim.add_testbench(done)
    sim.run()
    return got_l, got_s, info


def run_model(mem, cfg, plan, err_recs=()):
    model = EmitModel(cfg, D, LOCAL_ID, mem, base=BASE)
    for i, (meta, arg, rep) in enumerate(plan):
        model.run(meta, arg, rep, read_error=i in err_recs)
    return model


def fragment_plan(rng, n, rows):
    """MARS-numbered fragments of a slice (``seq = f·H_kv + h``, tokens_per_fragment 3)."""
    tpf, plan = 3, []
    for i in range(n):
        h = rng.randrange(H_KV)
        f = rng.randrange(rows // tpf)
        tokens = rng.randint(1, tpf)
        plan.append((frag_meta(kv_id=40 + i, seq=f * H_KV + h, tokens=tokens),
                     EmitArg(row=f * tpf, head=h, tokens=tokens), rng.random() < 0.6))
    return plan


# --- golden model ----------------------------------------------------------------------------

def test_golden_fragment_is_pack_kv_block():
    rng = np.random.default_rng(1)
    mem, cfg = act_memory(rng, 8)
    model = EmitModel(cfg, D, LOCAL_ID, mem, base=BASE)
    meta = frag_meta(9, 3, 4)
    res = model.run(meta, EmitArg(row=2, head=1, tokens=4), True)
    words = np.frombuffer(mem, dtype="<i4").astype(np.int64)
    pair = kv_pair_bytes(D) // 4
    rows = [words[(r * cfg.row_stride) // 4 + pair:][:pair] for r in range(2, 6)]
    k = np.stack([r[:D] for r in rows])
    v = np.stack([r[D:] for r in rows])
    k4, sk = quantize_kv_rows(k)
    v4, sv = quantize_kv_rows(v)
    assert res.local == (meta.replace(src=LOCAL_ID), pack_kv_block(k4, sk, v4, sv))
    assert res.staged == res.local[1]
    assert unpack_kv_block(res.staged, D)[0].shape == (4, D)
    bad = model.run(frag_meta(9, 3, 4, length=7), EmitArg(row=2, head=1, tokens=4), True)
    assert bad.bad and bad.local is None
    assert model.status["records"] == 2 and model.status["bad_record"] == 1


def test_abi_shapes():
    assert EMIT_ARG.size == 32
    names = {r.name for r in emit_registers()}
    assert {"EMIT_KV_BASE_LO", "EMIT_ROW_STRIDE", "emit_bad_record"} <= names
    assert max_fragment_tokens(D) * kv_token_bytes(D) <= 2048
    assert META["src"].width >= LOCAL_ID.bit_length()


# --- HDL -------------------------------------------------------------------------------------

@pytest.mark.parametrize("l_bp,s_bp,r_pause", [(0.0, 0.0, 0.0), (0.5, 0.0, 0.3),
                                               (0.0, 0.6, 0.0), (0.4, 0.7, 0.5)])
def test_tee_bit_exact(l_bp, s_bp, r_pause):
    seed = int(10 * (l_bp + 2 * s_bp + 4 * r_pause))
    rng = random.Random(seed)
    mem, cfg = act_memory(np.random.default_rng(seed), 12)
    plan = fragment_plan(rng, 7, 12)
    plan.append((frag_meta(90, 0, 9), EmitArg(row=1, head=0, tokens=9), True))   # 9 beats
    model = run_model(mem, cfg, plan)
    got_l, got_s, info = simulate(EmitUnit(D), mem, cfg, [cmd(*p) for p in plan],
                                  l_bp=l_bp, s_bp=s_bp, r_pause=r_pause, seed=seed)
    assert got_l == model.local
    assert got_s == model.staged
    assert info["done"] == len(plan) and info["early"] == 0
    assert info["status"] == model.status


def test_config_off_a_beat():
    """EMIT_ALIGN: the driver's EmitConfig refuses a base or stride off 16 bytes; registers
    written so anyway are read with their low 4 bits as 0 — the fragments of the aligned
    buffer, nothing hangs."""
    rng = random.Random(12)
    mem, cfg = act_memory(np.random.default_rng(12), 12)
    for base, stride in ((cfg.kv_base + 4, cfg.row_stride), (cfg.kv_base, cfg.row_stride + 8)):
        with pytest.raises(ValueError, match="multiples of 16"):
            EmitConfig(base, stride)
    plan = fragment_plan(rng, 4, 12)
    model = run_model(mem, cfg, plan)
    off = types.SimpleNamespace(kv_base=cfg.kv_base + 12, row_stride=cfg.row_stride + 4)
    got_l, got_s, info = simulate(EmitUnit(D), mem, off, [cmd(*p) for p in plan], seed=12)
    assert got_l == model.local and got_s == model.staged
    assert info["status"] == model.status


def test_replicate_off_stages_nothing():
    rng = random.Random(4)
    mem, cfg = act_memory(np.random.default_rng(4), 9)
    plan = [(m, a, False) for m, a, _ in fragment_plan(rng, 4, 9)]
    model = run_model(mem, cfg, plan)
    got_l, got_s, info = simulate(EmitUnit(D), mem, cfg, [cmd(*p) for p in plan], seed=4)
    assert got_l == model.local and got_s == [] and info["status"]["staged"] == 0


def test_staged_held_local_flows():
    """The send unit takes nothing for a long time: local packets (and ``done``) of the first
    replicated fragment and of unreplicated ones still flow; staged copies arrive later, whole."""
    rng = random.Random(6)
    mem, cfg = act_memory(np.random.default_rng(6), 12)
    plan = [(m, a, i == 0) for i, (m, a, _) in enumerate(fragment_plan(rng, 5, 12))]
    model = run_model(mem, cfg, plan)
    got_l, got_s, info = simulate(EmitUnit(D), mem, cfg, [cmd(*p) for p in plan], seed=6,
                                  staged_hold=3000)
    assert info["cycles"] < 3000          # every record retired while staged was held
    assert got_l == model.local and got_s == model.staged and info["early"] == 0


def test_bad_records_and_read_error():
    rng = random.Random(8)
    mem, cfg = act_memory(np.random.default_rng(8), 12, big=True)
    good = fragment_plan(rng, 4, 12)
    plan = [
        good[0],
        (frag_meta(50, 1, 2, length=41), EmitArg(row=0, head=1, tokens=2), True),   # length
        (frag_meta(51, 1, 2, op=Op.QUERY), EmitArg(row=0, head=1, tokens=2), False),  # op
        (frag_meta(52, 1, 0), EmitArg(row=0, head=1, tokens=0), True),             # 0 tokens
        good[1],
        (frag_meta(53, 0, 3), EmitArg(row=3, head=0, tokens=3), True),             # read error
        good[2], good[3],
    ]
    err_at = cfg.pair_address(D, 4, 0) + BB       # second beat of the error fragment's row 4
    model = run_model(mem, cfg, plan, err_recs=(5,))
    got_l, got_s, info = simulate(EmitUnit(D), mem, cfg, [cmd(*p) for p in plan], seed=8,
                                  err_rows=(err_at,), l_bp=0.3, s_bp=0.3)
    assert info["status"]["bad_record"] == 3 and info["status"]["read_errors"] == 1
    assert info["status"]["scale_sat"] > 0
    assert got_l == model.local and got_s == model.staged
    assert info["status"] == model.status and info["done"] == len(plan)


# --- cocotb + Verilator bench ------------------------------------------------------------------

BENCH = "mcf.sim.benches.node_emit"


class EmitLandBench(wiring.Component):
    """``EmitUnit`` → ``LandingEngine``, the emitter's AR/R and the lander's AW/W/B channels on
    one AXI4 master (one ``AxiRam`` holds the ACT K/V rows and the KV region)."""

    def __init__(self, head_dim: int = D, kv_count: int = SIM.kv_count):
        self.head_dim, self.kv_count = head_dim, kv_count
        super().__init__({
            "rec": In(stream.Signature(unsigned(CMD.size))),
            "done": Out(1),
            "staged": Out(stream.Signature(beat_layout(64))),
            "local_id": In(META["src"].width),
            "emit_cfg": In(EMIT_CONFIG),
            "land_cfg": In(LANDING_CONFIG),
            "land_off_we": In(1),
            "land_off_seq": In(META["seq"].width),
            "land_off_data": In(LAND_OFF_ENTRY),
            "landed": Out(stream.Signature(LAND_EVENT)),
            "m_axi": Out(AXI4Signature(ADDR_BITS, 128)),
            "emit_status": Out(EMIT_STATUS),
            "land_status": Out(LANDING_STATUS),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.emit = e = EmitUnit(self.head_dim)
        m.submodules.land = ld = LandingEngine(kv_count=self.kv_count)
        wiring.connect(m, e.local, ld.i)
        wiring.connect(m, e.staged, wiring.flipped(self.staged))
        wiring.connect(m, ld.landed, wiring.flipped(self.landed))
        m.d.comb += [e.rec.valid.eq(self.rec.valid), e.rec.payload.eq(self.rec.payload),
                     self.rec.ready.eq(e.rec.ready), self.done.eq(e.done),
                     e.local_id.eq(self.local_id), ld.local_id.eq(self.local_id),
                     e.cfg.eq(self.emit_cfg), ld.cfg.eq(self.land_cfg),
                     ld.land_off_we.eq(self.land_off_we), ld.land_off_seq.eq(self.land_off_seq),
                     ld.land_off_data.eq(self.land_off_data),
                     self.emit_status.eq(e.status), self.land_status.eq(ld.status)]
        for name, member in self.m_axi.signature.members.items():
            src = e.bus if name.startswith(("ar", "r")) else ld.m_axi
            if member.flow == Out:
                m.d.comb += getattr(self.m_axi, name).eq(getattr(src, name))
            else:
                m.d.comb += getattr(src, name).eq(getattr(self.m_axi, name))
        return m


def emit_built():
    from mcf.hdl.flat import FlatTop
    from mcf.sim import build
    return build(FlatTop(EmitLandBench(), {"rec": "s_axis_rec", "staged": "m_axis_staged"}),
                 "node_emit")


@pytest.mark.parametrize("pause", [0.0, 0.4])
def test_emit_bench(pause):
    from mcf.sim import run
    run(emit_built(), BENCH, params={"seed": 3 + int(10 * pause), "pause": pause,
                                     "tests": ["emit_land"]})


def test_emit_rate(tmp_path):
    """Payload beats per cycle, EmitUnit alone (reported with ``-s``; the bench's scoreboard
    checks every landed byte and staged payload)."""
    from mcf.sim import run
    out = tmp_path / "rate.json"
    run(emit_built(), BENCH, params={"seed": 5, "tests": ["rate"], "out": str(out)})
    result = json.loads(out.read_text())
    for r in result:
        print("emit rate:", r)
    assert [r["max_payload"] for r in result] == [200, 640]
