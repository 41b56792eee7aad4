"""cocotb bench of N node tops in a KR260 ring (:class:`mcf.sim.cluster.ClusterTop`, ``sim``
configuration; docs/node.md §13, issue #11 tests).

Every node has its own DDR: one byte array that four cocotbext-axi ``AxiRam`` share, one per HP
port, with random pauses on their channels. The host side is the project's own driver rule,
:mod:`mcf.node` (layout, configuration writes, MARS records → command rings), applied over each
node's AXI-Lite port with ``AxiLiteMaster`` — no register is poked from the side.

Tests (pick one with the runner's ``testcase``):

* ``prefill`` — MARS's own prefill chunk steps of the ``tiny`` model: before step ``c`` each
  owner's chunk-``c`` KV (random bytes per ``kv_id`` slot) is in its DDR and declared with
  ``DIR_LAND`` (what the K/V emitter's local copies will do); the host programs the step's
  route bank, writes both rings and rings both doorbells, then waits for the two step MARKs
  through the interrupt line. Checked after every step: every KV byte MARS planned has landed at
  every planned receiver, bit-exact, at :func:`mcf.abi.landing.kv_address`; every other KV byte
  of the receiver still holds the fill pattern; the landing, directory, send and ring counters
  equal their expectations; no drop counter moved anywhere. The cycles from the first doorbell
  to the last MARK of each step are reported (``out``). On a top whose cables are MACs
  (:class:`mcf.sim.cluster_eth.ClusterEthTop`) ``out`` also holds every MAC's counters
  (:func:`eth_status`) and every node's link receiver counters. ``fault = {"step": s,
  "node": v}`` arms a one-bit fault on every link leaving node ``v`` just before step ``s``
  (:func:`mcf.sim.benches.cluster_run.inject_link_fault`): the step must then stop on a
  ``link_error`` (else the test fails); the stop's message, and the counters once the links
  are quiet, go to ``out``. ``mirror``: every node's next and prev links swapped
  (:func:`mirrored_link_map`).
* ``bad_input`` — on a configured pair: a record with an unassigned op, a KV send of an
  unmapped ``kv_id``, a header-only KV packet the receiver must drop, a ring overrun, a FREE
  whose KV never arrives (watchdog halt → interrupt → ``skip``) and, on node 1, a JOB whose GEMM
  job the engine would reject (:func:`refused_gemm_job`); each counted where the design says,
  and a good KV send behind them still lands.
* ``layer`` — the layer program (:mod:`mcf.node.layer`) of the tiny model (``TINY`` geometry,
  random INT4 weights, random prompt) in MARS's prefill steps: every node computes its slice of
  every chunk on its own engines — JOB, EMIT (local copy + the store phase's sends as a tee),
  block barriers, ATTEND over the landed KV, JOB — driven only by its two rings. Checked after
  every step, bit for bit against :func:`mcf.golden.node_prefill.golden_prefill`: every layer's
  output rows of every node, and the INT4 KV records of every block each node attended to (its own
  and the ones it received); no bad record, drop, bus error or timeout anywhere. Reports the
  cycles of each step and the engines' busy counters (``out``).
* ``registers`` — every register of the node map on node 0 through AXI-Lite: RW fields written
  with random values and read back, W fields read 0, R registers readable, ``ID``/``CAPS``
  values, an unmapped address answers SLVERR and counts in ``BUS_ERRORS``.
"""

from __future__ import annotations

import json
import logging
import mmap
import random

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import (
    ClockCycles,
    First,
    RisingEdge,
    SimTimeoutError,
    Timer,
    with_timeout,
)
from cocotbext.axi import AxiLiteBus, AxiLiteMaster
from cocotbext.axi.constants import AxiResp

from mcf.abi.csrmap import node_regmap
from mcf.abi.eth import ETH_STATUS, PCS_STATUS
from mcf.abi.jobs import JOB_ARG, TemplateBuilder, template_image
from mcf.abi.link_map import link_map_for
from mcf.abi.meta import META, Meta, Op
from mcf.abi.node import CMD_BYTES, Cmd, PayloadSource, Queue, RecordClass
from mcf.abi.node_config import NODE_CONFIGS
from mcf.abi.platform import ACLK_HZ
from mcf.abi.regs import WORD_BYTES, Access
from mcf.cluster.checks import (
    check_layer_memory,
    check_step_counters,
    link_counter_names,
    step_counter_names,
)
from mcf.cluster.checks import link_faults as shared_link_faults
from mcf.cluster.setup import planned_receivers
from mcf.golden.node_prefill import golden_prefill
from mcf.golden.qwen_layer import TINY, quantize_layer, random_layer
from mcf.mars.model import ModelSpec
from mcf.mars.plan import tiny_plan
from mcf.node.layer import ModelImage, read_act, slice_positions
from mcf.node.layout import NodeLayout
from mcf.node.program import (
    configure,
    owner_declarations,
    route_writes,
    step_program,
)
from mcf.quant import QuantWeight, to_act
from mcf.sim.benches.cycles import cycle_counter
from mcf.sim.ddr import ddr_ram
from mcf.sim.toolchain import bench_params

