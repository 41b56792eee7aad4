"""The row-parallel step of tensor-parallel decode on the node (mcf.node.tp; issue #34 item 3):
the shards, the three templates as the walker's golden model issues them, the MAX all-reduce's
records, the SUM payload cut and records, the decode lander's SUM window (decision, and the
RTL lander against its golden model in amaranth.sim), and the step's golden (the engines'
golden models over the templates' buffers) equal to ``row_parallel`` and to the single-node
GEMM of the whole K; the RTL run of the whole step (ABSMAX → MAX all-reduce → REQUANT_EXT →
``acc_out`` → SUM all-reduce → ``acc_in``) on two node tops (sim/benches/node_tp.py); the TP
FFN (mcf.node.tp_ffn): its golden equal to ``tp_ffn`` and the replicated FFN, its column
template and records, its refusals, and its RTL run on two node tops; the post-attention half
of a TP layer (mcf.node.tp_layer): its golden equal to ``tp_layer``'s and the replicated
layer's, its norm and final templates, the two all-reduce steps' slots, tags and cumulative WAIT
thresholds, and its RTL run on two node tops; the pre-attention half (mcf.node.tp_pre): its
golden's query and K/V records equal replicated decode's, its template and records (query
multicast, K/V EMIT to the root), its refusals, and its RTL run on two node tops; the token's
clearing MARK; the KV-parallel attention with each head's result at its TP owner
(mcf.node.tp_decode): the owners' merge = replicated decode's, its records, their run on the
ABI's golden models, its refusals and its RTL run; TPDecodeImage (every layer of a TP token in
one node program): its table, rows, thresholds, and the whole token's RTL run."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from amaranth.sim import Simulator

from mcf.abi.compute import GemmJob, StripeJob
from mcf.abi.decode_land import (
    DECODE_LAND_STATUS,
    SUM_SLOT_BYTES,
    DecodeLandConfig,
    DecodeLandResult,
    decode_land_decision,
    sum_tag,
)
from mcf.abi.framing import MAX_PAYLOAD
from mcf.abi.jobs import JOB_ARG, STRIPE_JOB, VEC_CFG, walk
from mcf.abi.meta import Collective, Meta, Op, ReduceOp
from mcf.abi.node import PayloadSource, RecordClass
from mcf.abi.node_config import SIM
from mcf.abi.quant import VectorOp, requantize
from mcf.abi.sequencer import SeqCounter
from mcf.abi.tp import ACC_LANES, acc_lanes
from mcf.golden import gemm as G
from mcf.golden import vector as V
from mcf.golden.decode_land import DecodeLandModel
from mcf.golden.node_tp import golden_ffn, golden_post, golden_pre, golden_step
from mcf.golden.qwen_layer import QWEN25_1P5B, TINY, quantize_layer, random_layer
from mcf.golden.tp_decode import row_parallel, tp_ffn, tp_layer, tp_split
from mcf.node.layer import act_bytes
from mcf.node.tp import (
    MAX_BYTES,
    RowParallelImage,
    max_records,
    shard_weight,
    sum_payloads,
    sum_records,
)
from mcf.node.tp_ffn import TPFFNImage
from mcf.node.tp_layer import TPPostImage
from mcf.node.tp_pre import TPPreImage
from mcf.quant import QuantWeight, gemm_stripe_image, to_act
from mcf.sim.amsim import parsed_beats, send
from mcf.sim.axi_slave import write_slave

SEED = 7
MBUF, QBUF = 0x800, 0x400


def _layer():
    return quantize_layer(random_layer(TINY, SEED), TINY)


def _ranges(name: str, nodes: int):
    sp = tp_split(TINY, nodes)
    return [sp.q_rows(i) for i in range(nodes)] if name == "o" else list(sp.inter)


def _images(qw, ranges, bias=None):
    return [RowParallelImage(qw, k, SIM, base=0x10000, mbuf_base=MBUF, q_heads=TINY.heads,
                             bias=bias) for k in ranges]


def _row(k: int, seed: int = SEED) -> np.ndarray:
    return to_act(np.random.default_rng(seed).standard_normal(k) * 3)


def test_shards_are_whole_groups_with_zeros_outside():
    qw = _layer().qw["o"]
    for k in _ranges("o", 2):        # O at N = 2 cuts the one group of 128
        s = shard_weight(qw, k)
        assert s.groups == (0, 1) and s.kp == 128 and (s.lo, s.hi) == k
        assert np.array_equal(s.qw.q[:, s.lo:s.hi], qw.q[:, k[0]:k[1]])
        assert not s.qw.q[:, :s.lo].any() and not s.qw.q[:, s.hi:].any()
        assert np.array_equal(s.qw.m, qw.m[:, 0:1])
    down = _layer().qw["down"]
    s = shard_weight(down, _ranges("down", 2)[1])      # aligned: the second group only
    assert s.groups == (1, 2) and (s.lo, s.hi) == (0, 128)
    with pytest.raises(ValueError):
        shard_weight(qw, (64, 200))


@pytest.mark.parametrize("name,nodes", [("o", 2), ("down", 2), ("o", 4), ("down", 4)])
def test_golden_step_is_row_parallel_and_the_whole_k_gemm(name, nodes):
    """Every node's output row equals ``row_parallel``'s and the single-node GEMM of the whole
    row (with a bias through the ``acc_in`` weight path too); the ``acc_out`` lanes are each
    shard's exact accumulator; every node has the same scale."""
    qw = _layer().qw[name]
    k_all = qw.q.shape[1]
    ranges = _ranges(name, nodes)
    x = _row(k_all)
    shards = [x[a:b] for a, b in ranges]
    rp = row_parallel([s[None, :] for s in shards], qw, ranges)
    xq, xm, xe = requantize(x[None, :])
    bias = np.random.default_rng(SEED + 1).integers(-(1 << 20), 1 << 20, qw.q.shape[0])
    for b in (None, bias):
        gold = golden_step(_images(qw, ranges, b), shards)
        want = G.gemm(xq, xm, xe, qw.q, qw.m, qw.e, b, qw.group)[0]
        assert all(np.array_equal(y, want) for y in gold.y)
        if b is None:
            assert np.array_equal(gold.y[0], rp.y[0])
        assert (gold.x_m, gold.x_e) == (int(xm[0]), int(xe[0]))
        assert np.array_equal(gold.summed, rp.summed)
        for lanes, acc in zip(gold.lanes, rp.acc, strict=True):
            assert np.array_equal(lanes, acc_lanes(acc))
    assert not np.array_equal(golden_step(_images(qw, ranges, bias), shards).y[0],
                              golden_step(_images(qw, ranges), shards).y[0])


def _memory(img: RowParallelImage) -> bytearray:
    mem = bytearray(img.end)
    for a, raw in img.image.items():
        mem[a:a + len(raw)] = raw
    return mem


