"""The paper's evaluation (§6) reproduced on the event-level system model (issue #15 §4,
docs/evaluation.md, ``mcf model --evaluate``).

Every TTFT here is :func:`.system.simulate_plan` of a :mod:`mcf.mars` plan — MARS's or a
baseline's schedule, unchanged — with the node-program cycles calibrated from the committed
bench JSON (:mod:`.calibration`); every traffic figure is the plan's own bytes × hops. Nothing
is fitted to the paper; the paper's numbers (:data:`PAPER_DECODE`,
:data:`mcf.mars.sweep.PAPER`) are only printed beside ours and used in the arithmetic of
:func:`paper_checks`.

What is computed (:func:`evaluate`):

* **Fig. 3** — TTFT against the prompt length (up to 8K) for MARS, ring, zigzag, PD and full
  replication on ``seq_nodes`` nodes, whole model and attention only;
* **Fig. 4** — per-rank KV memory (max and mean over the ranks) against the owner-only layout,
  and the active replica factor, over the steps of MARS's plan at ``seq_len`` (no simulation:
  the plan's directory);
* **Fig. 5** — TTFT and traffic against the chunk size ``B`` (MARS, ring, zigzag, whole model);
* **Table 1** — TTFT and traffic against ``N`` at ``seq_len`` (MARS, ring, zigzag; full
  replication in the whole-model scope), both scopes, MARS's speedup over the best fair
  baseline (:data:`mcf.mars.sweep.FAIR`);
* **Table 2's decode row** — tokens/s of one decode token on ``decode_nodes`` nodes, weights
  replicated or tensor-parallel (an all-reduce over the NIC after the attention and the MLP
  block of every layer), read through the node's stripe readers at their measured rate
  (:data:`AS_BUILT`), against the DDR roofline (:func:`decode`);
* **the crossover map** — MARS's speedup over the best fair baseline across the node's
  compute rate (every node cycle cost divided by ``k``: GEMM, vector, ATTEND, KV reader, EMIT;
  the NIC unchanged) × the link rate (a ring of ``map_nodes`` boards, the same link on every
  cable, :data:`mcf.abi.platform.LINK_LATENCY_S` per cable), with the paper's apparent
  operating point: the compute rate its Table 1 needs at N = 2 over ours, at the SFP+ rate;
* **the clock** — Table 1 and Table 2's decode row again at every clock of
  :attr:`EvalSpec.clocks_mhz` (the ABI's assumed 300 MHz and 250 MHz, issue #35 §5) besides the
  run's own (``mcf model --clock-mhz``): the cycles are the same, the seconds are cycles / clock,
  and the links keep their bit/s and cable seconds (:func:`.calibration.at_clock`).

What a TTFT covers: ``model`` — the layer program of every layer for the whole prompt (Q/K/V,
attention, O projection, MLP; no embedding lookup, no LM head); ``attention`` — the ATTEND
records of every layer alone. Never one layer.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from ..abi.framing import MAX_PAYLOAD
from ..abi.kv import kv_token_bytes
from ..abi.node_config import AXI_WIDTH
from ..abi.platform import ACLK_HZ, HP_PORTS, K26, LINK_LATENCY_S, SFP_RATE_BPS
from ..abi.query import query_bytes
from ..mars.sweep import FAIR, SCHEMES
from ..mars.sweep import PAPER as PAPER_TABLE1
from .calibration import BenchFigures, at_clock
from .network import LINKS, Network, cluster_for
from .rates import NodeRates
from .sweep import clock_line
from .system import SystemSpec, simulate_plan
from .work import NodeWork, prefill_ops, vector_elements

__all__ = ["EvalSpec", "SchemeRun", "MemoryTrace", "MapPoint", "OperatingPoint", "DecodeRow",
           "PaperCheck", "ClockRun", "Evaluation", "PAPER_DECODE", "SCOPES", "CLOCKS_MHZ",
           "AS_BUILT", "DECODE_LINKS", "LM_HEAD", "evaluate", "decode",
           "table2_decode", "decode_bytes", "decode_network", "decode_paths",
           "decode_targets", "decode_vector_elements", "paper_checks", "count_runs",
           "write_report", "markdown", "scaled_rates", "speedups"]

GIB = 2 ** 30
MIB = 2 ** 20

SCOPES = ("model", "attention")
"""What a TTFT covers: the whole layer program of every layer, or every layer's ATTEND alone."""

COVERS = {"model": "whole model: the layer program of all layers (Q/K/V, attention, O, MLP) "
                   "for the whole prompt; no embedding, no LM head",
          "attention": "attention only: the ATTEND records of all layers"}

PAPER_DECODE = {"nodes": 4, "tok_s": 17.3, "mhz": 200.0, "dsps": 127, "watts_per_node": 4.52,
                "efficiency": 0.81}
"""Paper Table 2, the MCF column (4 KR260 nodes, Qwen2.5-1.5B, W4): for comparison only."""

CLOCKS_MHZ = (ACLK_HZ / 1e6, 250.0)
"""The clocks Table 1 and Table 2's decode row are also reported at: the ABI's assumed ``aclk``
(:data:`mcf.abi.platform.ACLK_HZ`) and 250 MHz — which of them the node's logic depth supports
is for ``mcf bench depth`` to say (issue #35 §4-5); no fmax is claimed."""

SEQ_SCHEMES = ("mars", "ring", "zigzag", "pd", "full")
TABLE_SCHEMES = ("mars", "ring", "zigzag")
CHUNK_SCHEMES = ("mars", "ring", "zigzag")


@dataclass(frozen=True)
class EvalSpec:
    """What to evaluate. ``alpha`` / ``kv_budget_mib`` are MARS's (eq 15, ``S_node``) and
    ``setting`` names where they come from; ``link`` is the link assumption of Fig. 3–5 and
    Table 1 (:data:`.network.LINKS`)."""
    alpha: float
    kv_budget_mib: float
    setting: str = "paper"
    model: str = "qwen2.5-1.5b"
    node_config: str = "kr260"
    link: str = "kr260-ring"
    seq_len: int = 16384
    chunk: int = 1024
    nodes: tuple[int, ...] = (2, 4, 8, 16)            # Table 1
    memory_nodes: tuple[int, ...] = (8, 16)           # Fig. 4
    seq_lens: tuple[int, ...] = (1024, 2048, 4096, 8192)  # Fig. 3
    seq_nodes: int = 4
    chunks: tuple[int, ...] = (512, 1024, 2048)       # Fig. 5
    chunk_nodes: int = 8
    map_nodes: int = 8
    compute_scales: tuple[float, ...] = (1, 4, 16, 64, 256)
    link_gbps: tuple[float, ...] = (1, 10, 100)
    decode_nodes: int = 4
    decode_contexts: tuple[int, ...] = (1024, 16384)
    buffer_mib: float = 8.0
    clocks_mhz: tuple[float, ...] = CLOCKS_MHZ        # Table 1 and Table 2 again at each

    def __post_init__(self):
        if self.link not in LINKS:
            raise ValueError(f"unknown link {self.link!r} (one of {', '.join(LINKS)})")
        if not (math.isfinite(self.alpha) and self.alpha >= 0):
            raise ValueError(f"alpha must be a finite number >= 0, got {self.alpha}")
        if not (math.isfinite(self.kv_budget_mib) and self.kv_budget_mib > 0):
            raise ValueError(f"S_node must be a finite number > 0 MiB, got {self.kv_budget_mib}")
        counts = (("node counts", self.nodes), ("Fig. 4 node counts", self.memory_nodes),
                  ("Fig. 3 node count", (self.seq_nodes,)),
                  ("Fig. 5 node count", (self.chunk_nodes,)),
                  ("map node count", (self.map_nodes,)),
                  ("decode node count", (self.decode_nodes,)))
        for what, ns in counts:
            if not ns or any(n < 2 for n in ns):
                raise ValueError(f"{what} must all be >= 2, got {ns}")
        for what, seqs, b in (("seq-len", (self.seq_len,), self.chunk),
                              ("Fig. 3 seq-len", self.seq_lens, self.chunk)):
            for s in seqs:
                if b < 1 or s < 1 or s % b:
                    raise ValueError(f"{what} {s} must be a positive multiple of the chunk {b}")
        for b in self.chunks:
            if b < 1 or self.seq_len % b:
                raise ValueError(f"seq-len {self.seq_len} is not a multiple of the Fig. 5 "
                                 f"chunk {b}")
        for what, vals in (("compute scales", self.compute_scales),
                           ("link rates", self.link_gbps)):
            if not vals or any(not (math.isfinite(v) and v > 0) for v in vals):
                raise ValueError(f"{what} must be finite numbers > 0, got {vals}")
        if not self.decode_contexts or any(c < 1 for c in self.decode_contexts):
            raise ValueError(f"decode contexts must be >= 1, got {self.decode_contexts}")
        if any(not (math.isfinite(f) and f > 0) for f in self.clocks_mhz):
            raise ValueError(f"clocks must be finite numbers > 0 MHz, got {self.clocks_mhz}")

    def quick(self) -> EvalSpec:
        """A small version for tests and a first look (seconds, not minutes): 4K prompt,
        N = 2 and 4, a 2 x 2 map on 4 nodes."""
        return replace(self, seq_len=4096, nodes=(2, 4), memory_nodes=(2, 4),
                       seq_lens=(1024, 2048), seq_nodes=2, chunks=(1024, 2048), chunk_nodes=2,
                       map_nodes=4, compute_scales=(1, 256), link_gbps=(1, 10),
                       decode_contexts=(1024,))


