"""cocotb bench: one whole cluster run (issue #14, the simulated back end of ``mcf run``) on N node
tops cabled as a KR260 ring (:class:`mcf.sim.cluster.ClusterTop`, ``sim`` configuration).

``run`` — a Qwen2 model (:func:`mcf.model.model_from_spec`: ``tiny`` or a checkpoint directory),
quantised by the project's quantiser, runs a prompt end to end:

1. **Prefill**: MARS's plan of the run (:func:`mcf.cluster.make_plan`, any executable policy),
   step by step as the layer program on every node (:func:`~mcf.sim.benches.node_cluster.
   run_layer_step`): the host writes the slice's embedding rows (ACT codes of the INT4 table),
   the step's routes, rings and ATTEND lists; the nodes do every layer. After every step, bit
   for bit against the run's golden model (:class:`mcf.cluster.ClusterGolden`): every layer's
   attention and output rows, the KV of every block each node read, the counters.
2. **First token**: the host reads the last prompt row of the last layer from the node that
   computed it and runs the LM head (:meth:`~mcf.cluster.ClusterGolden.head`).
3. **Decode**: per token the embedding row goes to the token's root (MARS's
   :meth:`~mcf.mars.plan.Plan.decode_owner`), every node attends over the KV it holds, the
   reduction engines merge the states, the root runs O-projection and MLP
   (:func:`~mcf.sim.benches.node_decode.run_decode_token`); checked bit for bit, then the host
   reads the root's last-layer row and runs the LM head for the next token.

After the prefill the KV layout is read back from every node's DDR: every block a node owns
holds the golden's KV (owner-only: each ``(block, slice)`` has exactly one owner, the
balance of owned tokens is reported). The generated tokens must equal the golden model's.

Written to ``out`` (JSON): the tokens (RTL and golden), per-step prefill cycles, the COMPUTE
queue's wait cycles per step (the cycles the compute engines waited for KV and counters: the
exposed communication), TTFT in cycles (every prefill step plus the first LM head's host time,
which is not counted), per-token decode cycles, owned tokens per node, the checks, and the
simulated cycles and wall time.

``fault = {"step": s, "node": v}`` arms a one-bit fault on every link leaving node ``v`` just
before prefill step ``s``: a receiver's CRC check drops the frame and raises ``link_error``,
and the run fails naming the node and link (it never reports tokens computed without that KV).
"""

from __future__ import annotations

import json
import sys
import time

import cocotb
import numpy as np
from cocotb.triggers import RisingEdge
from tqdm import tqdm

from mcf.abi.directory import DirState
from mcf.cluster import ClusterGolden, RunSpec, make_plan, run_prompt
from mcf.node.decode import DecodeImage, decode_layout, slice_tokens
from mcf.node.layer import max_read_set, slice_positions
from mcf.node.program import configure
from mcf.sim.benches.cycles import cycle_counter
from mcf.sim.benches.node_cluster import _act_rows, _setup, check_layer_step, run_layer_step
from mcf.sim.benches.node_decode import (
    _rows,
    check_decode_token,
    check_owned_kv,
    run_decode_token,
)
from mcf.sim.cluster import directed_links
from mcf.sim.toolchain import bench_params

__all__ = ["run"]


def _last_row_owner(p) -> tuple[int, int]:
    """``(node, row)``: who computed the prompt's last position, and its row in the slice."""
    S = p.num_chunks * p.chunk
    for s in range(p.cluster.nodes):
        p0, n = slice_positions(p, p.num_chunks, s)
        if p0 <= S - 1 < p0 + n:
            return s, S - 1 - p0
    raise AssertionError("no slice holds the last position")


