"""cocotb bench: the row-parallel step of tensor-parallel decode on two node tops
(:class:`mcf.sim.cluster.ClusterTop`, ``sim`` configuration; issue #34 item 3), the whole step
of :mod:`mcf.node.tp`. Runs on the build of
:mod:`mcf.sim.benches.node_cluster` and reuses its host side (``_setup``, ``Host``).

``row_parallel`` — one tiny-model projection (``proj``: ``o`` or ``down``, random INT4 weights)
split over the two nodes by :func:`mcf.golden.tp_decode.tp_split`; each node holds its K-range
shard (:class:`mcf.node.tp.RowParallelImage`) and its shard of a random ACT row. From the COMPUTE
rings alone (:func:`mcf.node.tp.max_records`, :func:`mcf.node.tp.sum_records`, then a MARK):
ABSMAX → the two absmax lanes to the root's ``ReduceOp.MAX`` reduction (MARS's decode
reduction tree of token 0), landed in the root's MBUF slot and multicast by the root to the
other node → REQUANT_EXT → GEMM ``acc_out`` → the ``acc_out`` lanes to the root's
``ReduceOp.SUM`` reduction on the same route, landed in the root's SUM slots (the image's
``sum_registers``) and multicast by the root → GEMM ``acc_in``. Checked bit for bit on every
node against :func:`mcf.node.tp.golden_step`: the ABSMAX beat's lanes, the MAX result in MBUF,
the whole row's codes and scale word, the ``acc_out`` lanes, the SUM result, the output row
``y``; one maxima and one SUM landing per node; no fault counter moved.

Reports (``out``) ``mark_cycles`` per node and ``step_cycles`` (the later): from the root's
COMPUTE doorbell (the last one) to the node's MARK interrupt, the root's first (a node whose
MARK raised its interrupt before the root's is counted when the root's has).
"""

from __future__ import annotations

import json

import cocotb
import numpy as np

from mcf.abi.node import Cmd, Queue, RecordClass
from mcf.abi.node_config import NODE_CONFIGS
from mcf.cluster.checks import bad_counter_names, bad_counters
from mcf.golden.qwen_layer import TINY, quantize_layer, random_layer
from mcf.golden.tp_decode import tp_split
from mcf.node.decode import COUNTER_CLEAR, decode_writes
from mcf.node.layout import REGION_ALIGN
from mcf.node.tp import MAX_BYTES, RowParallelImage, golden_step, max_records, sum_records
from mcf.quant import to_act, token_scale_words
from mcf.sim.benches.cycles import cycle_counter
from mcf.sim.benches.node_cluster import _setup, tiny_model_spec, wait_irq
from mcf.sim.toolchain import bench_params


def _words(raw: bytes) -> np.ndarray:
    return np.frombuffer(raw, dtype="<i4").astype(np.int64)


@cocotb.test()
async def row_parallel(dut):
    params = bench_params()
    seed, proj = params.get("seed", 1), params.get("proj", "o")
    p, layout, hosts = await _setup(dut, params, tiny_model_spec(params.get("layers", 2)))
    n = len(hosts)
    qw = quantize_layer(random_layer(TINY, seed), TINY).qw[proj]
    sp = tp_split(TINY, n)
    ranges = [sp.q_rows(i) for i in range(n)] if proj == "o" else list(sp.inter)
    x = to_act(np.random.default_rng(seed).standard_normal(qw.q.shape[1]) * 3)
    shards = [x[a:b] for a, b in ranges]
    base = -(-(layout.base + layout.size) // REGION_ALIGN) * REGION_ALIGN
    images = [RowParallelImage(qw, k, NODE_CONFIGS[params.get("config", "sim")], base=base,
                               mbuf_base=layout.mbuf_base, q_heads=layout.q_heads)
              for k in ranges]
    gold = golden_step(images, shards)
    k = 0                                   # MARS's decode routes and reduction of token 0
    root = p.decode_owner(k)
    bcast, reduce_, _ = p.decode_routes()
    tag = p.encoder.decode_tag(k, 0)
    for h, img, s in zip(hosts, images, shards, strict=True):
        assert img.end <= len(h.mem)
        for addr, raw in {**img.image, **img.x_writes(s)}.items():
            h.mem[addr: addr + len(raw)] = raw
        await h.apply(decode_writes(p, k, h.i))
        await h.write("JOBS_TABLE_LO", img.table & 0xFFFF_FFFF)
        await h.write("JOBS_TABLE_HI", img.table >> 32)
        await h.write("JOBS_TABLE_LEN", img.table_len)
        for name, value in img.sum_registers().items():
            await h.write(name, value)
        args = (img, h.i, root, n, reduce_[root], bcast[root], layout.qbuf_base, tag)
        recs = max_records(*args) + sum_records(*args)
        h.put(Queue.COMPUTE, recs + [Cmd(RecordClass.MARK, Queue.COMPUTE, irq=True,
                                         arg=COUNTER_CLEAR)])
        h.put(Queue.NET, [Cmd(RecordClass.MARK, Queue.NET)])
    cycle = cycle_counter(dut.aclk, dut)
    limit = params.get("step_limit", 1_000_000)
    for h in hosts:
        await h.doorbell(Queue.NET)
    for h in sorted(hosts, key=lambda h: h.i == root):     # the root last
        await h.doorbell(Queue.COMPUTE)
    t0 = cycle[0]
    done = {}
    for h in sorted(hosts, key=lambda h: h.i != root):      # the root's MARK comes first
        await wait_irq(h, hosts, limit, "the step's MARK")
        done[h.i] = cycle[0] - t0
    for h in hosts:
        assert [await h.read(f"seq{q}_marks") for q in range(2)] == [1, 1]

    for h, img in zip(hosts, images, strict=True):
        b, kp, m = img.buf, img.shard.kp, qw.q.shape[0]
        i = h.i
        assert np.array_equal(_words(h.mem[b.mx: b.mx + MAX_BYTES]), gold.mx[i]), i
        assert np.array_equal(_words(h.mem[b.mslot: b.mslot + MAX_BYTES]), gold.reduced), i
        codes = np.frombuffer(h.mem[b.xq: b.xq + kp], dtype=np.int8).astype(np.int64)
        assert np.array_equal(codes, gold.xq[i]), i
        assert bytes(h.mem[b.xq + kp: b.xq + kp + 4]) == \
            token_scale_words(np.array([gold.x_m]), np.array([gold.x_e])), i
        got = _words(h.mem[b.lanes: b.lanes + 2 * m * 4])
        assert np.array_equal(got, gold.lanes[i]), (i, np.flatnonzero(got != gold.lanes[i])[:8])
        assert np.array_equal(_words(h.mem[b.summed: b.summed + 2 * m * 4]), gold.summed), i
        got = _words(h.mem[b.y: b.y + m * 4])
        assert np.array_equal(got, gold.y[i]), (i, np.flatnonzero(got != gold.y[i])[:8])
        assert await h.read("dec_maxes_landed") == 1           # the root's own, or its cast
        assert await h.read("dec_sums_landed") == img.sum_slots
        for q in range(2):
            assert await h.read(f"seq{q}_timeouts") == 0
        bad = bad_counters({nm: await h.read(nm) for nm in bad_counter_names(h.regmap)})
        assert not bad, f"node {i}: {bad}"
    out = params.get("out")
    if out:
        with open(out, "w") as f:
            json.dump({"nodes": n, "root": root, "proj": proj, "k_shard": images[0].shard.kp,
                       "n": int(qw.q.shape[0]), "mark_cycles": done,
                       "step_cycles": max(done.values())}, f)