@dataclass(frozen=True)
class SchemeRun:
    """One scheme modelled at one (N, S, B) in one scope."""
    scheme: str
    nodes: int
    seq_len: int
    chunk: int
    scope: str
    ttft_s: float
    compute_s: float          # Σ steps of the busiest node's compute
    exposed_s: float          # Σ steps of what the busiest node's compute does not cover
    comm_gib: float           # the plan's bytes x hops
    delivered_gib: float      # the plan's bytes received
    peak_kv_mib: float        # largest KV of any node at any step
    memory_ok: bool           # within S_node at every step


@dataclass(frozen=True)
class MemoryTrace:
    """Fig. 4: MARS's KV per rank over the steps of one plan."""
    nodes: int
    seq_len: int
    chunk: int
    budget_mib: float
    steps: tuple[int, ...]               # 1..C, then C + 1: after the convergence deadline
    max_kv_mib: tuple[float, ...]       # the fullest rank after each step
    mean_kv_mib: tuple[float, ...]
    owner_only_mib: tuple[float, ...]   # c·M_chunk / N: the layout without replicas
    replica_factor: tuple[float, ...]   # mean copies per slice after each step
    final_owner_only: bool


@dataclass(frozen=True)
class MapPoint:
    """One point of the crossover map."""
    scope: str
    compute_scale: float
    link_gbps: float
    ttft_s: dict                 # scheme -> TTFT
    exposed_s: dict              # scheme -> exposed communication
    best_fair: str
    speedup: float               # best fair TTFT / MARS TTFT


@dataclass(frozen=True)
class OperatingPoint:
    """Where the paper's Table 1 puts a node on the map: the compute rate its MARS TTFT at
    N = 2 needs, over the rate our node reaches in the same scope."""
    scope: str
    ops: float                   # operations of the scope at the paper's 16K prompt
    paper_rate_ops_s: float      # ops / (2 x 1.68 s)
    our_rate_ops_s: float        # ops of our run / (N x its compute time)
    compute_scale: float         # paper / ours
    link_gbps: float             # the KR260's SFP+ rate


@dataclass(frozen=True)
class DecodeRow:
    """One decode token on ``nodes`` nodes (see :func:`decode`)."""
    mode: str                    # "replicated" | "tensor-parallel"
    weight_path: str
    weight_gb_s: float
    nodes: int
    context: int
    weight_bytes_per_node: int
    weights_s: float             # streaming the node's weights once
    gemm_s: float                # the node's MACs at the GEMM's rate
    vector_s: float
    attention_s: float           # every layer's ATTEND over the node's KV shard
    network_s: float             # query multicast, state reduction (and TP's all-reduces)
    tok_s: float
    roofline_tok_s: float        # the DDR peak over the node's weights
    key: str = ""                # replicated_1, replicated_4, tp_4_kr260_ring, tp_4_switch10g
    link: str = "-"
    weight_bytes_per_cycle: float = 0.0
    layer_bytes: int = 0         # of weight_bytes_per_node: the layers' GEMM blobs and norms
    lm_head_bytes: int = 0       # of weight_bytes_per_node: the LM head rows and final norm
    ddr_bytes_per_node: int = 0  # weights in the node's DDR (mcf.cluster.tp.tp_node_bytes)
    network: dict = field(default_factory=dict)   # seconds by message kind


@dataclass(frozen=True)
class PaperCheck:
    """One piece of arithmetic on the paper's own numbers."""
    claim: str
    arithmetic: str
    finding: str


@dataclass(frozen=True)
class ClockRun:
    """Table 1 and Table 2's decode row at one clock."""
    clock_hz: float
    table_runs: tuple            # SchemeRun, as Evaluation.table_runs
    decode: tuple                # DecodeRow, as Evaluation.decode

    def to_dict(self, nodes) -> dict:
        return {"clock_hz": self.clock_hz, "clock_mhz": self.clock_hz / 1e6,
                "table1": {"runs": [asdict(r) for r in self.table_runs],
                           "speedups": speedups(self.table_runs, nodes)},
                "table2_decode": [asdict(d) for d in self.decode]}


def speedups(table_runs, nodes) -> list[dict]:
    """Table 1: per (scope, N), MARS over each fair baseline and the best of them."""
    out = []
    by = {(r.scope, r.nodes, r.scheme): r for r in table_runs}
    for scope in SCOPES:
        for n in nodes:
            if (scope, n, "mars") not in by:
                continue
            mars = by[scope, n, "mars"].ttft_s
            fair = {f: by[scope, n, f].ttft_s for f in FAIR}
            best = min(fair, key=fair.get)
            row = {"scope": scope, "nodes": n, "best_fair": best,
                   "speedup_vs_best_fair": fair[best] / mars,
                   **{f"speedup_vs_{f}": v / mars for f, v in fair.items()}}
            if (scope, n, "full") in by:
                row["mars_over_full"] = mars / by[scope, n, "full"].ttft_s
                row["full_fits_budget"] = by[scope, n, "full"].memory_ok
            out.append(row)
    return out


@dataclass
class Evaluation:
    spec: EvalSpec
    clock_hz: float
    calibration: dict
    seq_runs: list                # Fig. 3: SchemeRun
    memory: list                  # Fig. 4: MemoryTrace
    chunk_runs: list              # Fig. 5: SchemeRun
    table_runs: list              # Table 1: SchemeRun
    crossover: list               # MapPoint
    operating_points: list        # OperatingPoint
    decode: list                  # DecodeRow
    checks: list                  # PaperCheck
    notes: dict = field(default_factory=dict)
    clocks: list = field(default_factory=list)   # ClockRun: the run's clock first, then the rest

    # --- the targets ---------------------------------------------------------------------
    def speedups(self) -> list[dict]:
        """Table 1: per (scope, N), MARS over each fair baseline and the best of them."""
        return speedups(self.table_runs, self.spec.nodes)

    def targets(self) -> dict:
        """The issue's targets as measured here, reported (never tuned): MARS's TTFT over the
        best fair baseline's at every N and grid point (worst = largest), MARS over full
        replication wherever full replication fits ``S_node``, the largest map speedup."""
        ratios = [("table", s["scope"], s["nodes"], None, None, 1 / s["speedup_vs_best_fair"])
                  for s in self.speedups()]
        ratios += [("map", p.scope, self.spec.map_nodes, p.compute_scale, p.link_gbps,
                    1 / p.speedup) for p in self.crossover]
        worst = max(ratios, key=lambda r: r[-1], default=None)
        full = []
        runs = self.seq_runs + self.table_runs
        by = {(r.scope, r.nodes, r.seq_len, r.chunk, r.scheme): r for r in runs}
        for (scope, n, s, b, scheme), r in sorted(by.items()):
            if scheme == "full" and r.memory_ok and (scope, n, s, b, "mars") in by:
                full.append({"scope": scope, "nodes": n, "seq_len": s, "chunk": b,
                             "mars_over_full": by[scope, n, s, b, "mars"].ttft_s / r.ttft_s})
        best = max(self.crossover, key=lambda p: p.speedup, default=None)
        out = {
            "worst_mars_over_best_fair": None if worst is None else {
                "where": worst[0], "scope": worst[1], "nodes": worst[2],
                "compute_scale": worst[3], "link_gbps": worst[4], "ratio": worst[5]},
            "mars_within_1_02_of_best_fair": worst is None or worst[-1] <= 1.02,
            "full_replication_fits": full,
            "mars_within_5pc_of_full": all(f["mars_over_full"] <= 1.05 for f in full),
            "largest_map_speedup": None if best is None else {
                "scope": best.scope, "compute_scale": best.compute_scale,
                "link_gbps": best.link_gbps, "speedup": best.speedup,
                "best_fair": best.best_fair},
        }
        return out

    def to_dict(self) -> dict:
        return {
            "spec": asdict(self.spec), "clock_hz": self.clock_hz,
            "calibration": dict(self.calibration), "covers": dict(COVERS),
            "fig3": [asdict(r) for r in self.seq_runs],
            "fig4": [asdict(m) for m in self.memory],
            "fig5": [asdict(r) for r in self.chunk_runs],
            "table1": {"runs": [asdict(r) for r in self.table_runs],
                       "speedups": self.speedups(),
                       "paper": {s: {str(n): {"ttft_s": v[0], "comm_gib": v[1]}
                                     for n, v in d.items()} for s, d in PAPER_TABLE1.items()}},
            "table2_decode": {"rows": [asdict(d) for d in self.decode],
                              "tok_s": decode_targets(self.decode,
                                                      min(self.spec.decode_contexts)),
                              "paper": dict(PAPER_DECODE)},
            "crossover": {"nodes": self.spec.map_nodes,
                          "points": [asdict(p) for p in self.crossover],
                          "operating_points": [asdict(o) for o in self.operating_points]},
            "paper_checks": [asdict(c) for c in self.checks],
            "targets": self.targets(),
            "clocks": [c.to_dict(self.spec.nodes) for c in self.clocks],
            "notes": dict(self.notes),
        }