MEM = 1 << 20
FILL = 0x5A
PERIOD_NS = 10
POLL = 32             # cycles between two status polls of a waiting host
_aclk_ps = PERIOD_NS * 1000     # the running test's aclk period (:func:`start_clocks`)


def _ps(cycles: int) -> int:
    """``cycles`` of ``aclk`` in ps (timeouts)."""
    return cycles * _aclk_ps


async def start_clocks(dut) -> None:
    """Start the DUT's clocks: ``aclk`` every :data:`PERIOD_NS` ns; on a top whose cables are
    MACs (an ``eth_clk`` port: :class:`mcf.sim.cluster_eth.ClusterEthTop`) ``aclk`` at
    :data:`~mcf.abi.platform.ACLK_HZ` instead (3,334 ps, so the node clock and the line clocks
    keep the board's ratio), and the MAC clocks at their own frequencies
    (:data:`~mcf.sim.cluster_eth.ETH_CLOCKS_PS`): ``eth_clk`` 125 MHz, ``eth_clk90`` the same
    2 ns later, ``gt_clk`` ≈ 161.13 MHz."""
    global _aclk_ps
    if not hasattr(dut, "eth_clk"):
        cocotb.start_soon(Clock(dut.aclk, PERIOD_NS, "ns").start())
        return
    from mcf.sim.cluster_eth import ETH_CLOCKS_PS

    _aclk_ps = 2 * round(1e12 / ACLK_HZ / 2)
    eth = ETH_CLOCKS_PS["eth_clk"]
    cocotb.start_soon(Clock(dut.aclk, _aclk_ps, "ps").start())
    cocotb.start_soon(Clock(dut.gt_clk, ETH_CLOCKS_PS["gt_clk"], "ps").start())
    cocotb.start_soon(Clock(dut.eth_clk, eth, "ps").start())
    await Timer(eth // 4, "ps")
    cocotb.start_soon(Clock(dut.eth_clk90, eth, "ps").start())


def _fields(raw: int, layout) -> dict[str, int]:
    return {name: (raw >> f.offset) & ((1 << f.width) - 1) for name, f in layout}


def eth_status(dut) -> dict[str, dict[str, int]]:
    """Every MAC's counters of a top whose cables are MACs, by port: ``{"n0_eth1": {tx_frames:
    ..., ...}}`` (:data:`~mcf.abi.eth.ETH_STATUS`, plus :data:`~mcf.abi.eth.PCS_STATUS` for a
    10G link); ``{}`` for a top with link models."""
    out = {}
    for i in range(8):
        for ln in range(8):
            name = f"n{i}_eth{ln}"
            if not hasattr(dut, f"{name}_status"):
                continue
            out[name] = _fields(int(getattr(dut, f"{name}_status").value), ETH_STATUS)
            if hasattr(dut, f"{name}_pcs_status"):
                out[name].update(_fields(int(getattr(dut, f"{name}_pcs_status").value),
                                         PCS_STATUS))
    return out


async def link_counters(hosts) -> dict[str, dict[str, int]]:
    """Every node's link receiver counters, ``{"n0": {"link0_rx_frames_ok": ..., ...}}``."""
    return {f"n{h.i}": await h.counters("link") for h in hosts}


class Host:
    """One node's host side: its DDR, its AXI-Lite master, ring indices. ``port``: the index
    of the node's ports on ``dut`` (``n{port}_…``; default ``i``; a
    :class:`mcf.sim.cluster.RankTop` has node ``i`` as ``n0``)."""

    def __init__(self, dut, i: int, regmap, layout: NodeLayout, rng: random.Random,
                 pause: float, mem_bytes: int = MEM, port: int | None = None):
        self.i, self.regmap, self.layout = i, regmap, layout
        port = i if port is None else port
        self.axil = AxiLiteMaster(AxiLiteBus.from_prefix(dut, f"n{port}_s_axi_ctrl"), dut.aclk,
                                  dut.aresetn, reset_active_level=False)
        self.axil.write_if.log.setLevel(logging.WARNING)     # one line per access otherwise
        self.axil.read_if.log.setLevel(logging.WARNING)
        self.mem = mmap.mmap(-1, mem_bytes)
        self.mem.write(bytes([FILL]) * mem_bytes)
        self.rams = [ddr_ram(dut, f"n{port}_m_axi_hp{p}", dut.aclk, dut.aresetn,
                             reset_active_level=False, size=mem_bytes, mem=self.mem, pause=pause,
                             rng=random.Random(rng.random())) for p in range(4)]
        self.irq = getattr(dut, f"n{port}_irq")
        self.prod = [0, 0]
        self.net_retired = 0

    async def write(self, reg: str, value: int) -> None:
        resp = await self.axil.write(self.regmap.addr(reg), value.to_bytes(WORD_BYTES, "little"))
        assert resp.resp == AxiResp.OKAY, f"node {self.i}: write {reg} answered {resp.resp}"

    async def read(self, reg: str) -> int:
        resp = await self.axil.read(self.regmap.addr(reg), WORD_BYTES)
        assert resp.resp == AxiResp.OKAY, f"node {self.i}: read {reg} answered {resp.resp}"
        return int.from_bytes(resp.data, "little")

    async def apply(self, writes) -> None:
        for w in writes:
            await self.write(w.reg, w.value)

    def put(self, queue: Queue, cmds: list[Cmd]) -> None:
        """Write entries into ring ``queue`` after the producer index (no doorbell)."""
        base, n = self.layout.cmd_base[queue.value], 1 << self.layout.cmd_log2
        for c in cmds:
            slot = self.prod[queue.value] % n
            self.mem[base + slot * CMD_BYTES: base + (slot + 1) * CMD_BYTES] = c.pack()
            self.prod[queue.value] = (self.prod[queue.value] + 1) % (1 << 16)

    async def doorbell(self, queue: Queue) -> None:
        await self.write(f"CMD{queue.value}_PROD", self.prod[queue.value])

    async def counters(self, prefix: str) -> dict[str, int]:
        out = {}
        for _, reg in self.regmap:
            if reg.name.startswith(prefix):
                out[reg.name] = await self.read(reg.name)
        return out


def tiny_model_spec(layers: int = 2) -> ModelSpec:
    """MARS's view of the golden ``TINY`` layer geometry."""
    return ModelSpec("tiny", layers=layers, q_heads=TINY.heads, kv_heads=TINY.kv_heads,
                     head_dim=TINY.head_dim, hidden=TINY.hidden, intermediate=TINY.intermediate)


def kv_slot_bytes(layout: NodeLayout, kv_id: int, seed: int) -> bytes:
    return random.Random(seed * 65_537 + kv_id).randbytes(layout.kv.kv_slot)


async def _setup(dut, params, spec=None, model_of=None, plan=None):
    """Reset, identity checks, ``configure`` every node. ``model_of(plan, layout, config)``
    builds a :class:`ModelImage`: it is written into every node's DDR and configured.
    ``plan``: MARS's plan to run (default: :func:`tiny_plan` of the parameters)."""
    cfg = NODE_CONFIGS[params.get("config", "sim")]
    n = params["nodes"]
    p = plan or tiny_plan(n, params.get("seq_len", 64), params.get("chunk", 32), spec)
    regmap = node_regmap()
    layout = NodeLayout.for_plan(p, cfg, base=params.get("base", 0x1000),
                                 cmd_log2=params.get("cmd_log2", 10))
    model = model_of(p, layout, cfg) if model_of else None
    mem_bytes = params.get("mem", MEM)
    if model is not None and model.alloc.at > mem_bytes:
        raise ValueError(f"the node image ends at {model.alloc.at:#x}, beyond the "
                         f"{mem_bytes:#x}-byte DDR model (params: mem)")
    rng = random.Random(params.get("seed", 1))
    hosts = [Host(dut, i, regmap, layout, rng, params.get("pause", 0.0), mem_bytes)
             for i in range(n)]
    await start_clocks(dut)
    dut.aresetn.value = 0
    await ClockCycles(dut.aclk, 8)
    dut.aresetn.value = 1
    await ClockCycles(dut.aclk, 4)
    for h in hosts:
        ident = await h.read("ID")
        assert ident == regmap.id_word, f"node {h.i}: ID {ident:#x}"
        assert await h.read("CAPS") == cfg.caps()
        for _ in range(200):
            if await h.read("DIR_READY"):
                break
            await ClockCycles(dut.aclk, 32)
        else:
            raise AssertionError(f"node {h.i}: DIR_READY never rose")
        if model is not None:
            for addr, raw in model.image.items():
                h.mem[addr: addr + len(raw)] = raw
        await h.apply(configure(p, layout, h.i, seq_timeout=params.get("timeout", 0),
                                model=model))
        if params.get("mirror"):
            await h.write("LINK_MAP", mirrored_link_map(regmap, h.i, n))
    if model_of:
        return p, layout, hosts, model
    return p, layout, hosts


def mirrored_link_map(regmap, node: int, n: int) -> int:
    """``LINK_MAP`` of ``node`` in the ring of ``n`` taken the other way round: the driver
    rule's next and prev links swapped on every node (still a ring: each node's next meets its
    neighbour's prev). A ring of two then carries its traffic on the RGMII cable instead of the
    SFP+ one (param ``mirror``)."""
    links = list(link_map_for(node, n, "ring"))
    links[0], links[1] = links[1], links[0]
    return regmap.register("LINK_MAP").pack(**{f"port{p}_link": ln for p, ln in enumerate(links)})


async def snapshot(hosts) -> dict:
    """Every non-zero readable register of every node (a stuck step's diagnosis)."""
    out = {}
    for h in hosts:
        for _, reg in h.regmap:
            if all(f.access is Access.W for f in reg.fields):
                continue
            v = await h.read(reg.name)
            if v and reg.name not in ("ID", "CAPS"):
                out[f"n{h.i}.{reg.name}"] = v
    return out


async def assert_rings_and_parsers_clean(h) -> None:
    """No bad record in either ring, no run-time bad record or timeout in either queue, no drop
    at any parser of node ``h``."""
    for q in range(2):
        assert await h.read(f"cmd{q}_bad_records") == 0
        assert await h.read(f"seq{q}_bad_runtime") == 0
        assert await h.read(f"seq{q}_timeouts") == 0
    for prs in range(4):
        drops = await h.counters(f"parser{prs}_drop_")
        assert not any(drops.values()), (h.i, prs, drops)


async def wait_irq(h, hosts, limit: int, what: str) -> None:
    """Until node ``h``'s interrupt line is high (at most ``limit`` cycles; else fail with
    every node's counters)."""
    if not int(h.irq.value):
        try:
            await with_timeout(RisingEdge(h.irq), _ps(limit), "ps")
        except SimTimeoutError:
            raise AssertionError(f"node {h.i}: no {what} within {limit} cycles; "
                                 f"counters {await snapshot(hosts)}") from None


async def link_faults(h) -> list[str]:
    """Node ``h``'s link receive errors, one phrase per link that has any (``[]``: none;
    :func:`mcf.cluster.checks.link_faults`)."""
    return shared_link_faults({n: await h.read(n) for n in link_counter_names(h.regmap)})


async def _wait_marks(dut, hosts, want: list[int], limit: int) -> None:
    """Wait until every node's two step MARKs raised the interrupt (and clear them), serving
    whichever node interrupts first: an error cause fails at once (a ``link_error`` with the node
    and link that saw it), whatever node the others are still waiting for."""
    seen = {h.i: set() for h in hosts}
    pending = list(hosts)
    while pending:
        ready = [h for h in pending if int(h.irq.value)]
        if not ready:
            try:
                await with_timeout(First(*(RisingEdge(h.irq) for h in pending)),
                                   _ps(limit), "ps")
            except SimTimeoutError:
                raise AssertionError(f"nodes {[h.i for h in pending]}: no step MARK within "
                                     f"{limit} cycles; counters {await snapshot(hosts)}") \
                    from None
            continue
        for h in ready:
            status = await h.read("IRQ_STATUS")
            fields = h.regmap.register("IRQ_STATUS").unpack(status)
            bad = {k: v for k, v in fields.items() if v and not k.startswith("mark")}
            if bad.get("link_error"):
                raise AssertionError(f"link fault at node {h.i}: "
                                     + "; ".join(await link_faults(h)))
            assert not bad, f"node {h.i}: unexpected interrupt causes {bad}"
            seen[h.i].update(k for k, v in fields.items() if v)
            await h.write("IRQ_STATUS", status)            # RW1C: clear what was seen
            if len(seen[h.i]) == 2:
                pending.remove(h)
    for h, w in zip(hosts, want, strict=True):
        marks = [await h.read(f"seq{q}_marks") for q in range(2)]
        assert marks == [w, w], f"node {h.i}: marks {marks}, want {w}"


@cocotb.test()
async def prefill(dut):
    params = bench_params()
    seed = params.get("seed", 1)
    p, layout, hosts = await _setup(dut, params)
    enc, n = p.encoder, len(hosts)
    landed = [dict() for _ in hosts]          # node -> {address: byte} expected
    expect_packets = [0] * n
    expect_frees = [0] * n
    expect_sent = [0] * n                     # SEND records (KV and header-only)
    step_cycles = []
    cycle = cycle_counter(dut.aclk, dut)
    fault, stopped = params.get("fault"), None
    for step in p.steps:
        idx = step.index
        progs = []
        for h in hosts:
            for layer in range(p.model.layers):     # the owner's KV of this chunk
                kv_id = enc.kv_id(layer, idx, h.i)
                base = layout.kv.kv_base + kv_id * layout.kv.kv_slot
                data = kv_slot_bytes(layout, kv_id, seed)
                h.mem[base: base + len(data)] = data
            await h.apply(owner_declarations(p, idx, h.i))
            await h.apply(route_writes(step.routes.entries, h.i))
            prog = step_program(p, idx, h.i, h.net_retired)
            h.net_retired += len(prog.net)
            h.put(Queue.NET, prog.net)
            h.put(Queue.COMPUTE, prog.compute)
            progs.append(prog)
        receivers = planned_receivers(p, idx)
        for v, prog in enumerate(progs):
            expect_sent[v] += sum(c.cls is RecordClass.SEND for c in prog.net + prog.compute)
            expect_frees[v] += sum(c.cls is RecordClass.DIR for c in prog.compute)
            for meta in prog.kv_sends:
                _, block, slice_ = enc.kv_key(meta.kv_id)
                off = layout.kv_layout.land_off[meta.seq]
                data = kv_slot_bytes(layout, meta.kv_id, seed)[off: off + meta.length]
                addr = layout.kv_address(meta.kv_id, meta.seq)
                for d in receivers[(meta.src, block, slice_, meta.route_id)]:
                    expect_packets[d] += 1
                    for k, b in enumerate(data):
                        landed[d][addr + k] = b
        if fault and idx == fault["step"]:
            from mcf.sim.benches.cluster_run import inject_link_fault
            await inject_link_fault(dut, n, fault["node"])
        t0 = cycle[0]
        for h in hosts:
            for q in Queue:
                await h.doorbell(q)
        limit = params.get("step_limit", 200_000)
        try:
            await _wait_marks(dut, hosts, [idx] * n, limit)
        except AssertionError as e:
            if not (fault and str(e).startswith("link fault at node ")):
                raise
            stopped = str(e)
            break
        # Replicas have no consumer in the communication-only program: the step is over when
        # every planned packet has landed (polled every POLL cycles).
        for h in hosts:
            while await h.read("land_packets") < expect_packets[h.i]:
                assert cycle[0] - t0 < limit, (f"step {idx} node {h.i}: packets missing; "
                                                f"counters {await snapshot(hosts)}")
                await ClockCycles(dut.aclk, POLL)
        step_cycles.append(cycle[0] - t0)
        # bytes: every planned byte landed; nothing else in the KV region written by the PL
        for h in hosts:
            kv = layout.kv
            region = h.mem[kv.kv_base: kv.kv_base + kv.kv_count * kv.kv_slot]
            own = {}
            for blk in range(1, idx + 1):
                for layer in range(p.model.layers):
                    kv_id = enc.kv_id(layer, blk, h.i)
                    base = kv_id * kv.kv_slot
                    for k, b in enumerate(kv_slot_bytes(layout, kv_id, seed)):
                        own[base + k] = b
            for off in range(len(region)):
                addr = kv.kv_base + off
                want = landed[h.i].get(addr, own.get(off, FILL))
                assert region[off] == want, (f"step {idx} node {h.i}: KV byte {addr:#x} = "
                                             f"{region[off]:#04x}, want {want:#04x}")
            c = await h.counters("land_")
            assert c["land_packets"] == expect_packets[h.i], (h.i, c)
            assert all(v == 0 for k, v in c.items() if k not in ("land_packets", "land_bytes")), c
            d = await h.counters("dir_")
            assert d["dir_frees"] == expect_frees[h.i], (h.i, d)
            assert d["dir_free_refused_owner"] == d["dir_free_refused_count"] == 0, d
            s = await h.counters("send_")
            assert s["send_packets"] == expect_sent[h.i], (h.i, s)
            assert all(s[f"send_{k}"] == 0 for k in ("drop_unmapped", "drop_bad_seq",
                                                      "drop_bad_record", "read_errors")), s
            await assert_rings_and_parsers_clean(h)
    if fault:
        assert stopped, f"the link fault armed before step {fault['step']} was not detected"
        await _links_quiet(dut)
    out = params.get("out")
    if out:
        got = {"nodes": n, "step_cycles": step_cycles, "kv_packets_landed": expect_packets}
        eth = eth_status(dut)
        if eth:
            got.update(eth=eth, links=await link_counters(hosts), aclk_ps=_aclk_ps,
                       cycles=cycle[0])
        if fault:
            got["stopped"] = stopped
        with open(out, "w") as f:
            json.dump(got, f)


async def _links_quiet(dut, every: int = 4000, polls: int = 100) -> None:
    """Until the MAC counters (:func:`eth_status`) held still for ``every`` cycles."""
    last = eth_status(dut)
    for _ in range(polls):
        await ClockCycles(dut.aclk, every)
        now = eth_status(dut)
        if now == last:
            return
        last = now
    raise AssertionError(f"the links are still busy after {every * polls} cycles: {last}")


def _act_rows(mem, addr: int, rows: int, cols: int) -> np.ndarray:
    return read_act(bytes(mem[addr: addr + rows * cols * 4]), rows, cols)


async def run_layer_step(dut, hosts, p, step, model, xa, expect_packets: list[int],
                         cycle: list[int], limit: int) -> int:
    """One MARS prefill step as the layer program on every node (``model``: the nodes'
    :class:`~mcf.node.layer.ModelImage` or a subclass; ``xa``: the prompt's ACT rows): the
    slice's DDR writes, routes, rings and ATTEND lists, both doorbells, then the step's MARKs
    and every planned landing (``expect_packets`` grows by the EMIT local copies and MARS's
    sends). Returns the step's cycles, doorbell to the last landing."""
    enc, m, idx = p.encoder, model.tokens, step.index
    progs = []
    for h in hosts:
        p0, _ = slice_positions(p, idx, h.i)
        for addr, raw in model.step_writes(np.arange(p0, p0 + m), xa[p0:p0 + m]).items():
            h.mem[addr: addr + len(raw)] = raw
        await h.apply(route_writes(step.routes.entries, h.i))
        prog = step_program(p, idx, h.i, h.net_retired, model=model)
        for addr, raw in prog.lists.items():
            h.mem[addr: addr + len(raw)] = raw
        h.net_retired += len(prog.net)
        h.put(Queue.NET, prog.net)
        h.put(Queue.COMPUTE, prog.compute)
        progs.append(prog)
        expect_packets[h.i] += p.model.layers * len(enc.fragments(m))   # EMIT local copies
    receivers = planned_receivers(p, idx)
    for prog in progs:
        for meta in prog.kv_sends:
            _, block, slice_ = enc.kv_key(meta.kv_id)
            for d in receivers[(meta.src, block, slice_, meta.route_id)]:
                expect_packets[d] += 1
    t0 = cycle[0]
    for h in hosts:
        for q in Queue:
            await h.doorbell(q)
    await _wait_marks(dut, hosts, [idx] * len(hosts), limit)
    for h in hosts:
        while await h.read("land_packets") < expect_packets[h.i]:
            assert cycle[0] - t0 < limit, (f"step {idx} node {h.i}: packets missing; "
                                            f"counters {await snapshot(hosts)}")
            await ClockCycles(dut.aclk, POLL)
    return cycle[0] - t0



async def check_layer_step(hosts, p, idx: int, model, layout: NodeLayout, gold,
                           expect_packets: list[int]) -> None:
    """After prefill step ``idx`` of the layer program, bit for bit against ``gold``
    (:func:`~mcf.golden.node_prefill.golden_prefill`'s layers): every node's DDR
    (:func:`mcf.cluster.checks.check_layer_memory`) and counters
    (:func:`mcf.cluster.checks.check_step_counters`: the landing count; no bad record, drop,
    bus error or timeout counter anywhere)."""
    names = step_counter_names(hosts[0].regmap)
    for h in hosts:
        check_layer_memory(h.mem, h.i, p, idx, model, layout, gold)
        check_step_counters(h.i, {n: await h.read(n) for n in names}, expect_packets[h.i])


@cocotb.test()
async def layer(dut):
    params = bench_params()
    seed = params.get("seed", 1)
    spec = tiny_model_spec(params.get("layers", 2))
    qls = [quantize_layer(random_layer(TINY, seed + 10 * i), TINY) for i in range(spec.layers)]

    def model_of(p, layout, cfg):
        return ModelImage(TINY, qls, cfg, layout, tokens=slice_positions(p, 1, 0)[1])

    p, layout, hosts, model = await _setup(dut, params, spec, model_of)
    n, S = len(hosts), p.num_chunks * p.chunk
    x = np.random.default_rng(seed).standard_normal((S, TINY.hidden)).astype(np.float32)
    slices = [slice_positions(p, b, s) for b in range(1, p.num_chunks + 1) for s in range(n)]
    gold = golden_prefill(x, qls, TINY, slices)
    cycle = cycle_counter(dut.aclk, dut)
    step_cycles, expect_packets = [], [0] * n
    for step in p.steps:
        idx = step.index
        step_cycles.append(await run_layer_step(dut, hosts, p, step, model, to_act(x),
                                                expect_packets, cycle,
                                                params.get("step_limit", 3_000_000)))
        await check_layer_step(hosts, p, idx, model, layout, gold, expect_packets)
    out = params.get("out")
    if out:
        engines = {h.i: {k: await h.read(k) for k in (
            "gemm_active_cycles", "gemm_steps", "att_records", "att_blocks", "kvr_tokens",
            "emit_tokens", "jobs_fence_cycles", "cmp_job_cycles", "cmp_emit_cycles",
            "cmp_attend_cycles", "cmp_busy_cycles")} for h in hosts}
        with open(out, "w") as f:
            json.dump({"nodes": n, "step_cycles": step_cycles, "cycles": cycle[0],
                       "engines": engines, "kv_packets_landed": expect_packets}, f)


async def refused_gemm_job(dut, h: Host, layout: NodeLayout, cfg) -> None:
    """A JOB whose template's GEMM job takes one row more than ``cfg``'s engine (the template
    as :class:`TemplateBuilder` writes one: the job, then its activation, weight and result
    descriptors) retires at once: ``jobs_bad_gemm`` counts it, the engine never sees it, the
    ``bad_record`` cause rises and the MARK behind it passes (the walker used to start the
    job's reads, which waited forever for the job the engine had refused)."""
    lim, rows = cfg.gemm_limits, cfg.gemm_rows
    m, k = lim.m_max + 1, lim.group
    assert not lim.accepts(m, k // lim.lanes, 1)
    at = (layout.base + layout.size + 0xFFF) & ~0xFFF        # past the node's regions
    qw = QuantWeight(np.zeros((rows, k), np.int8), np.ones((rows, 1), np.int64), 0, k)
    b = TemplateBuilder(0, rows, lim.lanes)
    b.gemm(at + 0x1000, m, k, (at + 0x2000, rows * k // 2), qw, at + 0x3000)
    image, n = template_image([b.entries], at)
    assert at + 0x3000 + rows * 4 * m <= len(h.mem)
    h.mem[at: at + len(image)] = image
    await h.write("JOBS_TABLE_LO", at & 0xFFFF_FFFF)
    await h.write("JOBS_TABLE_HI", at >> 32)
    await h.write("JOBS_TABLE_LEN", n)
    before = {r: await h.read(r) for r in ("jobs_jobs", "jobs_bad_gemm", "gemm_bad_jobs",
                                             "seq1_marks")}
    h.put(Queue.COMPUTE, [Cmd(RecordClass.JOB, Queue.COMPUTE,
                              arg=JOB_ARG.const({"template": 0}).as_bits()),
                          Cmd(RecordClass.MARK, Queue.COMPUTE, irq=True)])
    await h.doorbell(Queue.COMPUTE)
    for _ in range(100):
        if await h.read("seq1_marks") == before["seq1_marks"] + 1:
            break
        await ClockCycles(dut.aclk, 100)
    else:
        raise AssertionError(f"node {h.i}: the JOB of a refused GEMM job never retired")
    assert await h.read("jobs_jobs") == before["jobs_jobs"] + 1
    assert await h.read("jobs_bad_gemm") == before["jobs_bad_gemm"] + 1
    assert await h.read("gemm_bad_jobs") == before["gemm_bad_jobs"]
    st = h.regmap.register("IRQ_STATUS").unpack(await h.read("IRQ_STATUS"))
    assert st["bad_record"], st


@cocotb.test()
async def bad_input(dut):
    params = bench_params()
    params = {**params, "timeout": 3000}
    p, layout, hosts = await _setup(dut, params)
    enc = p.encoder
    h0, h1 = hosts[0], hosts[1]
    good_kv = enc.kv_id(0, 1, 0)          # node 0's block 1, layer 0: sent to node 1 below
    await h0.apply(owner_declarations(p, 1, 0))
    data = kv_slot_bytes(layout, good_kv, 7)
    base = layout.kv.kv_base + good_kv * layout.kv.kv_slot
    h0.mem[base: base + len(data)] = data
    await h0.apply(route_writes(p.steps[0].routes.entries, 0))
    good = [r.meta for r in p.step_records(1) if r.node == 0 and r.meta.op == Op.KV_REPLICA
            and r.meta.kv_id == good_kv]
    assert good
    op = META["op"]
    bad_op = Cmd(RecordClass.SEND, Queue.NET, src=PayloadSource.HDR,     # op code 7: unassigned
                 meta=good[0].replace(length=0).pack() | (((1 << op.width) - 1) << op.offset))
    # KV_COUNT written past the directory (the driver refuses it; a raw write here): the node
    # takes the directory's size, so a kv_id just past the directory is still unmapped
    directory = NODE_CONFIGS[params.get("config", "sim")].kv_count
    await h0.write("KV_COUNT", directory + 44)
    unmapped = Cmd(RecordClass.SEND, Queue.NET, src=PayloadSource.KV, meta=good[0].replace(
        kv_id=directory).pack())
    hdr_kv = Cmd(RecordClass.SEND, Queue.NET, src=PayloadSource.HDR,
                 meta=good[0].replace(length=0).pack())
    never = Cmd(RecordClass.DIR, Queue.COMPUTE, meta=good[0].replace(
        kv_id=enc.kv_id(1, 1, 1)).pack(), wait=2, arg=0)
    sends = [Cmd(RecordClass.SEND, Queue.NET, src=PayloadSource.KV, meta=m.pack(), wait=2)
             for m in good]
    h0.put(Queue.NET, [bad_op, unmapped, hdr_kv, *sends,
                       Cmd(RecordClass.MARK, Queue.NET, irq=True)])
    h0.put(Queue.COMPUTE, [never, Cmd(RecordClass.MARK, Queue.COMPUTE, irq=True)])
    await h0.doorbell(Queue.NET)
    await h0.doorbell(Queue.COMPUTE)
    # the FREE waits for KV that never comes: the watchdog halts COMPUTE
    await with_timeout(RisingEdge(h0.irq), _ps(200_000), "ps")
    for _ in range(100):
        st = h0.regmap.register("IRQ_STATUS").unpack(await h0.read("IRQ_STATUS"))
        if st["halt1"]:
            break
        await ClockCycles(dut.aclk, 200)
    assert st["halt1"] and st["bad_record"] and st["drop"], st
    assert await h0.read("seq1_timeouts") == 1
    halt = await h0.read("seq1_halt")
    assert halt & 1, halt
    assert await h0.read("cmd0_bad_records") == 1
    assert await h0.read("send_drop_unmapped") == 1
    await h0.write("SEQ1_CTRL", h0.regmap.register("SEQ1_CTRL").pack(run=1, skip=1))
    # ring overrun: a doorbell more than the ring's size ahead is ignored and counted
    await h0.write("CMD1_PROD", (h0.prod[1] + (1 << layout.cmd_log2) + 5) % (1 << 16))
    await ClockCycles(dut.aclk, 50)
    assert await h0.read("cmd1_overruns") == 1
    assert await h0.read("CMD1_HEAD") == h0.prod[1]
    for _ in range(400):
        if await h0.read("seq1_marks") == 1 and await h0.read("seq0_marks") == 1:
            break
        await ClockCycles(dut.aclk, 200)
    assert await h0.read("seq1_skipped") == 1
    await refused_gemm_job(dut, h1, layout, NODE_CONFIGS[params.get("config", "sim")])
    # node 1: the header-only KV packet dropped (bad seq/length), the good fragments landed
    for _ in range(400):
        if await h1.read("land_packets") == len(sends):
            break
        await ClockCycles(dut.aclk, 200)
    assert await h1.read("land_packets") == len(sends)
    assert await h1.read("land_drop_bad_seq") == 1
    for m in good:
        off = layout.kv_layout.land_off[m.seq]
        addr = layout.kv_address(m.kv_id, m.seq)
        assert h1.mem[addr: addr + m.length] == data[off: off + m.length]


@cocotb.test()
async def registers(dut):
    params = bench_params()
    p, layout, hosts = await _setup(dut, params)
    h = hosts[0]
    rng = random.Random(params.get("seed", 1))
    rm = h.regmap
    assert await h.read("ID") == rm.id_word
    skip = {"SEQ0_CTRL", "SEQ1_CTRL", "DIR_CTRL", "IRQ_STATUS", "LINK_MAP", "NODE"}
    for _addr, reg in rm:
        value = await h.read(reg.name)
        if reg.name in skip or not any(f.access is Access.RW for f in reg.fields):
            if all(f.access is Access.W for f in reg.fields):
                assert value == 0, (reg.name, value)
            continue
        if any(f.access in (Access.W, Access.RW1C) for f in reg.fields):
            continue                       # a write would strobe a table port: not here
        want = {f.name: rng.randrange(1 << f.width) for f in reg.fields}
        word = reg.pack(**want)
        await h.write(reg.name, word)
        back = await h.read(reg.name)
        assert back == word, (reg.name, hex(back), hex(word))
    errors = await h.read("BUS_ERRORS")
    unmapped = len(list(rm)) * WORD_BYTES
    resp = await h.axil.read(unmapped, WORD_BYTES)
    assert resp.resp == AxiResp.SLVERR
    resp = await h.axil.write(unmapped, b"\1\2\3\4")
    assert resp.resp == AxiResp.SLVERR
    assert await h.read("BUS_ERRORS") == errors + 2


@cocotb.test()
async def ingress_rate(dut):
    """Metadata records per cycle through a whole node: ``n`` header-only CONTROL sends (the
    barrier packets WAIT can count) in one ring batch on node 0 — ring reader, NET sequencer,
    send unit, packetizer, parser 0, local arbiter, local sink — from the doorbell write to the
    MARK's interrupt. No link is involved (a link frame costs several cycles of wire), so this is
    the node's own rate; every packet must be counted (``lsink_control``)."""
    params = bench_params()
    p, layout, hosts = await _setup(dut, params)
    h0 = hosts[0]
    n = params.get("records", 512)
    assert n < 1 << layout.cmd_log2, "one batch must fit the ring (params: cmd_log2)"
    barrier = Meta(op=Op.CONTROL, src=0, dst=0)
    cmds = [Cmd(RecordClass.SEND, Queue.NET, meta=barrier.pack(), src=PayloadSource.HDR)
            for _ in range(n)]
    h0.put(Queue.NET, [*cmds, Cmd(RecordClass.MARK, Queue.NET, irq=True)])
    cycles = 0

    async def count():
        nonlocal cycles
        while True:
            await RisingEdge(dut.aclk)
            cycles += 1

    counter = cocotb.start_soon(count())
    await h0.doorbell(Queue.NET)
    await with_timeout(RisingEdge(h0.irq), _ps(100 * n), "ps")
    counter.cancel()
    assert h0.regmap.register("IRQ_STATUS").unpack(await h0.read("IRQ_STATUS"))["mark0"]
    assert await h0.read("seq0_marks") == 1
    assert await h0.read("send_packets") == n
    assert await h0.read("lsink_control") == n
    assert await h0.read("cmd0_bad_records") == 0
    out = params.get("out")
    if out:
        with open(out, "w") as f:
            json.dump({"records": n + 1, "cycles": cycles,
                       "records_per_cycle": (n + 1) / cycles}, f)
