"""cocotb bench: one whole cluster run (issue #14, the simulated back end of ``mcf run``) on N node
tops cabled as a KR260 ring — all in one simulation (:class:`mcf.sim.cluster.ClusterTop`) or one
node per MPI rank (:class:`mcf.sim.cluster.RankTop`, params ``mpi``), with the same cycles and
bits (docs/cluster.md "MPI co-simulation").

``run`` — a Qwen2 model (:func:`mcf.model.model_from_spec`: ``tiny`` or a checkpoint directory),
quantised by the project's quantiser, runs a prompt end to end. Every node has its own host
coroutine (:func:`node_host`: its AXI-Lite master, its DDR), which touches only its own node;
the hosts meet only at the window grid (:class:`~mcf.sim.benches.grid.Grid`), so a node's host
does the same thing at the same cycle whether the other nodes are in this simulation or not.

1. **Prefill**: MARS's plan of the run (:func:`mcf.cluster.make_plan`, any executable policy),
   step by step as the layer program on every node: each host writes its slice's embedding rows
   (ACT codes of the INT4 table), the step's routes, rings and ATTEND lists, rings both
   doorbells, waits for its two MARKs and every planned landing, then checks its node bit for
   bit against the run's golden model (:class:`mcf.golden.cluster.ClusterGolden`: every layer's
   attention and output rows, the KV of every block it read, the counters) and reads its
   directory; then all meet. A step's cycles run from the first doorbell to the last landing.
2. **First token**: a head phase (:meth:`mcf.cluster.RunSetup.head_program`, both MARKs on
   every node): the node that computed the last prompt row runs the LM head on it
   (:mod:`mcf.node.head`); its host reads the logits and picks the token, which goes to every
   host at the grid.
3. **Decode**: per token each host writes its records (:func:`mcf.node.decode.decode_program`)
   and rings its doorbells, the root's COMPUTE doorbell last (after the grid); the root's
   program ends with the LM head and its MARK ends the token's cycles; the root checks OBUF,
   output row and new KV bit for bit and its host reads the logits for the next token. With
   ``spec.decode == "tp"`` every node runs the token tensor-parallel
   (:class:`mcf.node.tp_decode.TPDecodeImage`, written above the node image at setup; every
   host writes the token's input row) and checks its own heads' OBUF rows and every layer's
   output row (:func:`mcf.cluster.tp.check_tp_token`), the root the new KV. Every node's
   program ends with its slice of the LM head on the last layer's output row (its vocabulary
   rows, :func:`mcf.golden.tp_decode.vocab_split`); each host reads its node's slice and takes
   its (max, index) pair (:meth:`mcf.cluster.setup.RunSetup.decode_head`), and the token is the
   largest pair over the nodes at the grid (:func:`mcf.cluster.setup.decode_result`); the
   token's cycles run from the root's COMPUTE doorbell to the last node's MARK.

After the prefill every node's owned KV is checked in its DDR and the layout read from the
directories must be owner-only. Every logits row the nodes wrote must equal the golden head's
bit for bit, and the generated tokens the golden model's. A frame dropped by a receiver's MAC
buffer fails the run at the next window (:func:`mac_drops`).

Written to ``out`` (JSON, by node 0's simulation): the tokens (RTL and golden), per-step prefill
cycles, the COMPUTE queue's wait cycles per step and node (the cycles the compute engines waited
for KV and counters: the exposed communication), TTFT in cycles (the prefill steps; the first
token's head phase is ``head_cycles``), per-token decode cycles (each with its LM head; TP: the
nodes' slices concatenated are the token's logits), owned
tokens per node, the checks, the simulated cycles and wall time.

``fault = {"step": s, "node": v}`` arms a one-bit fault on every link leaving node ``v`` just
before prefill step ``s``: a receiver's CRC check drops the frame and raises ``link_error``,
and the run fails naming the node and link (it never reports tokens computed without that KV).
"""

from __future__ import annotations

import json
import random
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import cocotb
import numpy as np
from cocotb.triggers import ClockCycles, RisingEdge
from tqdm import tqdm