# --- helpers ---------------------------------------------------------------------------------

def scaled_rates(rates: NodeRates, k: float) -> NodeRates:
    """A node ``k`` times faster in everything it computes and reads from its DDR (GEMM,
    vector passes, ATTEND records and pairs, the tiled prefill's records, the KV reader, EMIT);
    the NIC is unchanged."""
    if k == 1:
        return rates
    return replace(rates, gemm_macs_per_cycle=rates.gemm_macs_per_cycle * k,
                   vector_cycles_per_element=rates.vector_cycles_per_element / k,
                   decode_vector_cycles_per_element=rates.decode_vector_cost / k,
                   attend_record_cycles=rates.attend_record_cycles / k,
                   attend_pair_cycles=rates.attend_pair_cycles / k,
                   kv_read_bytes_per_cycle=rates.kv_read_bytes_per_cycle * k,
                   emit_cycles_per_byte=rates.emit_cycles_per_byte / k,
                   tile_record_cycles=rates.tile_record_cycles / k,
                   tile_row_cycles=rates.tile_row_cycles / k,
                   tile_row_block_cycles=rates.tile_row_block_cycles / k,
                   tile_key_cycles=rates.tile_key_cycles / k,
                   tile_row_key_cycles=rates.tile_row_key_cycles / k,
                   sources=rates.sources | {"scaled": f"every node cycle cost / {k:g}"})


def scope_ops(model, seq_len: int, scope: str) -> float:
    """Operations of a causal prefill of ``seq_len`` tokens (:func:`.work.prefill_ops`)."""
    return prefill_ops(model, seq_len, scope)


def other_clocks(spec: EvalSpec, clock_hz: float) -> tuple[float, ...]:
    """The clocks (Hz) of ``spec.clocks_mhz`` besides the run's own ``clock_hz``, in order."""
    out: list[float] = []
    for mhz in spec.clocks_mhz:
        hz = mhz * 1e6
        if not math.isclose(hz, clock_hz) and not any(math.isclose(hz, o) for o in out):
            out.append(hz)
    return tuple(out)


def count_runs(spec: EvalSpec, clock_hz: float = ACLK_HZ) -> int:
    """How many model runs :func:`evaluate` makes at ``clock_hz`` (for a progress bar)."""
    seq = len(SCOPES) * len(spec.seq_lens) * len(SEQ_SCHEMES)
    table = len(spec.nodes) * (len(TABLE_SCHEMES) * len(SCOPES) + 1)
    chunk = len(spec.chunks) * len(CHUNK_SCHEMES)
    grid = len(spec.compute_scales) * len(spec.link_gbps) * len(SCOPES) * (1 + len(FAIR))
    return seq + table * (1 + len(other_clocks(spec, clock_hz))) + chunk + grid


class _Runner:
    """Builds each plan once and models it in each scope it is asked for."""

    def __init__(self, spec: EvalSpec, fig: BenchFigures, progress):
        from ..mars import get_model
        self.spec, self.fig, self.progress = spec, fig, progress
        self.model = get_model(spec.model)
        self.rates = NodeRates.calibrated(fig, spec.node_config, self.model)
        self.plans: dict = {}

    def plan(self, scheme: str, n: int, seq_len: int, chunk: int, link: str | None = None,
             link_gbps: float | None = None):
        from ..mars import make_cluster, plan
        key = (scheme, n, seq_len, chunk, link, link_gbps)
        if key not in self.plans:
            sp = self.spec
            if link_gbps is None:
                cl = cluster_for(link or sp.link, n, sp.kv_budget_mib,
                                 node_config=sp.node_config, buffer_mib=sp.buffer_mib)
            else:
                cl = make_cluster(n, sp.kv_budget_mib, node_config=sp.node_config,
                                  buffer_mib=sp.buffer_mib, topology="ring",
                                  link_gbps=link_gbps, link_latency_us=LINK_LATENCY_S * 1e6)
            policy, unchunked, bidir, _ = SCHEMES[scheme]
            b = seq_len if unchunked else chunk
            self.plans[key] = plan(self.model, cl, seq_len, b, policy, sp.alpha,
                                   bidirectional=bidir, streams=not unchunked)
        return self.plans[key]

    def run(self, scheme: str, n: int, seq_len: int, chunk: int, scope: str,
            rates: NodeRates | None = None, fig: BenchFigures | None = None, **kw) -> SchemeRun:
        fig = fig or self.fig
        if self.progress is not None:
            clock = "" if fig is self.fig else f" {fig.clock_hz / 1e6:g} MHz"
            self.progress(f"{scheme} N={n} S={seq_len} B={chunk} {scope}{clock}")
        p = self.plan(scheme, n, seq_len, chunk, **kw)
        r = simulate_plan(p, fig, SystemSpec(scope=scope), rates or self.rates)
        c, t = fig.clock_hz, p.totals
        return SchemeRun(scheme, n, seq_len, p.chunk, scope, r.ttft_s, r.compute_cycles / c,
                         r.exposed_cycles / c, t.comm_bytes / GIB, t.delivered_bytes / GIB,
                         t.peak_node_kv_bytes / MIB, t.memory_ok)


def _memory(p) -> MemoryTrace:
    """The plan's KV per rank after each step's store, then (step ``C + 1``) after the
    convergence deadline: the layout decode starts from."""
    n, m_chunk = p.cluster.nodes, p.model.m_chunk(p.chunk)
    final = p.totals.final_node_kv_bytes
    c = p.num_chunks
    return MemoryTrace(
        n, p.seq_len, p.chunk, p.cluster.kv_budget / MIB,
        tuple(s.index for s in p.steps) + (c + 1,),
        tuple(max(s.node_kv_bytes) / MIB for s in p.steps) + (max(final) / MIB,),
        tuple(sum(s.node_kv_bytes) / n / MIB for s in p.steps) + (sum(final) / n / MIB,),
        tuple(min(s.index, c) * m_chunk / n / MIB for s in p.steps) + (c * m_chunk / n / MIB,),
        tuple(float(s.active_replica_factor) for s in p.steps) + (sum(final) / (c * m_chunk),),
        p.totals.final_owner_only)


# --- decode (Table 2) ------------------------------------------------------------------------

def _path_cycles(net: Network, links, payloads) -> float:
    """Cycles for ``payloads`` to cross ``links`` (hop by hop, store and forward per packet:
    the first packet's hops, then the rest of the packets at the slowest link)."""
    if not links:
        return 0.0
    per = [[net.packet_cycles(link, p, k == 0) for p in payloads] for k, link in enumerate(links)]
    first = sum(c[0] + net.link_latency(link) for c, link in zip(per, links))
    return first + max(sum(c[1:]) for c in per)


def _round_trip(net: Network, topo, root: int, down, up) -> float:
    """The slowest node's ``down`` payloads from ``root`` plus its ``up`` payloads back."""
    return max((_path_cycles(net, topo.path(root, d), down)
                + _path_cycles(net, topo.path(d, root), up)
                for d in range(topo.n) if d != root), default=0.0)


AS_BUILT = "stripe readers (as built)"
""":class:`DecodeRow` ``weight_path`` of the node as built: every GEMM reads its weights through
the stripe readers, each matrix from the four HP ports in lockstep into the 512-bit ``w_in``
(docs/node.md §4), at the rate ``mcf bench decode`` measured against DDR ports at an assumed
90 % controller efficiency
(:attr:`.calibration.BenchFigures.stripe_weight_bytes_per_cycle`)."""
DECODE_LINKS = ("kr260-ring", "switch10g")
"""The links tensor-parallel decode is reported on (Table 2's ``tp_4_<link>`` rows)."""
LM_HEAD = ("the final RMSNorm and the tied LM head run on the node as a JOB (mcf.node.head: "
           "RMSNORM, REQUANT and the head GEMM in vocabulary slices through the stripe readers; "
           "the host reads the logits and picks the token); every row counts the head's bytes and "
           "MACs that way (tensor-parallel: the vocabulary split over the nodes in whole GEMM "
           "tiles, mcf.golden.tp_decode.vocab_split, each node's logit slice read by its own host "
           "and one (max, index) pair per node gathered between the hosts - modelled as 8 bytes "
           "per node over the node links to the root)")


