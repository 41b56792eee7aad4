"""cocotb bench: one decode step on two node tops (:class:`mcf.sim.cluster.ClusterTop`, ``sim``
configuration; issue #11 "then one decode step: the root's merged state bit-exact", docs/node.md
§7). Runs on the build of :mod:`mcf.sim.benches.node_cluster` and reuses its host side
(:class:`~mcf.sim.benches.node_cluster.Host`, ``_setup``, ``run_layer_step``, ``snapshot``).

``decode`` — the tiny model (``TINY`` geometry, random INT4 weights): the prefill layer program
of a short prompt in MARS's steps (as the ``layer`` testcase runs it), then ONE decode token
from the rings alone (:func:`mcf.node.decode.decode_program`): the root's one-token JOBs, the
query multicast, ATTEND DECODE on both nodes over the KV each owns (the root's list ends with
the new token, EMITted into its decode block), the states merged by the reduction engines
along MARS's tree, the root's final state normalised into OBUF by its decode lander, the
root's O-projection/MLP JOB. Checked bit for bit against
:func:`mcf.golden.node_decode.golden_decode`: the root's OBUF rows and output row of every
layer, the new token's INT4 KV; the decode counters (queries and results landed, states
reduced); no drop, bad record, error or timeout counter moved on any node. Reports
``decode_step_cycles``: from the root's COMPUTE doorbell to its last MARK's interrupt (``out``).

The node's layout is :func:`mcf.node.decode.decode_layout` (decode blocks in the KV region):
``_setup`` configures :class:`~mcf.node.layout.NodeLayout.for_plan`'s, so the bench applies
``configure`` again with the decode layout before the first doorbell.
"""

from __future__ import annotations

import json

import cocotb
import numpy as np
from cocotb.triggers import ClockCycles

from mcf.abi.node import Queue
from mcf.cluster.checks import bad_counter_names, bad_counters, check_decode_root, check_owned_kv
from mcf.golden.node_decode import golden_decode, prompt_blocks
from mcf.golden.node_prefill import golden_prefill
from mcf.golden.qwen_layer import TINY, quantize_layer, random_layer
from mcf.node.decode import (
    DecodeImage,
    decode_layout,
    decode_program,
    decode_slot,
    reduction_parents,
)
from mcf.node.layer import act_bytes, slice_positions
from mcf.node.program import configure
from mcf.quant import to_act
from mcf.sim.benches.cycles import cycle_counter
from mcf.sim.benches.node_cluster import (
    POLL,
    _setup,
    run_layer_step,
    snapshot,
    tiny_model_spec,
    wait_irq,
)
from mcf.sim.toolchain import bench_params


async def _bad_counters(h) -> dict[str, int]:
    """Node ``h``'s non-zero fault counters (:func:`mcf.cluster.checks.bad_counters`)."""
    return bad_counters({n: await h.read(n) for n in bad_counter_names(h.regmap)})


async def program_decode_token(h, p, k: int, image: DecodeImage, xa) -> None:
    """Node ``h``'s records of decode token ``k`` (:func:`mcf.node.decode.decode_program`): its
    register and DDR writes, at the root the input row ``xa`` (ACT codes), both rings (no
    doorbell); no MARK interrupt may be pending."""
    prog = decode_program(p, k, h.i, image)
    assert prog.root == p.decode_owner(k)
    await h.apply(prog.writes)
    for addr, raw in prog.ddr.items():
        h.mem[addr: addr + len(raw)] = raw
    if h.i == prog.root:
        h.mem[image.dx0: image.dx0 + len(xa) * 4] = act_bytes(np.reshape(xa, (1, -1)))
    h.put(Queue.NET, prog.net)
    h.put(Queue.COMPUTE, prog.compute)
    assert not h.regmap.register("IRQ_STATUS").unpack(await h.read("IRQ_STATUS"))["mark1"]


async def run_decode_token(dut, hosts, p, k: int, image: DecodeImage, xa, cycle: list[int],
                           limit: int, marks: int) -> int:
    """Decode token ``k`` on every node from the rings (:func:`mcf.node.decode.decode_program`):
    the token's DDR and register writes, the root's input row ``xa`` (ACT codes), both rings;
    the holders' doorbells first, the root's COMPUTE doorbell last. Waits for the root's MARK
    interrupt and every node's ``marks + 1``-th MARK on both queues; no interrupt cause but a
    MARK. Returns the cycles from the root's COMPUTE doorbell to its MARK."""
    root = p.decode_owner(k)
    for h in hosts:
        await program_decode_token(h, p, k, image, xa)
    hr = hosts[root]
    for h in sorted(hosts, key=lambda h: h.i == root):      # holders first, the root last
        await h.doorbell(Queue.NET)
        if h is not hr:
            await h.doorbell(Queue.COMPUTE)
    t0 = cycle[0]
    await hr.doorbell(Queue.COMPUTE)
    await wait_irq(hr, hosts, limit, f"MARK of decode token {k} (its root)")
    cycles = cycle[0] - t0
    for h in hosts:
        while await h.read("seq1_marks") < marks + 1:
            assert cycle[0] - t0 < limit, (f"node {h.i}: MARK of decode token {k} missing; "
                                           f"counters {await snapshot(hosts)}")
            await ClockCycles(dut.aclk, POLL)
        assert [await h.read(f"seq{q}_marks") for q in range(2)] == [marks + 1] * 2
        status = await h.read("IRQ_STATUS")
        fields = h.regmap.register("IRQ_STATUS").unpack(status)
        assert not {f: v for f, v in fields.items() if v and not f.startswith("mark")}, fields
        await h.write("IRQ_STATUS", status)            # RW1C: the token's MARKs seen
    return cycles