async def held_blocks(hosts, p) -> dict[str, dict[int, list[tuple[int, int]]]]:
    """The prompt's ``(block, slice)`` KV each node holds, read from its directory
    (``DIR_PEEK`` / ``DIR_ENTRY``, every layer's ``kv_id``): ``owned`` (state OWNER on every
    layer) and ``replicas`` (any layer VALID or DRAINING, or landed packets not owned)."""
    enc, L = p.encoder, p.model.layers
    out = {"owned": {}, "replicas": {}}
    for h in hosts:
        owned, replicas = [], []
        for b in range(1, p.num_chunks + 1):
            for s in range(p.cluster.nodes):
                states = []
                for layer in range(L):
                    await h.write("DIR_PEEK", enc.kv_id(layer, b, s))
                    e = h.regmap.register("DIR_ENTRY").unpack(await h.read("DIR_ENTRY"))
                    states.append((DirState(e["state"]), e["landed"]))
                if all(st is DirState.OWNER for st, _ in states):
                    owned.append((b, s))
                elif any(st is not DirState.ABSENT or landed for st, landed in states):
                    replicas.append((b, s))
        out["owned"][h.i], out["replicas"][h.i] = owned, replicas
    return out


async def inject_link_fault(dut, n: int, node: int) -> None:
    """Arm every link model leaving ``node`` (``link{k}_inject``; on a top cabled with MACs,
    :class:`mcf.sim.cluster_eth.ClusterEthTop`, the wire models): the next frame each carries
    gets one bit flipped — a link fault the receivers' CRC checks must catch."""
    ks = [k for k, (src, _) in enumerate(directed_links(n)) if src[0] == node]
    for k in ks:
        getattr(dut, f"link{k}_inject").value = 1
    await RisingEdge(dut.aclk)
    for k in ks:
        getattr(dut, f"link{k}_inject").value = 0


