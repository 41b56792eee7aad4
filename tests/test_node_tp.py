"""The row-parallel step of tensor-parallel decode on the node (mcf.node.tp; issue #34 item 3):
the shards, the three templates as the walker's golden model issues them, the MAX all-reduce's
records, the SUM payload cut, and the step's golden (the engines' golden models over the
templates' buffers) equal to ``row_parallel`` and to the single-node GEMM of the whole K; the
RTL run of the part the node top can do (ABSMAX → MAX all-reduce → REQUANT_EXT → ``acc_out``)
on two node tops (sim/benches/node_tp.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mcf.abi.compute import GemmJob, StripeJob
from mcf.abi.decode_land import DecodeLandConfig, DecodeLandResult, decode_land_decision
from mcf.abi.framing import MAX_PAYLOAD
from mcf.abi.jobs import JOB_ARG, STRIPE_JOB, VEC_CFG, walk
from mcf.abi.meta import Collective, Meta, Op, ReduceOp
from mcf.abi.node import PayloadSource, RecordClass
from mcf.abi.node_config import SIM
from mcf.abi.quant import VectorOp, requantize
from mcf.abi.sequencer import SeqCounter
from mcf.abi.tp import ACC_LANES, acc_lanes
from mcf.golden import gemm as G
from mcf.golden.qwen_layer import QWEN25_1P5B, TINY, quantize_layer, random_layer
from mcf.golden.tp_decode import row_parallel, tp_split
from mcf.node.tp import (
    MAX_BYTES,
    RowParallelImage,
    golden_step,
    max_records,
    shard_weight,
    sum_payloads,
)
from mcf.quant import gemm_stripe_image, to_act

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
    # what the node top lacks: the decode lander drops a SUM result longer than an MBUF slot
    res = Meta(op=Op.REDUCTION, collective=Collective.MULTICAST, reduce_op=ReduceOp.NONE,
               kv_id=100, length=pays[0].meta.length)
    assert decode_land_decision(cfg, res, b"", TINY.head_dim)[0] is DecodeLandResult.DROP_LENGTH


# ---- RTL: two node tops ------------------------------------------------------------------------

BENCH = "mcf.sim.benches.node_tp"


@pytest.fixture(scope="module")
def pair():
    from mcf.sim.cluster import build_cluster

    return build_cluster(2)          # the node_cluster / node_decode pair build, cached once


@pytest.mark.slow
@pytest.mark.parametrize("proj", ["o", "down"])
def test_two_nodes_run_the_row_parallel_step_to_acc_out(pair, proj, tmp_path):
    """ABSMAX → MAX all-reduce over the NIC → REQUANT_EXT → GEMM ``acc_out`` on two node tops
    from the rings: every node's absmax lanes, MBUF result, codes, scale and ``acc_out`` lanes
    bit-exact against ``golden_step`` (checked in the bench)."""
    from mcf.sim import run

    out = tmp_path / "tp.json"
    run(pair, BENCH, testcase="row_parallel", params={
        "nodes": 2, "seq_len": 32, "chunk": 32, "seed": SEED, "proj": proj, "pause": 0.1,
        "out": str(out)})
    got = json.loads(out.read_text())
    assert got["proj"] == proj and got["k_shard"] == 128 and got["n"] == TINY.hidden
    assert got["step_cycles"] > 0 and set(got["mark_cycles"]) == {"0", "1"}