async def check_decode_token(hosts, p, image: DecodeImage, gold, k: int) -> None:
    """Decode token ``k`` bit for bit against ``gold`` at its root (:func:`check_decode_root`);
    no drop, bad record, error or timeout counter on any node."""
    root, _ = decode_slot(p, k)
    check_decode_root(hosts[root].mem, root, p, image, gold, k)
    for h in hosts:
        assert await h.read("seq0_timeouts") == await h.read("seq1_timeouts") == 0
        bad = await _bad_counters(h)
        assert not bad, f"token {k} node {h.i}: {bad}"


async def prefilled(dut, params):
    """The tiny model (random INT4 weights) on the decode layout, its prompt run through the
    prefill layer program in MARS's steps, each node's owned KV checked. Returns
    ``(p, lay, hosts, image, qls, x, prefill, cycle, limit, prefill_cycles)``; ``x``: the
    prompt's rows and decode token 0's (also the start of :mod:`mcf.sim.benches.node_tp`'s
    decode benches)."""
    seed = params.get("seed", 1)
    spec = tiny_model_spec(params.get("layers", 2))
    qls = [quantize_layer(random_layer(TINY, seed + 10 * i), TINY) for i in range(spec.layers)]
    made = {}

    def model_of(p, layout, cfg):
        made["layout"] = decode_layout(p, cfg, layout.base, layout.cmd_log2)
        assert made["layout"].cmd_base == layout.cmd_base
        return DecodeImage(TINY, qls, cfg, made["layout"], tokens=slice_positions(p, 1, 0)[1])

    p, _, hosts, image = await _setup(dut, params, spec, model_of)
    lay = made["layout"]
    for h in hosts:                       # the decode layout: decode blocks, QBUF/OBUF moved
        h.layout = lay
        await h.apply(configure(p, lay, h.i, seq_timeout=params.get("timeout", 0),
                                model=image))
    n = len(hosts)
    S = p.num_chunks * p.chunk
    x = np.random.default_rng(seed).standard_normal((S + 1, TINY.hidden)).astype(np.float32)
    slices = [slice_positions(p, b, s) for b in range(1, p.num_chunks + 1) for s in range(n)]
    prefill = golden_prefill(x[:S], qls, TINY, slices)
    cycle = cycle_counter(dut.aclk, dut)
    limit = params.get("step_limit", 3_000_000)
    expect_packets = [0] * n
    prefill_cycles = [await run_layer_step(dut, hosts, p, step, image, to_act(x[:S]),
                                           expect_packets, cycle, limit) for step in p.steps]
    for h in hosts:
        check_owned_kv(h.mem, h.i, p, lay, prefill)
    return p, lay, hosts, image, qls, x, prefill, cycle, limit, prefill_cycles


@cocotb.test()
async def decode(dut):
    params = bench_params()
    # ---- the prompt: MARS's prefill steps with the layer program -------------------------------
    p, lay, hosts, image, qls, x, prefill, cycle, limit, prefill_cycles = \
        await prefilled(dut, params)
    n, L = len(hosts), len(qls)
    S = p.num_chunks * p.chunk
    marks = len(p.steps)

    # ---- one decode token ----------------------------------------------------------------------
    k = params.get("token", 0)
    assert k == 0, "the bench runs the first decode token (the golden's history is empty)"
    root = p.decode_owner(k)
    position = S + k
    xa = to_act(x[S:S + 1])[0]
    gold = golden_decode(xa, qls, TINY, position, root, reduction_parents(p, root),
                         prompt_blocks(p, prefill))
    decode_cycles = await run_decode_token(dut, hosts, p, k, image, xa, cycle, limit, marks)
    marks += 1
    await check_decode_token(hosts, p, image, gold, k)
    want_states = L * TINY.heads
    for h in hosts:
        assert await h.read("nic_reduce_rx_packets") == want_states * (
            1 + sum(par == h.i for par in reduction_parents(p, root).values()))
        if h.i == root:
            assert await h.read("dec_results_landed") == want_states
            assert await h.read("dec_queries_landed") == 0
        else:
            assert await h.read("dec_queries_landed") == L * TINY.kv_heads
    out = params.get("out")
    if out:
        with open(out, "w") as f:
            json.dump({"nodes": n, "root": root, "prefill_step_cycles": prefill_cycles,
                       "decode_step_cycles": decode_cycles,
                       "results_landed": want_states,
                       "att_records": {h.i: await h.read("att_records") for h in hosts}}, f)