from mcf.abi.csrmap import node_regmap
from mcf.abi.directory import DIR_PEEK_READS
from mcf.abi.node import Queue
from mcf.abi.node_config import NODE_CONFIGS
from mcf.cluster import RunSpec
from mcf.cluster.checks import (
    check_decode_root,
    check_owned_kv,
    directory_ids,
    held_from_directory,
)
from mcf.cluster.setup import (
    RunSetup,
    StepPrograms,
    decode_result,
    planned_landings,
    run_record,
)
from mcf.cluster.tp import check_tp_token
from mcf.node.decode import DecodeImage
from mcf.node.layer import slice_positions
from mcf.node.program import configure, route_writes
from mcf.sim.benches.grid import ClusterAbort, Grid
from mcf.sim.benches.node_cluster import (
    MEM,
    POLL,
    Host,
    _wait_marks,
    check_layer_step,
    start_clocks,
    wait_irq,
)
from mcf.sim.benches.node_decode import _bad_counters, program_decode_token
from mcf.sim.cluster import check_tx_params, directed_links
from mcf.sim.toolchain import bench_params

__all__ = ["run", "node_host", "held_blocks", "inject_link_fault", "cable_port"]


async def held_blocks(hosts, p) -> dict[str, dict[int, list[tuple[int, int]]]]:
    """The prompt's ``(block, slice)`` KV each node holds, read from its directory
    (``DIR_PEEK`` / ``DIR_ENTRY`` of every layer's ``kv_id``;
    :func:`mcf.cluster.checks.held_from_directory`)."""
    out = {"owned": {}, "replicas": {}}
    for h in hosts:
        entries = []
        for _, _, kv_id in directory_ids(p):
            await h.write("DIR_PEEK", kv_id)
            entry = {"fresh": 0}
            for _ in range(DIR_PEEK_READS):     # until the entry is DIR_PEEK's (fresh)
                entry = h.regmap.register("DIR_ENTRY").unpack(await h.read("DIR_ENTRY"))
                if entry["fresh"]:
                    break
            assert entry["fresh"], f"DIR_ENTRY of kv_id {kv_id} never fresh"
            entries.append(entry)
        held = held_from_directory(p, entries)
        out["owned"][h.i], out["replicas"][h.i] = held["owned"], held["replicas"]
    return out


@dataclass
class Run:
    """What every node host of a run shares (each simulation builds its own, the same)."""
    dut: object
    setup: RunSetup
    params: dict
    grid: Grid
    image: DecodeImage
    ports: dict[int, int]                 # node -> its index on ``dut`` (n{port}_...)
    limit: int
    bar: object = None
    step_programs: StepPrograms = None
    tp: dict | None = None                # --decode tp: node -> its TPDecodeImage

    def __post_init__(self):
        self.step_programs = StepPrograms(self.setup, self.image)

    @property
    def n(self) -> int:
        return self.setup.nodes

    @property
    def p(self):
        return self.setup.plan

    @property
    def spec(self) -> RunSpec:
        return self.setup.spec


def cable_port(dut, k: int, link: int, name: str):
    """Port ``name`` of cable direction ``k`` (:func:`~mcf.sim.cluster.directed_links`) whose
    end on this top is physical ``link``: ``link{k}_<name>`` on a top of the whole ring,
    ``link{link}_<name>`` on a :class:`~mcf.sim.cluster.RankTop` (one node, ports per link)."""
    return getattr(dut, f"link{link if hasattr(dut, 'link0_rx_window') else k}_{name}")


async def inject_link_fault(dut, n: int, node: int) -> None:
    """Arm every link leaving ``node`` (``inject`` of its cable directions; on a top cabled
    with MACs, :class:`mcf.sim.cluster_eth.ClusterEthTop`, the wire models): the next frame
    each carries gets one bit flipped — a link fault the receivers' CRC checks must catch."""
    ports = [cable_port(dut, k, src[1], "inject")
             for k, (src, _) in enumerate(directed_links(n)) if src[0] == node]
    for port in ports:
        port.value = 1
    await RisingEdge(dut.aclk)
    for port in ports:
        port.value = 0


def mac_drops(dut, n: int, node: int) -> str | None:
    """Which MAC buffers in front of ``node``'s link receivers dropped frames (``None``: none),
    checked by the grid every window (:class:`~mcf.sim.benches.grid.Grid`'s ``watch``): a
    dropped frame fails the run at once, even one no sequence gap would reveal."""
    drops = {dst[1]: int(cable_port(dut, k, dst[1], "dropped").value)
             for k, (_, dst) in enumerate(directed_links(n)) if dst[0] == node}
    bad = {ln: d for ln, d in drops.items() if d}
    return None if not bad else f"node {node}: frames dropped by the MAC buffer of " + \
        ", ".join(f"link {ln}: {d}" for ln, d in sorted(bad.items()))


