"""cocotb bench: the row-parallel step and the FFN of tensor-parallel decode on two node tops
(:class:`mcf.sim.cluster.ClusterTop`, ``sim`` configuration; issue #34 item 3): the whole step
of :mod:`mcf.node.tp` and of :mod:`mcf.node.tp_ffn`. Runs on the build of
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
node against :func:`mcf.golden.node_tp.golden_step`: the ABSMAX beat's lanes, the MAX result in
MBUF, the whole row's codes and scale word, the ``acc_out`` lanes, the SUM result, the output row
``y``; one maxima and one SUM landing per node; no fault counter moved.

``tp_ffn`` — the tiny model's whole FFN of one token (:mod:`mcf.node.tp_ffn`, random INT4
gate/up/down): each node holds its intermediate rows of W_gate / W_up and the down step's
K-range shard (:class:`mcf.node.tp_ffn.TPFFNImage`), the host writes the same random normed row's
INT8 codes and scale into every node. The column JOB (GEMM gate, GEMM up, SILU_MUL into the down
step's ACT row), then the row-parallel step as above. Checked on every node against
:func:`mcf.golden.node_tp.golden_ffn`: the gate and up rows, the ACT row (the SiLU shard at its
offset, zeros elsewhere), then every buffer of the down step as in ``row_parallel``.

``tp_post`` — the post-attention half of a tiny-model layer (:mod:`mcf.node.tp_layer`, random
INT4 weights): each node holds the O step's K-range shard (its query heads), its FFN shards and
the layer's γ2; the host writes the layer's input row into every node and each node's heads'
attention rows as :func:`mcf.golden.tp_decode.tp_layer` computes them (with random attention
rows standing in for the attention it is given). From the COMPUTE rings: the O step, ADD +
RMSNORM + REQUANT into the FFN's input, the FFN, the final ADD — two MAX and two SUM all-reduces
in one token (cumulative WAIT thresholds). Checked on every node against
:func:`mcf.golden.node_tp.golden_post` (itself checked equal to ``tp_layer``'s output row): every
buffer of the O step, ``h``, ``n2``, the FFN's input codes and scale word, every FFN buffer, the
output row ``y``; two maxima and ``2S`` SUM payloads landed per node.

``tp_pre`` — the pre-attention half of a tiny-model layer (:mod:`mcf.node.tp_pre`, random INT4
weights) for decode token 0: each node holds its pair-ordered rows of W_q (its query heads),
W_k and W_v (its KV heads) and γ1; the host writes the layer's input row, the RoPE words of the
token's position and the query records' headers into every node. The node layout is
:func:`mcf.node.decode.decode_layout`'s (decode blocks, their ``LAND_OFF`` entries), applied
with ``configure`` after ``_setup``; ``EMIT_KV_BASE`` / ``EMIT_ROW_STRIDE`` point at the image's
K/V row. From the COMPUTE rings (:meth:`mcf.node.tp_pre.TPPreImage.records`): the JOB (RMSNORM,
REQUANT, GEMM Q/K/V on the node's rows, ROPE, the K/V row, the query records), the query
records multicast into the other nodes' QBUF slots, the K/V pairs EMITted to the token's root
(the other node's teed and sent), the WAIT for the other nodes' queries, the root's barrier on
its decode block. Checked on every node against :func:`mcf.golden.node_tp.golden_pre` (itself
checked equal to replicated decode's query and K/V records, ``golden_decode``): ``n1``, the
codes and scale word, the Q/K/V GEMM rows, the post-RoPE Q, the K/V row, its own query records,
the other node's query record in its QBUF slot; at the root every KV head's INT4 record in its
decode block; the landing counters.

``tp_attend`` — the KV-parallel attention of decode token 0's first layer with each query
head's result at its TP owner (:mod:`mcf.node.tp_decode`; tiny model, random INT4 weights): a
32-token prompt through the prefill layer program (as :mod:`mcf.sim.benches.node_decode` runs
it), then the root's replicated-decode records of layer 0 up to its ATTEND (the JOB computing
the token's queries and K/V, the query multicast, the EMITs, the barrier) followed on every node
by :func:`mcf.node.tp_decode.attend_records` (ATTEND per KV head, each state SENT to its head's
owner on the owner's reduction tree, ``WAIT RESULTS_LANDED`` for its own heads). Checked on
every node: the OBUF rows of its own heads bit for bit against
:func:`mcf.golden.node_tp.owner_rows` (itself checked equal to replicated decode's OBUF rows,
``golden_decode``), the other heads' rows untouched, ``dec_results_landed`` = its heads,
``nic_reduce_rx_packets`` = every head's contributions through its engine; at the root the new
token's K/V records; no fault counter. The MARK cycles are polled (``POLL`` cycles' grain).

Reports (``out``) ``mark_cycles`` per node and ``step_cycles`` (the later): from the root's
COMPUTE doorbell (the last one) to the node's MARK interrupt, the root's first (a node whose
MARK raised its interrupt before the root's is counted when the root's has).
"""