@cocotb.test()
async def run(dut):
    params = bench_params()
    spec = RunSpec(**params["spec"])
    from mcf.model import model_from_spec, quantize_model

    mcfg, tensors = model_from_spec(spec.model, seed=spec.seed) if spec.model == "tiny" \
        else model_from_spec(spec.model)
    qm = quantize_model(mcfg, tensors)
    p = make_plan(spec, mcfg)
    lcfg = mcfg.layer
    made = {}
    held = [p.decode_owner(k) for k in range(spec.decode_tokens)]
    blocks = max([1] + [-(-held.count(v) // slice_tokens(p)) for v in range(spec.nodes)])

    def model_of(plan, layout, cfg):
        made["layout"] = decode_layout(plan, cfg, layout.base, layout.cmd_log2,
                                       decode_blocks=blocks)
        return DecodeImage(lcfg, qm.layers, cfg, made["layout"], tokens=slice_tokens(plan),
                           decode_blocks=blocks, max_blocks=max_read_set(plan))

    n = spec.nodes
    p, _, hosts, image = await _setup(dut, {**params, "nodes": n, "config": spec.config},
                                      model_of=model_of, plan=p)
    lay = made["layout"]
    for h in hosts:                       # the decode layout: decode blocks, QBUF/OBUF moved
        h.layout = lay
        await h.apply(configure(p, lay, h.i, seq_timeout=params.get("timeout", 0),
                                model=image))
    golden = ClusterGolden(qm, p)
    prompt, answer = run_prompt(spec, mcfg)
    gold = golden.prefill(prompt)
    xa = golden.embed(prompt)
    cycle = cycle_counter(dut.aclk)
    limit = params.get("step_limit", 5_000_000)
    wall0 = time.monotonic()
    bar = tqdm(total=len(p.steps) + spec.decode_tokens, desc=f"{spec.policy} N={n}",
               unit="step", file=sys.stderr, disable=not params.get("progress", False))

    # ---- prefill -------------------------------------------------------------------------------
    expect_packets = [0] * n
    step_cycles, wait_cycles, kv_bytes = [], [], []
    fault = params.get("fault")
    for step in p.steps:
        if fault and step.index == fault["step"]:
            await inject_link_fault(dut, n, fault["node"])
        waits0 = [await h.read("seq1_wait_cycles") for h in hosts]
        step_cycles.append(await run_layer_step(dut, hosts, p, step, image, xa, expect_packets,
                                                cycle, limit))
        wait_cycles.append([await h.read("seq1_wait_cycles") - w
                            for h, w in zip(hosts, waits0, strict=True)])
        await check_layer_step(hosts, p, step.index, image, lay, gold.prefill, expect_packets)
        held = await held_blocks(hosts, p)
        kv_bytes.append([int(sum(slice_positions(p, b, s)[1] * p.model.m_token
                                 for b, s in held["owned"][h.i] + held["replicas"][h.i]))
                         for h in hosts])
        bar.update()
    check_owned_kv(hosts, p, lay, gold.prefill)
    owner_only = all(not v for v in held["replicas"].values()) and \
        sorted(k for v in held["owned"].values() for k in v) == \
        sorted((b, s) for b in range(1, p.num_chunks + 1) for s in range(n))
    assert owner_only, f"the KV layout after the prefill is not owner-only: {held}"
    owned_tokens = {v: sum(slice_positions(p, b, s)[1] for b, s in blocks)
                    for v, blocks in held["owned"].items()}

    # ---- the first token: the last prompt row's LM head on the host ----------------------------
    node, row = _last_row_owner(p)
    last = _act_rows(hosts[node].mem, image.bufs[-1].buf["y"] + row * lcfg.hidden * 4, 1,
                     lcfg.hidden)[0]
    logits = [golden.head(last)]
    tokens = [int(np.argmax(logits[-1]))]
    ttft = sum(step_cycles)

    # ---- decode --------------------------------------------------------------------------------
    marks = len(p.steps)
    decode_cycles = []
    for k in range(spec.decode_tokens):
        layers = golden.decode_token(k)
        root = gold.roots[k]
        decode_cycles.append(await run_decode_token(
            dut, hosts, p, k, image, golden.embed([tokens[-1]])[0], cycle, limit, marks))
        marks += 1
        await check_decode_token(hosts, p, image, layers, k)
        y = _rows(hosts[root].mem, image.dbufs[-1].buf["y"], lcfg.hidden)
        logits.append(golden.head(y))
        tokens.append(int(np.argmax(logits[-1])))
        bar.update()
    bar.close()
    wall = time.monotonic() - wall0
    assert tokens == gold.tokens, f"generated tokens {tokens}, golden {gold.tokens}"
    out = params.get("out")
    if out:
        with open(out, "w") as f:
            json.dump({
                "spec": params["spec"], "nodes": n, "policy": spec.policy,
                "prompt": prompt.tolist(), "tokens": tokens, "golden_tokens": gold.tokens,
                "roots": gold.roots,
                "prefill_step_cycles": step_cycles, "exposed_comm_cycles": wait_cycles,
                "ttft_cycles": ttft, "decode_cycles": decode_cycles,
                "logits": [lg.tolist() for lg in logits],
                "owned_tokens": owned_tokens, "kv_bytes_per_step": kv_bytes,
                "peak_kv_bytes": max(max(b) for b in kv_bytes),
                "kv_budget": spec.kv_budget, "planned_peak_kv_bytes":
                    p.totals.peak_node_kv_bytes,
                "checks": {"bit_exact": True, "tokens_match": tokens == gold.tokens,
                           "owner_only": owner_only,
                           "memory_within_budget": max(max(b) for b in kv_bytes)
                           <= spec.kv_budget},
                "task": None if answer is None else {
                    "name": spec.task, "answer": answer.tolist(),
                    "generated": tokens[:len(answer)],
                    "correct": tokens[:len(answer)] == answer.tolist()},
                "sim_cycles": cycle[0], "wall_seconds": wall,
                "node_cycles_per_second": n * cycle[0] / wall if wall > 0 else 0.0,
            }, f)
