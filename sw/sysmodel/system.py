"""A MARS plan (or a baseline's) run through the event-level model: every chunk step of
:mod:`mcf.mars`'s schedule — its token ranges and its transfers, unchanged — played by
:func:`.events.simulate_step` with the node-program cycles of :mod:`.rates` and the link costs
of :mod:`.network`. ``TTFT = Σ step cycles`` (the steps run back to back, each from its
doorbell to its last landing; the PS writes the next step's rings while one runs), plus PD's
hand-off step. What a TTFT covers: the layer program of every layer for the whole prompt
(``scope="model"``: Q/K/V, attention, O projection and MLP on the nodes; the embedding lookup
and the LM head are not on the node) or the ATTEND records alone (``scope="attention"``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..mars.cluster import SWITCH
from .calibration import BenchFigures
from .events import COMPUTE, NET, Hop, Route, StepInput, StepTimeline, simulate_step
from .network import Network
from .rates import NodeRates
from .work import LAYOUTS, SCOPES, NodeWork, node_work

__all__ = ["SystemSpec", "StepResult", "SystemResult", "simulate_plan", "routes_of"]


@dataclass(frozen=True)
class SystemSpec:
    """How to model a plan: token layout (:mod:`.work`), scope, the node-program overheads
    (``False``: engine rates alone), Ethernet framing on the links (``False``: link frames
    only, as the cluster simulation's ``LinkModel``) and a cable latency in cycles replacing
    the topology's (``None``: the topology's); ``tile_chunk``: query tokens per PREFILL_TILE
    record (``None``: what the node program runs in a single-softmax run on the plan's node
    configuration, :func:`mcf.node.layer.prefill_tile_chunk`; 0: per-token PREFILL records, as
    a node without the tiled path or a ``two_phase`` run) — used when the rates are calibrated
    here; the work follows the rates' ``tile_chunk``. ``requant_overlap``: the vector unit's
    requantise overlap priced (:meth:`~.rates.NodeRates.calibrated`; ``False`` for a run
    recorded on the RTL before it)."""
    layout: str = "plan"
    scope: str = "model"
    overheads: bool = True
    ethernet: bool = True
    latency_cycles: float | None = None
    tile_chunk: int | None = None
    requant_overlap: bool = True

    def __post_init__(self):
        if self.layout not in LAYOUTS:
            raise ValueError(f"unknown layout {self.layout!r} (one of {', '.join(LAYOUTS)})")
        if self.scope not in SCOPES:
            raise ValueError(f"unknown scope {self.scope!r} (one of {', '.join(SCOPES)})")
        if self.latency_cycles is not None and not self.latency_cycles >= 0:
            raise ValueError("the link latency must be >= 0 cycles")


@dataclass
class StepResult:
    index: int                   # chunk step (1-based); C + 1 = PD's hand-off
    timeline: StepTimeline
    ops: tuple                   # per node: (JOB 2l, EMIT, ATTEND, JOB 2l+1) cycles per layer
    work: list                   # per node: NodeWork (empty for the hand-off)


@dataclass
class SystemResult:
    policy: str
    nodes: int
    chunk: int
    seq_len: int
    clock_hz: float
    steps: list
    rates: NodeRates
    spec: SystemSpec
    topology: str = ""
    notes: dict = field(default_factory=dict)

    @property
    def step_cycles(self) -> list[float]:
        return [s.timeline.cycles for s in self.steps]

    @property
    def ttft_cycles(self) -> float:
        return sum(self.step_cycles)

    @property
    def ttft_s(self) -> float:
        return self.ttft_cycles / self.clock_hz

    @property
    def compute_cycles(self) -> float:
        """Σ over steps of the busiest node's compute."""
        return sum(s.timeline.critical_busy for s in self.steps)

    @property
    def exposed_cycles(self) -> float:
        """Σ over steps of the cycles the busiest node's compute does not cover: exposed
        communication (waits for landings, the last landing after the compute)."""
        return sum(s.timeline.exposed for s in self.steps)

    def busy_fraction(self) -> list[float]:
        """Per node: compute-queue busy cycles / Σ step cycles (the node bench's
        ``compute_busy_fraction`` is the lowest of these)."""
        total = self.ttft_cycles or 1.0
        return [sum(s.timeline.busy[n] for s in self.steps) / total for n in range(self.nodes)]

    def to_dict(self, detail: bool = False) -> dict:
        c = self.clock_hz
        out = {
            "policy": self.policy, "nodes": self.nodes, "chunk": self.chunk,
            "seq_len": self.seq_len, "topology": self.topology, "clock_hz": c,
            "layout": self.spec.layout, "scope": self.spec.scope,
            "overheads": self.spec.overheads,
            "ttft_s": self.ttft_s, "ttft_cycles": self.ttft_cycles,
            "compute_s": self.compute_cycles / c, "exposed_comm_s": self.exposed_cycles / c,
            "busy_fraction": self.busy_fraction(),
        }
        if detail:
            out["steps"] = [{"step": s.index, "cycles": s.timeline.cycles,
                             "busy": s.timeline.busy, "waited": s.timeline.waited,
                             "exposed": s.timeline.exposed,
                             "last_landing": s.timeline.last_landing,
                             "ops_per_layer": [list(o) for o in s.ops]} for s in self.steps]
        return out