from __future__ import annotations

import json

import cocotb
import numpy as np
from cocotb.triggers import ClockCycles

from mcf.abi.decode_land import obuf_row_bytes
from mcf.abi.node import Cmd, Queue, RecordClass
from mcf.abi.node_config import NODE_CONFIGS
from mcf.abi.quant import requantize
from mcf.abi.sequencer import SeqCounter
from mcf.cluster.checks import bad_counter_names, bad_counters
from mcf.golden.node_decode import golden_decode, prompt_blocks
from mcf.golden.node_tp import (
    golden_ffn,
    golden_post,
    golden_pre,
    golden_step,
    owner_merged,
    owner_rows,
)
from mcf.golden.qwen_layer import TINY, quantize_layer, random_layer
from mcf.golden.tp_decode import tp_golden_decode, tp_layer, tp_split
from mcf.node.decode import (
    COUNTER_CLEAR,
    decode_kv_id,
    decode_layout,
    decode_program,
    decode_seq,
    decode_writes,
    reduction_parents,
)
from mcf.node.layer import act_bytes
from mcf.node.layout import REGION_ALIGN
from mcf.node.program import configure
from mcf.node.tp import MAX_BYTES, RowParallelImage, max_records, sum_records
from mcf.node.tp_decode import TPDecodeImage, attend_records
from mcf.node.tp_ffn import TPFFNImage
from mcf.node.tp_layer import TPPostImage
from mcf.node.tp_pre import TPPreImage
from mcf.quant import to_act, token_scale_words
from mcf.sim.benches.cycles import cycle_counter
from mcf.sim.benches.node_cluster import (
    POLL,
    _setup,
    snapshot,
    tiny_model_spec,
    wait_irq,
)
from mcf.sim.benches.node_decode import prefilled
from mcf.sim.toolchain import bench_params


def _words(raw: bytes) -> np.ndarray:
    return np.frombuffer(raw, dtype="<i4").astype(np.int64)


async def _run_step(dut, params, p, layout, hosts, images, rows, writes, records) -> dict:
    """Writes node ``i``'s ``images[i].image`` and ``writes[i]``, MARS's decode registers of
    token 0, the template table of ``images[i]`` and the registers ``rows[i]`` names: the SUM
    window of a :class:`~mcf.node.tp.RowParallelImage` (its ``sum_registers``) or a ``{name:
    value}`` dict; queues ``records[i]`` and a MARK on COMPUTE, rings the NET doorbells, then
    the COMPUTE ones (the root's last). Returns the cycles from the root's doorbell to each
    node's MARK interrupt."""
    root = p.decode_owner(0)
    for h, img, row, w, recs in zip(hosts, images, rows, writes, records, strict=True):
        assert img.end <= len(h.mem)
        for addr, raw in {**img.image, **w}.items():
            h.mem[addr: addr + len(raw)] = raw
        await h.apply(decode_writes(p, 0, h.i))
        await h.write("JOBS_TABLE_LO", img.table & 0xFFFF_FFFF)
        await h.write("JOBS_TABLE_HI", img.table >> 32)
        await h.write("JOBS_TABLE_LEN", img.table_len)
        regs = row if isinstance(row, dict) else row.sum_registers()
        for name, value in regs.items():
            await h.write(name, value)
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
    return done