async def _setup_node(h: Host, r: Run) -> None:
    """Identity, the directory's start, the model image in DDR, the node's configuration."""
    cfg = NODE_CONFIGS[r.spec.config]
    ident = await h.read("ID")
    assert ident == h.regmap.id_word, f"node {h.i}: ID {ident:#x}"
    assert await h.read("CAPS") == cfg.caps()
    for _ in range(cfg.kv_count // 32 + 200):      # the directory clears one entry a cycle
        if await h.read("DIR_READY"):
            break
        await ClockCycles(r.dut.aclk, 32)
    else:
        raise AssertionError(f"node {h.i}: DIR_READY never rose")
    for addr, raw in r.image.image.items():
        h.mem[addr: addr + len(raw)] = raw
    if r.tp is not None:
        for addr, raw in r.tp[h.i].image.items():
            h.mem[addr: addr + len(raw)] = raw
    await h.apply(configure(r.p, h.layout, h.i, seq_timeout=r.params.get("timeout", 0),
                            model=r.image))


async def _prefill_step(h: Host, r: Run, step, expect: list[int]) -> dict:
    """Node ``h``'s part of prefill step ``step``: its writes, doorbells, MARKs, landings and
    checks (``expect``: packets each node has landed so far). Returns what the others need
    (cycles, waits, directory)."""
    p, image, n, idx = r.p, r.image, r.n, step.index
    m = image.tokens
    fault = r.params.get("fault")
    if fault and idx == fault["step"] and h.i == fault["node"]:
        await inject_link_fault(r.dut, n, h.i)
    waits0 = await h.read("seq1_wait_cycles")
    p0, _ = slice_positions(p, idx, h.i)
    for addr, raw in image.step_writes(np.arange(p0, p0 + m),
                                       r.setup.xa[p0:p0 + m]).items():
        h.mem[addr: addr + len(raw)] = raw
    await h.apply(route_writes(step.routes.entries, h.i))
    progs = r.step_programs(idx)
    prog = progs[h.i]
    for addr, raw in prog.lists.items():
        h.mem[addr: addr + len(raw)] = raw
    h.put(Queue.NET, prog.net)
    h.put(Queue.COMPUTE, prog.compute)
    expect[h.i] += planned_landings(p, idx, progs, h.i, m)
    t0 = r.grid.now()
    for q in Queue:
        await h.doorbell(q)
    await _wait_marks(r.dut, [h], [idx], r.limit)
    while await h.read("land_packets") < expect[h.i]:
        assert r.grid.now() - t0 < r.limit, f"step {idx} node {h.i}: packets missing"
        await ClockCycles(r.dut.aclk, POLL)
    t1 = r.grid.now()
    wait = await h.read("seq1_wait_cycles") - waits0
    await check_layer_step([h], p, idx, image, h.layout, r.setup.gold.prefill, expect)
    held = await held_blocks([h], p)
    kv = sum(slice_positions(p, b, s)[1] * p.model.m_token
             for b, s in held["owned"][h.i] + held["replicas"][h.i])
    return {"t0": t0, "t1": t1, "wait": wait, "owned": held["owned"][h.i],
            "replicas": held["replicas"][h.i], "kv_bytes": int(kv)}


async def _decode_token(h: Host, r: Run, k: int, token: int, marks: int) -> dict:
    """Node ``h``'s part of decode token ``k`` (input ``token``). The root returns the
    token's cycles and logits (TP: every node its cycles, from the root's doorbell to its own
    MARK, and its logit slice and pair, :meth:`mcf.cluster.setup.RunSetup.decode_head`)."""
    p, image = r.p, r.image
    root = p.decode_owner(k)
    layers = r.setup.decode_gold(k)
    if r.tp is None:
        await program_decode_token(h, p, k, image, r.setup.golden.embed([token])[0])
    else:                                 # every node's records, its input row written
        await _program_tp_token(h, r, k, r.setup.golden.embed([token])[0])
    await h.doorbell(Queue.NET)
    if h.i != root:
        await h.doorbell(Queue.COMPUTE)
    await r.grid.gather(h.i)              # every node's records in place: the root starts
    out = {}
    t0 = r.grid.now()
    if h.i == root:
        await h.doorbell(Queue.COMPUTE)
    if h.i == root or r.tp is not None:   # TP: every node ends with its slice of the LM head
        await wait_irq(h, [h], r.limit, f"MARK of decode token {k}")
        out["cycles"] = r.grid.now() - t0
    while await h.read("seq1_marks") < marks + 1:
        assert r.grid.now() - t0 < r.limit, f"node {h.i}: MARK of decode token {k} missing"
        await ClockCycles(r.dut.aclk, POLL)
    assert [await h.read(f"seq{q}_marks") for q in range(2)] == [marks + 1] * 2
    status = await h.read("IRQ_STATUS")
    fields = h.regmap.register("IRQ_STATUS").unpack(status)
    assert not {f: v for f, v in fields.items() if v and not f.startswith("mark")}, fields
    await h.write("IRQ_STATUS", status)                # RW1C: the token's MARKs seen
    assert await h.read("seq0_timeouts") == await h.read("seq1_timeouts") == 0
    bad = await _bad_counters(h)
    assert not bad, f"token {k} node {h.i}: {bad}"
    if r.tp is not None:
        check_tp_token(h.mem, r.tp[h.i], layers, p, k)
    elif h.i == root:
        check_decode_root(h.mem, root, p, image, layers, k)
    if r.tp is not None:
        out.update(r.setup.decode_head(h.mem, image, r.tp[h.i]))
    elif h.i == root:
        out.update(r.setup.decode_head(h.mem, image))
    return out


async def _program_tp_token(h: Host, r: Run, k: int, x) -> None:
    """Node ``h``'s records of TP decode token ``k``
    (:meth:`mcf.node.tp_decode.TPDecodeImage.program`): its register and DDR writes, the input
    row ``x`` (ACT codes, every node's), both rings (no doorbell)."""
    prog = r.tp[h.i].program(r.p, k, x)
    await h.apply(prog.writes)
    for addr, raw in prog.ddr.items():
        h.mem[addr: addr + len(raw)] = raw
    h.put(Queue.NET, prog.net)
    h.put(Queue.COMPUTE, prog.compute)
    assert not h.regmap.register("IRQ_STATUS").unpack(await h.read("IRQ_STATUS"))["mark1"]


async def _first_head(h: Host, r: Run, marks: int) -> dict | None:
    """Node ``h``'s head phase after the prefill (:meth:`mcf.cluster.RunSetup.head_program`):
    both rings and doorbells, its two MARKs (the ``marks``-th), no bad counter. The node that
    computed the prompt's last row returns the phase's cycles (doorbell to MARKs) and the
    logits its LM head wrote; the others None."""
    net, compute = r.setup.head_program(h.i, r.image)
    h.put(Queue.NET, net)
    h.put(Queue.COMPUTE, compute)
    t0 = r.grid.now()
    for q in Queue:
        await h.doorbell(q)
    await _wait_marks(r.dut, [h], [marks], r.limit)
    cycles = r.grid.now() - t0
    bad = await _bad_counters(h)
    assert not bad, f"head phase node {h.i}: {bad}"
    logits = r.setup.first_logits(h.i, h.mem, r.image)
    return None if logits is None else {"cycles": cycles, "logits": logits}


async def node_host(h: Host, r: Run) -> dict:
    """Everything node ``h``'s host does in a run; meets the others only at ``r.grid``.
    Returns the run's record (the same on every node)."""
    p, n, spec = r.p, r.n, r.spec
    await _setup_node(h, r)
    await r.grid.gather(h.i)
    expect = [0] * n
    steps = []
    for step in p.steps:
        steps.append(await r.grid.gather(h.i, await _prefill_step(h, r, step, expect)))
        if r.bar is not None and h.i == min(r.ports):
            r.bar.update()
    check_owned_kv(h.mem, h.i, p, h.layout, r.setup.gold.prefill)
    marks = len(p.steps) + 1
    head = await _first_head(h, r, marks)
    got = await r.grid.gather(h.i, head)
    first = next(v for v in got if v is not None)
    logits = [first["logits"]]
    tokens = [int(np.argmax(logits[-1]))]
    decode_cycles, node_cycles = [], []
    for k in range(spec.decode_tokens):
        got = await r.grid.gather(h.i, await _decode_token(h, r, k, tokens[-1], marks))
        marks += 1
        token, row, cycles, per_node = decode_result(got)
        decode_cycles.append(cycles)
        node_cycles.append(per_node)
        logits.append(row)
        tokens.append(token)
        if r.bar is not None and h.i == min(r.ports):
            r.bar.update()
    return {**run_record(r.setup, steps, tokens, logits, decode_cycles, first["cycles"],
                         node_cycles),
            "sim_cycles": r.grid.now()}


async def _guarded(h: Host, r: Run, results: dict) -> None:
    """:func:`node_host`, a failure told to every node through the grid."""
    try:
        results[h.i] = await node_host(h, r)
    except ClusterAbort:
        return
    except Exception as exc:           # noqa: BLE001 - every failure stops every node
        if isinstance(exc, AssertionError) and str(exc):
            msg = str(exc)
        else:                              # a bug: where it happened
            where = traceback.extract_tb(exc.__traceback__)[-1]
            msg = f"node {h.i}: {exc!r} at {Path(where.filename).name}:{where.lineno}"
        r.grid.abort(h.i, msg)
        return
    r.grid.done(h.i)


@cocotb.test()
async def run(dut):
    params = bench_params()
    spec = RunSpec(**params["spec"])
    setup = RunSetup.prepare(spec)
    p, n = setup.plan, spec.nodes
    comm = None
    if params.get("mpi"):
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        assert comm.Get_size() == n, f"{comm.Get_size()} MPI ranks for {n} nodes"
        check_tx_params(n)
        ports = {comm.Get_rank(): 0}
    else:
        ports = {v: v for v in range(n)}
    image = setup.image(params.get("base", 0x1000), params.get("cmd_log2", 10))
    lay = image.layout
    mem_bytes = params.get("mem", MEM)
    if image.alloc.at > mem_bytes:
        raise ValueError(f"the node image ends at {image.alloc.at:#x}, beyond the "
                         f"{mem_bytes:#x}-byte DDR model (params: mem)")
    grid = Grid(dut, n, sorted(ports), comm=comm, wires=directed_links(n) if comm else [],
                watch=lambda node: mac_drops(dut, n, node))
    regmap = node_regmap()
    seed = params.get("seed", 1)
    hosts = [Host(dut, v, regmap, lay, random.Random(seed * 7919 + v),
                  params.get("pause", 0.0), mem_bytes, port=port)
             for v, port in sorted(ports.items())]
    first = 0 in ports
    bar = tqdm(total=len(p.steps) + spec.decode_tokens, desc=f"{spec.policy} N={n}",
               unit="step", file=sys.stderr,
               disable=not (params.get("progress", False) and first))
    r = Run(dut, setup, params, grid, image, ports, params.get("step_limit", 5_000_000), bar)
    if spec.decode == "tp":
        r.tp = {v: setup.tp_image(image, v) for v in ports}
        end = max(t.end for t in r.tp.values())
        if end > mem_bytes:
            raise ValueError(f"the TP decode image ends at {end:#x}, beyond the "
                             f"{mem_bytes:#x}-byte DDR model (params: mem)")
    await start_clocks(dut)
    dut.aresetn.value = 0
    await ClockCycles(dut.aclk, 8)
    dut.aresetn.value = 1
    await ClockCycles(dut.aclk, 4)        # the bus models see the reset end first
    wall0 = time.monotonic()
    cocotb.start_soon(grid.run())
    results = {}
    for h in hosts:
        cocotb.start_soon(_guarded(h, r, results))
    await grid.finished.wait()
    wall = time.monotonic() - wall0
    bar.close()
    if grid.aborted:
        raise AssertionError(grid.aborted)
    got = results[hosts[0].i]
    assert all(v == got for v in results.values())
    out = params.get("out")
    if out and first:
        got.update(wall_seconds=wall, spec=params["spec"], **setup.prompt_record(got["tokens"]),
            mpi_ranks=comm.Get_size() if comm else 0, grid_exchanges=grid.exchanges,
            node_cycles_per_second=n * got["sim_cycles"] / wall if wall > 0 else 0.0)
        with open(out, "w") as f:
            json.dump(got, f)
