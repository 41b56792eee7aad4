"""The chunk-step scheduler: replica factors, placement, routes, directory lifecycle (paper §4).

One step per chunk ``c = 1..C``, in three phases (the pipeline that lets MARS prefetch ahead):

1. **plan(c)** — while chunk ``c−1`` still computes: pick ``r(c)`` (eq 11–16, 29); replicas above
   it, or needed to keep every node within ``S_node`` once block ``c`` arrives, are marked
   DRAINING (they keep serving chunk ``c−1``); the history reads of chunk ``c`` are scheduled from
   owner/VALID copies only: local where a copy is on the node, else fetched from the nearest copy
   (mesh-aware multicast tree per source), or streamed around the ring for the baselines.
2. **complete(c−1)** — chunk ``c−1`` finishes: its reads are served (from VALID, OWNER or
   DRAINING copies); DRAINING copies with no dependants left are freed.
3. **store(c)** — chunk ``c`` computes its KV block: every node stores the slice it owns, the
   owner multicasts it to the ``r(c)−1`` replica holders (memory-checked per node), and the
   diagonal-block reads of chunk ``c`` are scheduled.

Policies: ``mars``; ``ring`` and ``zigzag`` (r = 1, KV streamed hop by hop around the logical
ring every chunk; contiguous vs zigzag token layout); ``full`` (r = N, no budget, replicas
dropped after prefill); ``pd`` (prefill pool of ⌊N/2⌋ nodes running zigzag, then every slice is
handed off to the decode pool).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .cluster import ClusterSpec, Tree
from .directory import CopyState, Directory, InvariantError
from .layout import chunk_ranges
from .model import ModelSpec
from .placement import assign_sources, holder_set
from .replicas import r_mem, r_reuse, replica_factor
from .routes import RouteAllocator, StepRoutes

__all__ = ["POLICIES", "Transfer", "Step", "Handoff", "Scheduler", "PlanError"]

POLICIES = ("mars", "ring", "zigzag", "full", "pd")


class PlanError(ValueError):
    """The requested plan cannot be built (bad or infeasible input); one-line message."""


@dataclass(frozen=True)
class Transfer:
    """One routed KV movement: ``nbytes`` (all layers) of slice ``(block, slice)``."""
    kind: str               # "replica" | "access" | "handoff"
    phase: str              # "plan" | "store" | "handoff"
    block: int
    slice: int              # the owner node of the slice
    tokens: int
    nbytes: int
    src: int
    dests: tuple
    tree: Tree
    latency_s: float        # from the start of the transfer's chain to its farthest receiver
    chain: bool = False     # a store-and-forward hop of ring streaming
    route_id: int | None = None


@dataclass
class Step:
    index: int
    r_mem: int
    r_reuse: int
    replica_factor: int
    ranges: list                        # per node: token ranges owned in this chunk
    replicas: dict = field(default_factory=dict)     # slice owner -> replica holders (block c)
    drains: list = field(default_factory=list)       # ((block, slice), node) marked at plan(c)
    frees: list = field(default_factory=list)        # ((block, slice), node) freed before store
    transfers: list = field(default_factory=list)
    node_kv_bytes: list = field(default_factory=list)
    draining_reads: int = 0             # reads of chunk c served by copies that began
                                        # DRAINING while it was in flight
    active_replica_factor: float = 1.0  # mean copies per slice after store(c)
    routes: StepRoutes | None = None
    cost: object = None                 # mcf.mars.cost.StepCost


@dataclass
class Handoff:
    transfers: list
    frees: list
    node_kv_bytes: list
    routes: StepRoutes | None = None
    cost: object = None


class Scheduler:
    def __init__(self, model: ModelSpec, cluster: ClusterSpec, seq_len: int, chunk: int,
                 policy: str = "mars", alpha: float = 0.5):
        if policy not in POLICIES:
            raise PlanError(f"unknown policy {policy!r} (one of {', '.join(POLICIES)})")
        n = cluster.nodes
        if chunk < 1 or seq_len < 1 or seq_len % chunk:
            raise PlanError(f"seq-len {seq_len} is not a multiple of the chunk size {chunk}")
        if not (alpha >= 0 and math.isfinite(alpha)):
            raise PlanError("alpha must be a finite number >= 0")
        self.model, self.cluster, self.topo = model, cluster, cluster.topology
        self.seq_len, self.chunk, self.policy, self.alpha = seq_len, chunk, policy, alpha
        self.num_chunks = seq_len // chunk
        if policy == "pd":
            if n < 2:
                raise PlanError("pd needs at least 2 nodes (a prefill and a decode pool)")
            self.pool = list(range(n // 2))
            self.decode_pool = list(range(n // 2, n))
        else:
            self.pool = list(range(n))
            self.decode_pool = list(range(n))
        if chunk < len(self.pool):
            raise PlanError(f"chunk {chunk} is smaller than the {len(self.pool)} nodes that "
                            f"share it (every node computes part of every chunk)")
        self.layout = "contiguous" if policy == "ring" else "zigzag"
        budgeted = policy == "mars"
        self.dir = Directory(n, cluster.kv_budget if budgeted else None)
        self.routes = RouteAllocator(self.topo)
        self.steps: list[Step] = []
        self.handoff: Handoff | None = None
        self.final_frees: list = []
        self._check_owner_only_fits()

    # --- helpers -----------------------------------------------------------------------------
    def ranges(self, c: int) -> list:
        """Token ranges of chunk ``c`` per cluster node (empty for nodes outside the pool)."""
        per_pool = chunk_ranges(c, self.chunk, len(self.pool), self.layout)
        out = [[] for _ in range(self.cluster.nodes)]
        for i, node in enumerate(self.pool):
            out[node] = per_pool[i]
        return out

    @staticmethod
    def tokens(ranges) -> int:
        return sum(b - a for a, b in ranges)

    def _owner_only_bytes(self) -> list[int]:
        owned = [0] * self.cluster.nodes
        for c in range(1, self.num_chunks + 1):
            for node, rg in enumerate(self.ranges(c)):
                owned[node] += self.tokens(rg) * self.model.m_token
        return owned

    def _check_owner_only_fits(self) -> None:
        if self.policy != "mars":
            return
        owned = self._owner_only_bytes()
        need = max(owned)
        if need > self.cluster.kv_budget:
            raise PlanError(
                f"KV budget {self.cluster.kv_budget / 2**20:.3f} MiB per node is too small even "
                f"for the owner-only layout, which needs {need / 2**20:.3f} MiB on node "
                f"{owned.index(need)}")

    def _target(self, c: int) -> tuple[int, int, int]:
        n, m = self.cluster.nodes, self.model
        rm = r_mem(n, self.cluster.kv_budget, m.m_hist(c, self.chunk))
        if self.policy == "mars":
            rr = r_reuse(c, self.num_chunks, n, self.alpha)
            return rm, rr, replica_factor(c, self.num_chunks, n, rm, rr)
        if self.policy == "full":
            return rm, n, n
        return rm, 1, 1

    # --- reads -------------------------------------------------------------------------------
    def _schedule_reads(self, c: int, keys, phase: str, out: list) -> None:
        """Every pool node reads every slice in ``keys`` for chunk ``c``."""
        topo, d = self.topo, self.dir
        streaming = self.policy in ("ring", "zigzag", "pd")
        for key in keys:
            nbytes = d.size[key]
            tokens = nbytes // self.model.m_token
            owner = d.owner(key)
            if streaming:
                # Ring streaming: the owner's copy travels hop by hop round the logical ring.
                k = self.pool.index(owner)
                order = self.pool[k:] + self.pool[:k]
                lat = 0.0
                for a, b in zip(order, order[1:]):
                    tree = topo.tree(a, [b])
                    lat += tree.latency_s
                    out.append(Transfer("access", phase, key[0], key[1], tokens, nbytes, a, (b,),
                                        tree, lat, chain=True))
                d.register_read(key, owner, c)     # every pool node reads the streamed owner copy
                continue
            sources = d.schedulable(key)
            requesters = [n for n in self.pool if n not in sources]
            for node in self.pool:
                if node in sources:
                    d.register_read(key, node, c)
            for src, reqs in sorted(assign_sources(topo, sources, requesters).items()):
                tree = topo.tree(src, reqs)
                out.append(Transfer("access", phase, key[0], key[1], tokens, nbytes, src,
                                    tree.dests, tree, tree.latency_s))
                d.register_read(key, src, c)

    # --- phases ------------------------------------------------------------------------------
    def _plan(self, step: Step) -> None:
        c, d = step.index, self.dir
        target = step.replica_factor
        history = [k for k in d.slices() if k[0] < c]
        if self.policy == "mars":
            for key in history:
                sched = d.schedulable(key)
                if len(sched) > target:
                    owner = d.owner(key)
                    keep = holder_set(self.topo, owner, target, frozenset(sched))
                    for node in sched:
                        if node not in keep:
                            d.mark_draining(key, node)
                            step.drains.append((key, node))
            self._relieve_pressure(step, history)
        self._schedule_reads(c, history, "plan", step.transfers)

    def _relieve_pressure(self, step: Step, history) -> None:
        """Drain more replicas on any node that would exceed S_node once block c arrives."""
        d, budget = self.dir, self.cluster.kv_budget
        for node in range(self.cluster.nodes):
            draining = sum(d.size[k] for k in history
                           if d.state(k, node) is CopyState.DRAINING)
            projected = d.used[node] - draining + \
                self.tokens(step.ranges[node]) * self.model.m_token
            if projected <= budget:
                continue
            victims = sorted((k for k in history if d.state(k, node) is CopyState.VALID),
                             key=lambda k: (-len(d.schedulable(k)), k))
            for key in victims:
                if projected <= budget:
                    break
                d.mark_draining(key, node)
                step.drains.append((key, node))
                projected -= d.size[key]
            if projected > budget:
                raise InvariantError(f"node {node} cannot fit block {step.index} "
                                     f"even after draining every replica")

    def _complete(self, c: int, step: Step | None) -> list:
        served = self.dir.serve_reads(c)
        if step is not None:
            step.draining_reads = served
        return self.dir.free_drained()

    def _store(self, step: Step) -> None:
        c, d, topo = step.index, self.dir, self.topo
        m_token = self.model.m_token
        new_keys = []
        for node in self.pool:
            tok = self.tokens(step.ranges[node])
            if tok:
                d.add_owner((c, node), node, tok * m_token)
                new_keys.append((c, node))
        r = step.replica_factor
        if r > 1:
            k = (c - 1) % len(self.pool)
            for owner in self.pool[k:] + self.pool[:k]:
                key = (c, owner)
                if key not in d.copies:
                    continue
                size = d.size[key]
                if d.budget is None:
                    allowed = frozenset(self.pool)
                else:
                    allowed = frozenset(x for x in self.pool
                                        if x == owner or d.used[x] + size <= d.budget)
                holders = holder_set(topo, owner, r, allowed)[1:]
                for h in holders:
                    d.add_replica(key, h)
                step.replicas[owner] = list(holders)
                if holders:
                    tree = topo.tree(owner, holders)
                    step.transfers.append(Transfer("replica", "store", c, owner,
                                                   size // m_token, size, owner, tree.dests,
                                                   tree, tree.latency_s))
        self._schedule_reads(c, new_keys, "store", step.transfers)
        d.check()
        step.node_kv_bytes = list(d.used)
        copies = [len(cps) for cps in d.copies.values()]
        step.active_replica_factor = sum(copies) / len(copies) if copies else 1.0

    # --- driver ------------------------------------------------------------------------------
    def run(self, progress=None) -> None:
        C = self.num_chunks
        prev: Step | None = None
        for c in range(1, C + 1):
            rm, rr, r = self._target(c)
            step = Step(c, rm, rr, r, self.ranges(c))
            self._plan(step)
            if prev is not None:
                step.frees = self._complete(c - 1, prev)
            self._store(step)
            step.transfers, step.routes = self.routes.assign(c, step.transfers)
            self.steps.append(step)
            prev = step
            if progress is not None:
                progress(c)
        if self.policy == "full":
            last = self.steps[-1]
            for key in self.dir.slices():
                for node in self.dir.holders(key, CopyState.VALID):
                    self.dir.mark_draining(key, node)
                    last.drains.append((key, node))
        self.final_frees = self._complete(C, prev)
        if self.policy == "pd":
            self._handoff()
        self.dir.check()
        self.dir.check_owner_only()
        self._check_balanced()

    def _check_balanced(self) -> None:
        """The decode-ready layout is evenly sharded: owned bytes differ by at most a slice."""
        owned = self.dir.owned_bytes()
        pool = [owned[n] for n in self.decode_pool]
        slice_max = max(self.dir.size.values(), default=0)
        if max(pool) - min(pool) > slice_max:
            raise InvariantError(f"final layout unbalanced: owned bytes {pool} differ by more "
                                 f"than one slice ({slice_max} B)")

    def _handoff(self) -> None:
        """PD disaggregation: each slice moves to a decode-pool node, round robin (balanced)."""
        d, topo, dp = self.dir, self.topo, self.decode_pool
        transfers, frees = [], []
        for i, key in enumerate(sorted(d.slices())):
            src, dst = d.owner(key), dp[i % len(dp)]
            tree = topo.tree(src, [dst])
            transfers.append(Transfer("handoff", "handoff", key[0], key[1],
                                      d.size[key] // self.model.m_token, d.size[key], src,
                                      (dst,), tree, tree.latency_s))
            d.move_owner(key, dst)
            frees.append((key, src))
        transfers, routes = self.routes.assign(self.num_chunks + 1, transfers)
        self.handoff = Handoff(transfers, frees, list(d.used), routes)