def _args(p, layout, h, n):
    """The all-reduces' arguments of node ``h`` (MARS's decode routes and reduction of token
    0) for :func:`mcf.node.tp.max_records` / :func:`~mcf.node.tp.sum_records` after the image."""
    root = p.decode_owner(0)
    bcast, reduce_, _ = p.decode_routes()
    return (h.i, root, n, reduce_[root], bcast[root], layout.qbuf_base, p.encoder.decode_tag(0, 0))


async def _check_row(h, img: RowParallelImage, gold, maxes: int = 1, sums: int | None = None):
    """Node ``h``'s buffers of the row-parallel step against :func:`mcf.golden.node_tp.golden_step`
    (``gold``), its landing counters (``maxes`` maxima and ``sums`` SUM payloads, default the
    step's own), no timeout, no fault counter."""
    b, kp, m, i = img.buf, img.shard.kp, img.qw.q.shape[0], h.i
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
    assert await h.read("dec_maxes_landed") == maxes       # the root's own, or its cast
    assert await h.read("dec_sums_landed") == (img.sum_slots if sums is None else sums)
    for q in range(2):
        assert await h.read(f"seq{q}_timeouts") == 0
    bad = bad_counters({nm: await h.read(nm) for nm in bad_counter_names(h.regmap)})
    assert not bad, f"node {i}: {bad}"


def _report(params, done, **fields) -> None:
    out = params.get("out")
    if out:
        with open(out, "w") as f:
            json.dump({**fields, "mark_cycles": done, "step_cycles": max(done.values())}, f)


