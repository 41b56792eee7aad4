"""KV reader (mcf.hdl.node.kv_reader, docs/node.md §4–5): the golden model against the attention
bench's own stimulus encoding, amaranth.sim unit tests of ``KvReader`` against the golden model
(:func:`mcf.abi.kv_reader.block_beats`) with an in-test AXI read slave, and the runner of the
cocotb + Verilator end-to-end bench (``sim/benches/node_kv_reader.py``: KV landed in an
``AxiRam`` → ``KvReader`` → ``AttentionEngine``, bit-exact against ``mcf.golden.attention``).

Busy-fraction report: ``pytest tests/test_node_kv_reader.py -k rate -s``.
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from amaranth import Module
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator
from hypothesis import given, settings
from hypothesis import strategies as st

from mcf.abi.attend import ATT_ALIGN
from mcf.abi.framing import beat_layout
from mcf.abi.kv import (
    attn_job_layout,
    attn_status_layout,
    kv_beat_layout,
    kv_token_bytes,
    pack_kv_block,
    q_beat_layout,
)
from mcf.abi.kv_reader import (
    KV_BLOCK_REQ,
    KV_READER_STATUS,
    KvBlockReq,
    block_address,
    block_beats,
    kv_reader_registers,
)
from mcf.abi.landing import KvLayout, LandingConfig, kv_address
from mcf.abi.node_config import KR260, SIM
from mcf.golden.attention import random_blocks
from mcf.hdl.compute.attention import AttentionEngine
from mcf.hdl.mem.axi import ADDR_BITS, AXI4Signature
from mcf.hdl.node.kv_reader import KvReader
from mcf.sim.attention_jobs import k_words, v_words
from mcf.sim.axi_slave import read_slave

BB = 16


def _records(blk) -> bytes:
    return pack_kv_block(blk.k, blk.sk, blk.v, blk.sv)


# --- golden model ---------------------------------------------------------------------------

@pytest.mark.parametrize("d,lanes", [(16, 4), (128, 64), (32, 32)])
def test_block_beats_match_engine_stimulus(d, lanes):
    """The reader's golden beats are the attention bench's K beats exactly and its V beats in
    ``data``/``v``/``last`` (the fields the engine reads on ``v``)."""
    rng = np.random.default_rng(d + lanes)
    (blk,) = random_blocks(rng, [13], d, pos0=1000)
    kb, vb = block_beats(_records(blk), d, lanes, pos0=1000)
    assert kb == k_words(blk, lanes)
    lay = kv_beat_layout(lanes)
    want = [lay.from_bits(w) for w in v_words(blk, lanes)]
    got = [lay.from_bits(w) for w in vb]
    assert [(int(g.data), int(g.v), int(g.last)) for g in got] == \
        [(int(w.data), int(w.v), int(w.last)) for w in want]
    assert block_beats(_records(blk), d, lanes, pos0=1000, k_only=True) == (kb, [])


def test_block_address_is_the_landing_rule():
    cfg = LandingConfig(kv_base=0xF0_0000_1000, kv_slot=2 * 384, kv_count=300)
    rec = kv_token_bytes(16)
    land_off = [h * 384 + t * rec for h in range(2) for t in (0, 8)]   # seq → (head, token)
    layout = KvLayout(head_stride=384, kv_slot=768, land_off=tuple(land_off))
    for kv_id in (0, 7, 299):
        for seq in range(len(land_off)):
            head, t0 = divmod(seq, 2)
            assert block_address(cfg, kv_id, head, layout, t0 * 8, 16) == \
                kv_address(cfg, kv_id, seq, land_off)
    with pytest.raises(ValueError):
        block_address(cfg, 300, 0, layout)
    with pytest.raises(ValueError):
        block_address(cfg, 0, 2, layout)
    assert [r.name for r in kv_reader_registers()] == \
        [f"kvr_{n}" for n, _ in KV_READER_STATUS]


# --- amaranth.sim unit tests ----------------------------------------------------------------

def simulate(dut: KvReader, mem: dict, reqs, *, k_bp=0.0, v_bp=0.0, r_pause=0.0,
             latency=(2, 12), err_beats=(), seed=1, v_lag=0, pace=1, v_gate=0):
    """Run ``reqs`` (:class:`KvBlockReq`) through ``dut`` against a byte memory; returns the
    ``k`` and ``v`` beats, the status and the cycle count. ``v_lag``: the V sink starts that many
    K beats late (the engine takes K rows ahead of V). Engine-shaped sinks: ``pace`` — a sink
    takes a beat at most every ``pace`` cycles (the engine's ``heads`` cycles per beat);
    ``v_gate`` — V beat ``i`` is taken only after K beat ``(i // v_gate + 1) · v_gate − 1``
    (a block's V rows after its K rows). ``info["k_starved"]`` / ``["v_starved"]`` count the
    cycles a sink was ready and no beat was offered, after its first beat."""
    rng = random.Random(seed)
    bus = dut.bus
    got_k, got_v = [], []
    kept = [r for r in reqs if 0 < r.tokens <= dut.max_block and r.addr % ATT_ALIGN == 0]
    n_k = sum(r.tokens * (dut.head_dim // dut.lanes) for r in kept)
    n_v = sum(r.tokens * (dut.head_dim // dut.lanes) for r in kept if not r.k_only)
    info = {}

    async def host(ctx):
        for r in reqs:
            ctx.set(dut.blocks.valid, 1)
            ctx.set(dut.blocks.payload.as_value(), r.pack())
            await ctx.tick().until(dut.blocks.ready)
            ctx.set(dut.blocks.valid, 0)
            for _ in range(rng.randrange(3)):
                await ctx.tick()

    def check_burst(addr, beats):
        assert addr % BB == 0 and addr // 4096 == (addr + BB * beats - 1) // 4096

    slave = read_slave(bus, rng, lambda a: bytes(mem.get(a + i, 0xEE) for i in range(BB)),
                       latency=latency, r_pause=r_pause, is_error=set(err_beats).__contains__,
                       on_ar=check_burst)

    info["k_starved"] = info["v_starved"] = 0

    async def drain(ctx, name, got, n, prng, bp, may_take=lambda: True):
        """Take ``n`` beats of stream ``name`` (``k`` or ``v``) into ``got``: ready on a cycle
        when ``pace`` allows, ``may_take()`` holds and ``prng`` passes the back-pressure ``bp``;
        counts ``info[name + "_starved"]``; returns the cycles it took."""
        port = getattr(dut, name)
        cycles, wait = 0, 0
        while len(got) < n:
            ready = wait == 0 and may_take() and prng.random() >= bp
            ctx.set(port.ready, ready)
            _, _, valid, payload = await ctx.tick().sample(port.valid, port.payload)
            cycles += 1
            wait = max(0, wait - 1)
            assert cycles < 50_000, f"reader hung ({name.upper()})"
            if valid and ready:
                got.append(payload.as_bits())
                wait = pace - 1
            elif ready and got:
                info[name + "_starved"] += 1
        ctx.set(port.ready, 1)
        return cycles

    async def k_sink(ctx):
        info["cycles"] = await drain(ctx, "k", got_k, n_k, rng, k_bp)

    def v_may_take():
        gate = (len(got_v) // v_gate + 1) * v_gate if v_gate else 0
        return len(got_k) >= min(max(v_lag, gate), n_k)

    async def v_sink(ctx):
        await drain(ctx, "v", got_v, n_v, random.Random(seed + 1), v_bp, v_may_take)

    async def done(ctx):
        await ctx.tick().until((dut.k.valid == 0) & (dut.v.valid == 0))
        while len(got_k) < n_k or len(got_v) < n_v:
            await ctx.tick()
        for _ in range(30):         # nothing more may arrive
            await ctx.tick()
            assert not ctx.get(dut.k.valid) and not ctx.get(dut.v.valid)
        info["status"] = {n: int(ctx.get(dut.status[n])) for n, _ in KV_READER_STATUS}

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(host, background=True)
    sim.add_testbench(slave, background=True)
    sim.add_testbench(k_sink, background=True)
    sim.add_testbench(v_sink, background=True)
    sim.add_testbench(done)
    sim.run()
    return got_k, got_v, info


def _landed(rng, d, lens, base=0x1_0000_0404, gap=36):
    """Blocks of random codes placed one after another on 32-bit words off the bus beat
    (:data:`~mcf.abi.attend.ATT_ALIGN`)."""
    mem, blocks, addr = {}, [], base
    for n in lens:
        (blk,) = random_blocks(rng, [n], d, pos0=int(rng.integers(0, 1 << 20)))
        data = _records(blk)
        for i, b in enumerate(data):
            mem[addr + i] = b
        blocks.append((addr, blk, data))
        addr += len(data) + gap
    return mem, blocks


@pytest.mark.parametrize("d,lanes,k_bp,v_bp,r_pause,v_lag", [
    (16, 4, 0.0, 0.0, 0.0, 0),
    (16, 4, 0.4, 0.5, 0.3, 40),
    (32, 8, 0.2, 0.7, 0.5, 0),
    (128, 64, 0.3, 0.3, 0.2, 9),
])
def test_reader_blocks(d, lanes, k_bp, v_bp, r_pause, v_lag):
    """Blocks of 1..max_block tokens at addresses off the bus beat (4 KiB crossings), K-only
    blocks, rejected requests (0 and max_block + 1 tokens, an address off a 32-bit word)
    between them; K and V beats bit-exact, counters exact."""
    T = 32
    rng = np.random.default_rng(d * 7 + lanes)
    lens = [1, T, 5, 17, T, 2, 31, 9]
    mem, blocks = _landed(rng, d, lens, gap=4000)
    reqs, want_k, want_v = [], [], []
    st = dict.fromkeys((n for n, _ in KV_READER_STATUS), 0)
    for i, (addr, blk, data) in enumerate(blocks):
        k_only = i == 3
        last = i % 3 == 2
        pos0 = int(blk.pos[0])
        reqs.append(KvBlockReq(addr, len(blk), pos0, last, k_only))
        kb, vb = block_beats(data, d, lanes, pos0, k_only)
        want_k += kb
        want_v += vb
        st["blocks"] += 1
        st["tokens"] += len(blk)
        st["jobs"] += last
        if i in (1, 5):          # rejected requests: no beats, counted
            reqs.append(KvBlockReq(addr, 0 if i == 1 else T + 1, 0, True))
            st["rejects"] += 1
        if i == 6:               # off ATT_ALIGN: rejected the same way
            reqs.append(KvBlockReq(addr + 2, len(blk), pos0, True))
            st["rejects"] += 1
    got_k, got_v, info = simulate(KvReader(d, lanes, T, v_blocks=1), mem, reqs, k_bp=k_bp,
                                  v_bp=v_bp, r_pause=r_pause, v_lag=v_lag, seed=d + lanes)
    assert got_k == want_k
    assert got_v == want_v
    assert info["status"] == st


def test_bus_error_counted_framing_kept():
    """A SLVERR beat: counted, its bytes passed on as read, every later block still framed."""
    d, lanes = 16, 4
    rng = np.random.default_rng(5)
    mem, blocks = _landed(rng, d, [20, 20, 20], gap=0)
    bad = blocks[1][0] - blocks[1][0] % BB + BB
    reqs = [KvBlockReq(a, len(b), int(b.pos[0])) for a, b, _ in blocks]
    got_k, got_v, info = simulate(KvReader(d, lanes, 32), mem, reqs, err_beats={bad})
    want = [block_beats(data, d, lanes, int(b.pos[0])) for _, b, data in blocks]
    assert got_k == [w for kb, _ in want for w in kb]
    assert got_v == [w for _, vb in want for w in vb]
    assert info["status"]["bus_errors"] == 1 and info["status"]["blocks"] == 3


@settings(max_examples=12)
@given(geom=st.sampled_from([(16, 4), (16, 16), (32, 8), (64, 16)]),
       lens=st.lists(st.integers(1, 12), min_size=1, max_size=5),
       offset=st.integers(0, 1023).map(lambda w: 4 * w), seed=st.integers(0, 1 << 16))
def test_reader_any_alignment(geom, lens, offset, seed):
    """Any start address on a 32-bit word (:data:`~mcf.abi.attend.ATT_ALIGN`; any word of the
    beat, any 4 KiB position) and block lengths: beats bit-exact."""
    d, lanes = geom
    rng = np.random.default_rng(seed)
    mem, blocks = _landed(rng, d, lens, base=0x4000_0000 + offset,
                          gap=4 * int(rng.integers(0, 18)))
    reqs = [KvBlockReq(a, len(b), int(b.pos[0])) for a, b, _ in blocks]
    got_k, got_v, _ = simulate(KvReader(d, lanes, 12, v_blocks=1), mem, reqs, k_bp=0.3,
                               v_bp=0.3, r_pause=0.3, seed=seed)
    want = [block_beats(data, d, lanes, int(b.pos[0])) for _, b, data in blocks]
    assert got_k == [w for kb, _ in want for w in kb]
    assert got_v == [w for _, vb in want for w in vb]


@pytest.mark.parametrize("d,lanes", [(16, 4), (128, 64)])
def test_reader_rate(d, lanes):
    """Full rate, no pauses: one record per max(d/lanes, record/16) cycles — the output rate
    (one K and one V beat per cycle) or one 16-byte bus beat per cycle, whichever binds
    (kr260: 132-byte records, 8.25 cycles per token at 16 B/cycle; sim: 4 cycles per token)."""
    T = 32
    rng = np.random.default_rng(9)
    mem, blocks = _landed(rng, d, [T] * 6, gap=0)
    reqs = [KvBlockReq(a, len(b), 0) for a, b, _ in blocks]
    _, _, info = simulate(KvReader(d, lanes, T), mem, reqs, latency=(20, 20))
    per_token = max(d // lanes, kv_token_bytes(d) / BB)
    print(f"reader d={d} lanes={lanes}: {info['cycles'] / (6 * T):.3f} cycles per token "
          f"(bound {per_token})")
    assert info["cycles"] <= 6 * T * per_token + 60, info["cycles"]


@pytest.mark.parametrize("heads", [6, 2])
def test_reader_feeds_kr260_engine(heads):
    """kr260 geometry (d 128, 32 lanes, 256-token blocks, one HP port at 16 B/cycle with
    20-cycle read latency) against an engine-shaped consumer: one K beat and one V beat every
    ``heads`` cycles, a block's V rows only after its K rows. 6:1 GQA (Qwen2.5-1.5B) needs
    132 B per 24 cycles = 5.5 B/cycle and 2:1 16.5 B/cycle: within a port's 16 B/cycle (6:1,
    the consumer never waits after the first beat) or just above it (2:1: the reader,
    bus-bound at 8.25 cycles per token, sets the pace)."""
    d, lanes, T = KR260.attn_head_dim, KR260.attn_lanes, KR260.attn_block
    nb = d // lanes
    rng = np.random.default_rng(heads)
    mem, blocks = _landed(rng, d, [T] * 3, gap=0)
    reqs = [KvBlockReq(a, len(b), int(b.pos[0])) for a, b, _ in blocks]
    got_k, got_v, info = simulate(KvReader(d, lanes, T), mem, reqs, latency=(20, 20),
                                  pace=heads, v_gate=T * nb, seed=heads)
    want = [block_beats(data, d, lanes, int(b.pos[0])) for _, b, data in blocks]
    assert got_k == [w for kb, _ in want for w in kb]
    assert got_v == [w for _, vb in want for w in vb]
    need = kv_token_bytes(d) / (heads * nb)
    print(f"kr260 heads={heads}: {need:.1f} B/cycle needed, {info['cycles']} cycles for "
          f"{3 * T} tokens, consumer waited {info['k_starved']} (K) {info['v_starved']} (V)")
    if need <= BB:
        assert info["k_starved"] == 0 and info["v_starved"] == 0
    else:
        assert info["cycles"] <= 3 * T * kv_token_bytes(d) / BB + 100


# --- cocotb + Verilator end to end -----------------------------------------------------------

GEOM = {"head_dim": SIM.attn_head_dim, "lanes": SIM.attn_lanes, "max_heads": SIM.attn_heads,
        "max_block": SIM.attn_block}
BENCH = "mcf.sim.benches.node_kv_reader"


class KvAttendBench(wiring.Component):
    """Bench top: ``KvReader`` → ``AttentionEngine``, with the engine's ``k``/``v`` taken
    either from the reader or (``direct = 1``) from the ``k_ext``/``v_ext`` streams, so one
    build measures both (the engine's ``busy`` and the run's cycles)."""

    def __init__(self, head_dim, lanes, max_heads, max_block):
        self.reader = KvReader(head_dim, lanes, max_block)
        self.engine = AttentionEngine(head_dim, lanes, max_heads, max_block)
        kvw = kv_beat_layout(lanes).size
        super().__init__({
            "blocks": In(stream.Signature(KV_BLOCK_REQ.size)),
            "job": In(stream.Signature(attn_job_layout(max_heads).size)),
            "q": In(stream.Signature(q_beat_layout(lanes).size)),
            "k_ext": In(stream.Signature(kvw)),
            "v_ext": In(stream.Signature(kvw)),
            "direct": In(1),
            "o": Out(stream.Signature(beat_layout(64))),
            "m_axi": Out(AXI4Signature(ADDR_BITS, 128)),
            "status": Out(attn_status_layout()),
            "kvr_status": Out(KV_READER_STATUS),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.reader = r = self.reader
        m.submodules.engine = e = self.engine
        wiring.connect(m, r.bus, wiring.flipped(self.m_axi))
        m.d.comb += [r.blocks.valid.eq(self.blocks.valid), self.blocks.ready.eq(r.blocks.ready),
                     r.blocks.payload.as_value().eq(self.blocks.payload)]
        for name in ("job", "q"):
            outer, inner = getattr(self, name), getattr(e, name)
            m.d.comb += [inner.valid.eq(outer.valid), outer.ready.eq(inner.ready),
                         inner.payload.as_value().eq(outer.payload)]
        for name in ("k", "v"):
            ext, src, dst = getattr(self, f"{name}_ext"), getattr(r, name), getattr(e, name)
            with m.If(self.direct):
                m.d.comb += [dst.valid.eq(ext.valid), ext.ready.eq(dst.ready),
                             dst.payload.as_value().eq(ext.payload)]
            with m.Else():
                m.d.comb += [dst.valid.eq(src.valid), src.ready.eq(dst.ready),
                             dst.payload.eq(src.payload)]
        wiring.connect(m, e.o, wiring.flipped(self.o))
        m.d.comb += [self.status.eq(e.status), self.kvr_status.eq(r.status)]
        return m


def kv_attend_built():
    from mcf.hdl.flat import FlatTop
    from mcf.sim import build
    top = KvAttendBench(**GEOM)
    return build(FlatTop(top, {"blocks": "s_axis_blocks", "job": "s_axis_job", "q": "s_axis_q",
                               "k_ext": "s_axis_k", "v_ext": "s_axis_v", "o": "m_axis"}),
                 "node_kv_reader", params=GEOM)


@pytest.mark.parametrize("pause", [0.0, 0.4])
def test_kv_reader_bench(pause):
    from mcf.sim import run
    run(kv_attend_built(), BENCH, params={**GEOM, "seed": 3 + int(10 * pause), "pause": pause,
                                          "tests": ["prefill_causal", "decode_states"]})


def test_kv_reader_rate(tmp_path):
    """Engine busy with the reader in front vs fed directly (reported with ``-s``; the bench's
    scoreboard checks every output word)."""
    from mcf.sim import run
    out = tmp_path / "rate.json"
    run(kv_attend_built(), BENCH, params={**GEOM, "seed": 5, "tests": ["rate"],
                                          "out": str(out)})
    result = json.loads(out.read_text())
    for r in result:
        print("kv reader rate:", r)
    assert {r["feed"] for r in result} == {"reader", "direct"}