def routes_of(transfers, plan, net: Network, reads=None) -> tuple[Route, ...]:
    """One :class:`Route` per transfer (its per-layer message's hops, packets, trigger).
    ``reads``: per node, the ``(block, slice)`` keys its ATTEND reads (``None``: every
    delivered slice, as MARS's schedule has every node read every slice of blocks ``1..c``)."""
    topo = plan.cluster.topology
    owner_hops: dict = {}
    for i, t in enumerate(transfers):
        if t.chain and len(t.dests) == 1:
            owner_hops[(t.block, t.slice, t.phase, t.dests[0])] = i
    succ: dict[int, list[int]] = {}
    preds: set[int] = set()
    for j, t in enumerate(transfers):
        if t.chain and t.src != t.slice:
            i = owner_hops.get((t.block, t.slice, t.phase, t.src))
            if i is None:
                raise ValueError(f"ring hop {t.src}->{t.dests} of slice {(t.block, t.slice)} "
                                 "has no hop delivering it to its relay")
            succ.setdefault(i, []).append(j)
            preds.add(j)
    cache: dict = {}
    out = []
    for j, t in enumerate(transfers):
        payloads = tuple(plan.encoder.fragments(t.tokens))
        dests = set(t.dests)
        index: dict = {}
        hops: list[Hop] = []
        for d in t.dests:
            path = topo.path(t.src, d)
            parent = -1
            for k, link in enumerate(path):
                if link not in index:
                    far = d if k == len(path) - 1 else path[k + 1][0]
                    key = (link, t.tokens, parent < 0)
                    if key not in cache:
                        cache[key] = net.hop(link, payloads, parent < 0)
                    cyc, first, last = cache[key]
                    index[link] = len(hops)
                    hops.append(Hop(link, parent, cyc, first, last, net.link_latency(link),
                                    far if far != SWITCH and far in dests else None))
                parent = index[link]
        cls = NET if t.phase in ("plan", "handoff") else COMPUTE
        trigger = "relay" if j in preds else ("emit" if t.phase == "store" else "start")
        needers = None if reads is None else tuple(
            d for d in t.dests if (t.block, t.slice) in reads[d])
        out.append(Route(t.src, tuple(hops), tuple(t.dests), cls, trigger,
                         tuple(succ.get(j, ())), needers))
    return tuple(out)


def simulate_plan(plan, fig: BenchFigures, spec: SystemSpec = SystemSpec(),
                  rates: NodeRates | None = None, progress=None) -> SystemResult:
    """Model every step of ``plan`` (a :class:`mcf.mars.Plan`) on its cluster's nodes and
    network. ``rates``: the node's cycle costs (default: calibrated for the plan's node
    configuration and model). ``progress``: optional callable ``(done, total)``."""
    model, cl = plan.model, plan.cluster
    if rates is None:
        rates = NodeRates.calibrated(fig, cl.node_config, model, overheads=spec.overheads,
                                     tile_chunk=spec.tile_chunk,
                                     requant_overlap=spec.requant_overlap)
    net = Network(cl.topology, fig, spec.ethernet, spec.latency_cycles)
    steps = []
    total = len(plan.steps) + (plan.handoff is not None)
    for s in plan.steps:
        work = [node_work(model, plan, s.index, n, spec.layout, spec.scope, rates.tile_chunk)
                for n in range(cl.nodes)]
        ops = tuple(_ops(rates, w) for w in work)
        reads = None
        if spec.layout == "node-program":
            from ..node.layer import read_set
            reads = [set(read_set(plan, s.index, n)) for n in range(cl.nodes)]
        tl = simulate_step(StepInput(cl.nodes, model.layers, ops,
                                     routes_of(s.transfers, plan, net, reads)))
        steps.append(StepResult(s.index, tl, ops, work))
        if progress is not None:
            progress(len(steps), total)
    if plan.handoff is not None:
        ops = tuple((0.0, 0.0, 0.0, 0.0) for _ in range(cl.nodes))
        tl = simulate_step(StepInput(cl.nodes, model.layers, ops,
                                     routes_of(plan.handoff.transfers, plan, net)))
        steps.append(StepResult(plan.num_chunks + 1, tl, ops, []))
        if progress is not None:
            progress(total, total)
    return SystemResult(plan.policy, cl.nodes, plan.chunk, plan.seq_len, fig.clock_hz, steps,
                        rates, spec, cl.topology.describe())


def _ops(rates: NodeRates, w: NodeWork) -> tuple[float, float, float, float]:
    return rates.job_a(w), rates.emit(w), rates.attend(w), rates.job_b(w)