def _base(layout) -> int:
    return -(-(layout.base + layout.size) // REGION_ALIGN) * REGION_ALIGN


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
    images = [RowParallelImage(qw, k, NODE_CONFIGS[params.get("config", "sim")], base=_base(layout),
                               mbuf_base=layout.mbuf_base, q_heads=layout.q_heads)
              for k in ranges]
    gold = golden_step(images, shards)
    records = [max_records(img, *_args(p, layout, h, n)) + sum_records(img, *_args(p, layout, h, n))
               for h, img in zip(hosts, images, strict=True)]
    done = await _run_step(dut, params, p, layout, hosts, images, images,
                           [img.x_writes(s) for img, s in zip(images, shards, strict=True)],
                           records)
    for h, img in zip(hosts, images, strict=True):
        await _check_row(h, img, gold)
    _report(params, done, nodes=n, root=p.decode_owner(0), proj=proj,
            k_shard=images[0].shard.kp, n=int(qw.q.shape[0]))


async def _check_ffn(h, img: TPFFNImage, gold, maxes: int = 1, sums: int | None = None):
    """Node ``h``'s FFN buffers against :func:`mcf.golden.node_tp.golden_ffn` (``gold``): gate and
    up rows, the down step's ACT row (the SiLU shard at its offset, zeros elsewhere), then the
    down step's (:func:`_check_row`, ``maxes`` / ``sums`` its counters)."""
    b, ni, i = img.buf, img.r[1] - img.r[0], h.i
    assert np.array_equal(_words(h.mem[b.g: b.g + ni * 4]), gold.g[i]), i
    assert np.array_equal(_words(h.mem[b.u: b.u + ni * 4]), gold.u[i]), i
    row = _words(h.mem[img.row.buf.x: img.row.buf.x + img.row.shard.kp * 4])
    want = np.zeros_like(row)
    want[img.row.shard.lo: img.row.shard.hi] = gold.s[i]
    assert np.array_equal(row, want), i                 # the shard at lo, zeros elsewhere
    await _check_row(h, img.row, gold.step, maxes, sums)


@cocotb.test()
async def tp_ffn(dut):
    params = bench_params()
    seed = params.get("seed", 1)
    p, layout, hosts = await _setup(dut, params, tiny_model_spec(params.get("layers", 2)))
    n = len(hosts)
    ql = quantize_layer(random_layer(TINY, seed), TINY)
    sp = tp_split(TINY, n)
    x = to_act(np.random.default_rng(seed).standard_normal((1, TINY.hidden)) * 3)
    xq, xm, xe = requantize(x)
    images = [TPFFNImage(ql.qw["gate"], ql.qw["up"], ql.qw["down"], r,
                         NODE_CONFIGS[params.get("config", "sim")], base=_base(layout),
                         mbuf_base=layout.mbuf_base, q_heads=layout.q_heads) for r in sp.inter]
    gold = golden_ffn(images, xq, xm, xe)
    done = await _run_step(dut, params, p, layout, hosts, images, [img.row for img in images],
                           [img.x_writes(xq, xm, xe) for img in images],
                           [img.records(*_args(p, layout, h, n))
                            for h, img in zip(hosts, images, strict=True)])
    for h, img in zip(hosts, images, strict=True):
        await _check_ffn(h, img, gold)
    _report(params, done, nodes=n, root=p.decode_owner(0), inter=[list(r) for r in sp.inter],
            k_shard=images[0].row.shard.kp, n=TINY.hidden)


@cocotb.test()
async def tp_post(dut):
    params = bench_params()
    seed = params.get("seed", 1)
    p, layout, hosts = await _setup(dut, params, tiny_model_spec(params.get("layers", 2)))
    n = len(hosts)
    ql = quantize_layer(random_layer(TINY, seed), TINY)
    sp = tp_split(TINY, n)
    rng = np.random.default_rng(seed)
    x = to_act(rng.standard_normal(TINY.hidden) * 3)
    rows = to_act(rng.standard_normal((1, TINY.heads * TINY.head_dim)) * 2)
    y, att, _, _ = tp_layer(x, ql, TINY, 0, sp, lambda q, k, v, pos: rows)
    images = [TPPostImage(ql, TINY, sp, h.i, NODE_CONFIGS[params.get("config", "sim")],
                          base=_base(layout), mbuf_base=layout.mbuf_base, q_heads=layout.q_heads)
              for h in hosts]
    gold = golden_post(images, x, att)
    assert all(np.array_equal(g, y[0]) for g in gold.y)      # = tp_layer's output row
    root = p.decode_owner(0)
    done = await _run_step(dut, params, p, layout, hosts, images, images,
                           [{**img.x_writes(x), **img.att_writes(att)} for img in images],
                           [img.records(root, *_args(p, layout, h, n)[3:])
                            for h, img in zip(hosts, images, strict=True)])
    hid, s2 = TINY.hidden, 2 * images[0].sum_step
    for h, img in zip(hosts, images, strict=True):
        b, i = img.buf, h.i
        await _check_row(h, img.o, gold.o, 2, s2)
        for name, want in (("h", gold.h[i]), ("n2", gold.n2[i]), ("y", gold.y[i])):
            at = getattr(b, name)
            assert np.array_equal(_words(h.mem[at: at + hid * 4]), want), (i, name)
        xq = img.ffn.buf.xq
        assert np.array_equal(np.frombuffer(h.mem[xq: xq + hid], dtype=np.int8), gold.xq), i
        assert bytes(h.mem[xq + hid: xq + hid + 4]) == \
            token_scale_words(np.array([gold.xm]), np.array([gold.xe])), i
        await _check_ffn(h, img.ffn, gold.ffn, 2, s2)
    _report(params, done, nodes=n, root=root, templates=len(images[0].templates),
            sum_slots=s2, n=hid)


@cocotb.test()
async def tp_pre(dut):
    params = bench_params()
    seed = params.get("seed", 1)
    cfg = NODE_CONFIGS[params.get("config", "sim")]
    p, layout, hosts = await _setup(dut, params, tiny_model_spec(params.get("layers", 2)))
    lay = decode_layout(p, cfg, layout.base, layout.cmd_log2)
    assert lay.cmd_base == layout.cmd_base
    for h in hosts:                       # the decode layout: decode blocks, QBUF moved
        h.layout = lay
        await h.apply(configure(p, lay, h.i, seq_timeout=params.get("timeout", 0)))
    n = len(hosts)
    ql = quantize_layer(random_layer(TINY, seed), TINY)
    sp = tp_split(TINY, n)
    x = to_act(np.random.default_rng(seed).standard_normal(TINY.hidden) * 3)
    position = p.num_chunks * p.chunk                       # decode token 0
    images = [TPPreImage(ql, TINY, sp, h.i, cfg, base=_base(lay)) for h in hosts]
    gold = golden_pre(images, x, position)
    root = p.decode_owner(0)
    regs = [{"EMIT_KV_BASE_LO": img.emit_config().kv_base & 0xFFFF_FFFF,
             "EMIT_KV_BASE_HI": img.emit_config().kv_base >> 32,
             "EMIT_ROW_STRIDE": img.emit_config().row_stride} for img in images]
    done = await _run_step(dut, params, p, lay, hosts, images, regs,
                           [img.pre_writes(position, x) for img in images],
                           [img.records(p, 0, lay.qbuf_base) for img in images])
    hd, hid = TINY.head_dim, TINY.hidden
    rep = TINY.heads // TINY.kv_heads
    for h, img in zip(hosts, images, strict=True):
        b, i = img.buf, h.i
        assert np.array_equal(_words(h.mem[b.n1: b.n1 + hid * 4]), gold.n1), i
        assert np.array_equal(np.frombuffer(h.mem[b.xq: b.xq + hid], dtype=np.int8), gold.xq), i
        assert bytes(h.mem[b.xq + hid: b.xq + hid + 4]) == \
            token_scale_words(np.array([gold.xm]), np.array([gold.xe])), i
        for name, want in (("q", gold.q[i]), ("k", gold.k[i]), ("v", gold.v[i]),
                           ("qr", gold.qr[i]), ("kv", gold.kv[i])):
            at = getattr(b, name)
            got = _words(h.mem[at: at + want.size * 4])
            assert np.array_equal(got, want), (i, name, np.flatnonzero(got != want)[:8])
        for g in range(TINY.kv_heads):
            want = gold.queries[g]
            if img.kv_heads[0] <= g < img.kv_heads[1]:
                at = img.query_record(g)                     # its own record
            else:                                            # the owner's, landed in QBUF
                at = lay.qbuf_base + ((img.layer & 1) * lay.q_heads + g * rep) * lay.qbuf_slot
            assert bytes(h.mem[at: at + len(want)]) == want, (i, g)
        others = TINY.kv_heads - (img.kv_heads[1] - img.kv_heads[0])
        assert await h.read("dec_queries_landed") == others, i
        mine = img.kv_heads[1] - img.kv_heads[0]
        assert await h.read("emit_records") == mine and await h.read("emit_local") == mine, i
        assert await h.read("land_packets") == (TINY.kv_heads if i == root else mine), i
        for q in range(2):
            assert await h.read(f"seq{q}_timeouts") == 0
        bad = bad_counters({nm: await h.read(nm) for nm in bad_counter_names(h.regmap)})
        assert not bad, f"node {i}: {bad}"
    kv_id = decode_kv_id(p, 0, root, 0)
    for g in range(TINY.kv_heads):                 # the token's K/V at its root, every KV head
        a = lay.kv_address(kv_id, decode_seq(p, 0, g))
        assert bytes(hosts[root].mem[a: a + len(gold.kv_records[g])]) == gold.kv_records[g], g
    _report(params, done, nodes=n, root=root, position=position, hd=hd,
            heads=[list(img.heads) for img in images],
            kv_heads=[list(img.kv_heads) for img in images])


async def _run_token(dut, hosts, p, root, cycle, limit) -> dict:
    """Rings the NET doorbells and the COMPUTE ones (the root's last) of the queued token and
    waits for every node's next MARK on both queues (polled); returns the cycles from the root's
    COMPUTE doorbell to each node's MARK."""
    for h in sorted(hosts, key=lambda h: h.i == root):      # the root's COMPUTE doorbell last
        await h.doorbell(Queue.NET)
        if h.i != root:
            await h.doorbell(Queue.COMPUTE)
    t0 = cycle[0]
    await hosts[root].doorbell(Queue.COMPUTE)
    done = {}
    marks = len(p.steps) + 1
    for h in sorted(hosts, key=lambda h: h.i != root):
        while await h.read("seq1_marks") < marks:
            assert cycle[0] - t0 < limit, f"node {h.i}: no MARK; {await snapshot(hosts)}"
            await ClockCycles(dut.aclk, POLL)
        done[h.i] = cycle[0] - t0
        assert [await h.read(f"seq{q}_marks") for q in range(2)] == [marks] * 2
    return done


async def _no_faults(h) -> None:
    for q in range(2):
        assert await h.read(f"seq{q}_timeouts") == 0
    bad = bad_counters({nm: await h.read(nm) for nm in bad_counter_names(h.regmap)})
    assert not bad, f"node {h.i}: {bad}"


@cocotb.test()
async def tp_attend(dut):
    """The KV-parallel attention of decode token 0's first layer with each query head's result
    at its TP owner (module docstring, ``tp_attend``)."""
    params = bench_params()
    p, lay, hosts, image, qls, x, prefill, cycle, limit, _ = await prefilled(dut, params)
    n = len(hosts)
    sp = tp_split(TINY, n)
    S = p.num_chunks * p.chunk

    # ---- decode token 0, layer 0: the root's queries and K/V, then the TP attention ----------
    root = p.decode_owner(0)
    xa = to_act(x[S:S + 1])[0]
    gold = golden_decode(xa, qls, TINY, S, root, reduction_parents(p, root),
                         prompt_blocks(p, prefill))[0]
    merged = owner_merged(gold.states, p, sp)
    rows = owner_rows(merged, TINY.head_dim)
    att = np.concatenate([_words(r) for r in rows])
    assert np.array_equal(att, gold.att)                   # = replicated decode's OBUF rows
    rb = obuf_row_bytes(TINY.head_dim)
    obuf = image.obuf_rows(0)
    before = {h.i: bytes(h.mem[obuf: obuf + TINY.heads * rb]) for h in hosts}
    for h in hosts:
        prog = decode_program(p, 0, h.i, image)
        cut = next(i for i, r in enumerate(prog.compute) if r.cls is RecordClass.ATTEND or (
            r.cls is RecordClass.WAIT and r.arg == SeqCounter.QUERIES_LANDED.value))
        tp = attend_records(p, 0, h.i, image, sp, layers=[0])
        await h.apply(prog.writes + tp.writes)
        for addr, raw in {**prog.ddr, **tp.ddr}.items():
            h.mem[addr: addr + len(raw)] = raw
        if h.i == root:
            h.mem[image.dx0: image.dx0 + len(xa) * 4] = act_bytes(np.reshape(xa, (1, -1)))
        h.put(Queue.COMPUTE, prog.compute[:cut] + tp.compute + [
            Cmd(RecordClass.MARK, Queue.COMPUTE, irq=True, arg=COUNTER_CLEAR)])
        h.put(Queue.NET, prog.net)
    done = await _run_token(dut, hosts, p, root, cycle, limit)
    _, reduce_, _ = p.decode_routes()
    for h in hosts:
        i = h.i
        h0, h1 = sp.heads[i]
        got = bytes(h.mem[obuf: obuf + TINY.heads * rb])
        for hq in range(TINY.heads):
            want = rows[hq] if h0 <= hq < h1 else before[i][hq * rb:(hq + 1) * rb]
            assert got[hq * rb:(hq + 1) * rb] == want, (i, hq)   # own heads; others untouched
        assert await h.read("dec_results_landed") == h1 - h0, i
        contrib = sum(1 + sum(par == i for par in reduction_parents(p, sp.head_owner(hq))
                              .values()) for hq in range(TINY.heads))
        assert await h.read("nic_reduce_rx_packets") == contrib, i
        await _no_faults(h)
    for g in range(TINY.kv_heads):                 # the token's K/V at its root, every KV head
        a = lay.kv_address(decode_kv_id(p, 0, root, 0), decode_seq(p, 0, g))
        assert bytes(hosts[root].mem[a: a + len(gold.kv[g])]) == gold.kv[g], g
    _report(params, done, nodes=n, root=root, heads=[list(r) for r in sp.heads],
            routes=[reduce_[o] for o in range(n)], results_landed=TINY.heads)


@cocotb.test()
async def tp_token(dut):
    """Every layer of decode token 0 tensor-parallel on two node tops (module docstring,
    ``tp_token``)."""
    params = bench_params()
    p, lay, hosts, image, qls, x, prefill, cycle, limit, _ = await prefilled(dut, params)
    n = len(hosts)
    sp = tp_split(TINY, n)
    S, L = p.num_chunks * p.chunk, len(qls)
    root = p.decode_owner(0)
    xa = to_act(x[S:S + 1])[0]
    parents = reduction_parents(p, root)
    blocks = prompt_blocks(p, prefill)
    gold = tp_golden_decode(xa, qls, TINY, S, root, parents, blocks, sp)
    rep = golden_decode(xa, qls, TINY, S, root, parents, blocks)
    for g, r in zip(gold, rep, strict=True):                  # TP = the replicated root
        assert np.array_equal(g.y, r.y) and np.array_equal(g.att, r.att) and g.kv == r.kv
    base = _base(lay)
    tps = [TPDecodeImage(image, sp, h.i, base) for h in hosts]
    rb = obuf_row_bytes(TINY.head_dim)
    for h, tpi in zip(hosts, tps, strict=True):
        assert tpi.end <= len(h.mem)
        prog = tpi.program(p, 0, xa)
        for addr, raw in {**tpi.image, **prog.ddr}.items():
            h.mem[addr: addr + len(raw)] = raw
        for li in range(L):          # the O step's padded rows: the other heads' rows are zero
            a0 = image.obuf_rows(li)
            assert not any(h.mem[a0: a0 + TINY.heads * rb]), (h.i, li)
        await h.apply(prog.writes)
        h.put(Queue.COMPUTE, prog.compute)
        h.put(Queue.NET, prog.net)
    done = await _run_token(dut, hosts, p, root, cycle, limit)
    hd, hid = TINY.head_dim, TINY.hidden
    S2 = 2 * tps[0].layers[0][1].sum_step
    for h, tpi in zip(hosts, tps, strict=True):
        i = h.i
        h0, h1 = sp.heads[i]
        for li, (_, post) in enumerate(tpi.layers):
            a0 = image.obuf_rows(li)
            got = _words(h.mem[a0: a0 + TINY.heads * rb])
            want = np.zeros_like(got)
            want[h0 * hd:h1 * hd] = gold[li].att[h0 * hd:h1 * hd]
            assert np.array_equal(got, want), (i, li, "OBUF")     # its heads; the others zero
            y = _words(h.mem[post.buf.y: post.buf.y + hid * 4])
            assert np.array_equal(y, gold[li].y), (i, li, np.flatnonzero(y != gold[li].y)[:8])
        assert await h.read("dec_results_landed") == (h1 - h0) * L, i
        assert await h.read("dec_queries_landed") == \
            (TINY.kv_heads - (tpi.layers[0][0].kv_heads[1] - tpi.layers[0][0].kv_heads[0])) * L, i
        assert await h.read("dec_maxes_landed") == 2 * L, i
        assert await h.read("dec_sums_landed") == S2 * L, i
        await _no_faults(h)
    for li in range(L):                            # the token's K/V at its root, every KV head
        for g in range(TINY.kv_heads):
            a = lay.kv_address(decode_kv_id(p, li, root, 0), decode_seq(p, 0, g))
            assert bytes(hosts[root].mem[a: a + len(gold[li].kv[g])]) == gold[li].kv[g], (li, g)
    _report(params, done, nodes=n, root=root, layers=L, reduce_root=tps[0].reduce_root(),
            templates=len(tps[0].templates), sum_slots=S2)