def test_templates_issue_the_step():
    """Walked by the template walker's golden model: ABSMAX over the padded row into one beat;
    REQUANT_EXT of the row with the MBUF slot's lanes, then an ``acc_out`` job over the shard's
    stripe image writing ``2·rows`` lanes per tile; an ``acc_in`` job on the scale word and the
    summed lanes with the bias stripes, writing the output row."""
    qw = _layer().qw["o"]
    bias = np.arange(qw.q.shape[0])
    img = _images(qw, _ranges("o", 2), bias)[1]
    b, kp, n = img.buf, img.shard.kp, qw.q.shape[0]
    mem = _memory(img)

    def read(a, k):
        return bytes(mem[a:a + k])

    acts = []
    for t in range(3):
        a, counts = walk(read, img.table, img.table_len,
                         JOB_ARG.const({"template": t}).as_bits(), SIM.gemm_limits)
        assert counts["bad_entries"] == counts["bad_gemm"] == counts["bad_index"] == 0
        acts.append([(tgt, v) for _, tgt, v in a])
    from mcf.abi.compute import DmaDesc

    def descs(t, tgt):
        return [DmaDesc.unpack(v) for g, v in acts[t] if g == tgt]

    vec = [VEC_CFG.from_bits(v) for g, v in acts[0] if g == "vec"]
    assert [(v.op, v.n_beats) for v in vec] == [(VectorOp.ABSMAX, kp // SIM.vec_lanes)]
    assert [(d.addr, d.length) for d in descs(0, "rd_desc0")] == [(b.x, kp * 4)]
    assert [(d.addr, d.length) for d in descs(0, "wr_desc")] == [(b.mx, 16)]

    vec = [VEC_CFG.from_bits(v) for g, v in acts[1] if g == "vec"]
    assert [v.op for v in vec] == [VectorOp.REQUANT_EXT]
    assert [(d.addr, d.length) for d in descs(1, "rd_desc1")] == [(b.mslot, 16)]
    jobs = [GemmJob.unpack(v) for g, v in acts[1] if g == "gemm_job"]
    assert jobs == [GemmJob(1, kp // 16, n // 16, qw.e, acc_in=0, acc_out=1)]
    assert [(d.addr, d.length) for d in descs(1, "rd_desc0")] == \
        [(b.x, kp * 4), (b.xq + kp, 4), (b.xq, kp)]
    wr = [(d.addr, d.length) for d in descs(1, "wr_desc")]
    assert wr[:2] == [(b.xq, kp), (b.xq + kp, 4)]
    assert wr[2:] == [(b.lanes + t * 16 * ACC_LANES * 4, 16 * ACC_LANES * 4)
                      for t in range(n // 16)]
    sj = [StripeJob.unpack(v, STRIPE_JOB) for g, v in acts[1] if g == "w_job"]
    raw, want = gemm_stripe_image(img.shard.qw, 16, 16, ports=SIM.hp_ports, beat_bytes=16)
    assert sj == [b.w] and (b.w.length, b.w.pitch) == (want.length, want.pitch)
    assert read(b.w.addr, len(raw)) == raw

    jobs = [GemmJob.unpack(v) for g, v in acts[2] if g == "gemm_job"]
    assert jobs == [GemmJob(1, kp // 16, n // 16, qw.e, acc_in=1, acc_out=0)]
    assert [(d.addr, d.length) for d in descs(2, "rd_desc0")] == \
        [(b.xq + kp, 4), (b.summed, ACC_LANES * n * 4)]
    assert [(d.addr, d.length) for d in descs(2, "wr_desc")] == \
        [(b.y + t * 64, 64) for t in range(n // 16)]
    sj = [StripeJob.unpack(v, STRIPE_JOB) for g, v in acts[2] if g == "w_job"]
    assert sj == [b.bias] and sj[0].length == n // 16 * 16      # one 16-byte beat per tile
    stripes = [read(b.bias.addr + p * b.bias.pitch, b.bias.length) for p in range(SIM.hp_ports)]
    words = b"".join(b"".join(s[i:i + 16] for s in stripes) for i in range(0, b.bias.length, 16))
    assert np.array_equal(np.frombuffer(words, "<i4"), bias)    # w_in words = the bias tiles


def test_max_records_and_sum_payloads():
    qw = _layer().qw["o"]
    img = _images(qw, _ranges("o", 2))[0]
    for node in (0, 1):
        recs = max_records(img, node, 0, 2, reduce_route=5, bcast_route=6, qbuf_base=QBUF,
                           tag_base=40)
        cls = [r.cls for r in recs]
        assert cls == [RecordClass.JOB, RecordClass.SEND, RecordClass.WAIT] + \
            ([RecordClass.SEND] if node == 0 else []) + [RecordClass.JOB]
        m = Meta.unpack(recs[1].meta)
        assert (m.op, m.collective, m.reduce_op, m.length, m.kv_id, m.route_id, m.src) == \
            (Op.REDUCTION, Collective.ALL_REDUCE, ReduceOp.MAX, MAX_BYTES, 40, 5, node)
        assert recs[1].src is PayloadSource.QBUF and recs[1].arg == img.buf.mx - QBUF
        assert (recs[2].arg, recs[2].wait) == (SeqCounter.MAXES_LANDED.value, 1)
        assert [JOB_ARG.from_bits(r.arg).template for r in recs if r.cls is RecordClass.JOB] \
            == [0, 1]
        cfg = DecodeLandConfig(QBUF, 0x600, 64, TINY.heads, tag_base=40, mbuf_base=MBUF)
        final = Meta(**{**m.__dict__, "reduce_op": ReduceOp.NONE,
                        "collective": Collective.MULTICAST})
        assert decode_land_decision(cfg, final, b"", TINY.head_dim) == \
            (DecodeLandResult.MAXES, img.buf.mslot)
    # the SUM all-reduce: whole lane pairs per payload; Qwen2.5-1.5B's O/down: 6 payloads
    for n, want in ((TINY.hidden, [2 * TINY.hidden]), (QWEN25_1P5B.hidden, [512] * 6)):
        pays = sum_payloads(n, 1, 0, 5, 100)
        assert [p.words for p in pays] == want
        assert [p.w0 for p in pays] == list(np.cumsum([0] + want[:-1]))
        assert all(p.meta.length <= MAX_PAYLOAD and p.words % ACC_LANES == 0 for p in pays)
        assert [p.meta.kv_id for p in pays] == list(range(100, 100 + len(want)))
    assert [p.words for p in sum_payloads(5, 0, 0, 0, 0, max_payload=12)] == [2] * 5
    assert [p.meta.kv_id for p in sum_payloads(5, 0, 0, 0, 0xFFFF, max_payload=12)] == \
        [0xFFFF, 0, 1, 2, 3]


def _sum_cfg(slots=3, tag_base=0xFFF0):
    return DecodeLandConfig(QBUF, 0x600, 64, TINY.heads, tag_base=tag_base, mbuf_base=MBUF,
                            sum_base=0x1_0000_0010, sum_slots=slots)


def _final(**kw):
    return Meta(op=Op.REDUCTION, collective=Collective.MULTICAST, reduce_op=ReduceOp.NONE, **kw)


def test_sum_window_decision():
    """A final REDUCTION tagged ``sum_tag(TAG_BASE, Q_HEADS, slot)`` with ``slot < SUM_SLOTS``
    lands at ``SUM_BASE + slot · MAX_PAYLOAD`` (lengths: whole lane pairs up to MAX_PAYLOAD);
    below the window it is maxima (MBUF), above it (or with the window closed) the maxima
    rules drop it; a bad length in the window is ``drop_length``."""
    cfg, d = _sum_cfg(), TINY.head_dim
    assert SUM_SLOT_BYTES == MAX_PAYLOAD
    for slot, length in ((0, 8), (1, 1024), (2, MAX_PAYLOAD)):
        meta = _final(kv_id=sum_tag(cfg.tag_base, cfg.q_heads, slot), length=length, seq=1)
        assert decode_land_decision(cfg, meta, b"", d) == \
            (DecodeLandResult.SUMS, 0x1_0000_0010 + slot * MAX_PAYLOAD)
    tag = sum_tag(cfg.tag_base, cfg.q_heads, 1)
    for length in (0, 4, 12, MAX_PAYLOAD + 8):
        assert decode_land_decision(cfg, _final(kv_id=tag, length=length), b"", d)[0] is \
            DecodeLandResult.DROP_LENGTH
    above = _final(kv_id=sum_tag(cfg.tag_base, cfg.q_heads, 3), length=16)
    assert decode_land_decision(cfg, above, b"", d)[0] is DecodeLandResult.DROP_SLOT
    assert decode_land_decision(cfg, above.replace(length=1024), b"", d)[0] is \
        DecodeLandResult.DROP_LENGTH
    closed = _sum_cfg(slots=0)
    assert decode_land_decision(closed, _final(kv_id=tag, length=16), b"", d)[0] is \
        DecodeLandResult.DROP_SLOT
    maxima = _final(kv_id=cfg.tag_base + 2, length=16)
    assert decode_land_decision(cfg, maxima, b"", d)[0] is DecodeLandResult.MAXES
    assert decode_land_decision(cfg, _final(kv_id=tag, length=16).replace(
        reduce_op=ReduceOp.SUM), b"", d)[0] is DecodeLandResult.DROP_REDUCE_OP


def test_sum_records():
    """After ``acc_out``: the lanes as SUM payloads tagged in the SUM window (payload ``i`` from
    ``lanes + i·MAX_PAYLOAD``), WAIT SUMS_LANDED ≥ payloads, the root's casts of its SUM
    slots, the ``acc_in`` JOB; the image's SUM registers open exactly those slots at
    ``summed``."""
    qw = _layer().qw["o"]
    img = _images(qw, _ranges("o", 2))[1]
    b, n = img.buf, qw.q.shape[0]
    regs = img.sum_registers()
    assert regs == {"SUM_BASE_LO": b.summed, "SUM_BASE_HI": 0, "DEC_SUM_SLOTS": 1}
    cfg = DecodeLandConfig(QBUF, 0x600, 64, TINY.heads, tag_base=40, mbuf_base=MBUF,
                           sum_base=b.summed, sum_slots=regs["DEC_SUM_SLOTS"])
    for node in (0, 1):
        recs = sum_records(img, node, 0, 2, reduce_route=5, bcast_route=6, qbuf_base=QBUF,
                           tag_base=40)
        assert [r.cls for r in recs] == [RecordClass.SEND, RecordClass.WAIT] + \
            ([RecordClass.SEND] if node == 0 else []) + [RecordClass.JOB]
        m = Meta.unpack(recs[0].meta)
        assert (m.op, m.collective, m.reduce_op, m.length, m.kv_id, m.route_id, m.src) == \
            (Op.REDUCTION, Collective.ALL_REDUCE, ReduceOp.SUM, ACC_LANES * n * 4,
             40 + TINY.heads, 5, node)
        assert recs[0].src is PayloadSource.QBUF and recs[0].arg == b.lanes - QBUF
        assert (recs[1].arg, recs[1].wait) == (SeqCounter.SUMS_LANDED.value, 1)
        assert JOB_ARG.from_bits(recs[-1].arg).template == 2
        final = Meta(**{**m.__dict__, "reduce_op": ReduceOp.NONE,
                        "collective": Collective.MULTICAST})
        assert decode_land_decision(cfg, final, b"", TINY.head_dim) == \
            (DecodeLandResult.SUMS, b.summed)
        if node == 0:
            cast = Meta.unpack(recs[2].meta)
            assert (cast.collective, cast.reduce_op, cast.route_id, cast.dst, cast.kv_id) == \
                (Collective.MULTICAST, ReduceOp.NONE, 6, 1, 40 + TINY.heads)
            assert recs[2].arg == b.summed - QBUF


def test_lander_rtl_sum_window():
    """The RTL decode lander (amaranth.sim, random W pauses) on SUM payloads in every slot of
    the window (lengths 8..MAX_PAYLOAD), maxima beside them, and SUM-window packets it must
    drop (bad length, above the window, reduce_op SUM): bytes written and every counter equal
    to the golden model's."""
    from mcf.hdl.node.decode_land import DecodeLander

    cfg, d = _sum_cfg(), TINY.head_dim
    rng = np.random.default_rng(SEED)

    def pay(k):
        return rng.integers(0, 256, k, dtype=np.uint8).tobytes()

    def tag(slot):
        return sum_tag(cfg.tag_base, cfg.q_heads, slot)

    packets = [
        (_final(kv_id=tag(0), length=MAX_PAYLOAD), pay(MAX_PAYLOAD)),
        (_final(kv_id=tag(2), length=8), pay(8)),
        (_final(kv_id=cfg.tag_base + 1, length=24, seq=1), pay(24)),      # maxima
        (_final(kv_id=tag(1), length=12), pay(12)),                        # drop_length
        (_final(kv_id=tag(3), length=16), pay(16)),                        # drop_slot
        (_final(kv_id=tag(1), length=64).replace(reduce_op=ReduceOp.SUM), pay(64)),  # reduce_op
        (_final(kv_id=tag(1), length=520), pay(520)),
    ]
    model = DecodeLandModel(cfg, d)
    for meta, p in packets:
        model.land(meta, p)
    dut = DecodeLander(d)
    wmem: dict[int, int] = {}
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(write_slave(dut.bus, random.Random(SEED), wmem, [], wpause=0.3),
                      background=True)
    out = {}

    async def host(ctx):
        ctx.set(dut.cfg.as_value(), cfg.pack())
        for meta, p in packets:
            await send(ctx, dut.i, parsed_beats(meta, p))
        landed = sum(1 for mt, _ in packets
                     if decode_land_decision(cfg, mt, b"", d)[1] is not None)
        for _ in range(2000):
            await ctx.tick()
            st = {nm: ctx.get(dut.status[nm]) for nm, _ in DECODE_LAND_STATUS}
            if st["sums_landed"] + st["maxes_landed"] == landed:
                break
        out["status"] = st

    sim.add_testbench(host)
    sim.run()
    assert out["status"] == model.status
    assert model.status["sums_landed"] == 3 and model.status["maxes_landed"] == 1
    assert wmem == model.mem
    assert np.array_equal(model.lanes(0, 2), np.frombuffer(packets[0][1][:8], "<i4"))


# ---- the TP FFN (mcf.node.tp_ffn) ------------------------------------------------------------


def _ffn_images(ql, nodes):
    return [TPFFNImage(ql.qw["gate"], ql.qw["up"], ql.qw["down"], r, SIM, base=0x10000,
                       mbuf_base=MBUF, q_heads=TINY.heads) for r in tp_split(TINY, nodes).inter]


@pytest.mark.parametrize("nodes", [2, 4])
def test_golden_ffn_is_tp_ffn_and_the_replicated_ffn(nodes):
    """The engines' golden models over the FFN images' buffers: every node's output row equals
    ``tp_ffn``'s and the replicated FFN's; each node's SiLU shard is ``column_ffn``'s and lands
    at the down step's offset ``lo`` (tiny at N = 4: 64 rows inside a group, lo = 0 or 64)."""
    ql = _layer()
    x = _row(TINY.hidden)[None, :]
    xq, xm, xe = requantize(x)
    images = _ffn_images(ql, nodes)
    gold = golden_ffn(images, xq, xm, xe)
    w = [ql.qw[n] for n in ("gate", "up", "down")]
    ffn = tp_ffn(xq, xm, xe, *w, tp_split(TINY, nodes).inter)
    g, u = (G.gemm(xq, xm, xe, q.q, q.m, q.e, None, q.group) for q in w[:2])
    want = G.gemm(*requantize(V.silu_mul(g, u)), w[2].q, w[2].m, w[2].e, None, w[2].group)[0]
    assert all(np.array_equal(y, want) for y in gold.step.y)
    assert np.array_equal(ffn.y[0], want)
    for im, s, shard in zip(images, gold.s, ffn.shards, strict=True):
        assert np.array_equal(s, shard[0])
        assert im.buf.s == im.row.buf.x + 4 * im.row.shard.lo
    if nodes == 4:
        assert [im.row.shard.lo for im in images] == [0, 64, 0, 64]


def test_ffn_column_template_and_records():
    """Template 0 walked by the walker's golden model: GEMM gate then GEMM up on the input
    codes (K = hidden, the shard's rows) from their stripe images, SILU_MUL of ``g`` and ``u``
    into the down step's ACT row at ``lo``; templates 1–3 are the down step's. The records:
    the column JOB, then the down step's MAX and SUM records on templates 1, 2, 3."""
    ql = _layer()
    img = _ffn_images(ql, 4)[1]
    b, ni, h = img.buf, img.r[1] - img.r[0], TINY.hidden
    assert img.templates[1:] == img.row.templates and img.table not in img.row.image
    mem = bytearray(img.end)
    for a, raw in img.image.items():
        mem[a:a + len(raw)] = raw
    acts, counts = walk(lambda a, k: bytes(mem[a:a + k]), img.table, img.table_len,
                        JOB_ARG.const({"template": 0}).as_bits(), SIM.gemm_limits)
    assert counts["bad_entries"] == counts["bad_gemm"] == counts["bad_index"] == 0
    from mcf.abi.compute import DmaDesc
    jobs = [GemmJob.unpack(v) for _, g, v in acts if g == "gemm_job"]
    assert jobs == [GemmJob(1, h // 16, ni // 16, ql.qw[n].e) for n in ("gate", "up")]
    assert [StripeJob.unpack(v, STRIPE_JOB) for _, g, v in acts if g == "w_job"] == \
        [b.gate, b.up]
    for name, sj in (("gate", b.gate), ("up", b.up)):
        qw, (r0, r1) = ql.qw[name], img.r
        rows = QuantWeight(qw.q[r0:r1], qw.m[r0:r1], qw.e, qw.group)
        raw, _ = gemm_stripe_image(rows, 16, 16, ports=SIM.hp_ports, beat_bytes=16)
        assert bytes(mem[sj.addr:sj.addr + len(raw)]) == raw
    vec = [VEC_CFG.from_bits(v) for _, g, v in acts if g == "vec"]
    assert [(v.op, v.n_beats) for v in vec] == [(VectorOp.SILU_MUL, ni // SIM.vec_lanes)]
    rd = [(d.addr, d.length) for d in (DmaDesc.unpack(v) for _, g, v in acts if g == "rd_desc0")]
    assert rd == [(b.xq + h, 4), (b.xq, h)] * 2 + [(b.g, ni * 4)]
    wr = [(d.addr, d.length) for d in (DmaDesc.unpack(v) for _, g, v in acts if g == "wr_desc")]
    assert wr == [(out + t * 64, 64) for out in (b.g, b.u) for t in range(ni // 16)] + \
        [(img.row.buf.x + 64 * 4, ni * 4)]
    args = (1, 0, 4, 5, 6, QBUF, 40)
    recs = img.records(*args)
    assert recs[1:] == max_records(img.row, *args, first=1) + sum_records(img.row, *args, first=1)
    assert [JOB_ARG.from_bits(r.arg).template for r in recs if r.cls is RecordClass.JOB] == \
        [0, 1, 2, 3]
    xw = img.x_writes(*(a[0] for a in requantize(_row(h)[None, :])))
    assert list(xw) == [b.xq] and len(xw[b.xq]) == h + 4
    with pytest.raises(ValueError, match="codes"):
        img.x_writes(np.zeros(h - 1), 1, 0)


def test_ffn_image_refuses_what_the_engines_cannot_run():
    ql = _layer()
    g, u, d = (ql.qw[n] for n in ("gate", "up", "down"))
    with pytest.raises(ValueError, match="whole 16-row tiles"):
        TPFFNImage(g, u, d, (0, 40), SIM, 0x10000, MBUF, TINY.heads)
    with pytest.raises(ValueError, match="intermediate rows"):
        TPFFNImage(g, u, d, (128, 512), SIM, 0x10000, MBUF, TINY.heads)
    with pytest.raises(ValueError, match="hidden x I"):
        TPFFNImage(g, u, g, (0, 128), SIM, 0x10000, MBUF, TINY.heads)


# ---- the post-attention half of a TP layer (mcf.node.tp_layer) -------------------------------


def _post(nodes, seed=SEED):
    """The layer, its split, an input row, ``tp_layer``'s output and attention rows (random
    attention rows given to it), and the nodes' images."""
    ql, sp = _layer(), tp_split(TINY, nodes)
    rng = np.random.default_rng(seed)
    x = to_act(rng.standard_normal(TINY.hidden) * 3)
    rows = to_act(rng.standard_normal((1, TINY.heads * TINY.head_dim)) * 2)
    y, att, o, down = tp_layer(x, ql, TINY, 5, sp, lambda q, k, v, pos: rows)
    assert np.array_equal(att, rows)
    images = [TPPostImage(ql, TINY, sp, i, SIM, base=0x10000, mbuf_base=MBUF,
                          q_heads=TINY.heads) for i in range(nodes)]
    return ql, x, att, (y, o, down), images


@pytest.mark.parametrize("nodes", [2, 4])
def test_golden_post_is_tp_layers_post_attention_half(nodes):
    """The engines' golden models over the half's buffers (O step, ADD, RMSNORM, REQUANT, the
    FFN, ADD): every node's output row equals ``tp_layer``'s, and so do the O and down rows;
    the same as the replicated layer after attention (whole-K GEMMs on one node)."""
    ql, x, att, (y, o, down), images = _post(nodes)
    gold = golden_post(images, x, att)
    for i in range(nodes):
        assert np.array_equal(gold.y[i], y[0])
        assert np.array_equal(gold.o.y[i], o.y[0])
        assert np.array_equal(gold.ffn.step.y[i], down.y[0])
    w = ql.qw
    ow = G.gemm(*requantize(att), w["o"].q, w["o"].m, w["o"].e, None, w["o"].group)
    h = V.residual_add(x[None, :], ow)
    xq, xm, xe = requantize(V.rmsnorm(h, ql.gamma["g2"], TINY.eps))
    assert np.array_equal(gold.xq, xq[0]) and (gold.xm, gold.xe) == (xm[0], xe[0])
    g, u = (G.gemm(xq, xm, xe, w[n].q, w[n].m, w[n].e, None, w[n].group) for n in ("gate", "up"))
    d = G.gemm(*requantize(V.silu_mul(g, u)), w["down"].q, w["down"].m, w["down"].e, None,
               w["down"].group)
    assert np.array_equal(gold.y[0], V.residual_add(h, d)[0])
    other = golden_post(images, x, np.roll(att, 1))
    assert not np.array_equal(other.y[0], gold.y[0])


def test_post_templates_slots_and_records():
    """The nine templates: the O step's three, then ``ADD(x, o.y) → h``, ``RMSNORM(h, γ2) →
    n2``, ``REQUANT(n2)`` into the FFN's input (codes, then the scale word), the FFN's four,
    ``ADD(h, d.y) → y``. The two steps' maxima land in MBUF slots (0, 0) and (0, 1), their
    sums in SUM slots 0 and 1 of one window; WAIT thresholds cumulative (1, S; 2, 2S)."""
    from mcf.abi.compute import DmaDesc

    *_, images = _post(2)
    img, h = images[1], TINY.hidden
    b, hb = img.buf, h // SIM.vec_lanes
    assert img.templates == [*img.o.templates, img.templates[3], *img.ffn.templates,
                             img.templates[8]]
    assert img.o.table not in img.image and img.ffn.table not in img.image
    mem = bytearray(img.end)
    for a, raw in img.image.items():
        mem[a:a + len(raw)] = raw
    assert bytes(mem[b.g2:b.g2 + 4 * h]) == act_bytes(_layer().gamma["g2"] & 0xFFFF)

    def walked(t):
        acts, counts = walk(lambda a, k: bytes(mem[a:a + k]), img.table, img.table_len,
                            JOB_ARG.const({"template": t}).as_bits(), SIM.gemm_limits)
        assert counts["bad_entries"] == counts["bad_gemm"] == counts["bad_index"] == 0
        return {k: [DmaDesc.unpack(v) if k != "vec" else VEC_CFG.from_bits(v)
                    for _, g, v in acts if g == k] for k in ("vec", "rd_desc0", "rd_desc1",
                                                             "wr_desc")}

    norm, final = walked(3), walked(8)
    assert [(v.op, v.n_beats) for v in norm["vec"]] == \
        [(VectorOp.ADD, hb), (VectorOp.RMSNORM, hb), (VectorOp.REQUANT, hb)]
    assert [d.addr for d in norm["rd_desc0"]] == [b.x, b.h, b.n2]
    assert [d.addr for d in norm["rd_desc1"]] == [img.o.buf.y, b.g2]
    assert [(d.addr, d.length) for d in norm["wr_desc"]] == \
        [(b.h, 4 * h), (b.n2, 4 * h), (img.ffn.buf.xq, h), (img.ffn.buf.xq + h, 4)]
    assert [(v.op, v.n_beats) for v in final["vec"]] == [(VectorOp.ADD, hb)]
    assert [d.addr for d in final["rd_desc0"] + final["rd_desc1"] + final["wr_desc"]] == \
        [b.h, img.ffn.row.buf.y, b.y]
    # two steps: distinct MBUF slots and disjoint SUM slots of one window
    s = img.sum_step
    assert s == 1 and img.o.buf.summed == b.window
    assert img.ffn.row.buf.summed == b.window + s * SUM_SLOT_BYTES
    assert img.sum_registers() == {"SUM_BASE_LO": b.window, "SUM_BASE_HI": 0,
                                   "DEC_SUM_SLOTS": 2 * s}
    assert img.o.buf.mslot == MBUF and img.ffn.row.buf.mslot == MBUF + 32
    cfg = DecodeLandConfig(QBUF, 0x600, 64, TINY.heads, tag_base=40, mbuf_base=MBUF,
                           sum_base=b.window, sum_slots=2 * s)
    for node in (0, 1):
        recs = images[node].records(0, 5, 6, QBUF, 40)
        assert [JOB_ARG.from_bits(r.arg).template for r in recs if r.cls is RecordClass.JOB] \
            == list(range(9))
        waits = [(r.arg, r.wait) for r in recs if r.cls is RecordClass.WAIT]
        mx, sm = SeqCounter.MAXES_LANDED.value, SeqCounter.SUMS_LANDED.value
        assert waits == [(mx, 1), (sm, s), (mx, 2), (sm, 2 * s)]
        landed = []
        for r in recs:
            if r.cls is RecordClass.SEND:
                m = Meta.unpack(r.meta)
                final_meta = m.replace(reduce_op=ReduceOp.NONE, collective=Collective.MULTICAST)
                landed.append(decode_land_decision(cfg, final_meta, b"", TINY.head_dim))
        want = [(DecodeLandResult.MAXES, MBUF), (DecodeLandResult.SUMS, b.window),
                (DecodeLandResult.MAXES, MBUF + 32),
                (DecodeLandResult.SUMS, b.window + SUM_SLOT_BYTES)]
        # the root's multicasts repeat each result's landing after its WAIT
        assert landed == ([w for w in want for _ in (0, 1)] if node == 0 else want)
    with pytest.raises(ValueError, match="two MBUF slots"):
        TPPostImage(_layer(), TINY, tp_split(TINY, 2), 0, SIM, 0x10000, MBUF, 1)


# ---- the pre-attention half (mcf.node.tp_pre) ---------------------------------------------------

POS = 37


def _pre(nodes: int = 2):
    ql = _layer()
    sp = tp_split(TINY, nodes)
    x = _row(TINY.hidden, SEED + 3)
    images = [TPPreImage(ql, TINY, sp, i, SIM, base=0x10000) for i in range(nodes)]
    return ql, sp, x, images


def _tiny_plan(nodes: int = 2):
    from mcf.mars import ClusterSpec, make_topology, plan
    from mcf.mars.model import ModelSpec

    spec = ModelSpec("tiny", layers=2, q_heads=TINY.heads, kv_heads=TINY.kv_heads,
                     head_dim=TINY.head_dim, hidden=TINY.hidden,
                     intermediate=TINY.intermediate)
    cl = ClusterSpec(nodes, 1 << 20, 1 << 20, make_topology("kr260-ring", nodes))
    return plan(spec, cl, 32, 32, "mars", alpha=0.5)


def test_golden_pre_is_replicated_decode():
    """Column-parallel Q/K/V give each output row the replicated GEMM's bits: the query records
    and INT4 K/V records the nodes write (gathered over the nodes) equal replicated decode's
    (``golden_decode``) byte for byte, and the nodes' rows (pair order undone) equal
    ``tp_pre_attention``'s shards, whose gathered rows equal the replicated layer's Q/K/V."""
    from mcf.abi.quant import rope_pair_order
    from mcf.golden.node_decode import golden_decode
    from mcf.golden.qwen_layer import layer_fixed
    from mcf.golden.tp_decode import tp_pre_attention

    ql, sp, x, images = _pre()
    gold = golden_pre(images, x, POS)
    rep = golden_decode(x, [ql], TINY, POS, 0, {1: 0}, lambda n, layer, g: [])[0]
    assert gold.queries == rep.queries and gold.kv_records == rep.kv
    pre = tp_pre_attention(x, ql, TINY, POS, sp)
    seen = {}

    def attn(q, k, v, pos):
        seen.update(q=q, k=k, v=v)
        return np.zeros((1, TINY.heads * TINY.head_dim), dtype=np.int64)

    layer_fixed(x[None, :], ql, TINY, np.array([POS]), attn=attn, act_in=True)
    for name in "qkv":
        assert np.array_equal(getattr(pre, name), seen[name]), name
    hd = TINY.head_dim
    for i, img in enumerate(images):
        pq = rope_pair_order(img.q_rows[1] - img.q_rows[0], hd)
        assert np.array_equal(gold.qr[i], pre.q_shards[i][0][pq])
        pk = rope_pair_order(hd, hd)
        (k0, k1) = img.kv_rows
        assert np.array_equal(gold.kv[i], np.concatenate([pre.k[0, k0:k1][pk],
                                                          pre.v[0, k0:k1]]))
        assert np.array_equal(gold.v[i], pre.v_shards[i][0])
    n1 = V.rmsnorm(x[None, :], ql.gamma["g1"], TINY.eps)
    assert np.array_equal(gold.n1, n1[0]) and np.array_equal(gold.xq, requantize(n1)[0][0])
    other = golden_pre(images, np.roll(x, 1), POS)
    assert other.queries != gold.queries and other.kv_records != gold.kv_records


def test_pre_template_and_records():
    """The one template walked by the walker's golden model: RMSNORM, REQUANT, GEMM Q/K/V on
    the node's rows from their stripe images (biases in), ROPE of Q, per KV head ROPE of K and
    ``ADD(v, 0)`` into the EMIT row's pair, per query head REQUANT into its query record (codes,
    then the scale word). The records: the JOB; the query record multicast on the node's
    broadcast tree, landing in the decode lander's QBUF slot of its heads; the EMIT of the K/V
    pair for the root's decode block (teed and sent by the other node); the WAIT for the other
    node's query; the root's barrier on its decode block."""
    from mcf.abi.compute import DmaDesc
    from mcf.abi.emit import EmitArg
    from mcf.abi.query import QUERY_HEADER_BYTES, query_bytes, query_head_bytes
    from mcf.node.decode import decode_kv_id, decode_seq

    ql, sp, x, images = _pre()
    hd, h, rep = TINY.head_dim, TINY.hidden, TINY.heads // TINY.kv_heads
    for img in images:
        b = img.buf
        mem = bytearray(img.end)
        for a, raw in img.image.items():
            mem[a:a + len(raw)] = raw
        acts, counts = walk(lambda a, k, mem=mem: bytes(mem[a:a + k]), img.table,
                            img.table_len, JOB_ARG.const({"template": 0}).as_bits(),
                            SIM.gemm_limits)
        assert counts["bad_entries"] == counts["bad_gemm"] == counts["bad_index"] == 0
        nq = img.q_rows[1] - img.q_rows[0]
        assert [StripeJob.unpack(v, STRIPE_JOB) for _, g, v in acts if g == "w_job"] == \
            [b.wq, b.wk, b.wv]
        vec = [(v.op, v.n_beats) for v in (VEC_CFG.from_bits(v) for _, g, v in acts
                                           if g == "vec")]
        lb = SIM.vec_lanes
        assert vec == [(VectorOp.RMSNORM, h // lb), (VectorOp.REQUANT, h // lb),
                       (VectorOp.ROPE, nq // lb), (VectorOp.ROPE, hd // lb),
                       (VectorOp.ADD, hd // lb)] + [(VectorOp.REQUANT, hd // lb)] * rep
        wr = [(d.addr, d.length) for d in (DmaDesc.unpack(v) for _, g, v in acts
                                           if g == "wr_desc")]
        head = [b.qrec + QUERY_HEADER_BYTES + i * query_head_bytes(hd) for i in range(rep)]
        assert wr[-2 * rep:] == [w for a in head for w in ((a + 4, hd), (a, 4))]
        assert (b.kv, hd * 4) in wr and (b.kv + hd * 4, hd * 4) in wr
        assert img.emit_config().row_stride == 2 * hd * 4
    p = _tiny_plan()
    root = p.decode_owner(0)
    bcast = p.decode_routes()[0]
    slot = images[0].q_slot
    cfg = DecodeLandConfig(QBUF, 0x600, slot, TINY.heads, tag_base=p.encoder.decode_tag(0, 0))
    kv_id = decode_kv_id(p, 0, root, 0)
    for img in images:
        i = img.node
        recs = img.records(p, 0, QBUF)
        want = [RecordClass.JOB, RecordClass.SEND, RecordClass.EMIT] + \
            ([RecordClass.SEND] if i != root else []) + [RecordClass.WAIT] + \
            ([RecordClass.NOP] if i == root else [])
        assert [r.cls for r in recs] == want, i
        q = Meta.unpack(recs[1].meta)
        assert (q.op, q.collective, q.src, q.route_id, q.seq, q.length) == \
            (Op.QUERY, Collective.MULTICAST, i, bcast[i], 0, query_bytes(rep, hd))
        assert recs[1].src is PayloadSource.QBUF and recs[1].arg == img.query_record(i) - QBUF
        hdr = img.pre_writes(POS)[img.query_record(i)]
        assert decode_land_decision(cfg, q, hdr, hd) == \
            (DecodeLandResult.QUERY, QBUF + i * rep * slot)
        e = Meta.unpack(recs[2].meta)
        assert (e.op, e.kv_id, e.seq, e.dst) == (Op.KV_REPLICA, kv_id, decode_seq(p, 0, i), root)
        assert EmitArg.unpack(recs[2].arg) == EmitArg(0, 0, 1)
        assert recs[2].replicate == (i != root)
        if i != root:
            assert recs[3].src is PayloadSource.EMIT and recs[3].meta == recs[2].meta
            assert e.route_id == root
        w = next(r for r in recs if r.cls is RecordClass.WAIT)
        assert (w.arg, w.wait) == (SeqCounter.QUERIES_LANDED.value, 1)
        if i == root:
            assert (Meta.unpack(recs[-1].meta).kv_id, recs[-1].wait) == (kv_id, TINY.kv_heads)
    with pytest.raises(ValueError, match="above QBUF"):
        images[0].records(p, 0, images[0].end)


def test_pre_image_refuses_partial_groups():
    """A node whose query heads are not whole KV-head groups (tiny at N = 4: one head of a
    group of two) or whose K/V rows are not whole KV heads is refused in one line."""
    ql = _layer()
    with pytest.raises(ValueError, match="whole groups"):
        TPPreImage(ql, TINY, tp_split(TINY, 4), 1, SIM, base=0x10000)
    import dataclasses

    sp = dataclasses.replace(tp_split(TINY, 2), kv_rows=((0, 48), (48, 64)))
    with pytest.raises(ValueError, match="whole KV heads"):
        TPPreImage(ql, TINY, sp, 0, SIM, base=0x10000)
    img = TPPreImage(ql, TINY, tp_split(TINY, 2), 0, SIM, base=0x10000)
    with pytest.raises(ValueError, match="not node 0's"):
        img.query_record(1)


def test_the_tokens_mark_clears_every_decode_lander_counter():
    """A decode token's clearing MARK re-bases the four counters the decode lander moves —
    ``SUMS_LANDED`` too, so a TP token's cumulative WAIT thresholds count from the token's
    start — and leaves ``CONTROL`` and ``OTHER_RETIRED`` alone."""
    from mcf.node.decode import COUNTER_CLEAR

    want = {SeqCounter.RESULTS_LANDED, SeqCounter.QUERIES_LANDED, SeqCounter.MAXES_LANDED,
            SeqCounter.SUMS_LANDED}
    assert {c for c in SeqCounter if COUNTER_CLEAR >> c.value & 1} == want
    assert COUNTER_CLEAR >> len(SeqCounter) == 0



# ---- KV-parallel attention to the head owners (mcf.node.tp_decode) -------------------------------

ATT_S = 32                  # prompt: 2 nodes, one chunk of 32 tokens (two slices of 16)


def _tiny_plan(nodes: int = 2):
    from mcf.mars import ClusterSpec, make_topology, plan
    from mcf.mars.model import ModelSpec

    spec = ModelSpec("tiny", layers=2, q_heads=TINY.heads, kv_heads=TINY.kv_heads,
                     head_dim=TINY.head_dim, hidden=TINY.hidden, intermediate=TINY.intermediate)
    cl = ClusterSpec(nodes, 1 << 20, 1 << 20, make_topology("kr260-ring", nodes))
    return plan(spec, cl, ATT_S, 32, "mars", alpha=0.5)


@pytest.fixture(scope="module")
def attend_case():
    from mcf.golden.node_decode import golden_decode, prompt_blocks
    from mcf.golden.node_prefill import golden_prefill
    from mcf.node.decode import DecodeImage, decode_layout, reduction_parents
    from mcf.node.layer import slice_positions

    p = _tiny_plan()
    qls = [quantize_layer(random_layer(TINY, SEED + 10 * i), TINY) for i in range(2)]
    x = np.random.default_rng(SEED).standard_normal((ATT_S + 1, TINY.hidden)).astype(np.float32)
    slices = [slice_positions(p, 1, s) for s in range(2)]
    prefill = golden_prefill(x[:ATT_S], qls, TINY, slices)
    lay = decode_layout(p, SIM, base=0x1000)
    image = DecodeImage(TINY, qls, SIM, lay, tokens=slices[0][1])
    root = p.decode_owner(0)
    gold = golden_decode(to_act(x[ATT_S:ATT_S + 1])[0], qls, TINY, ATT_S, root,
                         reduction_parents(p, root), prompt_blocks(p, prefill))
    return dict(p=p, qls=qls, prefill=prefill, lay=lay, image=image, root=root, gold=gold,
                sp=tp_split(TINY, 2))


def test_owner_merge_is_replicated_decodes_bits(attend_case):
    """Each head's states merged on its TP owner's reduction tree give the root's merged state
    of replicated decode, byte for byte, and the owner's OBUF row its OBUF row (N = 2)."""
    from mcf.golden.node_tp import owner_merged, owner_rows

    c = attend_case
    assert {c["sp"].head_owner(h) for h in range(TINY.heads)} == {0, 1}
    for gl in c["gold"]:
        merged = owner_merged(gl.states, c["p"], c["sp"])
        assert merged == gl.merged
        rows = np.concatenate([np.frombuffer(r, dtype="<i4")
                               for r in owner_rows(merged, TINY.head_dim)])
        assert np.array_equal(rows, gl.att)


def test_attend_records_send_each_state_to_its_owner(attend_case):
    """Per node and layer: one ATTEND per KV head (after the query's WAIT off the root), one
    state SEND per query head to the head's owner on the owner's reduction tree, then the WAIT
    for the node's own heads' results (cumulative over layers); each node's engine entry for
    the other owner's tree (the owner's final, its unicast route as the result route)."""
    from mcf.abi.csrmap import node_regmap
    from mcf.abi.nic import reduce_config
    from mcf.node.tp_decode import attend_records, owner_reduce_entries

    c = attend_case
    p, image, sp, root = c["p"], c["image"], c["sp"], c["root"]
    _, reduce_, _ = p.decode_routes()
    assert reduce_[0] != reduce_[1]
    tag0 = p.encoder.decode_tag(0, 0)
    for node in range(2):
        prog = attend_records(p, 0, node, image, sp)
        recs = prog.compute
        assert sum(r.cls is RecordClass.ATTEND for r in recs) == 2 * TINY.kv_heads
        sends = [Meta.unpack(r.meta) for r in recs
                 if r.cls is RecordClass.SEND and r.src is PayloadSource.ATTN]
        assert len(sends) == 2 * TINY.heads
        for m in sends:
            o = sp.head_owner((m.kv_id - tag0) % (1 << 16))
            assert (m.op, m.src, m.dst, m.route_id) == (Op.PARTIAL_STATE, node, o, reduce_[o])
        results = [r.wait for r in recs if r.cls is RecordClass.WAIT
                   and r.arg == SeqCounter.RESULTS_LANDED.value]
        assert results == [2, 4]                      # its 2 heads, layers 0 and 1
        queries = [r for r in recs if r.cls is RecordClass.WAIT
                   and r.arg == SeqCounter.QUERIES_LANDED.value]
        assert len(queries) == (0 if node == root else 2 * TINY.kv_heads)
        other = 1 - root
        want = [e for e in owner_reduce_entries(p, sp) if e.node == node and e.route_id ==
                reduce_[other]]
        assert len(want) == 1 and want[0].final == (node == other)
        assert want[0].k == 1 + (node == other)       # the owner merges its own and the other's
        reg = node_regmap().register("REDUCE_CFG_WR")
        assert [w.value for w in prog.writes] == [reg.pack(route_id=reduce_[other],
                                                           config=reduce_config(
                                                               want[0].k, final=want[0].final,
                                                               result_route=want[0].result_route))]


def test_attend_records_execute_to_the_owner_rows_on_the_abi_models(attend_case):
    """Both nodes' attention records run through the ABI's golden models — every ATTEND
    (``attend_model``) over the prompt KV each node owns and the root's new token, each SEND's
    state merged in its owner's engine (own state first) and landed by the owner's decode lander
    (``DecodeLandModel``): every node's OBUF rows of its own heads are replicated decode's."""
    from mcf.abi.decode_land import DecodeLandConfig
    from mcf.abi.kv import kv_token_bytes
    from mcf.abi.meta import Stage
    from mcf.abi.softmax import state_words
    from mcf.golden.attend_unit import attend_model
    from mcf.golden.nic import softmax_payload_merge
    from mcf.node.decode import decode_kv_id, decode_seq, owned_blocks
    from mcf.node.layer import slice_positions
    from mcf.node.tp_decode import attend_records

    c = attend_case
    p, image, sp, root, lay, gold = c["p"], c["image"], c["sp"], c["root"], c["lay"], c["gold"]
    rec, hd, rep = kv_token_bytes(TINY.head_dim), TINY.head_dim, TINY.heads // TINY.kv_heads
    progs = {n: attend_records(p, 0, n, image, sp) for n in range(2)}
    mem = {n: bytearray(1 << 20) for n in range(2)}
    for n in range(2):
        for addr, raw in {**image.image, **progs[n].ddr}.items():
            mem[n][addr:addr + len(raw)] = raw
        for b, s in owned_blocks(p)[n]:
            p0, t = slice_positions(p, b, s)
            for layer in range(2):
                for g in range(TINY.kv_heads):
                    a = lay.kv.kv_base + p.encoder.kv_id(layer, b, s) * lay.kv.kv_slot + \
                        g * lay.kv_layout.head_stride
                    mem[n][a:a + t * rec] = c["prefill"][layer].kv[g][p0 * rec:(p0 + t) * rec]
        for layer in range(2):
            for g in range(TINY.kv_heads):                 # the gathered query records
                q = gold[layer].queries[g]
                a = image.query_record(layer, g) if n == root else image.qbuf_slot(layer, g)
                mem[n][a:a + len(q)] = q
    for layer in range(2):                                 # the new token's K/V at the root
        for g in range(TINY.kv_heads):
            a = lay.kv_address(decode_kv_id(p, layer, root, 0), decode_seq(p, 0, g))
            mem[root][a:a + rec] = gold[layer].kv[g]
    contrib: dict[tuple[int, int], dict[int, bytes]] = {}
    for n in range(2):
        staged = []
        for r in progs[n].compute:
            if r.cls is RecordClass.ATTEND:
                res = attend_model(r.arg, image.lists, lambda a, k, n=n: bytes(mem[n][a:a + k]),
                                   hd, SIM.attn_heads, SIM.attn_block, 64)
                assert res.bad is None
                staged += res.payloads
            elif r.cls is RecordClass.SEND and r.src is PayloadSource.ATTN:
                m = Meta.unpack(r.meta)
                contrib.setdefault((m.seq, m.kv_id), {})[n] = staged.pop(0)
        assert not staged
    dcfg = DecodeLandConfig(lay.qbuf_base, lay.obuf_base, lay.qbuf_slot, lay.q_heads, 0)
    lands = {n: DecodeLandModel(dcfg, hd) for n in range(2)}
    for layer in range(2):
        for h in range(TINY.heads):
            o = sp.head_owner(h)
            got = contrib[(layer, p.encoder.decode_tag(0, h))]
            final = softmax_payload_merge(got[o], got[1 - o])      # the owner's engine
            meta = Meta(stage=Stage.DECODE, op=Op.PARTIAL_STATE, collective=Collective.MULTICAST,
                        reduce_op=ReduceOp.NONE, src=o, dst=o, route_id=0,
                        kv_id=p.encoder.decode_tag(0, h), length=4 * state_words(hd), seq=layer)
            lands[o].land(meta, final)
        for n in range(2):
            h0, h1 = sp.heads[n]
            rows = np.concatenate([lands[n].row(layer, h) for h in range(h0, h1)])
            assert np.array_equal(rows, gold[layer].att[h0 * hd:h1 * hd]), (layer, n)
    assert rep == 2 and {sp.head_owner(h) for h in range(TINY.heads)} == {0, 1}


def test_attend_records_refuse_what_is_not_built(attend_case):
    """Two-phase images and more than two nodes are refused in one line (TPError)."""
    from mcf.golden.tp_decode import TPError
    from mcf.node.tp_decode import attend_records

    c = attend_case
    image = c["image"]
    saved = image.softmax
    try:
        image.softmax = "two_phase"
        with pytest.raises(TPError, match="single-pass"):
            attend_records(c["p"], 0, 0, image, c["sp"])
    finally:
        image.softmax = saved
    p4 = _tiny_plan(4)
    with pytest.raises(TPError, match="N = 2 only"):
        attend_records(p4, 0, 0, image, tp_split(TINY, 4))


def test_tp_decode_image_folds_every_layer(attend_case):
    """TPDecodeImage: per layer the pre half's template and the post half's nine in one table;
    one K/V row region (EMIT row = layer), one SUM window for every layer; the O step reads the
    node's OBUF rows of the layer's parity in place; per node and layer the records in order
    pre → attention → post with cumulative thresholds (queries, results, maxima, sums); the
    post half's all-reduces rooted at the node owning neither head 0 nor 1; the token's MARK."""
    from mcf.abi.decode_land import SUM_SLOT_BYTES
    from mcf.golden.tp_decode import TPError
    from mcf.node.decode import COUNTER_CLEAR
    from mcf.node.layout import REGION_ALIGN
    from mcf.node.tp_decode import TPDecodeImage

    c = attend_case
    p, dec, sp, root = c["p"], c["image"], c["sp"], c["root"]
    base = -(-(dec.layout.base + dec.size) // REGION_ALIGN) * REGION_ALIGN
    _, reduce_, _ = p.decode_routes()
    for node in range(2):
        t = TPDecodeImage(dec, sp, node, base)
        assert t.reduce_root() == 1 and t.head_template is None
        assert len(t.templates) == 20 and t.per_layer == 10
        regs = t.registers()
        assert regs["EMIT_ROW_STRIDE"] == t.row_stride == 2 * TINY.head_dim * 4
        assert regs["DEC_SUM_SLOTS"] == 2 and regs["SUM_BASE_LO"] == t.window
        for li, (pre, post) in enumerate(t.layers):
            assert pre.buf.kv == regs["EMIT_KV_BASE_LO"] + li * t.row_stride
            assert post.buf.window == t.window and post.o.buf.summed == t.window
            assert post.o.buf.x == dec.obuf_rows(li)               # K range 0.. of the group
            assert pre.buf.x == (t.x0 if li == 0 else t.layers[li - 1][1].buf.y)
            assert post.buf.x == pre.buf.x and post.parity == li & 1
        assert t.y == t.layers[-1][1].buf.y and t.window % SUM_SLOT_BYTES == 0
        prog = t.program(p, 0, np.zeros(TINY.hidden, dtype=np.int64))
        recs = prog.compute
        jobs = [JOB_ARG.from_bits(r.arg).template for r in recs if r.cls is RecordClass.JOB]
        assert jobs == list(range(20))
        waits = {}
        for r in recs:
            if r.cls is RecordClass.WAIT:
                waits.setdefault(SeqCounter(r.arg).name, []).append(r.wait)
        assert waits["QUERIES_LANDED"] == [1, 2] and waits["RESULTS_LANDED"] == [2, 4]
        assert waits["MAXES_LANDED"] == [1, 2, 3, 4] and waits["SUMS_LANDED"] == [1, 2, 3, 4]
        reduct = [Meta.unpack(r.meta) for r in recs if r.cls is RecordClass.SEND
                  and Meta.unpack(r.meta).op is Op.REDUCTION
                  and Meta.unpack(r.meta).collective is Collective.ALL_REDUCE]
        assert {(m.dst, m.route_id) for m in reduct} == {(1, reduce_[1])}
        assert recs[-1].cls is RecordClass.MARK and recs[-1].arg == COUNTER_CLEAR
        order = [r.cls for r in recs]
        first_attend = order.index(RecordClass.ATTEND)
        assert jobs and order.index(RecordClass.JOB) < first_attend
        assert any(w.reg == "JOBS_TABLE_LO" and w.value == t.table for w in prog.writes)
        assert t.x0 in prog.ddr and all(pre.buf.rq in prog.ddr for pre, _ in t.layers)
        assert (node == root) == any(r.cls is RecordClass.NOP for r in recs)
    with pytest.raises(TPError, match="2 nodes"):
        TPDecodeImage(dec, tp_split(TINY, 4), 0, base)

def test_tp_decode_image_runs_its_slice_of_the_lm_head():
    """On a HeadImage every node's TP image ends with its slice of the LM head: the vocabulary
    split in whole GEMM tiles (node 0 the first rows), its template RMSNORM of the last layer's
    output row with the final norm, REQUANT, then one GEMM per slice whose STRIPE job points at
    the node's own stripe image of its rows (in the TP image) and whose results tile exactly
    its rows of the logits; every node's program runs it (a JOB) before its MARK."""
    from mcf.abi.compute import DmaDesc
    from mcf.abi.node_config import AXI_WIDTH
    from mcf.cluster import RunSpec
    from mcf.cluster.setup import RunSetup
    from mcf.golden.tp_decode import vocab_split
    from mcf.node.head import slice_weight
    from mcf.quant import gemm_stripe_image

    s = RunSetup.prepare(RunSpec(decode="tp"))
    img = s.image(0x1000)
    h, vocab = img.cfg.hidden, img.vocab
    assert vocab_split(vocab, 2, SIM.gemm_rows) == ((0, vocab // 2), (vocab // 2, vocab))
    for node in range(2):
        t = s.tp_image(img, node)
        r0, r1 = t.vocab
        assert t.vocab == vocab_split(vocab, 2, SIM.gemm_rows)[node]
        mem = bytearray(t.end)
        for part in (img.image, t.image):
            for a, raw in part.items():
                mem[a:a + len(raw)] = raw

        def read(a, n, mem=mem):
            return bytes(mem[a:a + n])

        acts, counts = walk(read, t.table, t.table_len,
                            JOB_ARG.const({"template": t.head_template}).as_bits(),
                            SIM.gemm_limits)
        assert counts["bad_entries"] == counts["bad_gemm"] == counts["bad_index"] == 0
        vecs = [VEC_CFG.from_bits(v) for _, tgt, v in acts if tgt == "vec"]
        assert [v.op for v in vecs] == [VectorOp.RMSNORM, VectorOp.REQUANT]
        rd = [DmaDesc.unpack(v) for _, tgt, v in acts if tgt in ("rd_desc0", "rd_desc1")]
        assert {(d.addr, d.length) for d in rd[:2]} == {(t.y, h * 4), (img.head_gamma, h * 4)}
        stripes = [StripeJob.unpack(v, STRIPE_JOB) for _, tgt, v in acts if tgt == "w_job"]
        jobs = [GemmJob.unpack(v) for _, tgt, v in acts if tgt == "gemm_job"]
        assert len(stripes) == len(jobs) == 1 and jobs[0].n_tiles * SIM.gemm_rows == r1 - r0
        raw, want = gemm_stripe_image(slice_weight(s.quantized.lm_head, r0, r1), SIM.gemm_rows,
                                      SIM.gemm_lanes, ports=SIM.hp_ports,
                                      beat_bytes=AXI_WIDTH // 8)
        assert stripes[0].addr >= img.alloc.at and read(stripes[0].addr, len(raw)) == raw
        assert (stripes[0].length, stripes[0].pitch) == (want.length, want.pitch)
        covered = bytearray(vocab * 4)
        for _, tgt, v in acts:
            if tgt == "wr_desc" and DmaDesc.unpack(v).addr >= img.logits:
                d = DmaDesc.unpack(v)
                off = d.addr - img.logits
                assert not any(covered[off:off + d.length])
                covered[off:off + d.length] = b"\1" * d.length
        assert covered == bytes(r0 * 4) + b"\1" * ((r1 - r0) * 4) + bytes((vocab - r1) * 4)
        recs = t.program(s.plan, 0).compute
        assert recs[-1].cls is RecordClass.MARK and recs[-2].cls is RecordClass.JOB
        assert JOB_ARG.from_bits(recs[-2].arg).template == t.head_template


# ---- RTL: two node tops ------------------------------------------------------------------------

BENCH = "mcf.sim.benches.node_tp"


@pytest.fixture(scope="module")
def pair():
    from mcf.sim.cluster import build_cluster

    return build_cluster(2)          # the node_cluster / node_decode pair build, cached once


@pytest.mark.slow
@pytest.mark.parametrize("proj", ["o", "down"])
def test_two_nodes_run_the_row_parallel_step(pair, proj, tmp_path):
    """ABSMAX → MAX all-reduce over the NIC → REQUANT_EXT → GEMM ``acc_out`` → SUM all-reduce
    into the SUM slots → GEMM ``acc_in`` on two node tops from the rings: every node's absmax
    lanes, MBUF result, codes, scale, ``acc_out`` lanes, SUM result and output row ``y``
    bit-exact against ``golden_step`` (checked in the bench)."""
    from mcf.sim import run

    out = tmp_path / "tp.json"
    run(pair, BENCH, testcase="row_parallel", params={
        "nodes": 2, "seq_len": 32, "chunk": 32, "seed": SEED, "proj": proj, "pause": 0.1,
        "out": str(out)})
    got = json.loads(out.read_text())
    assert got["proj"] == proj and got["k_shard"] == 128 and got["n"] == TINY.hidden
    assert got["step_cycles"] > 0 and set(got["mark_cycles"]) == {"0", "1"}


@pytest.mark.slow
def test_two_nodes_run_the_tp_ffn(pair, tmp_path):
    """The TP FFN of one token on two node tops from the rings: GEMM gate and up on each node's
    intermediate rows, SILU_MUL into the down step's ACT row, then the row-parallel down step;
    every node's gate/up rows, SiLU shard, down-step buffers and output row bit-exact against
    ``golden_ffn`` (checked in the bench)."""
    from mcf.sim import run

    out = tmp_path / "ffn.json"
    run(pair, BENCH, testcase="tp_ffn", params={
        "nodes": 2, "seq_len": 32, "chunk": 32, "seed": SEED, "pause": 0.1, "out": str(out)})
    got = json.loads(out.read_text())
    assert got["inter"] == [[0, 128], [128, 256]] and got["n"] == TINY.hidden
    assert got["step_cycles"] > 0 and set(got["mark_cycles"]) == {"0", "1"}


@pytest.mark.slow
def test_two_nodes_run_the_tp_post_attention_half(pair, tmp_path):
    """The post-attention half of a TP layer on two node tops from the rings: the O step over
    each node's heads, ADD + RMSNORM + REQUANT into the FFN's input, the FFN, the final ADD;
    two MAX and two SUM all-reduces in one token. Every node's buffers and the output row
    bit-exact against ``golden_post`` (= ``tp_layer``'s output; checked in the bench)."""
    from mcf.sim import run

    out = tmp_path / "post.json"
    run(pair, BENCH, testcase="tp_post", params={
        "nodes": 2, "seq_len": 32, "chunk": 32, "seed": SEED, "pause": 0.1, "out": str(out)})
    got = json.loads(out.read_text())
    assert got["templates"] == 9 and got["sum_slots"] == 2 and got["n"] == TINY.hidden
    assert got["step_cycles"] > 0 and set(got["mark_cycles"]) == {"0", "1"}


@pytest.mark.slow
def test_two_nodes_run_the_tp_pre_attention_half(pair, tmp_path):
    """The pre-attention half of a TP layer on two node tops from the rings: RMSNORM + REQUANT
    of the whole row, GEMM Q/K/V on each node's rows, ROPE, the K/V row and the query records;
    the query records multicast into the other node's QBUF, the K/V pairs EMITted to the
    token's root. Every node's buffers, the QBUF slots it received and the root's landed K/V
    records of every KV head bit-exact against ``golden_pre`` (= replicated decode's query and
    K/V records; checked in the bench)."""
    from mcf.sim import run

    out = tmp_path / "pre.json"
    run(pair, BENCH, testcase="tp_pre", params={
        "nodes": 2, "seq_len": 32, "chunk": 32, "seed": SEED, "pause": 0.1, "out": str(out)})
    got = json.loads(out.read_text())
    assert got["heads"] == [[0, 2], [2, 4]] and got["kv_heads"] == [[0, 1], [1, 2]]
    assert got["step_cycles"] > 0 and set(got["mark_cycles"]) == {"0", "1"}


@pytest.mark.slow
def test_two_nodes_run_the_kv_parallel_attention_to_the_head_owners(pair, tmp_path):
    """A 32-token prompt through the prefill layer program on two node tops, then decode token
    0's first layer: the root's queries and K/V (replicated decode's JOB, multicast, EMIT), the
    ATTEND of every KV head on both nodes, each query head's states merged on its TP owner's
    reduction tree and normalised by the owner's decode lander: every node's OBUF rows of its
    own heads bit-exact (= replicated decode's), the other rows untouched (checked in the
    bench)."""
    from mcf.sim import run

    out = tmp_path / "attend.json"
    run(pair, BENCH, testcase="tp_attend", params={
        "nodes": 2, "seq_len": 32, "chunk": 32, "seed": SEED, "pause": 0.1, "out": str(out)})
    got = json.loads(out.read_text())
    assert got["heads"] == [[0, 2], [2, 4]] and got["results_landed"] == TINY.heads
    assert got["step_cycles"] > 0 and set(got["mark_cycles"]) == {"0", "1"}


@pytest.mark.slow
def test_two_nodes_run_a_whole_tp_decode_token(pair, tmp_path):
    """A 32-token prompt through the prefill layer program on two node tops, then every layer
    of decode token 0 tensor-parallel (mcf.node.tp_decode.TPDecodeImage): the pre half, the
    KV-parallel attention to the head owners, the post half, per layer. Every node's OBUF rows
    and every layer's output row bit-exact against tp_golden_decode (= replicated decode;
    checked in the bench)."""
    from mcf.sim import run

    out = tmp_path / "token.json"
    run(pair, BENCH, testcase="tp_token", params={
        "nodes": 2, "seq_len": 32, "chunk": 32, "seed": SEED, "pause": 0.1, "out": str(out)})
    got = json.loads(out.read_text())
    assert got["layers"] == 2 and got["reduce_root"] == 1 and got["templates"] == 20
    assert got["step_cycles"] > 0 and set(got["mark_cycles"]) == {"0", "1"}