def decode_bytes(model, nodes: int) -> tuple[int, int, int, int]:
    """Weight bytes one decode token streams on the busiest of ``nodes`` tensor-parallel nodes
    (``nodes = 1``: one node, everything): ``(total, layers, lm_head, ddr)`` — its GEMM blobs of
    every layer as the node stores them (:func:`mcf.golden.tp_decode.node_weight_bytes`: INT4
    codes, a 16-bit scale per row and group, a 32-bit bias per row, the two RMSNorm weights;
    :func:`mcf.golden.tp_decode.tp_split`'s shards), its rows of the tied LM head
    (:func:`~mcf.golden.tp_decode.gemm_blob_bytes` of ``⌈vocab / N⌉ × hidden``) and the final
    RMSNorm's weights; ``ddr`` is the node's weights in DDR as the TP run lays them out
    (:func:`mcf.cluster.tp.tp_node_bytes`: its layer shards and the whole INT4 embedding table
    the host keeps, the busiest node)."""
    from ..cluster.tp import tp_node_bytes
    from ..golden.tp_decode import gemm_blob_bytes, node_weight_bytes, tp_split
    from ..model.config import Qwen2Config
    cfg = Qwen2Config(model.hidden, model.layers, model.q_heads, model.kv_heads, model.head_dim,
                      model.intermediate, max(model.vocab, 1))
    lay = cfg.layer
    split = tp_split(lay, nodes)
    layers = max(node_weight_bytes(lay, split, i, model.layers) for i in range(nodes))
    head = (gemm_blob_bytes(-(-model.vocab // nodes), model.hidden, lay.group)
            + model.hidden * 4) if model.vocab else 0
    ddr = max(tp_node_bytes(cfg, split, i) for i in range(nodes)) if model.vocab else layers
    return layers + head, layers, head, ddr


def _decode_macs(model, nodes: int) -> int:
    """MACs of one decode token on the busiest of ``nodes`` TP nodes (its shards and head rows;
    row-parallel shards as the whole groups they touch)."""
    from ..golden.qwen_layer import LayerConfig
    from ..golden.tp_decode import tp_split
    lay = LayerConfig(model.hidden, model.q_heads, model.kv_heads, model.head_dim,
                      model.intermediate)
    s = tp_split(lay, nodes)
    h = model.hidden

    def padded(r):
        j0, j1 = s.groups(r)
        return (j1 - j0) * s.group

    per = max((s.q_rows(i)[1] - s.q_rows(i)[0]) * h
              + 2 * (s.kv_rows[i][1] - s.kv_rows[i][0]) * h + h * padded(s.q_rows(i))
              + 2 * (s.inter[i][1] - s.inter[i][0]) * h + h * padded(s.inter[i])
              for i in range(nodes))
    return model.layers * per + -(-model.vocab // nodes) * h


def decode_vector_elements(model, nodes: int) -> int:
    """Vector elements per layer of one decode token on each of ``nodes`` TP nodes (``1``:
    :func:`.work.vector_elements`' two JOBs): the passes over the whole hidden row (RMSNorm and
    requantise before Q/K/V and before the MLP, the residual adds) run on every node, as the
    TP golden model does (:func:`mcf.golden.tp_decode.tp_layer`); the passes over a node's
    column-parallel shard (RoPE of its Q heads, its K/V rows, the query and attention-row
    requantise, SiLU·mul and its requantise of its intermediate rows) are ``1/N`` of them
    (rounded up)."""
    va, vb = vector_elements(model)
    if nodes == 1:
        return va + vb
    h, nq = model.hidden, model.q_heads * model.head_dim
    nkv, inter = model.kv_heads * model.head_dim, model.intermediate
    whole = 2 * h + 4 * h
    if whole + 3 * nq + 2 * nkv + 2 * inter != va + vb:
        raise AssertionError("vector_elements changed: update decode_vector_elements")
    return whole + -(-(3 * nq + 2 * nkv + 2 * inter) // nodes)


def _parts(total: int) -> tuple[int, ...]:
    """``total`` bytes cut into payloads of at most ``MAX_PAYLOAD``."""
    return (MAX_PAYLOAD,) * (total // MAX_PAYLOAD) + ((total % MAX_PAYLOAD,)
                                                      if total % MAX_PAYLOAD else ())


def decode_network(fig: BenchFigures, model, nodes: int, link: str, mode: str,
                   node_config: str = "kr260", buffer_mib: float = 8.0) -> dict:
    """Cycles of one decode token's messages on ``nodes`` nodes over ``link``, by kind (every
    layer): ``attention`` — the query multicast from the root and the softmax states reduced
    back (one wave per ``reduce_slots`` heads); tensor-parallel also ``kv_gather`` — every
    node's K/V row shard (32-bit ACT words) to the token's root; ``allreduce_max`` — the two
    row-parallel GEMMs' (O, down) scale all-reduce (``ReduceOp.MAX``, :data:`ACC_LANES` lanes
    of :func:`mcf.abi.tp.absmax_lanes`); ``allreduce_sum`` — their partial accumulators
    (``ReduceOp.SUM``, ``hidden`` x :data:`mcf.abi.tp.ACC_LANES` 32-bit lanes, cut into
    ``MAX_PAYLOAD`` payloads); and once per token ``head_gather`` — each node's (max logit,
    index) of its vocabulary rows to the root. An all-reduce is modelled as a reduction to the
    root and a multicast back (the slowest node's round trip, :func:`_round_trip`)."""
    from ..abi.nic import LANE_BYTES
    from ..abi.tp import ACC_LANES
    from ..mars.metadata import payloads as cut
    if nodes == 1:
        return {"attention": 0.0}
    cl = cluster_for(link, nodes, 1 << 20, node_config=node_config, buffer_mib=buffer_mib)
    net = Network(cl.topology, fig)
    pay = cut(model, cl.max_payload, cl.reduce_slots)
    L, d = model.layers, model.head_dim
    kvs = 0.0
    for wave in pay.waves:
        down = tuple(query_bytes(h, d) for _, h in wave)
        up = (pay.state_bytes,) * sum(h for _, h in wave)
        kvs += _round_trip(net, cl.topology, 0, down, up)
    out = {"attention": L * kvs}
    if mode == "replicated":
        return out
    topo = cl.topology
    kv_rows = -(-model.kv_heads * d // nodes)
    gather = max(_path_cycles(net, topo.path(i, 0), _parts(2 * kv_rows * LANE_BYTES))
                 for i in range(1, nodes))
    mx = (ACC_LANES * LANE_BYTES,)
    sums = _parts(model.hidden * ACC_LANES * LANE_BYTES)
    out |= {"kv_gather": L * gather,
            "allreduce_max": L * 2 * _round_trip(net, topo, 0, mx, mx),
            "allreduce_sum": L * 2 * _round_trip(net, topo, 0, sums, sums),
            "head_gather": max(_path_cycles(net, topo.path(i, 0), (2 * LANE_BYTES,))
                               for i in range(1, nodes))}
    return out


def decode_paths(fig: BenchFigures) -> tuple[tuple[str, float], ...]:
    """``(weight_path, bytes per cycle)`` of the decode row's weight stream: the node as built,
    :data:`AS_BUILT`, at the rate ``decode.json`` measured with DDR ports at the assumed 90 %
    efficiency. Raises :class:`~.calibration.CalibrationError` when there is no
    ``decode.json``."""
    from .calibration import CalibrationError
    if fig.stripe_weight_bytes_per_cycle is None:
        raise CalibrationError("Table 2's decode row needs decode.json (run `mcf bench "
                               "decode`)")
    return ((AS_BUILT, fig.stripe_weight_bytes_per_cycle),)


def _decode_weights_note(fig: BenchFigures) -> str:
    """Where the decode row's weight rate comes from."""
    src = fig.sources
    if fig.stripe_weight_bytes_per_cycle is None:
        return f"{AS_BUILT}: {src.get('stripe_weight_bytes_per_cycle', 'no decode.json')}"
    return (f"{AS_BUILT}: {fig.stripe_weight_bytes_per_cycle:g} B/cycle "
            f"({src['stripe_weight_bytes_per_cycle']}; DDR ports idle "
            f"{100 * (1 - fig.stripe_ddr_efficiency):.0f} % of cycles, an assumed controller "
            f"efficiency of {fig.stripe_ddr_efficiency:g} of the {HP_PORTS} ports' "
            f"{HP_PORTS * AXI_WIDTH // 8} B/cycle; "
            f"{fig.stripe_ideal_weight_bytes_per_cycle:g} B/cycle with ideal ports, "
            f"{src['stripe_ideal_weight_bytes_per_cycle']}); measured on the stripe reader "
            f"alone (the node-top runs check the stripe path bit for bit, publish no rate), "
            f"the GEMM assumed to take a 512-bit w_in word every cycle at M = 1, as the "
            f"bench's consumer does")


def decode(fig: BenchFigures, rates: NodeRates, model, nodes: int, context: int,
           link: str = "kr260-ring", buffer_mib: float = 8.0,
           modes: tuple[str, ...] = ("replicated", "tensor-parallel")) -> list[DecodeRow]:
    """One decode token (batch 1) after a ``context``-token prompt, KV-stationary on ``nodes``
    nodes (each holds ``⌈context / N⌉`` tokens of KV), per layer in order: the linear layers,
    the query multicast from the root, every node's ATTEND over its shard, the softmax states
    reduced back, and for tensor parallelism the messages of :func:`decode_network`.

    * ``replicated`` — every node holds all weights; the root streams all of them
      (:func:`decode_bytes` at N = 1: every layer and the LM head) and runs every MAC;
      ``nodes = 1`` is one board (no network). ``tensor-parallel`` — each node streams and
      multiplies its shards (:func:`mcf.golden.tp_decode.tp_split`, the busiest node) and
      ``1/N`` of the LM head's rows; the vector passes over its shards are split, those over
      the whole hidden row are not (:func:`decode_vector_elements`).
    * Linear time per token = max(weights / weight bandwidth, MACs / the GEMM's measured
      prefill rate) + vector elements x cycles per element; the weight bandwidth is
      :func:`decode_paths`: the stripe readers of the node as built at their measured bytes
      per cycle (``mcf bench decode``, DDR ports idle 10 % of cycles: assumed).
    * The roofline is the PL's DDR reach (``HP_PORTS`` x 16 B per cycle at the clock; at
      300 MHz that is DDR4-2400 x 64 bit, 19.2 GB/s) over the node's weight bytes.
    * Where the LM head runs: :data:`LM_HEAD`.
    """
    c = fig.clock_hz
    L = model.layers
    shard = -(-context // nodes)
    w = NodeWork(1, 0, 0, 0, 0, model.kv_heads, shard * model.q_heads,
                 shard * model.kv_heads * kv_token_bytes(model.head_dim), 0)
    attention = L * rates.attend(w) / c
    ddr_peak = HP_PORTS * AXI_WIDTH // 8 * c
    paths = decode_paths(fig)
    rows = []
    for mode in modes:
        share = 1 if mode == "replicated" else nodes
        vector = L * decode_vector_elements(model, share) * rates.decode_vector_cost / c
        wb, layers_b, head_b, ddr_b = decode_bytes(model, share)
        gemm = _decode_macs(model, share) / rates.gemm_macs_per_cycle / c
        net = decode_network(fig, model, nodes, link, mode, rates.config, buffer_mib)
        net_s = sum(net.values()) / c
        key = (f"replicated_{nodes}" if mode == "replicated"
               else f"tp_{nodes}_{link.replace('-', '_')}")
        for path, bpc in paths:
            weights = wb / (bpc * c)
            t = max(weights, gemm) + vector + attention + net_s
            rows.append(DecodeRow(mode, path, bpc * c / 1e9, nodes, context, wb, weights,
                                  gemm, vector, attention, net_s, 1 / t, ddr_peak / wb,
                                  key=key, link=link if nodes > 1 else "-",
                                  weight_bytes_per_cycle=bpc, layer_bytes=layers_b,
                                  lm_head_bytes=head_b, ddr_bytes_per_node=ddr_b,
                                  network={k: v / c for k, v in net.items()}))
    return rows


def table2_decode(fig: BenchFigures, rates: NodeRates, model, nodes: int, context: int,
                  link: str = "kr260-ring", buffer_mib: float = 8.0) -> list[DecodeRow]:
    """Table 2's decode rows at ``context``: ``replicated_1`` (one board), then tensor-parallel
    on ``nodes`` nodes over every link of :data:`DECODE_LINKS` other than ``link``, then
    ``replicated_<nodes>`` and ``tp_<nodes>_<link>`` on ``link`` (last, so that a reader keyed
    by mode finds the run's own link's rows), each for every weight path of
    :func:`decode_paths` (one: the node as built)."""
    rows = decode(fig, rates, model, 1, context, link, buffer_mib, modes=("replicated",))
    for other in DECODE_LINKS:
        if other != link:
            rows += decode(fig, rates, model, nodes, context, other, buffer_mib,
                           modes=("tensor-parallel",))
    return rows + decode(fig, rates, model, nodes, context, link, buffer_mib)


def _row_order(r) -> tuple:
    """Reading order of Table 2's decode rows: replicated by N, then tensor-parallel by link."""
    return r.mode != "replicated", r.nodes, DECODE_LINKS.index(r.link) if r.link in \
        DECODE_LINKS else -1


def decode_targets(rows, context: int = 1024) -> dict:
    """``tok_s.<key>`` of every row of the node as built (:data:`AS_BUILT`) at ``context``
    (issue #34's figures; the targets reported, never tuned): ``{"context": context,
    "as_built": {key: tok/s}}``."""
    out: dict = {"context": context, "as_built": {}}
    for r in sorted(rows, key=_row_order):
        if r.context == context and r.weight_path == AS_BUILT:
            out["as_built"][r.key] = r.tok_s
    return out


# --- the paper's own arithmetic --------------------------------------------------------------

def paper_checks(model, seq_len_paper: int = 16384, chunk: int = 1024,
                 clock_hz: float = ACLK_HZ) -> list[PaperCheck]:
    """Where the paper's numbers need more compute than its hardware has, or disagree with
    its own equations (the K26's DSP peak at ``clock_hz``)."""
    from ..mars.cost import c_ring
    from ..mars.setting import weight_bytes
    out = []
    k26 = 4 * K26["DSP"] * clock_hz
    own = 4 * PAPER_DECODE["dsps"] * PAPER_DECODE["mhz"] * 1e6
    t2, t16 = PAPER_TABLE1["mars"][2][0], PAPER_TABLE1["mars"][16][0]
    s = seq_len_paper
    full = scope_ops(model, s, "model")
    attn = scope_ops(model, s, "attention")
    covers = (("the whole model", full), ("every layer's attention", attn),
              ("one layer", full / model.layers), ("one layer's attention", attn / model.layers))
    for what, ops in covers:
        need = ops / (2 * t2)
        out.append(PaperCheck(
            f"Table 1: MARS {t2} s at N = 2, {s // 1024}K, if it covers {what}",
            f"{ops:.3g} ops / (2 nodes x {t2} s) = {need / 1e12:.3g} Tops/s per node",
            f"{need / k26:.3g}x the K26's DSP peak (4 x {K26['DSP']} DSPs x "
            f"{clock_hz / 1e6:g} MHz = {k26 / 1e12:.2f} Tops/s); {need / own:.3g}x the paper's "
            f"own design (4 x {PAPER_DECODE['dsps']} DSPs x {PAPER_DECODE['mhz']:g} MHz = "
            f"{own / 1e12:.2f} Tops/s)"))
    out.append(PaperCheck(
        "Table 1: MARS scales 2 -> 16 nodes",
        f"{t2} s / {t16} s = {t2 / t16:.2f}x for 8x the nodes",
        "sub-linear, as the paper says; compute alone would give 8x"))
    m_chunk = model.m_chunk(chunk)
    cc = s // chunk
    parts = []
    for n in (2, 16):
        parts.append(f"N = {n}: {c_ring(m_chunk, n, cc, 1.0) / GIB:.2f} GiB")
    g = PAPER_TABLE1["ring"]
    out.append(PaperCheck(
        "Table 1: ring traffic (Comm GiB) against eq 21",
        f"eq 21 with h_ring = 1, B = {chunk}, C = {cc}: " + ", ".join(parts)
        + f" ({(16 - 1) / (2 - 1):.0f}x); the paper: {g[2][1]} -> {g[16][1]} GiB "
        f"({g[16][1] / g[2][1]:.2f}x)",
        "the paper's column grows far slower than its own eq 21: it must count something else "
        "(per node, per link, or a smaller scope)"))
    wb = weight_bytes(model)
    need_bw = PAPER_DECODE["tok_s"] * wb
    ports_200 = HP_PORTS * AXI_WIDTH // 8 * PAPER_DECODE["mhz"] * 1e6
    out.append(PaperCheck(
        f"Table 2: {PAPER_DECODE['tok_s']} tok/s on {PAPER_DECODE['nodes']} nodes, weights "
        "replicated",
        f"{PAPER_DECODE['tok_s']} tok/s x {wb / 1e9:.3f} GB of INT4 weights per token = "
        f"{need_bw / 1e9:.1f} GB/s on the root; {HP_PORTS} HP ports x 16 B x "
        f"{PAPER_DECODE['mhz']:g} MHz = {ports_200 / 1e9:.1f} GB/s",
        ("more than the PL can read at the paper's own 200 MHz clock: the row needs weights "
         "split over the nodes (tensor parallel) or a faster clock" if need_bw > ports_200
         else "within the PL's DDR reach")))
    eff_node = PAPER_DECODE["tok_s"] / PAPER_DECODE["watts_per_node"]
    eff_all = PAPER_DECODE["tok_s"] / (PAPER_DECODE["nodes"] * PAPER_DECODE["watts_per_node"])
    out.append(PaperCheck(
        f"Table 2: power efficiency {PAPER_DECODE['efficiency']} tok/J",
        f"{PAPER_DECODE['tok_s']} / {PAPER_DECODE['watts_per_node']} W = {eff_node:.2f}; "
        f"{PAPER_DECODE['tok_s']} / ({PAPER_DECODE['nodes']} x "
        f"{PAPER_DECODE['watts_per_node']} W) = {eff_all:.2f}",
        "neither per-node nor cluster power gives the table's figure"))
    return out


# --- the evaluation --------------------------------------------------------------------------

def evaluate(spec: EvalSpec, fig: BenchFigures, progress=None) -> Evaluation:
    """Every figure and table. ``progress(label)`` is called before each model run
    (:func:`count_runs` of them). Raises :class:`mcf.mars.PlanError` for a plan MARS
    refuses."""
    run = _Runner(spec, fig, progress)
    seq_runs = [run.run(s, spec.seq_nodes, seq, spec.chunk, scope)
                for scope in SCOPES for seq in spec.seq_lens for s in SEQ_SCHEMES]

    def table1(f: BenchFigures) -> list[SchemeRun]:
        out = []
        for scope in SCOPES:
            for n in spec.nodes:
                schemes = TABLE_SCHEMES + (("full",) if scope == "model" else ())
                out += [run.run(s, n, spec.seq_len, spec.chunk, scope, fig=f) for s in schemes]
        return out

    def decode_rows(f: BenchFigures) -> list[DecodeRow]:
        return [row for ctx in spec.decode_contexts
                for row in table2_decode(f, run.rates, run.model, spec.decode_nodes, ctx,
                                         spec.link, spec.buffer_mib)]

    table = table1(fig)
    clocks = [(fig, table)] + [(f, table1(f)) for f in
                               (at_clock(fig, hz) for hz in other_clocks(spec, fig.clock_hz))]
    memory = [_memory(run.plan("mars", n, spec.seq_len, spec.chunk)) for n in spec.memory_nodes]
    chunk_runs = [run.run(s, spec.chunk_nodes, spec.seq_len, b, "model")
                  for b in spec.chunks for s in CHUNK_SCHEMES]
    grid = []
    n = spec.map_nodes
    for gbps in spec.link_gbps:
        for k in spec.compute_scales:
            rates = scaled_rates(run.rates, k)
            for scope in SCOPES:
                res = {s: run.run(s, n, spec.seq_len, spec.chunk, scope, rates,
                                  link_gbps=gbps) for s in ("mars", *FAIR)}
                best = min(FAIR, key=lambda f: res[f].ttft_s)
                grid.append(MapPoint(scope, k, gbps, {s: r.ttft_s for s, r in res.items()},
                                     {s: r.exposed_s for s, r in res.items()}, best,
                                     res[best].ttft_s / res["mars"].ttft_s))
        run.plans = {key: p for key, p in run.plans.items() if key[-1] is None}
    ops_points = []
    for scope in SCOPES:
        ref = min((r for r in table if r.scheme == "mars" and r.scope == scope),
                  key=lambda r: r.nodes)
        ours = scope_ops(run.model, ref.seq_len, scope) / (ref.nodes * ref.compute_s)
        ops = scope_ops(run.model, 16384, scope)
        paper = ops / (2 * PAPER_TABLE1["mars"][2][0])
        ops_points.append(OperatingPoint(scope, ops, paper, ours, paper / ours,
                                         SFP_RATE_BPS / 1e9))
    dec = decode_rows(fig)
    notes = {
        "clock": clock_line(fig),
        "clocks": "Table 1 and Table 2's decode row at " + ", ".join(
            f"{f.clock_hz / 1e6:g} MHz" for f, _ in clocks) + ": the same cycles; seconds = "
            "cycles / clock; the links keep their bit/s and cable seconds, so their cycles "
            "change (bytes per cycle = bit/s / 8 / clock, latency cycles = seconds x clock)",
        "links": f"Fig. 3-5, Table 1, decode: {spec.link} - {LINKS[spec.link].text}",
        "decode_links": "; ".join(f"{k}: {LINKS[k].text}" for k in DECODE_LINKS),
        "decode_weights": _decode_weights_note(fig),
        "lm_head": LM_HEAD,
        "map": f"a ring of {n} boards with the same link on every cable, "
               f"{LINK_LATENCY_S * 1e6:g} us per cable; compute scale k divides every node "
               "cycle cost (GEMM, vector, ATTEND, KV reader, EMIT), the NIC unchanged",
        "setting": f"{spec.setting}: alpha = {spec.alpha:g}, S_node = "
                   f"{spec.kv_budget_mib:.1f} MiB",
        "rates": run.rates.to_dict(),
    }
    by_clock = [ClockRun(f.clock_hz, tuple(t), tuple(dec if f is fig else decode_rows(f)))
                for f, t in clocks]
    return Evaluation(spec, fig.clock_hz, dict(fig.sources), seq_runs, memory, chunk_runs,
                      table, grid, ops_points, dec,
                      paper_checks(run.model, chunk=spec.chunk, clock_hz=fig.clock_hz),
                      notes, by_clock)


# --- output ----------------------------------------------------------------------------------

def _fmt(v: float, nd: int = 2) -> str:
    return f"{v:.{nd}f}"


def markdown(ev: Evaluation) -> str:
    """The tables of the evaluation as markdown (what ``summary.md`` holds)."""
    sp = ev.spec
    out = [f"# Evaluation ({sp.model}, {ev.notes['setting']}, {sp.node_config} nodes)", "",
           f"* {ev.notes['clock']}", f"* {ev.notes['links']}", f"* map: {ev.notes['map']}",
           *(f"* TTFT `{s}`: {COVERS[s]}" for s in SCOPES), ""]
    out += [f"## Table 1: TTFT and traffic vs N (S = {sp.seq_len}, B = {sp.chunk})", "",
            "| scope | scheme | N | TTFT s | exposed s | Comm GiB x hops | peak KV MiB "
            "| paper TTFT s | paper GiB |", "|---|---|---|---|---|---|---|---|---|"]
    for r in ev.table_runs:
        p = PAPER_TABLE1.get(r.scheme, {}).get(r.nodes) if sp.seq_len == 16384 else None
        mem = "" if r.memory_ok else " (over S_node)"
        out.append(f"| {r.scope} | {r.scheme} | {r.nodes} | {_fmt(r.ttft_s)} | "
                   f"{_fmt(r.exposed_s)} | {_fmt(r.comm_gib)} | {r.peak_kv_mib:.1f}{mem} | "
                   f"{p[0] if p else '-'} | {p[1] if p else '-'} |")
    out += ["", "| scope | N | best fair | MARS speedup vs ring | vs zigzag | vs best fair "
            "| MARS / full |", "|---|---|---|---|---|---|---|"]
    for s in ev.speedups():
        full = f"{s['mars_over_full']:.3f}" + ("" if s.get("full_fits_budget") else
                                               " (full over S_node)") \
            if "mars_over_full" in s else "-"
        out.append(f"| {s['scope']} | {s['nodes']} | {s['best_fair']} | "
                   f"{s['speedup_vs_ring']:.3f} | {s['speedup_vs_zigzag']:.3f} | "
                   f"{s['speedup_vs_best_fair']:.3f} | {full} |")
    out += ["", f"## Fig. 3: TTFT vs prompt length (N = {sp.seq_nodes}, B = {sp.chunk})", "",
            "| scope | S | " + " | ".join(SEQ_SCHEMES) + " |",
            "|---|---|" + "---|" * len(SEQ_SCHEMES)]
    by = {(r.scope, r.seq_len, r.scheme): r for r in ev.seq_runs}
    for scope in SCOPES:
        for s in sp.seq_lens:
            out.append(f"| {scope} | {s} | " + " | ".join(
                _fmt(by[scope, s, x].ttft_s) + ("" if by[scope, s, x].memory_ok else "*")
                for x in SEQ_SCHEMES) + " |")
    out += ["", "(* over S_node)", "",
            f"## Fig. 4: MARS KV per rank (S = {sp.seq_len}, B = {sp.chunk})", "",
            "| N | S_node MiB | peak max MiB | owner-only at the end MiB | max at the end MiB "
            "| first-step replica factor | final owner-only |", "|---|---|---|---|---|---|---|"]
    for m in ev.memory:
        out.append(f"| {m.nodes} | {m.budget_mib:.0f} | {max(m.max_kv_mib):.1f} | "
                   f"{m.owner_only_mib[-1]:.1f} | {m.max_kv_mib[-1]:.1f} | "
                   f"{m.replica_factor[0]:.2f} | {m.final_owner_only} |")
    out += ["", f"## Fig. 5: chunk size (N = {sp.chunk_nodes}, S = {sp.seq_len}, whole model)",
            "", "| B | " + " | ".join(f"{s} TTFT s | {s} GiB" for s in CHUNK_SCHEMES) + " |",
            "|---|" + "---|---|" * len(CHUNK_SCHEMES)]
    by = {(r.chunk, r.scheme): r for r in ev.chunk_runs}
    for b in sp.chunks:
        out.append(f"| {b} | " + " | ".join(f"{_fmt(by[b, s].ttft_s)} | {_fmt(by[b, s].comm_gib)}"
                                            for s in CHUNK_SCHEMES) + " |")
    out += _decode_tables(ev)
    out += _clock_tables(ev)
    out += ["", f"## Crossover map (N = {sp.map_nodes}, S = {sp.seq_len}, B = {sp.chunk}): "
            "MARS speedup over the best fair baseline", ""]
    for scope in SCOPES:
        out += [f"{scope}:", "", "| link Gb/s \\ compute x | " + " | ".join(
            f"{k:g}" for k in sp.compute_scales) + " |",
            "|---|" + "---|" * len(sp.compute_scales)]
        pts = {(p.link_gbps, p.compute_scale): p for p in ev.crossover if p.scope == scope}
        for g in sp.link_gbps:
            out.append(f"| {g:g} | " + " | ".join(f"{pts[g, k].speedup:.3f}"
                                                   for k in sp.compute_scales) + " |")
        out.append("")
    for o in ev.operating_points:
        out.append(f"* paper operating point ({o.scope}): {o.paper_rate_ops_s / 1e12:.2f} "
                   f"Tops/s per node needed, ours {o.our_rate_ops_s / 1e12:.4f} -> compute "
                   f"x{o.compute_scale:.0f} at {o.link_gbps:g} Gb/s")
    t = ev.targets()
    out += ["", "## Targets (reported, not tuned)", ""]
    w = t["worst_mars_over_best_fair"]
    if w is not None:
        where = f"N = {w['nodes']}" + ("" if w["compute_scale"] is None else
                                       f", compute x{w['compute_scale']:g}, "
                                       f"{w['link_gbps']:g} Gb/s")
        out.append(f"* worst MARS / best fair TTFT: {w['ratio']:.3f} ({w['where']}, "
                   f"{w['scope']}, {where}); <= 1.02: {t['mars_within_1_02_of_best_fair']}")
    for f in t["full_replication_fits"]:
        out.append(f"* full replication fits S_node at N = {f['nodes']}, S = {f['seq_len']} "
                   f"({f['scope']}): MARS / full = {f['mars_over_full']:.3f}")
    b = t["largest_map_speedup"]
    if b is not None:
        out.append(f"* largest map speedup: {b['speedup']:.2f}x over {b['best_fair']} "
                   f"({b['scope']}, compute x{b['compute_scale']:g}, {b['link_gbps']:g} Gb/s)")
    out += ["", "## The paper's own arithmetic", ""]
    out += [f"* **{c.claim}**: {c.arithmetic} — {c.finding}" for c in ev.checks]
    return "\n".join(out) + "\n"


DECODE_TARGETS = {"replicated": 22.0, "tp_switch10g": 60.0}
"""Issue #34's decode targets (tok/s): printed beside the model's figures, never tuned to."""


def _decode_tables(ev: Evaluation) -> list[str]:
    """Table 2's decode row: every row in full, then tok/s per row at every context."""
    sp = ev.spec
    n = ev.notes
    out = ["", f"## Table 2, decode row ({sp.model}, {sp.decode_nodes} nodes)", "",
           f"* weights: {n.get('decode_weights', '')}", f"* LM head: {n.get('lm_head', '')}",
           f"* links: {n.get('decode_links', '')}",
           "* weights MB/node: what one token streams on the busiest node (every layer's GEMM "
           "blobs with scales and biases, the RMSNorm weights, the LM head's rows); DDR MiB: "
           "the node's weights in DDR (mcf.cluster.tp.tp_node_bytes, the host's embedding "
           "table included)", "",
           "| row | mode | N | link | weights from | context | weights MB/node (LM head) "
           "| DDR MiB/node | weights ms | GEMM ms | vector ms | attention ms | network ms "
           "| tok/s | DDR roofline tok/s |", "|---|---|---|---|---|---|---|---|---|---|---|---|"
           "---|---|---|"]
    for d in sorted(ev.decode, key=lambda d: (d.context, _row_order(d))):
        out.append(f"| {d.key} | {d.mode} | {d.nodes} | {d.link} | {d.weight_path} | "
                   f"{d.context} | {d.weight_bytes_per_node / 1e6:.1f} "
                   f"({d.lm_head_bytes / 1e6:.1f}) | {d.ddr_bytes_per_node / MIB:.1f} | "
                   f"{1e3 * d.weights_s:.1f} | {1e3 * d.gemm_s:.1f} | {1e3 * d.vector_s:.1f} | "
                   f"{1e3 * d.attention_s:.1f} | {1e3 * d.network_s:.2f} | {d.tok_s:.1f} | "
                   f"{d.roofline_tok_s:.1f} |")
    out.append(f"| paper (MCF, {PAPER_DECODE['nodes']} KR260) | - | - | - | - | - | - | - | - | "
               f"- | - | - | - | {PAPER_DECODE['tok_s']} | - |")
    net = [d for d in sorted(ev.decode, key=_row_order) if d.mode == "tensor-parallel"
           and d.context == min(sp.decode_contexts) and d.weight_path == AS_BUILT]
    if net:
        kinds = list(net[0].network)
        out += ["", f"Network per token, tensor-parallel (context {min(sp.decode_contexts)}), "
                "ms:", "", "| row | " + " | ".join(kinds) + " |",
                "|---|" + "---|" * len(kinds)]
        for d in net:
            out.append(f"| {d.key} | " + " | ".join(f"{1e3 * d.network[k]:.2f}"
                                                   for k in kinds) + " |")
    for ctx in sp.decode_contexts:
        tg = decode_targets(ev.decode, ctx)["as_built"]
        out += ["", f"tok/s at context {ctx}:", "", f"| row | {AS_BUILT} |", "|---|---|"]
        out += [f"| {k} | {v:.1f} |" for k, v in tg.items()]
    tg = decode_targets(ev.decode, min(sp.decode_contexts))["as_built"]
    rep = {k: v for k, v in tg.items() if k.startswith("replicated")}
    tps = {k: v for k, v in tg.items() if k.startswith("tp_")}
    out += ["", f"Targets (issue #34; reported, not tuned; {AS_BUILT}, context "
            f"{min(sp.decode_contexts)}): replicated >= {DECODE_TARGETS['replicated']:g} tok/s: "
            + ", ".join(f"{k} {v:.1f}" for k, v in rep.items())
            + f"; tensor-parallel on switch10g >= {DECODE_TARGETS['tp_switch10g']:g} tok/s, "
            "kr260-ring stated: " + ", ".join(f"{k} {v:.1f}" for k, v in tps.items())]
    return out


def _clock_tables(ev: Evaluation) -> list[str]:
    """Table 1 (MARS, the best fair baseline, the speedup) and Table 2's decode row at every
    clock of the evaluation."""
    sp = ev.spec
    if not ev.clocks:
        return []
    mhz = [f"{c.clock_hz / 1e6:g}" for c in ev.clocks]
    out = ["", f"## Table 1 and Table 2 at {' and '.join(mhz)} MHz", "",
           f"* {ev.notes.get('clocks', '')}", "",
           f"Table 1 (S = {sp.seq_len}, B = {sp.chunk}): TTFT s of MARS / the best fair "
           "baseline, and MARS's speedup over it", "",
           "| clock MHz | scope | " + " | ".join(f"N = {n}" for n in sp.nodes) + " |",
           "|---|---|" + "---|" * len(sp.nodes)]
    for c in ev.clocks:
        by = {(r.scope, r.nodes, r.scheme): r for r in c.table_runs}
        sps = {(s["scope"], s["nodes"]): s for s in speedups(c.table_runs, sp.nodes)}
        for scope in SCOPES:
            out.append(f"| {c.clock_hz / 1e6:g} | {scope} | " + " | ".join(
                f"{_fmt(by[scope, n, 'mars'].ttft_s)} / "
                f"{_fmt(by[scope, n, sps[scope, n]['best_fair']].ttft_s)} "
                f"({sps[scope, n]['speedup_vs_best_fair']:.3f}x)" for n in sp.nodes) + " |")
    out += ["", f"Table 2, decode row ({sp.decode_nodes} nodes): tok/s", "",
            "| clock MHz | row | weights from | " + " | ".join(
                f"context {x}" for x in sp.decode_contexts) + " | DDR roofline |",
            "|---|---|---|" + "---|" * len(sp.decode_contexts) + "---|"]
    for c in ev.clocks:
        rows = {}
        for d in sorted(c.decode, key=_row_order):
            rows.setdefault((d.key, d.weight_path), {})[d.context] = d
        for (key, path), per in rows.items():
            out.append(f"| {c.clock_hz / 1e6:g} | {key} | {path} | " + " | ".join(
                f"{per[x].tok_s:.1f}" for x in sp.decode_contexts)
                + f" | {next(iter(per.values())).roofline_tok_s:.1f} |")
    return out


def write_report(ev: Evaluation, out: Path, dpi: int = 100) -> list[Path]:
    """Write the PNGs (matplotlib, Agg), ``summary.md`` and ``evaluation.json`` into ``out``."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    sp = ev.spec
    plt.rcParams.update({"font.size": 8})

    def save(f, name):
        path = out / name
        f.tight_layout()
        f.savefig(path, dpi=dpi)
        plt.close(f)
        written.append(path)

    # Fig. 3
    f, axes = plt.subplots(1, 2, figsize=(8, 3.2))
    for ax, scope in zip(axes, SCOPES):
        for s in SEQ_SCHEMES:
            rs = [r for r in ev.seq_runs if r.scope == scope and r.scheme == s]
            ax.plot([r.seq_len for r in rs], [r.ttft_s for r in rs], marker="o", label=s)
        ax.set(xlabel="prompt length S (tokens)", ylabel="TTFT (s)", xscale="log",
               title=f"({'ab'[SCOPES.index(scope)]}) {scope}, N = {sp.seq_nodes}")
        _log_ticks(ax, sp.seq_lens)
    save(f, "fig3_ttft_vs_seq.png")
    # Fig. 4
    f, (a1, a2) = plt.subplots(1, 2, figsize=(8, 3.2))
    for m in ev.memory:
        line, = a1.plot(m.steps, m.max_kv_mib, label=f"N={m.nodes} max rank")
        a1.plot(m.steps, m.owner_only_mib, "--", color=line.get_color(),
                label=f"N={m.nodes} owner-only")
        a2.plot(m.steps, m.replica_factor, marker=".", label=f"N={m.nodes}")
    a1.axhline(sp.kv_budget_mib, color="grey", lw=0.8, ls=":", label="S_node")
    a1.set(xlabel="prefill step (chunk; last = after the deadline)", ylabel="KV per rank (MiB)",
           title=f"(a) KV per rank, S = {sp.seq_len}")
    a2.set(xlabel="prefill step (chunk)", ylabel="mean copies per slice",
           title="(b) active replica factor")
    a1.legend()
    a2.legend()
    save(f, "fig4_memory.png")
    # Fig. 5
    f, (a1, a2) = plt.subplots(1, 2, figsize=(8, 3.2))
    for s in CHUNK_SCHEMES:
        rs = [r for r in ev.chunk_runs if r.scheme == s]
        a1.plot([r.chunk for r in rs], [r.ttft_s for r in rs], marker="o", label=s)
        a2.plot([r.chunk for r in rs], [r.comm_gib for r in rs], marker="o", label=s)
    for ax, yl, t in ((a1, "TTFT (s)", "(a) TTFT"), (a2, "GiB x hops", "(b) traffic")):
        ax.set(xlabel="chunk B (tokens)", ylabel=yl, xscale="log",
               title=f"{t}, N = {sp.chunk_nodes}, S = {sp.seq_len}")
        _log_ticks(ax, sp.chunks)
    save(f, "fig5_chunk.png")
    # Table 1: TTFT per scheme (top), MARS over the best fair baseline per N (bottom)
    f, axes = plt.subplots(2, 2, figsize=(8, 5.6),
                           gridspec_kw={"height_ratios": (3, 2)})
    rows = speedups(ev.table_runs, sp.nodes)
    for (ax, bx), scope in zip(axes.T, SCOPES):
        for s in TABLE_SCHEMES + ("full",):
            rs = [r for r in ev.table_runs if r.scope == scope and r.scheme == s]
            if rs:
                ax.plot([r.nodes for r in rs], [r.ttft_s for r in rs], marker="o", label=s)
        ax.set(ylabel="TTFT (s)", xscale="log", yscale="log",
               title=f"{scope}, S = {sp.seq_len}")
        _log_y_ticks(ax)
        _log_ticks(ax, sp.nodes)
        mine = [r for r in rows if r["scope"] == scope]
        ns, ups = [r["nodes"] for r in mine], [r["speedup_vs_best_fair"] for r in mine]
        bx.bar(range(len(ns)), ups, color="tab:blue", width=0.6)
        for i, (u, r) in enumerate(zip(ups, mine)):
            bx.text(i, u, f"{u:.3f}x\nvs {r['best_fair']}", ha="center", va="bottom",
                    fontsize=7)
        bx.axhline(1.0, color="grey", lw=0.8, ls=":")
        lo = min(ups + [1.0])
        bx.set_ylim(lo - 0.05 * max(1e-3, max(ups + [1.0]) - lo) - 0.01,
                    max(ups + [1.0]) * 1.06)
        bx.set_xscale("linear")
        bx.set_xticks(range(len(ns)), [str(n) for n in ns])
        bx.set(xlabel="nodes N", ylabel="MARS speedup (x)",
               title="MARS over the best fair baseline")
    save(f, "table1_ttft_vs_nodes.png")
    # crossover map
    f, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    ks, gs = sp.compute_scales, sp.link_gbps
    top = max((p.speedup for p in ev.crossover), default=1.0)
    for ax, scope in zip(axes, SCOPES):
        pts = {(p.link_gbps, p.compute_scale): p.speedup for p in ev.crossover
               if p.scope == scope}
        grid = [[pts[g, k] for k in ks] for g in gs]
        im = ax.imshow(grid, origin="lower", aspect="auto", cmap="viridis", vmin=0.9,
                       vmax=max(1.1, top))
        for i, g in enumerate(gs):
            for j, k in enumerate(ks):
                ax.text(j, i, f"{pts[g, k]:.2f}", ha="center", va="center", color="w"
                        if pts[g, k] < (0.9 + max(1.1, top)) / 2 else "k", fontsize=7)
        ax.set_xticks(range(len(ks)), [f"{k:g}" for k in ks])
        ax.set_yticks(range(len(gs)), [f"{g:g}" for g in gs])
        ax.set(xlabel="node compute rate (x ours)", ylabel="link rate (Gb/s)",
               title=f"MARS / best fair speedup, {scope}, N = {sp.map_nodes}")
        op = next(o for o in ev.operating_points if o.scope == scope)
        x = _index(ks, op.compute_scale)
        y = _index(gs, op.link_gbps)
        ax.plot([x], [y], marker="*", ms=12, color="red", mec="k", ls="none",
                label=f"paper's apparent point (x{op.compute_scale:.0f}, "
                      f"{op.link_gbps:g} Gb/s)")
        ax.legend(loc="upper left", fontsize=6)
        f.colorbar(im, ax=ax)
    save(f, "crossover.png")
    (out / "summary.md").write_text(markdown(ev))
    (out / "evaluation.json").write_text(json.dumps(ev.to_dict(), indent=1, default=str))
    written += [out / "summary.md", out / "evaluation.json"]
    return written


def _log_ticks(ax, ticks) -> None:
    """A log x axis labelled at exactly ``ticks``, with its legend."""
    ax.minorticks_off()
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.legend()


def _log_y_ticks(ax) -> None:
    """Label a log y axis at 1-2-5 steps so every decade shows numbers, not one tick."""
    from matplotlib.ticker import LogLocator, ScalarFormatter
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_minor_locator(LogLocator(base=10, subs=()))
    fmt = ScalarFormatter()
    fmt.set_scientific(False)
    ax.yaxis.set_major_formatter(fmt)


def _index(axis, v: float) -> float:
    """``v``'s fractional position on a log-spaced axis of tick values (clamped)."""
    logs = [math.log(a) for a in axis]
    x = math.log(v)
    if len(logs) == 1 or x <= logs[0]:
        return 0.0 if x <= logs[0] else float(len(logs) - 1)
    for i in range(len(logs) - 1):
        if x <= logs[i + 1]:
            return i + (x - logs[i]) / (logs[i + 1] - logs[i])
    return float(len(logs) - 1)
